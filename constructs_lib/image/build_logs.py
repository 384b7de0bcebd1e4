"""The training-image build's key and log groups: the key (given or created, rotation on) that encrypts the
build's artifacts and every log group here, the build's log group (given or created) and the deploy-time
handlers' log group."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from constructs_lib._shared.log_keys import allow_logs_to_use_key


@dataclass(frozen=True)
class BuildLogs:
    """What :func:`key_and_logs` built or took."""

    key: kms.IKey
    """Encrypts the build's artifacts and the log groups."""
    build_logs: logs.ILogGroup
    """The CodeBuild project's log group."""
    handler_logs: logs.LogGroup
    """The deploy-time functions' (and the Provider framework's) log group."""


def key_and_logs(
    scope: Construct,
    *,
    encryption_key: kms.IKey | None,
    log_group: logs.ILogGroup | None,
    retention: logs.RetentionDays,
    removal_policy: RemovalPolicy,
) -> BuildLogs:
    """The key (``encryption_key``, or ``Key`` created in ``scope``), the build's log group (``log_group``, or
    ``BuildLogs`` created) and the handlers' log group ``DeployLogs``; the created ones keep ``retention`` and
    ``removal_policy``. The key's policy lets CloudWatch Logs use it for this account's log groups (a no-op on an
    imported key)."""
    if encryption_key is None:
        encryption_key = kms.Key(
            scope,
            "Key",
            description="Encrypts the training-image build's artifacts and logs",
            enable_key_rotation=True,
            removal_policy=removal_policy,
        )
    # Let CloudWatch Logs use the key for this account's log groups.
    allow_logs_to_use_key(
        encryption_key, Stack.of(scope), sid="CloudWatchLogsInThisAccount", log_group_name="*"
    )
    build_logs = log_group or logs.LogGroup(
        scope,
        "BuildLogs",
        retention=retention,
        encryption_key=encryption_key,
        removal_policy=removal_policy,
    )
    handler_logs = logs.LogGroup(
        scope,
        "DeployLogs",
        retention=retention,
        encryption_key=encryption_key,
        removal_policy=removal_policy,
    )
    return BuildLogs(key=encryption_key, build_logs=build_logs, handler_logs=handler_logs)
