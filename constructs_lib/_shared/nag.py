"""cdk-nag 3 rule packs and acknowledgements: one finding at a time, each with its reason.

cdk-nag 3 runs as CDK policy-validation plugins (``Validations.of(app).add_plugins(*nag_packs())``); an
unacknowledged finding fails ``app.synth()``. A finding is acknowledged on the construct it was raised on.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnElement, Stack, Validations
from cdk_nag import AwsSolutionsChecks, NagPack, NIST80053R5Checks, ServerlessChecks
from constructs import IConstruct

AWS_SOLUTIONS = "AwsSolutions"
NIST_800_53_R5 = "NIST.800.53.R5"
SERVERLESS = "Serverless"


def nag_packs() -> list[NagPack]:
    """The rule packs the app and every construct test must pass: AwsSolutions, NIST 800-53 R5 and Serverless.

    HIPAA Security is not among them: on this library it raises the NIST 800-53 R5 rules again plus one that does
    not apply (CodeBuildProjectSourceRepoUrl: the build's source is an S3 asset, with no repository URL that could
    hold credentials); ``tests/test_app.py`` checks that this stays so.
    """
    return [AwsSolutionsChecks(), NIST80053R5Checks(), ServerlessChecks()]


def acknowledge(scope: IConstruct, finding: str, reason: str, *, pack: str = AWS_SOLUTIONS) -> None:
    """Acknowledge exactly one finding of ``pack`` (default AwsSolutions) on ``scope`` with a specific reason.

    ``finding`` is the rule with its evidence as cdk-nag prints it, e.g. ``IAM5[Resource::*]`` or
    ``IAM5[Resource::<Bucket.Arn>/checkpoints/*]`` (build the latter with :func:`arn_evidence`), or a NIST /
    Serverless rule such as ``LambdaDLQ`` with ``pack=NIST_800_53_R5``.
    """
    if pack not in (AWS_SOLUTIONS, NIST_800_53_R5, SERVERLESS):
        raise ValueError(f"acknowledge: pack must be one of {AWS_SOLUTIONS}, {NIST_800_53_R5}, {SERVERLESS}")
    if len(reason) < 20:
        raise ValueError(f"acknowledge: give {finding} a specific reason (at least 20 characters)")
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{pack}::{pack}-{finding}", reason=reason))


def logical_id(element: IConstruct) -> str:
    """The CloudFormation logical ID of ``element`` (a CfnElement, or an L2 whose default child is one)."""
    cfn = element if isinstance(element, CfnElement) else element.node.default_child
    if not isinstance(cfn, CfnElement):
        raise TypeError(f"{element.node.path} has no CloudFormation element")
    stack = Stack.of(cfn)
    return str(stack.resolve(stack.get_logical_id(cfn)))


def arn_evidence(element: IConstruct, suffix: str = "") -> str:
    """cdk-nag's rendering of ``Fn::GetAtt [<element>, Arn]`` followed by ``suffix``: ``<LogicalId.Arn>suffix``."""
    return f"<{logical_id(element)}.Arn>{suffix}"


def rendered(scope: IConstruct, value: str) -> str:
    """``value`` (a string that may hold tokens) as cdk-nag prints it in a finding: ``Ref`` becomes
    ``<Name>``, ``Fn::GetAtt`` becomes ``<Name.Attr>``, ``Fn::Join`` is joined."""
    return _render(Stack.of(scope).resolve(value))


def rendered_or_none(scope: IConstruct, value: str) -> str | None:
    """:func:`rendered`, or None for a value whose rendering is not known here (e.g. a cross-stack
    ``Fn::ImportValue``): the finding then stays for the app to acknowledge, rather than failing synthesis."""
    try:
        return rendered(scope, value)
    except ValueError:
        return None


def _render(node: object) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and len(node) == 1:
        ((fn, arg),) = node.items()
        if fn == "Ref":
            return f"<{arg}>"
        if fn == "Fn::GetAtt":
            return f"<{arg[0]}.{arg[1]}>"
        if fn == "Fn::Join":
            return str(arg[0]).join(_render(part) for part in arg[1])
    raise ValueError(f"cannot render {node!r} as cdk-nag evidence")


def policy_scope(grantee: IConstruct) -> IConstruct:
    """Where a grant's statements land: a role's ``DefaultPolicy`` (a created role) or ``Policy`` (a role
    imported with ``Role.from_role_arn``/``from_role_name``) when it has one, else the grantee itself.

    Acknowledging there, not on the whole role, keeps a finding about one grant from covering the role's
    other policies.
    """
    node = grantee.node
    return node.try_find_child("DefaultPolicy") or node.try_find_child("Policy") or grantee


def grant_scope(grantee: object) -> IConstruct | None:
    """:func:`policy_scope` of a grantee that is a construct, created or imported (an imported role is a jsii
    proxy of ``IRole``, not a ``Construct`` subclass, but it has a ``node``); None for a bare principal such as
    ``iam.AccountRootPrincipal()``, which has no place to acknowledge on."""
    if getattr(grantee, "node", None) is None:
        return None
    return policy_scope(grantee)  # type: ignore[arg-type]


ROLE_POLICY_REASON = (
    "CDK grants write this role's least-privilege statements into one AWS::IAM::Policy that is attached to this "
    "role only and created and deleted with it; a customer managed policy would be a separately versioned, "
    "reusable object holding the same statements, which nothing else should reuse."
)


def acknowledge_role_policy(policy: IConstruct) -> None:
    """Acknowledge NIST 800-53 R5 IAMNoInlinePolicy on one role's own policy (a grant's ``DefaultPolicy`` or an
    ``iam.Policy`` attached to that one role)."""
    acknowledge(policy, "IAMNoInlinePolicy", ROLE_POLICY_REASON, pack=NIST_800_53_R5)
