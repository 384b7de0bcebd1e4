"""Log groups encrypted with a customer key, for every construct that has one: the one key-policy statement that
lets CloudWatch Logs of this region use the key, only in the encryption context of the named log group(s), and a
log group built that way (:func:`keyed_log_group`).

The actions are named (no ``kms:*`` wildcards): the ones CloudWatch Logs calls for an encrypted log group.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Aws, Names, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from constructs_lib._shared.nag import NIST_800_53_R5, acknowledge

LOGS_KEY_ACTIONS = (
    "kms:Encrypt",
    "kms:Decrypt",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
    "kms:GenerateDataKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:DescribeKey",
)


def allow_logs_to_use_key(key: kms.IKey, stack: Stack, *, sid: str, log_group_name: str) -> None:
    """Add the statement to ``key``'s policy (a no-op on an imported key, whose own policy must allow it).
    ``log_group_name`` is one group's name (``ArnEquals``) or a pattern with ``*`` (``ArnLike``)."""
    operator = "ArnLike" if "*" in log_group_name else "ArnEquals"
    key.add_to_resource_policy(
        iam.PolicyStatement(
            sid=sid,
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.{Aws.URL_SUFFIX}")],
            actions=list(LOGS_KEY_ACTIONS),
            resources=["*"],
            conditions={
                operator: {
                    "kms:EncryptionContext:aws:logs:arn": stack.format_arn(
                        service="logs",
                        resource="log-group",
                        resource_name=log_group_name,
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                }
            },
        )
    )


def keyed_log_group(
    scope: Construct,
    key: kms.IKey | None,
    retention: logs.RetentionDays,
    policy: RemovalPolicy,
    name_prefix: str,
) -> logs.LogGroup:
    """``scope``'s log group ``Logs``. With ``key``: named ``<name_prefix><unique name>`` and encrypted, and the
    key policy lets CloudWatch Logs use the key for exactly that log group (a no-op on an imported key). Without:
    CloudWatch Logs' own encryption, acknowledged for NIST 800-53 R5."""
    stack = Stack.of(scope)
    name = None
    if key is not None:
        name = name_prefix + Names.unique_resource_name(scope, max_length=200)
        allow_logs_to_use_key(key, stack, sid=f"Logs{Names.unique_id(scope)[-12:]}", log_group_name=name)
    group = logs.LogGroup(
        scope, "Logs", log_group_name=name, retention=retention, encryption_key=key, removal_policy=policy
    )
    if key is None:
        acknowledge(
            group,
            "CloudWatchLogGroupEncrypted",
            "No encryption_key was given: CloudWatch Logs encrypts the log with its own key; pass encryption_key "
            "(the app always does) for a customer managed key.",
            pack=NIST_800_53_R5,
        )
    return group
