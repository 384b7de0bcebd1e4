"""App settings from ``cdk.json`` context, validated before any resource is built.

Every key is optional; a key set to null or "" takes its default. An unknown key (with the closest known key
suggested), an invalid value, or two keys that contradict each other raise ``ConfigError`` naming the context key
and what is allowed; ``app.py`` prints it as one line and exits non-zero.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_codebuild as codebuild
from constructs import Node

from constructs_lib.context_keys import (
    _ACCOUNT,
    _COMPUTE_TYPES,
    _EVENT_BUS_NAME,
    _JOB_NAME_PREFIX,
    _JOB_NAME_PREFIX_TEXT,
    _KMS_KEY_ARN,
    _REGION,
    _STACK_NAME,
    _VPC_ID,
    CONTEXT_BY_NAME,
    CONTEXT_KEYS,
    DEFAULTS,
)
from constructs_lib.workflow.request import MLFLOW_ARN
from training.contract.hardware import GPU_INSTANCE_TYPES, instance_types_supporting
from training.request.rules import parse_data_sources


class ConfigError(ValueError):
    """A wrong ``cdk.json`` context setting; the message is one line that names the key and what is allowed."""


def check_known_keys(keys: Iterable[str]) -> None:
    """Refuse a context key that is neither one of ``CONTEXT_KEYS`` nor CDK's own, suggesting the closest known key.

    CDK's own keys are left alone: feature flags (``@aws-cdk/...``), the CLI's ``aws:cdk:...`` and the context
    lookups kept in ``cdk.context.json`` (``vpc-provider:account=...``) all contain ``:`` or start with ``@``.
    """
    by_lower = {known.lower(): known for known in CONTEXT_KEYS}
    for key in sorted(keys):
        if key.startswith("@") or ":" in key or key in CONTEXT_KEYS:
            continue
        close = by_lower.get(key.lower()) or next(
            iter(difflib.get_close_matches(key, CONTEXT_KEYS, n=1, cutoff=0.6)), None
        )
        hint = f"did you mean {close}?" if close else f"known keys: {', '.join(CONTEXT_KEYS)}"
        raise ConfigError(f"context {key}: unknown key; {hint}")


def check_vpc_lookup(vpc_id: str | None, account: str | None, region: str | None) -> None:
    """Refuse a ``vpcId`` that cannot be looked up: ``Vpc.from_lookup`` reads the VPC from the account at synth
    time, so the synth needs both the account (the CDK CLI sets ``CDK_DEFAULT_ACCOUNT`` from AWS credentials) and
    the region (context ``region`` or ``CDK_DEFAULT_REGION``). Without them CDK itself fails with a
    ``StackAccountRegionNotSpecified`` traceback that names neither ``vpcId`` nor what is missing."""
    if vpc_id is None or (account and region):
        return
    missing = " and ".join(
        what
        for what, given in (
            ("no account (CDK_DEFAULT_ACCOUNT, which the CDK CLI sets from your AWS credentials)", account),
            ("no region (context region or CDK_DEFAULT_REGION)", region),
        )
        if not given
    )
    raise ConfigError(
        f"context vpcId: looking up {vpc_id} needs AWS credentials and an explicit account and region, and this "
        f"synth has {missing}; run cdk with credentials for the VPC's account (or set CDK_DEFAULT_ACCOUNT when "
        "cdk.context.json already holds the lookup), or remove vpcId"
    )


@dataclass(frozen=True)
class StackSettings:
    stack_name: str = DEFAULTS["stackName"]
    region: str | None = None
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    use_kms: bool = False
    kms_key_arn: str | None = None
    vpc_id: str | None = None
    build_in_vpc: bool = False
    build_compute_type: codebuild.ComputeType | None = None
    build_timeout_minutes: int | None = None
    base_image_account: str | None = None
    workflow: WorkflowSettings = field(default_factory=lambda: WorkflowSettings())

    @classmethod
    def from_context(cls, node: Node, *, default_region: str | None = None) -> StackSettings:
        """Settings from ``node``'s context. ``default_region`` (the CLI's ``CDK_DEFAULT_REGION``) is the region
        a ``kmsKeyArn`` must be in when ``region`` is not set."""
        check_known_keys(node.get_all_context())

        def get(key: str) -> Any:
            value = node.try_get_context(key)
            return None if value in (None, "") else value

        stack_name = _match(
            "stackName",
            get("stackName") or DEFAULTS["stackName"],
            _STACK_NAME,
            f"match {_STACK_NAME.pattern}",
        )
        region = _match("region", get("region"), _REGION, "be an AWS region name such as us-west-2")
        removal = _checked("removalPolicy", get, lower=True)
        use_kms = _bool("useKms", get("useKms"), None)  # None (unset) and false differ: see _check_key
        kms_key_arn = _match(
            "kmsKeyArn",
            get("kmsKeyArn"),
            _KMS_KEY_ARN,
            "be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<uuid>)",
        )
        if kms_key_arn is not None:
            _check_key(kms_key_arn, use_kms, region or default_region)
        vpc_id = _match("vpcId", get("vpcId"), _VPC_ID, "look like vpc-0123456789abcdef0")
        build_in_vpc = _checked("buildInVpc", get)
        if build_in_vpc and vpc_id is None:
            raise ConfigError(
                "context buildInVpc: needs vpcId (the VPC to build in); set vpcId or remove buildInVpc"
            )
        compute = _checked("buildComputeType", get, lower=True)
        build_timeout = _checked("buildTimeoutMinutes", get)
        base_account = get("baseImageAccount")
        if base_account is not None:
            base_account = _match(
                "baseImageAccount",
                str(base_account),
                _ACCOUNT,
                "be the 12-digit account of the region's AWS Deep Learning Containers registry",
            )
        return cls(
            stack_name=stack_name,
            region=region,
            removal_policy=RemovalPolicy.DESTROY if removal == "destroy" else RemovalPolicy.RETAIN,
            use_kms=bool(use_kms) or kms_key_arn is not None,
            kms_key_arn=kms_key_arn,
            vpc_id=vpc_id,
            build_in_vpc=build_in_vpc,
            build_compute_type=_COMPUTE_TYPES[compute] if compute is not None else None,
            build_timeout_minutes=build_timeout,
            base_image_account=base_account,
            workflow=WorkflowSettings.from_context(get),
        )

    def stack_kwargs(self) -> dict[str, Any]:
        return {
            "removal_policy": self.removal_policy,
            "use_kms": self.use_kms,
            "kms_key_arn": self.kms_key_arn,
            "vpc_id": self.vpc_id,
            "build_in_vpc": self.build_in_vpc,
            "build_compute_type": self.build_compute_type,
            "build_timeout_minutes": self.build_timeout_minutes,
            "base_image_account": self.base_image_account,
            "workflow": self.workflow,
        }


@dataclass(frozen=True)
class WorkflowSettings:
    """Settings of the training workflow (``TrainingWorkflow``) from context; each key's row of :data:`CONTEXT`
    (and docs/reference.md) says what it does."""

    max_instance_count: int = DEFAULTS["maxInstanceCount"]
    max_capacity_retries: int = DEFAULTS["maxCapacityRetries"]
    capacity_retry_wait_minutes: int = DEFAULTS["capacityRetryWaitMinutes"]
    timeout_hours: int = DEFAULTS["workflowTimeoutHours"]
    default_instance_type: str = DEFAULTS["defaultInstanceType"]
    default_precision: str = DEFAULTS["defaultPrecision"]
    default_job_name_prefix: str = DEFAULTS["defaultJobNamePrefix"]
    """The ``job_name_prefix`` of an execution that sets none (``defaultJobNamePrefix``), which the dashboard searches
    by: give each deployment in an account and region its own to keep their dashboards apart."""
    notifications: bool = DEFAULTS["notifications"]
    network_isolation: bool = DEFAULTS["networkIsolation"]
    trigger: bool = DEFAULTS["workflowTrigger"]
    event_bus_name: str | None = None
    trigger_source: str = DEFAULTS["triggerSource"]
    trigger_detail_type: str = DEFAULTS["triggerDetailType"]
    data_sources: tuple[str, ...] = tuple(DEFAULTS["dataSources"])
    """Where an execution's ``train_data_uri``, ``init_from`` and ``evaluate.task_data_uri`` may point
    (``dataSources``): ``s3://bucket/prefix/`` URIs or key prefixes of the checkpoint bucket; the jobs' role may read
    exactly these."""
    dashboard: bool = DEFAULTS["dashboard"]
    """A CloudWatch dashboard of the workflow (``dashboard``; stack output ``DashboardUrl``)."""
    dashboard_job_name_prefixes: tuple[str, ...] = ()
    """Further ``job_name_prefix`` values whose jobs the dashboard shows (``dashboardJobNamePrefixes``, at most 9)."""
    mlflow_tracking_server_arn: str | None = None
    """A SageMaker managed MLflow tracking server the training jobs log to (``mlflowTrackingServerArn``). Default:
    none."""
    max_keep_alive_seconds: int = DEFAULTS["maxKeepAliveSeconds"]
    """The largest ``keep_alive_seconds`` (warm pool) an execution may ask for (``maxKeepAliveSeconds``, 0 to
    SageMaker's maximum from botocore); 0 turns warm pools off."""
    remote_debug: bool = DEFAULTS["remoteDebug"]
    """Let executions ask for ``remote_debug`` (``remoteDebug``): grants the execution role the four
    ``ssmmessages`` actions of an SSM session. Refused together with ``networkIsolation``."""

    @classmethod
    def from_context(cls, get: Callable[[str], Any]) -> WorkflowSettings:
        instance_type = _checked("defaultInstanceType", get)
        precision = _checked("defaultPrecision", get)
        if not GPU_INSTANCE_TYPES[instance_type].supports(precision):
            raise ConfigError(
                f"context defaultPrecision: {precision} cannot run on defaultInstanceType {instance_type}; "
                f"it needs one of {', '.join(instance_types_supporting(precision))}"
            )
        bus = _match("eventBusName", get("eventBusName"), _EVENT_BUS_NAME, f"match {_EVENT_BUS_NAME.pattern}")
        trigger = _checked("workflowTrigger", get)
        if bus is not None and not trigger:
            raise ConfigError(
                "context eventBusName: only used by the trigger rule, which is off; "
                "set workflowTrigger to true or remove eventBusName"
            )
        remote_debug = _checked("remoteDebug", get)
        if remote_debug and _checked("networkIsolation", get):
            raise ConfigError(
                "context remoteDebug: needs the network (an SSM session into the container), which "
                "networkIsolation takes away; set one of them to false"
            )
        dashboard = _checked("dashboard", get)
        prefixes = _prefixes(get("dashboardJobNamePrefixes"))
        if prefixes and not dashboard:
            raise ConfigError(
                "context dashboardJobNamePrefixes: only used by the dashboard, which is off; "
                "set dashboard to true or remove dashboardJobNamePrefixes"
            )
        texts = {}
        for key, default in (
            ("triggerSource", cls.trigger_source),
            ("triggerDetailType", cls.trigger_detail_type),
        ):
            value = get(key) or default
            if not isinstance(value, str) or not 1 <= len(value) <= 256:
                raise ConfigError(f"context {key}: must be a string of 1 to 256 characters; got {value!r}")
            if value != default and not trigger:
                raise ConfigError(
                    f"context {key}: only used by the trigger rule, which is off; "
                    f"set workflowTrigger to true or remove {key}"
                )
            texts[key] = value
        return cls(
            max_instance_count=_checked("maxInstanceCount", get),
            max_capacity_retries=_checked("maxCapacityRetries", get),
            capacity_retry_wait_minutes=_checked("capacityRetryWaitMinutes", get),
            timeout_hours=_checked("workflowTimeoutHours", get),
            default_instance_type=instance_type,
            default_precision=precision,
            default_job_name_prefix=_match(
                "defaultJobNamePrefix",
                get("defaultJobNamePrefix") or cls.default_job_name_prefix,
                _JOB_NAME_PREFIX,
                f"be {_JOB_NAME_PREFIX_TEXT}",
            ),
            notifications=_checked("notifications", get),
            network_isolation=_checked("networkIsolation", get),
            trigger=trigger,
            event_bus_name=bus,
            trigger_source=texts["triggerSource"],
            trigger_detail_type=texts["triggerDetailType"],
            data_sources=parse_data_sources(get("dataSources")),
            dashboard=dashboard,
            dashboard_job_name_prefixes=prefixes,
            mlflow_tracking_server_arn=_mlflow(get),
            max_keep_alive_seconds=_checked("maxKeepAliveSeconds", get),
            remote_debug=remote_debug,
        )


def _prefixes(value: Any) -> tuple[str, ...]:
    """``dashboardJobNamePrefixes``: a JSON list (or, from ``-c``, a comma-separated string) of job name prefixes."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > 9:
        raise ConfigError(
            f"context dashboardJobNamePrefixes: must be a list of at most 9 prefixes; got {value!r}"
        )
    expected = f"be {_JOB_NAME_PREFIX_TEXT}"
    return tuple(_match("dashboardJobNamePrefixes", item, _JOB_NAME_PREFIX, expected) for item in items)


def _mlflow(get: Callable[[str], Any]) -> str | None:
    arn = _match(
        "mlflowTrackingServerArn",
        get("mlflowTrackingServerArn"),
        MLFLOW_ARN,
        "be a SageMaker MLflow tracking server ARN (arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>)",
    )
    if arn is not None and _bool("networkIsolation", get("networkIsolation"), False):
        raise ConfigError(
            "context mlflowTrackingServerArn: the jobs cannot reach MLflow with networkIsolation=true; "
            "set networkIsolation to false or remove mlflowTrackingServerArn"
        )
    return arn


def _checked(key: str, get: Callable[[str], Any], *, lower: bool = False) -> Any:
    """A bool, int or choice key's value (its default when unset), checked by its row of :data:`CONTEXT`."""
    row, value = CONTEXT_BY_NAME[key], get(key)
    if row.kind == "bool":
        return _bool(key, value, row.default)
    if row.kind == "int":
        return _int(key, value, row.default, row.low, row.high_value())
    if value is None:
        return row.default
    return _choice(key, str(value) if lower else value, row.choices, lower=lower)


def _match(key: str, value: Any, pattern: re.Pattern[str], expected: str) -> Any:
    """``value`` when it is None or a string matching ``pattern``; else a ConfigError saying it must ``expected``."""
    if value is not None and (not isinstance(value, str) or not pattern.match(value)):
        raise ConfigError(f"context {key}: must {expected}; got {value!r}")
    return value


def _choice(key: str, value: Any, choices: Sequence[str], *, lower: bool = False) -> str:
    """``value`` (lower-cased with ``lower``) when it is one of ``choices``; else a ConfigError listing them."""
    text = str(value).lower() if lower else value
    if text not in choices:
        allowed = " or ".join(choices) if len(choices) == 2 else f"one of {', '.join(choices)}"
        raise ConfigError(f"context {key}: must be {allowed}; got {value!r}")
    return text


def _int(key: str, value: Any, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    try:
        number = int(str(value)) if not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise ConfigError(f"context {key}: must be an integer in [{low}, {high}]; got {value!r}")
    return number


def _check_key(arn: str, use_kms: bool | None, region: str | None) -> None:
    """Refuse a ``kmsKeyArn`` that contradicts ``useKms=false`` or is in another region than the stack."""
    if use_kms is False:
        raise ConfigError(
            "context kmsKeyArn: given with useKms=false; set useKms to true (or remove it) to use this key, "
            "or remove kmsKeyArn"
        )
    match = _KMS_KEY_ARN.match(arn)
    key_region = match.group(1) if match else None
    if region is not None and key_region != region:
        raise ConfigError(
            f"context kmsKeyArn: the key is in {key_region} but the stack deploys to {region}; "
            "KMS keys are regional: use a key of the stack's region"
        )


def _bool(key: str, value: Any, default: Any) -> Any:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"context {key}: must be true or false; got {value!r}")
