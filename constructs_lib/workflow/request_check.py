"""Decide every training request before anything is launched: one plain Python function, also the workflow's Lambda.

Its one job: turn an execution input into either a complete, checked ``CreateTrainingJob`` plan (the merged
settings and the exact ``HyperParameters`` map) or the list of every problem, each one line naming the field, the
value and what is allowed. Three callers share it, so they cannot disagree:

* the ``TrainingWorkflow`` state machine calls :func:`handler` as a Lambda function before ``CreateTrainingJob``;
* the operator CLI calls :func:`validate_request` locally, with the :class:`RequestRules` of the deployment;
* the construct checks its own defaults with it at synth time.

Why a Lambda function and not JSONata states: the checks that matter are the trainer's own rules (every setting of
``training/contract.py``, its parsers and its cross-setting rules), and importing the contract runs exactly those
rules, so a new trainer setting is checked with no edit here. A JSONata copy of them would be a second
implementation to keep in step, could not list S3 to decide ``resume_from`` on its own, and is not evaluated by
moto 5.2.5 (the tests would need a second evaluator). The Lambda asset holds only this module and
``training/contract.py`` (standard library only; ``boto3`` from the Lambda runtime is imported only to list S3).

SageMaker's request constraints (name length and pattern, hyperparameter count and sizes, S3 URI length and
pattern, input modes, training plan ARN pattern, tag and environment counts, patterns and lengths, the warm-pool
keep-alive maximum) are read from botocore's service model by :func:`sagemaker_limits` at synth time and carried in
the rules, so the Lambda needs no botocore of a particular version.

Besides the checked input, the decision carries the per-execution fields of the request (:func:`job_fields`:
``Tags``, ``Environment``, ``InfraCheckConfig``, ``RemoteDebugConfig``) and, before launch, lists S3 once for a
``train_data_uri`` (it must hold an object) and for ``resume_from``.

Nothing here imports ``aws_cdk``.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any

from training.contract import (
    CHECKPOINT_DIR_NAME,
    CHECKPOINT_LOCAL_PATH,
    DEFAULT_INSTANCE_TYPE,
    GPU_INSTANCE_TYPES,
    HYPERPARAMETERS_BY_NAME,
    MLFLOW_EXPERIMENT_ENV,
    MLFLOW_RUN_NAME_ENV,
    MLFLOW_TRACKING_URI_ENV,
    MODEL_DIR,
    PRECISIONS,
    RESUME_CHANNEL,
    SET_ASIDE_SUFFIX,
    TRAIN_CHANNEL,
    ContractError,
    instance_types_supporting,
    normalize_name,
    parse_hyperparameters,
    to_sagemaker_hyperparameters,
)
from training.plan import make_plan, refusal

INVALID_INPUT_ERROR = "InvalidInput"
MAX_RUNTIME_SECONDS_LIMIT = 28 * 24 * 3600
"""SageMaker's ceiling for ``MaxRuntimeInSeconds`` and ``MaxWaitTimeInSeconds`` (28 days)."""
UUID_LENGTH = 36
"""Job names are ``<job_name_prefix>-<UUID>``."""
CHECKPOINT_MARKER = "COMPLETE"
"""The file the trainer writes last into a finished checkpoint (``training/trainer/checkpoint.py``)."""
DATA_INPUT_MODES = ("FastFile", "File")
"""Input modes of the train channel (``Pipe`` is not something the trainer reads)."""
EXECUTION_NAME = re.compile(r"^[A-Za-z0-9_-]+$")

PLATFORM_HYPERPARAMETERS: Mapping[str, str] = MappingProxyType(
    {"checkpoint_dir": CHECKPOINT_LOCAL_PATH, "model_dir": MODEL_DIR}
)
"""Set by the platform: SageMaker syncs only its own paths, so moving them breaks spot resume and model upload."""
TOP_LEVEL_HYPERPARAMETERS = (
    "precision",
    "num_layers",
    "batch_size",
    "seq_length",
    "activation_checkpointing",
)
"""Trainer settings that are top-level input fields (so they are refused inside ``hyperparameters``)."""
DATA_HYPERPARAMETER = "dataset"

DEFAULT_INPUT: Mapping[str, Any] = MappingProxyType(
    {
        "precision": HYPERPARAMETERS_BY_NAME["precision"].default,
        "num_layers": None,
        "batch_size": HYPERPARAMETERS_BY_NAME["batch_size"].default,
        "seq_length": HYPERPARAMETERS_BY_NAME["seq_length"].default,
        "activation_checkpointing": HYPERPARAMETERS_BY_NAME["activation_checkpointing"].default,
        "instance_type": DEFAULT_INSTANCE_TYPE,
        "instance_count": 1,
        "training_plan_arn": None,
        "use_spot": False,
        "max_runtime_seconds": 24 * 3600,
        "max_wait_seconds": None,
        "hyperparameters": {},
        "job_name_prefix": "blackwell-training",
        "train_data_uri": None,
        "train_data_input_mode": "FastFile",
        "resume_from": None,
        "keep_alive_seconds": 0,
        "infra_check": False,
        "tags": {},
        "remote_debug": False,
        "environment": {},
        "ignore_memory_estimate": False,
    }
)
"""Every execution-input field and its value when neither the input nor the workflow's defaults give one."""
INPUT_FIELDS: tuple[str, ...] = tuple(DEFAULT_INPUT)
DEFAULT_MAX_KEEP_ALIVE_SECONDS = 3600
"""The deployment's default ceiling of ``keep_alive_seconds`` (SageMaker's own, from botocore, is 21,600)."""
DECIDE_STATE = "Decide request"
"""The workflow's first state: it invokes :func:`handler` with the rules."""
WORKFLOW_TAG = "training-workflow"
EXECUTION_TAG = "training-workflow-execution"
"""The tags every job gets first: the workflow's construct path and the execution's name."""
ENVIRONMENT_PREFIXES = ("NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "NVTE_", "FI_")
"""Names an execution's ``environment`` may set: NCCL, PyTorch, CUDA, Transformer Engine and libfabric (EFA) knobs."""
PLATFORM_ENVIRONMENT: Mapping[str, str] = MappingProxyType(
    {
        "NVTE_FRAMEWORK": "set by the training image (training/Dockerfile)",
        "CUDA_VISIBLE_DEVICES": "train.sh starts one process per visible GPU; hiding GPUs breaks that count",
    }
)
"""Names under the allowed prefixes that the platform sets itself (refused, with the reason)."""
INSTANCE_STORAGE_TYPES = frozenset(
    {
        "ml.p4d.24xlarge",
        "ml.p4de.24xlarge",
        "ml.p5.4xlarge",
        "ml.p5.48xlarge",
        "ml.p5e.48xlarge",
        "ml.p5en.48xlarge",
        "ml.p6-b200.48xlarge",
        "ml.p6-b300.48xlarge",
        "ml.p6e-gb200.36xlarge",
    }
)
"""Instance types with local NVMe instance storage, for which SageMaker refuses ``ResourceConfig.VolumeKmsKeyId``
(botocore's ``ResourceConfig.VolumeKmsKeyId`` documentation: local storage is encrypted by a hardware module on the
instance). Sources: eksctl's ``pkg/utils/instance/instance_types.go`` (``InstanceStorageSupported: true`` for the p4d,
p4de, p5, p5e, p5en, p6-b200 and p6-b300 types); ml.p6e-gb200.36xlarge is not in that table and is assumed to
have NVMe storage like every other P-family type here (not verified)."""


# --------------------------------------------------------------------------------------------------------------
# SageMaker's constraints, read from botocore's service model
# --------------------------------------------------------------------------------------------------------------


def sagemaker_limits() -> dict[str, Any]:
    """The ``CreateTrainingJob`` constraints this module checks, read from botocore's SageMaker and Step Functions
    service models (needs botocore; call it at synth time and keep the result in :class:`RequestRules`)."""
    import botocore.session  # noqa: PLC0415 - optional: the Lambda gets the limits from its rules

    session = botocore.session.get_session()
    request = session.get_service_model("sagemaker").operation_model("CreateTrainingJob").input_shape
    members = request.members
    channel = members["InputDataConfig"].member
    s3_uri = channel.members["DataSource"].members["S3DataSource"].members["S3Uri"]
    hyperparameters = members["HyperParameters"]
    execution_name = (
        session.get_service_model("stepfunctions")
        .operation_model("StartExecution")
        .input_shape.members["name"]
    )

    def limits(shape: Any) -> dict[str, Any]:
        return {key: shape.metadata[key] for key in ("min", "max", "pattern") if key in shape.metadata}

    return {
        "TrainingJobName": limits(members["TrainingJobName"]),
        "HyperParameters": limits(hyperparameters),
        "HyperParameterKey": limits(hyperparameters.key),
        "HyperParameterValue": limits(hyperparameters.value),
        "InputDataConfig": limits(members["InputDataConfig"]),
        "S3Uri": limits(s3_uri),
        "TrainingInputMode": list(channel.members["InputMode"].enum),
        "TrainingPlanArn": limits(members["ResourceConfig"].members["TrainingPlanArn"]),
        "InstanceCount": limits(members["ResourceConfig"].members["InstanceCount"]),
        "MaxRuntimeInSeconds": limits(members["StoppingCondition"].members["MaxRuntimeInSeconds"]),
        "ExecutionName": limits(execution_name),
        "KeepAlivePeriodInSeconds": limits(members["ResourceConfig"].members["KeepAlivePeriodInSeconds"]),
        "Tags": limits(members["Tags"]),
        "TagKey": limits(members["Tags"].member.members["Key"]),
        "TagValue": limits(members["Tags"].member.members["Value"]),
        "Environment": limits(members["Environment"]),
        "EnvironmentKey": limits(members["Environment"].key),
        "EnvironmentValue": limits(members["Environment"].value),
    }


# --------------------------------------------------------------------------------------------------------------
# Rules of one deployed workflow
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRules:
    """What one deployed workflow allows. JSON-serializable (:meth:`to_json`); the workflow hands it to its Lambda.

    ``defaults``: the value of each input field an execution leaves out (merged over :data:`DEFAULT_INPUT`).
    ``data_sources``: where ``train_data_uri`` may point: ``s3://bucket/prefix/`` URIs, or key prefixes in the
    workflow's bucket (``data/``). ``bucket_name`` None (e.g. the CLI before deployment): relative sources are
    matched on the key only and ``resume_from`` cannot be decided. ``workflow_segment``: the per-workflow folder
    under ``checkpoint_prefix`` that keeps the runs of workflows sharing a bucket apart. ``limits``: SageMaker's
    constraints (:func:`sagemaker_limits`); None reads them from the installed botocore.
    ``max_keep_alive_seconds``: the largest ``keep_alive_seconds`` (warm pool); 0 turns warm pools off.
    ``remote_debug``: whether the workflow's execution role may open remote-debugging channels (``remote_debug``
    true is refused otherwise); ``network_isolation``: whether the jobs run network-isolated (no remote debugging).
    ``volume_kms_key``: whether the request names a ``VolumeKmsKeyId`` (refused for instance types with NVMe
    instance storage). ``workflow_path`` and ``tags``: the tags every job gets before the execution's own.
    ``mlflow_tracking_server_arn``: the MLflow tracking server the jobs log to (its variables join every job's
    ``Environment``, see :func:`job_fields`); None: no MLflow.
    """

    defaults: Mapping[str, Any] = field(default_factory=dict)
    allowed_instance_types: tuple[str, ...] = tuple(GPU_INSTANCE_TYPES)
    max_instance_count: int = 4
    max_runtime_seconds: int = MAX_RUNTIME_SECONDS_LIMIT
    region: str | None = None
    bucket_name: str | None = None
    checkpoint_prefix: str = "checkpoints/"
    workflow_segment: str | None = None
    data_sources: tuple[str, ...] = ("data/",)
    max_capacity_retries: int = 3
    max_keep_alive_seconds: int = DEFAULT_MAX_KEEP_ALIVE_SECONDS
    remote_debug: bool = False
    network_isolation: bool = False
    volume_kms_key: bool = False
    workflow_path: str = "TrainingWorkflow"
    tags: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, Any] | None = None
    mlflow_tracking_server_arn: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.defaults) - set(INPUT_FIELDS))
        if unknown:
            raise ValueError(
                f"RequestRules.defaults: unknown fields {unknown}; allowed: {', '.join(INPUT_FIELDS)}"
            )
        bad = [t for t in self.allowed_instance_types if t not in GPU_INSTANCE_TYPES]
        if bad or not self.allowed_instance_types:
            raise ValueError(
                f"RequestRules.allowed_instance_types: must be names from {', '.join(GPU_INSTANCE_TYPES)}; got {bad}"
            )
        for source in self.data_sources:
            if not isinstance(source, str) or not source.endswith("/") or source.startswith("/"):
                raise ValueError(
                    "RequestRules.data_sources: each must be s3://<bucket>/<prefix>/ or a key prefix ending in "
                    f"'/'; got {source!r}"
                )

    # -- derived ---------------------------------------------------------------------------------------------
    def full_defaults(self) -> dict[str, Any]:
        merged = {**DEFAULT_INPUT, **self.defaults}
        for name in ("hyperparameters", "tags", "environment"):
            merged[name] = dict(merged[name] or {})
        return merged

    def fixed_tags(self) -> tuple[str, ...]:
        """Keys of the tags every job of this workflow gets (an execution's ``tags`` may not use them)."""
        return (WORKFLOW_TAG, EXECUTION_TAG, *sorted(self.tags))

    def sagemaker(self) -> Mapping[str, Any]:
        """SageMaker's constraints: those carried in the rules; a constraint they lack (rules of a workflow deployed
        before it was checked) is read from the installed botocore."""
        if self.limits is None:
            return _cached_limits()
        if set(self.limits) >= LIMIT_NAMES:
            return self.limits
        return {**_cached_limits(), **self.limits}

    def data_source_uris(self) -> tuple[str, ...]:
        """Allowed data prefixes as ``s3://`` URIs (relative ones in the workflow's bucket; ``s3://*/`` when the
        bucket is not known)."""
        bucket = self.bucket_name or "*"
        return tuple(s if s.startswith("s3://") else f"s3://{bucket}/{s}" for s in self.data_sources)

    def runs_uri(self) -> str | None:
        """``s3://bucket/<checkpoint_prefix><segment>/``: where this workflow's runs keep their checkpoints."""
        if self.bucket_name is None:
            return None
        segment = f"{self.workflow_segment}/" if self.workflow_segment else ""
        return f"s3://{self.bucket_name}/{self.checkpoint_prefix}{segment}"

    # -- serialization ---------------------------------------------------------------------------------------
    def to_json(self) -> str:
        data = asdict(self)
        data["defaults"] = dict(self.defaults)
        data["tags"] = dict(self.tags)
        data["limits"] = None if self.limits is None else dict(self.limits)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> RequestRules:
        data = dict(json.loads(text) if isinstance(text, str) else text)
        unknown = sorted(set(data) - {f for f in cls.__dataclass_fields__})
        if unknown:
            raise ValueError(f"RequestRules: unknown keys {unknown}")
        for key in ("allowed_instance_types", "data_sources"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)

    @classmethod
    def from_state_machine_definition(cls, definition: str | Mapping[str, Any]) -> RequestRules:
        """The exact rules of a deployed workflow, from its state machine definition (``DescribeStateMachine``'s
        ``definition``): the ``Decide request`` state hands them to the Lambda function."""
        data = json.loads(definition) if isinstance(definition, str) else definition
        try:
            return cls.from_json(data["States"][DECIDE_STATE]["Parameters"]["Payload"]["rules"])
        except (KeyError, TypeError):
            raise ValueError(
                f"definition: no '{DECIDE_STATE}' state with rules (not a TrainingWorkflow?)"
            ) from None

    def with_limits(self) -> RequestRules:
        """These rules with SageMaker's constraints read now (so they travel with the rules)."""
        return replace(self, limits=sagemaker_limits())

    @classmethod
    def from_cdk_context(cls, context: Mapping[str, Any]) -> RequestRules:
        """Rules from a ``cdk.json`` ``context`` dict (the keys ``BlackwellTrainingStack`` reads), without aws_cdk.

        The bucket name is generated at deploy time, so it is not known here (pass it with ``dataclasses.replace``
        from the stack's outputs)."""

        def get(key: str, default: Any) -> Any:
            value = context.get(key)
            return default if value in (None, "") else value

        count = _context_int("maxInstanceCount", get("maxInstanceCount", 4), 1, 64)
        hours = _context_int("workflowTimeoutHours", get("workflowTimeoutHours", 168), 1, 8760)
        instance_type = get("defaultInstanceType", DEFAULT_INSTANCE_TYPE)
        precision = get("defaultPrecision", DEFAULT_INPUT["precision"])
        if not isinstance(instance_type, str) or instance_type not in GPU_INSTANCE_TYPES:
            raise ValueError(
                f"context defaultInstanceType: must be one of {', '.join(GPU_INSTANCE_TYPES)}; got {instance_type!r}"
            )
        if not isinstance(precision, str) or precision not in PRECISIONS:
            raise ValueError(
                f"context defaultPrecision: must be one of {', '.join(PRECISIONS)}; got {precision!r}"
            )
        defaults = {"instance_type": instance_type, "precision": precision}
        if get("defaultJobNamePrefix", None) is not None:
            defaults["job_name_prefix"] = get("defaultJobNamePrefix", None)
        return cls(
            defaults=defaults,
            max_instance_count=count,
            max_runtime_seconds=min(MAX_RUNTIME_SECONDS_LIMIT, hours * 3600),
            region=get("region", None),
            data_sources=parse_data_sources(context.get("dataSources")),
            max_capacity_retries=_context_int("maxCapacityRetries", get("maxCapacityRetries", 3), 0, 20),
            max_keep_alive_seconds=_context_int(
                "maxKeepAliveSeconds",
                get("maxKeepAliveSeconds", DEFAULT_MAX_KEEP_ALIVE_SECONDS),
                0,
                int(_cached_limits()["KeepAlivePeriodInSeconds"]["max"]),
            ),
            remote_debug=_context_bool("remoteDebug", get("remoteDebug", False)),
            network_isolation=_context_bool("networkIsolation", get("networkIsolation", False)),
            workflow_path=f"{get('stackName', 'BlackwellTraining')}/Workflow",
        )


DATA_SOURCE = re.compile(r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/)?([A-Za-z0-9!_.()=-]+/)*$")


def parse_data_sources(value: Any) -> tuple[str, ...]:
    """The ``dataSources`` context value: a list of ``s3://bucket/prefix/`` URIs or key prefixes of the workflow's
    bucket, each ending in ``/``. Absent or empty: ``("data/",)``."""
    if isinstance(value, str) and value.startswith("["):  # -c dataSources='["data/"]' arrives as text
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    if value in (None, "", []):
        return ("data/",)
    if not isinstance(value, list) or not all(
        isinstance(v, str) and v.endswith("/") and DATA_SOURCE.match(v) and v != "/" for v in value
    ):
        raise ValueError(
            "context dataSources: must be a list of S3 prefixes ending in '/', each s3://<bucket>/<prefix>/ or a key "
            f"prefix of the workflow's bucket such as data/; got {value!r}"
        )
    return tuple(dict.fromkeys(value))


def _context_bool(key: str, value: Any) -> bool:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise ValueError(f"context {key}: must be true or false; got {value!r}")
    return value


def _context_int(key: str, value: Any, low: int, high: int) -> int:
    try:
        number = None if isinstance(value, bool) else int(str(value))
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise ValueError(f"context {key}: must be an integer in [{low}, {high}]; got {value!r}")
    return number


_LIMITS_CACHE: list[dict[str, Any]] = []
LIMIT_NAMES = frozenset(
    {
        "TrainingJobName",
        "HyperParameters",
        "HyperParameterKey",
        "HyperParameterValue",
        "InputDataConfig",
        "S3Uri",
        "TrainingInputMode",
        "TrainingPlanArn",
        "InstanceCount",
        "MaxRuntimeInSeconds",
        "ExecutionName",
        "KeepAlivePeriodInSeconds",
        "Tags",
        "TagKey",
        "TagValue",
        "Environment",
        "EnvironmentKey",
        "EnvironmentValue",
    }
)
"""Every constraint :func:`sagemaker_limits` reads."""


def _cached_limits() -> dict[str, Any]:
    if not _LIMITS_CACHE:
        _LIMITS_CACHE.append(sagemaker_limits())
    return _LIMITS_CACHE[0]


# --------------------------------------------------------------------------------------------------------------
# The request
# --------------------------------------------------------------------------------------------------------------


@dataclass
class PreparedRequest:
    """The outcome of :func:`prepare_request`: ``config`` (every input field, merged and normalized),
    ``hyperparameters`` (the exact string map for ``CreateTrainingJob``), ``channels`` (its ``InputDataConfig``)
    and ``problems`` (empty when valid)."""

    config: dict[str, Any]
    hyperparameters: dict[str, str]
    problems: list[str]
    channels: list[dict[str, Any]] = field(default_factory=list)
    plan: dict[str, Any] | None = None
    """``training.plan``'s estimate (memory by part, time, cost; ``ignored`` when launched although it did not
    fit); None when the request has other problems."""

    @property
    def cause(self) -> str:
        return "; ".join(self.problems)


def validate_request(raw: object, rules: RequestRules) -> list[str]:
    """Every problem of the execution input ``raw`` under ``rules``, one line each (empty: valid)."""
    return prepare_request(raw, rules).problems


def prepare_request(raw: object, rules: RequestRules) -> PreparedRequest:
    """Merge ``raw`` over the defaults, check every field, the trainer settings and SageMaker's constraints."""
    if not isinstance(raw, Mapping):
        return PreparedRequest({}, {}, [f"input: must be a JSON object of input fields; got {_show(raw)}"])
    problems: list[str] = []
    for key in raw:
        if key not in INPUT_FIELDS:
            problems.append(
                f"{key}: unknown input field{_suggest(str(key), INPUT_FIELDS)}; allowed: {', '.join(INPUT_FIELDS)}"
            )
    defaults = rules.full_defaults()
    config = {name: (raw[name] if name in raw else defaults[name]) for name in INPUT_FIELDS}
    if isinstance(raw.get("hyperparameters"), Mapping):  # the input's settings over the workflow's defaults
        config["hyperparameters"] = {**defaults["hyperparameters"], **raw["hyperparameters"]}
    field_problems = [
        p for name in INPUT_FIELDS if (p := _check_field(name, config[name], rules)) is not None
    ]
    problems += field_problems
    if not any(p.startswith(("tags:", "environment:")) for p in field_problems):
        problems += _map_problems(config, rules)
    if not field_problems:
        problems += _cross_field_problems(config, rules)
    hyperparameters: dict[str, str] = {}
    if not field_problems:
        hyperparameters, hp_problems = _hyperparameters(config, rules)
        problems += hp_problems
    elif not any(p.startswith("hyperparameters") for p in field_problems):
        problems += _setting_problems(config["hyperparameters"])[1]  # the rest needs the other fields valid
    if not problems and config["use_spot"] and config["max_wait_seconds"] is None:
        config["max_wait_seconds"] = config["max_runtime_seconds"]
    if problems:
        return PreparedRequest(config, {}, problems)
    estimate, refused = _memory_plan(config, rules)
    if refused:
        return PreparedRequest(config, {}, [refused], plan=estimate)
    channels = []
    if config["train_data_uri"] is not None:
        channels.append(channel(TRAIN_CHANNEL, config["train_data_uri"], config["train_data_input_mode"]))
    return PreparedRequest(config, hyperparameters, problems, channels, estimate)


def _memory_plan(config: Mapping[str, Any], rules: RequestRules) -> tuple[dict[str, Any], str | None]:
    """The plan of a request with no other problem, and its refusal when its estimated per-GPU peak exceeds the
    GPU's memory with headroom (``training.plan``), unless ``ignore_memory_estimate`` is true."""
    estimate = make_plan(
        config, max_instance_count=rules.max_instance_count, instance_types=rules.allowed_instance_types
    )
    ignored = bool(config["ignore_memory_estimate"]) and not estimate.memory.fits
    line = None if config["ignore_memory_estimate"] else refusal(estimate)
    return {**estimate.to_dict(), "ignored": ignored}, line


def job_fields(config: Mapping[str, Any], rules: RequestRules, execution: str) -> dict[str, Any]:
    """The request fields decided per execution (the workflow's template takes each from ``$.request``): the job's
    ``Tags`` (the workflow's path, the execution's name, the workflow's tags, then the input's ``tags``, each
    group sorted), ``Environment`` (the input's ``environment``, plus with an MLflow tracking server the
    trainer's MLflow variables: server, experiment = the workflow's segment, run = the execution),
    ``InfraCheckConfig`` and ``RemoteDebugConfig``."""
    fixed = [(WORKFLOW_TAG, rules.workflow_path), (EXECUTION_TAG, execution), *sorted(rules.tags.items())]
    environment = dict(config["environment"])
    if rules.mlflow_tracking_server_arn:
        environment.update(
            {
                MLFLOW_TRACKING_URI_ENV: rules.mlflow_tracking_server_arn,
                MLFLOW_EXPERIMENT_ENV: rules.workflow_segment or rules.workflow_path,
                MLFLOW_RUN_NAME_ENV: execution,
            }
        )
    return {
        "Tags": [{"Key": k, "Value": v} for k, v in (*fixed, *sorted(config["tags"].items()))],
        "Environment": environment,
        "InfraCheckConfig": {"EnableInfraCheck": config["infra_check"]},
        "RemoteDebugConfig": {"EnableRemoteDebug": config["remote_debug"]},
    }


def channel(name: str, uri: str, mode: str) -> dict[str, Any]:
    """One ``InputDataConfig`` entry: every object under the ``uri`` prefix, on every instance."""
    return {
        "ChannelName": name,
        "DataSource": {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": uri,
                "S3DataDistributionType": "FullyReplicated",
            }
        },
        "InputMode": mode,
    }


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= 200 else text[:197] + "..."


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_field(name: str, value: Any, rules: RequestRules) -> str | None:
    """The problem of one field's value, or None."""
    allowed = _field_allowed(name, rules)
    if value is None:
        return None if name in _OPTIONAL else f"{name}: must be {allowed}; got null"
    ok = _FIELD_CHECKS[name](value, rules)
    return None if ok else f"{name}: must be {allowed}; got {_show(value)}"


_OPTIONAL = frozenset(  # null allowed
    {"num_layers", "training_plan_arn", "max_wait_seconds", "train_data_uri", "resume_from"}
)


def _int_between(
    low: Callable[[RequestRules], int], high: Callable[[RequestRules], int]
) -> Callable[..., bool]:
    return lambda v, r: _is_int(v) and low(r) <= v <= high(r)


def _contract_int(name: str) -> Callable[..., bool]:
    spec = HYPERPARAMETERS_BY_NAME[name]
    return lambda v, r: _is_int(v) and spec.minimum <= v <= spec.maximum  # type: ignore[operator]


def _job_name_prefix_ok(value: Any, rules: RequestRules) -> bool:
    limits = rules.sagemaker()["TrainingJobName"]
    if not isinstance(value, str) or not value or len(value) + 1 + UUID_LENGTH > limits["max"]:
        return False
    example = f"{value}-{'0' * 8}-{'0' * 4}-{'0' * 4}-{'0' * 4}-{'0' * 12}"
    return re.fullmatch(limits["pattern"], example) is not None


def _plan_arn_ok(value: Any, rules: RequestRules) -> bool:
    limits = rules.sagemaker()["TrainingPlanArn"]
    if not isinstance(value, str) or not limits.get("min", 0) <= len(value) <= limits["max"]:
        return False
    if re.fullmatch(limits["pattern"], value) is None:
        return False
    return rules.region is None or value.split(":")[3] == rules.region


def _data_uri_ok(value: Any, rules: RequestRules) -> bool:
    limits = rules.sagemaker()["S3Uri"]
    if not isinstance(value, str) or len(value) > limits["max"] or not re.fullmatch(limits["pattern"], value):
        return False
    if not value.startswith("s3://") or not value.endswith("/") or "//" in value[5:] or "/../" in value:
        return False
    return any(_under(value, source) for source in rules.data_source_uris())


def _under(uri: str, source: str) -> bool:
    if source.startswith("s3://*/"):
        key = uri[5:].partition("/")[2]
        return key.startswith(source[len("s3://*/") :])
    return uri.startswith(source)


def _execution_name_ok(value: Any, rules: RequestRules) -> bool:
    limits = rules.sagemaker()["ExecutionName"]
    return (
        isinstance(value, str)
        and 1 <= len(value) <= limits["max"]
        and EXECUTION_NAME.match(value) is not None
    )


def _string_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _hyperparameters_shape_ok(value: Any, rules: RequestRules) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str)
        and (isinstance(v, str | bool) or (isinstance(v, int | float) and math.isfinite(v)))
        for k, v in value.items()
    )


_FIELD_CHECKS: Mapping[str, Callable[[Any, RequestRules], bool]] = {
    "precision": lambda v, r: v in PRECISIONS,
    "num_layers": _contract_int("num_layers"),
    "batch_size": _contract_int("batch_size"),
    "seq_length": _contract_int("seq_length"),
    "activation_checkpointing": lambda v, r: isinstance(v, bool),
    "instance_type": lambda v, r: isinstance(v, str) and v in r.allowed_instance_types,
    "instance_count": _int_between(lambda r: 1, lambda r: r.max_instance_count),
    "training_plan_arn": _plan_arn_ok,
    "use_spot": lambda v, r: isinstance(v, bool),
    "max_runtime_seconds": _int_between(lambda r: 1, lambda r: r.max_runtime_seconds),
    "max_wait_seconds": _int_between(lambda r: 1, lambda r: MAX_RUNTIME_SECONDS_LIMIT),
    "hyperparameters": _hyperparameters_shape_ok,
    "job_name_prefix": _job_name_prefix_ok,
    "train_data_uri": _data_uri_ok,
    "train_data_input_mode": lambda v, r: v in DATA_INPUT_MODES and v in r.sagemaker()["TrainingInputMode"],
    "resume_from": _execution_name_ok,
    "keep_alive_seconds": _int_between(lambda r: 0, lambda r: r.max_keep_alive_seconds),
    "infra_check": lambda v, r: isinstance(v, bool),
    "tags": lambda v, r: _string_map(v),
    "remote_debug": lambda v, r: v is False or (v is True and r.remote_debug and not r.network_isolation),
    "environment": lambda v, r: _string_map(v),
    "ignore_memory_estimate": lambda v, r: isinstance(v, bool),
}


def _field_allowed(name: str, rules: RequestRules) -> str:
    """What ``name`` allows, in words (every problem line says it)."""
    if name in ("num_layers", "batch_size", "seq_length"):
        text = HYPERPARAMETERS_BY_NAME[name].allowed()
    elif name == "precision":
        text = "one of " + ", ".join(PRECISIONS)
    elif name == "instance_type":
        text = "one of " + ", ".join(rules.allowed_instance_types)
    elif name == "instance_count":
        text = f"an integer in [1, {rules.max_instance_count}]"
    elif name == "max_runtime_seconds":
        text = f"an integer in [1, {rules.max_runtime_seconds}]"
    elif name == "max_wait_seconds":
        text = f"an integer in [1, {MAX_RUNTIME_SECONDS_LIMIT}]"
    elif name in ("activation_checkpointing", "use_spot", "infra_check", "ignore_memory_estimate"):
        text = "true or false"
    elif name == "keep_alive_seconds":
        most = rules.max_keep_alive_seconds
        text = (
            f"an integer in [0, {most}] (seconds the instances stay in a warm pool after the job)"
            if most
            else "0 (this workflow is deployed without warm pools: maxKeepAliveSeconds is 0)"
        )
    elif name == "remote_debug":
        text = "true or false"
        if rules.network_isolation:
            text = "false (the jobs run with network isolation, and remote debugging needs the network)"
        elif not rules.remote_debug:
            text = "false (this workflow is deployed without remote debugging: set remoteDebug in cdk.json)"
    elif name in ("tags", "environment"):
        text = f"a JSON object of string values ({_map_allowed(name, rules)})"
    elif name == "hyperparameters":
        text = "a JSON object of trainer settings (string, number or boolean values)"
    elif name == "job_name_prefix":
        most = rules.sagemaker()["TrainingJobName"]["max"] - 1 - UUID_LENGTH
        text = f"1 to {most} characters of a-z, A-Z, 0-9 and hyphen, starting with a letter or digit"
    elif name == "training_plan_arn":
        region = rules.region or "<region>"
        text = f"a training plan ARN arn:aws:sagemaker:{region}:<12 digits>:training-plan/<name>"
    elif name == "train_data_uri":
        text = "an s3:// prefix ending in '/' under one of " + ", ".join(rules.data_source_uris())
    elif name == "train_data_input_mode":
        text = "one of " + ", ".join(DATA_INPUT_MODES)
    else:  # resume_from
        most = rules.sagemaker()["ExecutionName"]["max"]
        text = f"the name of an earlier execution of this workflow (1 to {most} characters of a-z, A-Z, 0-9, _ and -)"
    return f"{text}, or null" if name in _OPTIONAL else text


def _map_allowed(name: str, rules: RequestRules) -> str:
    limits = rules.sagemaker()
    if name == "tags":
        most = limits["Tags"]["max"] - len(rules.fixed_tags())
        return (
            f"at most {most} tags; keys of {limits['TagKey'].get('min', 1)} to {limits['TagKey']['max']} and values "
            f"of up to {limits['TagValue']['max']} {TAG_CHARACTERS}; keys not starting with aws: "
            f"nor one of the workflow's own: {', '.join(rules.fixed_tags())}"
        )
    return (
        f"at most {limits['Environment']['max']} variables whose names start with {', '.join(ENVIRONMENT_PREFIXES)} "
        f"(letters, digits and _, at most {limits['EnvironmentKey']['max']} characters), values of up to "
        f"{limits['EnvironmentValue']['max']} characters; not {', '.join(PLATFORM_ENVIRONMENT)}"
    )


TAG_CHARACTERS = "letters, digits, spaces and _.:/=+-@"


def _tag_text_ok(text: str, pattern: str, low: int, high: int) -> bool:
    """Whether ``text`` fits botocore's tag pattern ``([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)`` (Java's Unicode
    classes, which Python's ``re`` lacks: letters, separators and numbers by Unicode category)."""
    body = pattern.removeprefix("(").removesuffix(")").removeprefix("[").removesuffix("]*")
    categories = set(re.findall(r"\\p\{(\w)\}", body))
    literal = re.sub(r"\\p\{\w\}", "", body).replace("\\", "")
    return low <= len(text) <= high and all(
        unicodedata.category(c)[0] in categories or c in literal for c in text
    )


def _map_problems(config: Mapping[str, Any], rules: RequestRules) -> list[str]:
    """Each entry of ``tags`` and ``environment`` on its own (their shapes already checked)."""
    limits, problems = rules.sagemaker(), []
    tags, fixed = config["tags"], rules.fixed_tags()
    most = limits["Tags"]["max"] - len(fixed)
    if len(tags) > most:
        problems.append(
            f"tags: at most {most} (SageMaker's {limits['Tags']['max']} less the workflow's {len(fixed)}); "
            f"got {len(tags)}"
        )
    for key, value in tags.items():
        key_limits, value_limits = limits["TagKey"], limits["TagValue"]
        if key.lower().startswith("aws:") or key in fixed:
            problems.append(
                f"tags.{key}: reserved (aws: prefix, or one of {', '.join(fixed)}); choose another key"
            )
        elif not _tag_text_ok(key, key_limits["pattern"], key_limits.get("min", 1), key_limits["max"]):
            problems.append(
                f"tags.{key}: key must be {key_limits.get('min', 1)} to {key_limits['max']} {TAG_CHARACTERS}; "
                f"got {_show(key)}"
            )
        if not _tag_text_ok(value, value_limits["pattern"], 0, value_limits["max"]):
            problems.append(
                f"tags.{key}: value must be at most {value_limits['max']} {TAG_CHARACTERS}; got {_show(value)}"
            )
    environment = config["environment"]
    room = limits["Environment"]["max"] - (
        3 if rules.mlflow_tracking_server_arn else 0
    )  # job_fields adds MLflow's
    if len(environment) > room:
        problems.append(f"environment: at most {room} variables; got {len(environment)}")
    key_limits, value_limits = limits["EnvironmentKey"], limits["EnvironmentValue"]
    for name, value in environment.items():
        if name in PLATFORM_ENVIRONMENT:
            problems.append(f"environment.{name}: set by the platform ({PLATFORM_ENVIRONMENT[name]})")
        elif (
            not name.startswith(ENVIRONMENT_PREFIXES)
            or len(name) > key_limits["max"]
            or not re.fullmatch(key_limits["pattern"], name)
        ):
            problems.append(
                f"environment.{name}: name must start with one of {', '.join(ENVIRONMENT_PREFIXES)} (letters, "
                f"digits and _, at most {key_limits['max']} characters); got {_show(name)}"
            )
        if len(value) > value_limits["max"]:
            problems.append(
                f"environment.{name}: value of {len(value)} characters; SageMaker allows at most {value_limits['max']}"
            )
    return problems


def _cross_field_problems(config: Mapping[str, Any], rules: RequestRules) -> list[str]:
    problems = []
    keep_alive = config["keep_alive_seconds"]
    if keep_alive and config["use_spot"]:
        problems.append(
            f"keep_alive_seconds: warm pools cannot be used with managed spot (use_spot true); set it to 0 or "
            f"use_spot to false; got {keep_alive}"
        )
    if rules.volume_kms_key and config["instance_type"] in INSTANCE_STORAGE_TYPES:
        problems.append(
            f"instance_type: {config['instance_type']} has NVMe instance storage (encrypted by the instance), and "
            "SageMaker refuses a VolumeKmsKeyId for it, which this workflow sets (volume_kms_key); deploy without "
            "volume_kms_key to use it"
        )
    precision, instance_type = config["precision"], config["instance_type"]
    if instance_type not in instance_types_supporting(precision):
        where = [t for t in instance_types_supporting(precision) if t in rules.allowed_instance_types]
        problems.append(
            f"precision: {precision} cannot run on the GPUs of instance_type {instance_type}; it needs one of "
            f"{', '.join(where) or 'no allowed instance type'}"
        )
    if config["use_spot"] and config["training_plan_arn"] is not None:
        problems.append(
            "use_spot: managed spot cannot be combined with training_plan_arn; set use_spot to false or "
            "training_plan_arn to null"
        )
    wait = config["max_wait_seconds"]
    if wait is not None and not config["use_spot"]:
        problems.append(
            f"max_wait_seconds: only allowed with use_spot true; got {wait} (set it to null for on-demand or a plan)"
        )
    elif wait is not None and wait < config["max_runtime_seconds"]:
        problems.append(
            f"max_wait_seconds: must be >= max_runtime_seconds ({config['max_runtime_seconds']}); got {wait}"
        )
    return problems


def _setting_problems(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Each trainer setting of the input on its own: known, not the platform's, parsed by the trainer's rules.
    Needs no other field, so it runs even when other fields have problems (every problem is listed at once)."""
    problems: list[str] = []
    unknown: list[str] = []
    given: dict[str, Any] = {}
    for key, value in settings.items():
        name = normalize_name(key)
        spec = HYPERPARAMETERS_BY_NAME.get(name)
        where = f"hyperparameters.{key}"
        if spec is None:
            unknown.append(f"{key}{_suggest(name, HYPERPARAMETERS_BY_NAME)}")
        elif name in PLATFORM_HYPERPARAMETERS:
            problems.append(
                f"{where}: set by the platform ({PLATFORM_HYPERPARAMETERS[name]}, the path SageMaker syncs); "
                "it cannot be set from an execution"
            )
        elif name in TOP_LEVEL_HYPERPARAMETERS:
            problems.append(
                f"{where}: is the top-level input field {name}; set it there, not in hyperparameters"
            )
        elif name in given:
            problems.append(f"{where}: {name} is given twice (in two spellings)")
        else:
            try:
                spec.parse(value)
                given[name] = value
            except ContractError as err:
                problems.append(f"hyperparameters.{err}")
    if unknown:
        settable = [
            n
            for n in HYPERPARAMETERS_BY_NAME
            if n not in PLATFORM_HYPERPARAMETERS and n not in TOP_LEVEL_HYPERPARAMETERS
        ]
        problems.insert(
            0,
            f"hyperparameters: unknown trainer setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"allowed: {', '.join(settable)}",
        )
    return given, problems


def _hyperparameters(config: Mapping[str, Any], rules: RequestRules) -> tuple[dict[str, str], list[str]]:
    """The ``HyperParameters`` map: the input's trainer settings, the top-level ones, the data switch and the
    platform's paths; checked by the trainer's own parsers and cross-setting rules and SageMaker's sizes."""
    given, problems = _setting_problems(config["hyperparameters"])
    for name in TOP_LEVEL_HYPERPARAMETERS:
        if config[name] is not None:
            given[name] = config[name]
    has_data = config["train_data_uri"] is not None
    dataset = str(given.get(DATA_HYPERPARAMETER, "channel" if has_data else "synthetic")).strip().lower()
    if dataset == "channel" and not has_data:
        problems.append(
            "hyperparameters.dataset: channel needs train_data_uri (the data to mount); got no train_data_uri"
        )
    if dataset == "synthetic" and has_data:
        problems.append(
            f"hyperparameters.dataset: synthetic would ignore train_data_uri {config['train_data_uri']}; "
            "leave dataset out (or channel) to train on it"
        )
    if has_data:
        given[DATA_HYPERPARAMETER] = "channel"
    if problems:
        return {}, problems
    try:
        parse_hyperparameters(given)
    except ContractError as err:
        return {}, [f"hyperparameters.{err}"]
    rendered = {**to_sagemaker_hyperparameters(given), **PLATFORM_HYPERPARAMETERS}
    return rendered, _size_problems(rendered, rules)


def _size_problems(rendered: Mapping[str, str], rules: RequestRules) -> list[str]:
    limits = rules.sagemaker()
    problems = []
    most = limits["HyperParameters"]["max"]
    if len(rendered) > most:
        problems.append(
            f"hyperparameters: SageMaker allows at most {most} in all; the request would have {len(rendered)}"
        )
    for key, value in rendered.items():
        if len(key) > limits["HyperParameterKey"]["max"]:
            problems.append(
                f"hyperparameters.{key}: name longer than {limits['HyperParameterKey']['max']} characters"
            )
        if len(value) > limits["HyperParameterValue"]["max"]:
            problems.append(
                f"hyperparameters.{key}: value of {len(value)} characters; SageMaker allows at most "
                f"{limits['HyperParameterValue']['max']}"
            )
    return problems


# --------------------------------------------------------------------------------------------------------------
# resume_from: the newest complete checkpoint of an earlier run
# --------------------------------------------------------------------------------------------------------------


def newest_complete_checkpoint(
    objects: Mapping[str, int], read: Callable[[str], bytes], run_key: str
) -> tuple[int, str] | None:
    """(step, key prefix) of the newest complete checkpoint under ``run_key`` (``.../<execution>/``), the trainer's
    rule: a ``step_XXXXXXXX`` (or ``step_XXXXXXXX-N``, a later save of that step) folder whose ``COMPLETE`` lists
    files that all exist with the listed sizes; unsealed folders and folders the trainer set aside (a
    ``step_XXXXXXXX.unusable`` object beside the folder) never count.

    ``objects`` maps every key under ``run_key`` to its size; ``read`` returns an object's bytes."""
    candidates = []
    for key in objects:
        parts = key[len(run_key) :].split("/")
        if len(parts) == 2 and parts[1] == CHECKPOINT_MARKER and (m := CHECKPOINT_DIR_NAME.match(parts[0])):
            if f"{run_key}{parts[0]}{SET_ASIDE_SUFFIX}" in objects:
                continue  # the trainer found it damaged
            candidates.append((int(m.group(1)), int(m.group(2) or 1), f"{run_key}{parts[0]}/"))
    for step, _, prefix in sorted(candidates, reverse=True):
        try:
            files = json.loads(read(prefix + CHECKPOINT_MARKER))["files"]
            if all(objects.get(prefix + name) == size for name, size in files.items()):
                return step, prefix
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def resume_problems(
    config: Mapping[str, Any], hyperparameters: Mapping[str, str], found: tuple[int, str] | None, run_uri: str
) -> list[str]:
    """Problems of continuing from ``found`` (what :func:`newest_complete_checkpoint` gave for ``run_uri``)."""
    name = config["resume_from"]
    if found is None:
        return [
            f"resume_from: execution {name} has no complete checkpoint under {run_uri}; got {_show(name)}"
        ]
    step = found[0]
    max_steps = int(hyperparameters.get("max_steps", HYPERPARAMETERS_BY_NAME["max_steps"].default))
    if max_steps <= step:
        return [
            f"hyperparameters.max_steps: must be greater than the step of the checkpoint resumed from ({step}, "
            f"execution {name}) to train further; got {max_steps}"
        ]
    return []


def _list_run(s3: Any, bucket: str, prefix: str) -> dict[str, int]:
    objects: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            objects[item["Key"]] = item["Size"]
    return objects


def decide(event: Mapping[str, Any], s3: Any = None) -> dict[str, Any]:
    """The Lambda's work: ``event`` = ``{"input": <execution input>, "rules": <RequestRules or its JSON>,
    "execution": <this execution's name>}``. Returns ``{"valid", "cause", "config", "hyperparameters",
    "channels", "resume", "request", "plan"}`` (all but the first two null when not valid; ``request``:
    :func:`job_fields`); ``s3``: a boto3 S3 client (default: one for the rules' region) to check ``train_data_uri``
    holds data and to decide ``resume_from``."""
    rules = RequestRules.from_json(event["rules"])
    prepared = prepare_request(event.get("input"), rules)
    resume = None
    if not prepared.problems and prepared.config["train_data_uri"] is not None:
        s3 = s3 or _s3_client(rules)
        prepared.problems += data_problems(s3, prepared.config["train_data_uri"])
    if not prepared.problems and prepared.config["resume_from"] is not None:
        name = prepared.config["resume_from"]
        runs_uri = rules.runs_uri()
        if runs_uri is None:
            raise ValueError("RequestRules.bucket_name: needed to decide resume_from")
        run_uri = f"{runs_uri}{name}/"
        if name == event.get("execution"):
            prepared.problems.append(
                f"resume_from: must name an earlier execution, not this one; got {_show(name)}"
            )
        else:
            s3 = s3 or _s3_client(rules)
            bucket, _, run_key = run_uri[5:].partition("/")
            objects = _list_run(s3, bucket, run_key)
            found = newest_complete_checkpoint(
                objects, lambda key: s3.get_object(Bucket=bucket, Key=key)["Body"].read(), run_key
            )
            prepared.problems += resume_problems(prepared.config, prepared.hyperparameters, found, run_uri)
            if found is not None:
                resume = {"step": found[0], "uri": f"s3://{bucket}/{found[1]}", "execution": name}
                prepared.channels.append(channel(RESUME_CHANNEL, resume["uri"], "File"))
    valid = not prepared.problems
    return {
        "valid": valid,
        "cause": prepared.cause,
        "config": prepared.config if valid else None,
        "hyperparameters": prepared.hyperparameters if valid else None,
        "channels": prepared.channels if valid else None,
        "resume": resume if valid else None,
        "request": job_fields(prepared.config, rules, str(event.get("execution"))) if valid else None,
        "plan": prepared.plan if valid else None,
    }


def data_problems(s3: Any, uri: str) -> list[str]:
    """The problem of a ``train_data_uri`` prefix that holds no object (one ``ListObjectsV2``, ``MaxKeys`` 1)."""
    bucket, _, prefix = uri[5:].partition("/")
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0):
        return []
    return [f"train_data_uri: must hold the training data, but no object is under it; got {_show(uri)}"]


def _s3_client(rules: RequestRules) -> Any:
    import boto3  # noqa: PLC0415 - in the Lambda runtime; the CLI passes its own client

    return boto3.client("s3", region_name=rules.region) if rules.region else boto3.client("s3")


def handler(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Lambda entry point (see :func:`decide`)."""
    return decide(event)
