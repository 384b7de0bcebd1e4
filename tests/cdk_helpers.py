"""Synthesis helpers shared by the construct and workflow tests.

``synth_with_nag`` runs the real cdk-nag packs (AwsSolutions, NIST 800-53 R5, Serverless) the way ``app.py`` does
and returns what they found (violations that were not acknowledged), read from CDK's ``validation-report.json``.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk import assertions
from cdk_nag import NagPack

from constructs_lib._shared.nag import nag_packs

DEFAULT_ENV = cdk.Environment(account="123456789012", region="us-west-2")


@dataclass(frozen=True)
class NagResult:
    """Unacknowledged findings of every pack: (rule with evidence, construct path)."""

    violations: tuple[tuple[str, str], ...]
    templates: dict[str, dict[str, Any]]

    def rules(self) -> set[str]:
        return {rule for rule, _ in self.violations}


def synth_with_nag(build: Callable[[cdk.App], None], packs: list[NagPack] | None = None) -> NagResult:
    """Build an app with ``build(app)``, register ``packs`` (default: the app's, ``nag_packs()``), synthesize,
    and collect findings."""
    outdir = tempfile.mkdtemp(prefix="nag-")
    app = cdk.App(outdir=outdir)
    build(app)
    cdk.Validations.of(app).add_plugins(*(packs if packs is not None else nag_packs()))
    try:
        app.synth()
    except Exception as error:  # jsii raises a generic error whose text says "Validation failed"
        if "ValidationFailed" not in str(error) and "Validation failed" not in str(error):
            raise
    report_path = Path(outdir) / "validation-report.json"
    violations: list[tuple[str, str]] = []
    if report_path.exists():
        report = json.loads(report_path.read_text())
        for plugin in report["pluginReports"]:
            for violation in plugin["violations"]:
                for construct in violation["violatingConstructs"]:
                    violations.append((violation["ruleName"], construct["constructPath"]))
    templates = {p.name: json.loads(p.read_text()) for p in Path(outdir).glob("*.template.json")}
    return NagResult(tuple(violations), templates)


def template_of(
    build: Callable[[cdk.Stack], None], env: cdk.Environment = DEFAULT_ENV
) -> assertions.Template:
    """A Template of one fresh stack built by ``build(stack)`` (no cdk-nag)."""
    app = cdk.App()
    stack = cdk.Stack(app, "Test", env=env)
    build(stack)
    return assertions.Template.from_stack(stack)


def statements(template: assertions.Template) -> list[dict[str, Any]]:
    """Every statement of every IAM policy (inline AWS::IAM::Policy and role inline policies) in the template."""
    found: list[dict[str, Any]] = []
    for resource in template.find_resources("AWS::IAM::Policy").values():
        found.extend(resource["Properties"]["PolicyDocument"]["Statement"])
    for resource in template.find_resources("AWS::IAM::Role").values():
        for policy in resource["Properties"].get("Policies", []):
            found.extend(policy["PolicyDocument"]["Statement"])
    return found


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# ---- state machine ARNs in IAM ---------------------------------------------------------------------------------


def policy_statements(template: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(logical id, where, statement)`` of every policy statement anywhere in a template: role trust and
    inline policies, IAM policies, key policies, topic and bucket policies (any ``Statement`` list under a
    resource's properties)."""

    def walk(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if isinstance(node, dict):
            found = node.get("Statement")
            if (
                isinstance(found, list)
                and found
                and all(isinstance(s, dict) and "Effect" in s for s in found)
            ):
                for index, statement in enumerate(found):
                    yield f"{where}/Statement[{index}]", statement
                return
            for key, value in node.items():
                yield from walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from walk(value, f"{where}[{index}]")

    for logical, resource in template["Resources"].items():
        for where, statement in walk(resource.get("Properties", {}), ""):
            yield logical, where, statement


def _rendered(value: Any) -> str:
    """A template value as one string: ``Ref`` as ``<Name>``, ``Fn::GetAtt`` as ``<Name.Attr>``, joins joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((function, argument),) = value.items()
        if function == "Ref":
            return f"<{argument}>"
        if function == "Fn::GetAtt":
            return f"<{argument[0]}.{argument[1]}>"
        if function == "Fn::Join":
            return argument[0].join(_rendered(part) for part in argument[1])
    return json.dumps(value, sort_keys=True)


def state_machine_references(template: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(logical id, where, value)`` of every Resource or Condition value of a policy statement that names a
    state machine: a ``Ref``/``GetAtt`` of an ``AWS::StepFunctions::StateMachine``, or an ARN with
    ``:stateMachine:`` or ``:execution:`` in it (a pattern or an empty name included)."""
    machines = {
        k for k, r in template["Resources"].items() if r["Type"] == "AWS::StepFunctions::StateMachine"
    }
    own = {f"<{m}>" for m in machines} | {f"<{m}.Arn>" for m in machines}
    found = []
    for logical, where, statement in policy_statements(template):
        values = [
            ("Resource", v) for key in ("Resource", "NotResource") for v in as_list(statement.get(key, []))
        ]
        for operator, keys in statement.get("Condition", {}).items():
            values += [
                (f"Condition/{operator}/{key}", v) for key, given in keys.items() for v in as_list(given)
            ]
        for what, value in values:
            text = _rendered(value)
            if text in own or ":stateMachine:" in text or ":execution:" in text:
                found.append((logical, f"{where}/{what}", text))
    return found


def names_only_this_state_machine(template: dict[str, Any], machine: str) -> Callable[[str], bool]:
    """A test of a rendered value: does it name exactly the state machine ``machine`` (its logical ID) of
    ``template``: its ``Ref``/``GetAtt Arn``, or ``arn:<partition>:states:<region>:<account>:stateMachine:<its
    StateMachineName>`` (optionally with ``:<version or alias>`` as ``:*``, or an ``:execution:<name>:`` ARN)?
    Not an empty name, another name, nor a pattern over names. Without a ``StateMachineName`` (CloudFormation
    then makes one at deployment) no ARN written in the template can name it: only the references do."""
    given = template["Resources"][machine]["Properties"].get("StateMachineName")
    if given is None:
        return lambda text: text in (f"<{machine}>", f"<{machine}.Arn>")
    name = _rendered(given)
    prefix = r"^arn:(?:aws[a-z-]*|<AWS::Partition>):states:(?:[a-z0-9-]+|<AWS::Region>):(?:\d{12}|<AWS::AccountId>):"
    arn = re.compile(prefix + r"stateMachine:" + re.escape(name) + r"(?::\*)?$")
    executions = re.compile(prefix + r"execution:" + re.escape(name) + r":[^:*?]*\*?$")
    return lambda text: (
        text in (f"<{machine}>", f"<{machine}.Arn>") or bool(arn.match(text) or executions.match(text))
    )
