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

from constructs_lib.workflow.request import MLFLOW_ARN
from training.contract.hardware import (
    DEFAULT_INSTANCE_TYPE,
    GPU_INSTANCE_TYPES,
    PRECISIONS,
    instance_types_supporting,
)
from training.contract.settings_table import HYPERPARAMETERS_BY_NAME
from training.request.rules import (
    DEFAULT_MAX_KEEP_ALIVE_SECONDS,
    RequestRules,
    parse_data_sources,
)

_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$")
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:([a-z0-9-]+):\d{12}:key/[0-9a-f-]{36}$")
_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")
_ACCOUNT = re.compile(r"^\d{12}$")
_EVENT_BUS_NAME = re.compile(r"^[A-Za-z0-9._\-/]{1,256}$")
_JOB_NAME_PREFIX = re.compile(r"^(?=.{1,26}$)[A-Za-z0-9](-*[A-Za-z0-9])*$")
"""Fits ``<prefix>-<UUID>`` in SageMaker's 63-character job name, and ends in a letter or digit (the dashboard's
search term)."""
_COMPUTE_TYPES = {
    "small": codebuild.ComputeType.SMALL,
    "medium": codebuild.ComputeType.MEDIUM,
    "large": codebuild.ComputeType.LARGE,
    "x_large": codebuild.ComputeType.X_LARGE,
    "2x_large": codebuild.ComputeType.X2_LARGE,
}


@dataclass(frozen=True)
class ContextKey:
    """One ``cdk.json`` context key: its default (None: not set, see ``shown_default``), what it allows and what it
    does. ``kind`` bool, int (``low`` to ``high``; ``high`` may be a function, for a limit read from botocore),
    choice (``choices``) or text (``allowed`` says what; checked by the code of :class:`StackSettings`)."""

    name: str
    kind: str
    default: Any
    description: str
    low: int = 0
    high: int | Callable[[], int] = 0
    choices: tuple[str, ...] = ()
    allowed: str = ""
    shown_default: str | None = None

    def high_value(self) -> int:
        return self.high() if callable(self.high) else self.high

    def allowed_text(self) -> str:
        """What the key allows, in words (the reference page's column)."""
        if self.kind == "bool":
            return "true, false"
        if self.kind == "int":
            return f"integer {self.low} to {self.high_value():,}"
        if self.kind == "choice":
            return ", ".join(self.choices)
        return self.allowed


def _keep_alive_ceiling() -> int:
    """SageMaker's largest ``KeepAlivePeriodInSeconds``, from botocore's service model."""
    return int(RequestRules().sagemaker()["KeepAlivePeriodInSeconds"]["max"])


_JOB_NAME_PREFIX_TEXT = "1 to 26 of a-z, A-Z, 0-9 and '-', starting and ending with a letter or digit"

CONTEXT: tuple[ContextKey, ...] = (
    ContextKey(
        "stackName",
        "text",
        "BlackwellTraining",
        "CloudFormation stack name (the CLI finds the stack by it).",
        allowed=f"matches {_STACK_NAME.pattern}",
    ),
    ContextKey(
        "region",
        "text",
        None,
        "Target region (this repository's cdk.json sets us-west-2). Needs P6-B200 capacity for SageMaker training.",
        allowed="an AWS region name such as us-west-2",
        shown_default="the CDK CLI's `CDK_DEFAULT_REGION`",
    ),
    ContextKey(
        "removalPolicy",
        "choice",
        "retain",
        "retain keeps bucket, repository, KMS key and log groups (and their data) when the stack is deleted; "
        "destroy deletes them and empties bucket and repository (test accounts only). See "
        "[Clean-up](deploy.md#clean-up).",
        choices=("retain", "destroy"),
    ),
    ContextKey(
        "useKms",
        "bool",
        False,
        "Create a customer managed KMS key (rotation on) for bucket and repository too (the stack always has one "
        "key, see [What gets created](deploy.md#what-gets-created)). kmsKeyArn implies it.",
    ),
    ContextKey(
        "kmsKeyArn",
        "text",
        None,
        "Use this existing key instead (same region as the stack; with useKms true or unset).",
        allowed="a KMS key ARN arn:aws:kms:<region>:<account>:key/<uuid>",
    ),
    ContextKey(
        "vpcId",
        "text",
        None,
        "Run training jobs in this VPC's private subnets (looked up at synth time: needs credentials).",
        allowed="vpc-0123456789abcdef0",
    ),
    ContextKey(
        "buildInVpc",
        "bool",
        False,
        "Run the image build and its deploy-time functions in vpcId's private subnets too (they need a NAT "
        "gateway or VPC endpoints for ECR, S3, CloudWatch Logs, CodeBuild). Needs vpcId.",
    ),
    ContextKey(
        "buildComputeType",
        "choice",
        None,
        "CodeBuild compute type of the image build (more cores compile Transformer Engine faster).",
        choices=tuple(_COMPUTE_TYPES),
        shown_default="`large` (the construct's default)",
    ),
    ContextKey(
        "buildTimeoutMinutes",
        "int",
        None,
        "CodeBuild build timeout (the deployment itself waits at most 60 minutes).",
        low=5,
        high=2160,
        shown_default="120 (the construct's default)",
    ),
    ContextKey(
        "baseImageAccount",
        "text",
        None,
        "The account of the region's AWS Deep Learning Containers registry, needed where CDK does not know it "
        "(e.g. af-south-1, ca-west-1: synthesis stops with a message naming it).",
        allowed="12 digits",
        shown_default="CDK's table of DLC accounts",
    ),
    ContextKey(
        "maxInstanceCount", "int", 4, "The largest instance_count an execution may ask for.", low=1, high=64
    ),
    ContextKey(
        "maxCapacityRetries",
        "int",
        3,
        "How many times a job that failed with CapacityError is relaunched (from the same checkpoints).",
        low=0,
        high=20,
    ),
    ContextKey(
        "capacityRetryWaitMinutes",
        "int",
        10,
        "The wait before a capacity relaunch.",
        low=1,
        high=1440,
    ),
    ContextKey(
        "workflowTimeoutHours",
        "int",
        168,
        "The state machine's timeout: bounds an execution with all its relaunches, and max_runtime_seconds.",
        low=1,
        high=8760,
    ),
    ContextKey(
        "defaultInstanceType",
        "choice",
        DEFAULT_INSTANCE_TYPE,
        "The instance_type of an execution that sets none.",
        choices=tuple(GPU_INSTANCE_TYPES),
    ),
    ContextKey(
        "defaultPrecision",
        "choice",
        HYPERPARAMETERS_BY_NAME["precision"].default,
        "The precision of an execution that sets none (it must run on defaultInstanceType's GPUs).",
        choices=PRECISIONS,
    ),
    ContextKey(
        "defaultJobNamePrefix",
        "text",
        "blackwell-training",
        "The job_name_prefix of an execution that sets none, and what the dashboard searches job names by: one "
        "per deployment in an account and region keeps their dashboards apart.",
        allowed=_JOB_NAME_PREFIX_TEXT,
    ),
    ContextKey(
        "notifications",
        "bool",
        True,
        "An encrypted SNS topic (stack output NotificationTopicArn) told of every execution that ends.",
    ),
    ContextKey(
        "networkIsolation",
        "bool",
        False,
        "Start the training jobs with EnableNetworkIsolation (no network from the container; SageMaker still "
        "moves data, checkpoints and output); evaluation jobs always have it. Not with remoteDebug or "
        "mlflowTrackingServerArn.",
    ),
    ContextKey(
        "workflowTrigger",
        "bool",
        False,
        "An EventBridge rule that starts an execution per matching event (the event's detail is the input).",
    ),
    ContextKey(
        "eventBusName",
        "text",
        None,
        "The event bus of the trigger rule (needs workflowTrigger).",
        allowed=f"matches {_EVENT_BUS_NAME.pattern}",
        shown_default="the default bus",
    ),
    ContextKey(
        "triggerSource",
        "text",
        "blackwell-training",
        "The event source the trigger rule matches (changed only with workflowTrigger).",
        allowed="1 to 256 characters",
    ),
    ContextKey(
        "triggerDetailType",
        "text",
        "Start training job",
        "The event detail-type the trigger rule matches (changed only with workflowTrigger).",
        allowed="1 to 256 characters",
    ),
    ContextKey(
        "dataSources",
        "text",
        ["data/"],
        "Where an execution's data may come from: its train_data_uri, init_from and evaluate.task_data_uri must "
        "each be under one of these; the jobs' role may read exactly these.",
        allowed="a JSON list of s3://<bucket>/<prefix>/ URIs or key prefixes of the checkpoint bucket, each ending "
        "in /",
    ),
    ContextKey(
        "dashboard",
        "bool",
        True,
        "A CloudWatch dashboard of the workflow (stack output DashboardUrl).",
    ),
    ContextKey(
        "dashboardJobNamePrefixes",
        "text",
        [],
        "Further job_name_prefix values whose executions' jobs the dashboard shows too (needs dashboard).",
        allowed=f"a JSON list (or a,b with -c) of at most 9, each {_JOB_NAME_PREFIX_TEXT}",
    ),
    ContextKey(
        "mlflowTrackingServerArn",
        "text",
        None,
        "A SageMaker managed MLflow tracking server (or MLflow app) the training jobs log their settings and "
        "metrics to (not with networkIsolation); evaluation jobs, always network-isolated, log nothing there.",
        allowed="arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name> (or mlflow-app/<name>)",
    ),
    ContextKey(
        "maxKeepAliveSeconds",
        "int",
        DEFAULT_MAX_KEEP_ALIVE_SECONDS,
        "The largest keep_alive_seconds (warm pool) an execution may ask for; 0 turns warm pools off. The upper "
        "limit is SageMaker's, read from botocore.",
        low=0,
        high=_keep_alive_ceiling,
    ),
    ContextKey(
        "remoteDebug",
        "bool",
        False,
        "Let executions ask for remote_debug: grants the execution role exactly the four ssmmessages channel "
        "actions (nothing when false). Not with networkIsolation.",
    ),
)
"""THE table of known keys: the unknown-key check, its suggestions, the defaults and the int, bool and choice
checks are read from it, and so is the reference page (``make docs``)."""

CONTEXT_BY_NAME = {key.name: key for key in CONTEXT}
CONTEXT_KEYS = tuple(CONTEXT_BY_NAME)
DEFAULTS: dict[str, Any] = {key.name: key.default for key in CONTEXT}


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
