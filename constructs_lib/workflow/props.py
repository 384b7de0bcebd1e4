"""The checks of ``TrainingWorkflow``'s props that are more than one line: each takes a prop's value and returns
the checked value, or raises a ``ValueError`` that names the prop, what is allowed and what was given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aws_cdk import Duration, Names, RemovalPolicy, Token
from aws_cdk import aws_iam as iam
from constructs import IConstruct

from constructs_lib.identity.execution_role import SageMakerExecutionRole
from constructs_lib.workflow.request import MLFLOW_ARN

RUN_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
STATE_MACHINE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
"""Step Functions' state machine names with logging on, as the workflow's always is (CreateStateMachine ``name``:
"To enable logging with CloudWatch Logs, the name should only contain 0-9, A-Z, a-z, - and _"; aws-cdk-lib's
``validateStateMachineName`` also lets ``+!@.()=`` and ``'`` through)."""


def state_machine_name_of(given: str | None, workflow: IConstruct) -> str:
    """The state machine's physical name: ``given``, or one made from ``workflow``'s construct path (unique per
    stack and path, at most 80 characters, stable across deployments). A name known at synth lets the IAM
    conditions name the exact state machine ARN without a reference, which would be a dependency cycle (role,
    state machine, role): CDK's key condition (``kms:EncryptionContext:aws:states:stateMachineArn``) and the
    role's trust (``aws:SourceArn``). A token (a CloudFormation parameter) is taken as given."""
    if given is None:
        return Names.unique_resource_name(workflow, max_length=80)
    if not isinstance(given, str) or not (Token.is_unresolved(given) or STATE_MACHINE_NAME.match(given)):
        raise ValueError(
            "TrainingWorkflow: state_machine_name must be 1 to 80 of letters, digits, '-' and '_' (the workflow "
            f"logs its executions to CloudWatch Logs, which Step Functions allows only for such names); got {given!r}"
        )
    return given


def checked_remote_debug(remote_debug: object, network_isolation: bool) -> bool:
    if not isinstance(remote_debug, bool):
        raise ValueError(f"TrainingWorkflow: remote_debug must be True or False; got {remote_debug!r}")
    if remote_debug and network_isolation:
        raise ValueError(
            "TrainingWorkflow: remote_debug needs the network (an SSM session into the container), which "
            "network_isolation takes away; turn one of them off"
        )
    return remote_debug


def run_segment_of(given: str | None, path: str) -> str:
    segment = given if given is not None else re.sub(r"[^A-Za-z0-9_.-]", "-", path)
    if not RUN_SEGMENT.match(segment):
        raise ValueError(
            "TrainingWorkflow: run_segment must be 1 to 128 of letters, digits, _ . and -, starting with a "
            f"letter or digit; got {segment!r}"
        )
    return segment


def removal_and_isolation(removal_policy: RemovalPolicy | None, network_isolation: object) -> RemovalPolicy:
    """The checked ``removal_policy`` (default RETAIN); refuses a ``network_isolation`` that is not a bool."""
    policy = removal_policy or RemovalPolicy.RETAIN
    if policy not in (RemovalPolicy.RETAIN, RemovalPolicy.DESTROY):
        raise ValueError(f"TrainingWorkflow: removal_policy must be RETAIN or DESTROY; got {policy}")
    if not isinstance(network_isolation, bool):
        raise ValueError(
            f"TrainingWorkflow: network_isolation must be True or False; got {network_isolation!r}"
        )
    return policy


def role_of(execution_role: SageMakerExecutionRole | iam.IRole) -> iam.IRole:
    if isinstance(execution_role, SageMakerExecutionRole):
        return execution_role.role
    if hasattr(execution_role, "role_arn") and hasattr(execution_role, "grant_pass_role"):
        return execution_role
    raise ValueError("TrainingWorkflow: execution_role must be a SageMakerExecutionRole or an iam.IRole")


def key_prefix(name: str, value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9!_.()-]+(/[A-Za-z0-9!_.()-]+)*/", value or ""):
        raise ValueError(
            f"TrainingWorkflow: {name} must be a relative S3 key prefix ending in '/' (letters, digits, "
            f"!_.()- and '/'), such as 'checkpoints/'; got {value!r}"
        )
    return value


def int_in(name: str, value: int | None, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"TrainingWorkflow: {name} must be an integer in [{low}, {high}]; got {value!r}")
    return value


def seconds_in(name: str, value: Duration | None, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if not isinstance(value, Duration):
        raise ValueError(f"TrainingWorkflow: {name} must be a Duration; got {value!r}")
    seconds = int(value.to_seconds())
    if not low <= seconds <= high:
        raise ValueError(f"TrainingWorkflow: {name} must be between {low} and {high} seconds; got {seconds}")
    return seconds


def mlflow_arn(arn: str | None, network_isolation: bool) -> str | None:
    if arn is None:
        return None
    if not isinstance(arn, str) or not MLFLOW_ARN.match(arn):
        raise ValueError(
            "TrainingWorkflow: mlflow_tracking_server_arn must be a SageMaker MLflow tracking server or app ARN "
            f"(arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>); got {arn!r}"
        )
    if network_isolation:
        raise ValueError(
            "TrainingWorkflow: mlflow_tracking_server_arn needs network access from the training container, "
            "which network_isolation=True removes; turn one of them off"
        )
    return arn


def dashboard_prefixes(prefixes: Sequence[str], dashboard: bool) -> tuple[str, ...]:
    if isinstance(prefixes, str) or not all(isinstance(p, str) for p in prefixes):
        raise ValueError(
            f"TrainingWorkflow: dashboard_job_name_prefixes must be a list of strings; got {prefixes!r}"
        )
    if prefixes and not dashboard:
        raise ValueError("TrainingWorkflow: dashboard_job_name_prefixes needs dashboard=True")
    return tuple(prefixes)
