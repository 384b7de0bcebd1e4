"""What one deployed workflow allows (``RequestRules``) and the constants of the request check: the names the
platform owns, and SageMaker's ``CreateTrainingJob`` constraints read from botocore's service model
(:func:`sagemaker_limits`, at synth time; the rules carry them to the Lambda function). The input fields and their
defaults are ``fields``' table.

Pure Python, no aws_cdk: part of the request check's Lambda asset (``request_function``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any

from training.contract.container import (
    CHECKPOINT_LOCAL_PATH,
    MLFLOW_EXPERIMENT_ENV,
    MLFLOW_RUN_NAME_ENV,
    MLFLOW_TRACKING_URI_ENV,
    MODEL_DIR,
    WEIGHTS_CHANNEL_DIR,
)
from training.contract.hardware import DEFAULT_INSTANCE_TYPE, GPU_INSTANCE_TYPES, PRECISIONS
from training.contract.settings_table import TOP_LEVEL_SETTINGS
from training.contract.tuning import TUNE_RECORDS_FILE, TUNE_REPORT_FOLDER, TUNE_WINNER_FILE, image_tag
from training.request.fields import DEFAULT_INPUT, INPUT_FIELDS, MAX_RUNTIME_SECONDS_LIMIT

INVALID_INPUT_ERROR = "InvalidInput"
MEASUREMENTS_FOLDER = "measurements"
CHECKPOINT_MARKER = "COMPLETE"
"""The file the trainer writes last into a finished checkpoint (``training/trainer/checkpoint/names.py``)."""

PLATFORM_HYPERPARAMETERS: Mapping[str, str] = MappingProxyType(
    {"checkpoint_dir": CHECKPOINT_LOCAL_PATH, "model_dir": MODEL_DIR}
)
"""Set by the platform: SageMaker syncs only its own paths, so moving them breaks spot resume and model upload."""
INPUT_FIELD_HYPERPARAMETERS: Mapping[str, str] = MappingProxyType(
    {"init_from": f"the input field init_from, an S3 prefix mounted at {WEIGHTS_CHANNEL_DIR}"}
)
"""Trainer settings the workflow sets from an input field of another kind (refused inside ``hyperparameters``)."""
TOP_LEVEL_HYPERPARAMETERS = TOP_LEVEL_SETTINGS
"""Trainer settings that are top-level input fields (so they are refused inside ``hyperparameters``)."""
DATA_HYPERPARAMETER = "dataset"

DEFAULT_MAX_KEEP_ALIVE_SECONDS = 3600
"""The deployment's default ceiling of ``keep_alive_seconds`` (SageMaker's own, from botocore, is 21,600)."""
DECIDE_STATE = "Decide request"
"""The workflow's first state: it invokes :func:`handler` with the rules."""
WORKFLOW_TAG = "training-workflow"
EXECUTION_TAG = "training-workflow-execution"
"""The tags every job gets first: the workflow's construct path and the execution's name."""
MLFLOW_ENVIRONMENT = (MLFLOW_TRACKING_URI_ENV, MLFLOW_EXPERIMENT_ENV, MLFLOW_RUN_NAME_ENV)
"""The variables ``job.job_fields`` adds to a job's environment when the workflow logs to MLflow."""
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
    ``Environment``, see :func:`job_fields`); None: no MLflow. ``image_uri``: the training image the jobs run (its
    tag keys the tuning measurements the plan may use); None (e.g. the CLI before deployment): no measurement is
    matched. ``tuning_prefix``: where the workflow stores the tuning runs' measurement records in its bucket.
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
    image_uri: str | None = None
    tuning_prefix: str = "tuning/"

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

    def image_tag(self) -> str | None:
        """The tag of the workflow's image (``tuning.image_tag``), or None when the image is not known."""
        return image_tag(self.image_uri) if self.image_uri else None

    def measurements_prefix(self) -> str | None:
        """``<tuning_prefix>measurements/<image tag>/``: the measurement records of every tuning run of this image
        (any workflow sharing the bucket), the request check's one listing; None without the image."""
        tag = self.image_tag()
        return None if tag is None else f"{measurements_root(self.tuning_prefix)}{tag}/"

    def tuning_paths(self, execution: str) -> dict[str, str | None]:
        """Where tuning run ``execution`` leaves its report (the ``tune/`` folder the job's checkpoint sync uploads)
        and where the workflow stores its records (the request check reads them there)."""
        segment = f"{self.workflow_segment}/" if self.workflow_segment else ""
        report_key = f"{self.checkpoint_prefix}{segment}{execution}/{TUNE_REPORT_FOLDER}/"
        records = self.measurements_prefix()
        return {
            "bucket": self.bucket_name,
            "report_uri": f"s3://{self.bucket_name}/{report_key}" if self.bucket_name else None,
            "winner_key": f"{report_key}{TUNE_WINNER_FILE}",
            "records_source": f"{self.bucket_name}/{report_key}{TUNE_RECORDS_FILE}",
            "records_key": None if records is None else f"{records}{segment}{execution}.json",
        }

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
        """These rules with SageMaker's constraints (so they travel with the rules): botocore's service model is
        read once per process (a copy each time, so no rules share a dict)."""
        return replace(self, limits=copy.deepcopy(_cached_limits()))

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


def measurements_root(tuning_prefix: str) -> str:
    """Where a workflow stores the tuning runs' measurement records: ``<tuning_prefix>measurements/``."""
    return f"{tuning_prefix}{MEASUREMENTS_FOLDER}/"


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


def size_problems(rendered: Mapping[str, str], rules: RequestRules) -> list[str]:
    """The problems of a rendered ``HyperParameters`` map with SageMaker's sizes (count, name and value lengths)."""
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
