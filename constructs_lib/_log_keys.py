"""One key-policy statement, shared by every construct that encrypts a log group with a customer key: CloudWatch
Logs of this region may use the key, only in the encryption context of the named log group(s).

The actions are named (no ``kms:*`` wildcards): the ones CloudWatch Logs calls for an encrypted log group.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Aws, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms

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
