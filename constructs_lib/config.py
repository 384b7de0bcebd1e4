"""App settings from ``cdk.json`` context, validated before any resource is built.

Every key is optional; an invalid value raises ``ValueError`` naming the context key and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_codebuild as codebuild
from constructs import Node

from training.contract import (
    DEFAULT_INSTANCE_TYPE,
    GPU_INSTANCE_TYPES,
    HYPERPARAMETERS_BY_NAME,
    PRECISIONS,
    instance_types_supporting,
)

_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$")
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")
_ACCOUNT = re.compile(r"^\d{12}$")
_EVENT_BUS_NAME = re.compile(r"^[A-Za-z0-9._\-/]{1,256}$")
_COMPUTE_TYPES = {
    "small": codebuild.ComputeType.SMALL,
    "medium": codebuild.ComputeType.MEDIUM,
    "large": codebuild.ComputeType.LARGE,
    "x_large": codebuild.ComputeType.X_LARGE,
    "2x_large": codebuild.ComputeType.X2_LARGE,
}

WORKFLOW_CONTEXT_KEYS = (
    "maxInstanceCount",
    "maxCapacityRetries",
    "capacityRetryWaitMinutes",
    "workflowTimeoutHours",
    "defaultInstanceType",
    "defaultPrecision",
    "notifications",
    "workflowTrigger",
    "eventBusName",
    "triggerSource",
    "triggerDetailType",
)

CONTEXT_KEYS = (
    "stackName",
    "region",
    "removalPolicy",
    "useKms",
    "kmsKeyArn",
    "vpcId",
    "buildComputeType",
    "buildTimeoutMinutes",
    "baseImageAccount",
    *WORKFLOW_CONTEXT_KEYS,
)


@dataclass(frozen=True)
class StackSettings:
    stack_name: str = "BlackwellTraining"
    region: str | None = None
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    use_kms: bool = False
    kms_key_arn: str | None = None
    vpc_id: str | None = None
    build_compute_type: codebuild.ComputeType | None = None
    build_timeout_minutes: int | None = None
    base_image_account: str | None = None
    workflow: WorkflowSettings = field(default_factory=lambda: WorkflowSettings())
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_context(cls, node: Node) -> StackSettings:
        def get(key: str) -> Any:
            value = node.try_get_context(key)
            return None if value in (None, "") else value

        stack_name = get("stackName") or cls.stack_name
        if not isinstance(stack_name, str) or not _STACK_NAME.match(stack_name):
            raise ValueError(f"context stackName: must match {_STACK_NAME.pattern}; got {stack_name!r}")
        region = get("region")
        if region is not None and (not isinstance(region, str) or not _REGION.match(region)):
            raise ValueError(f"context region: must be an AWS region name such as us-west-2; got {region!r}")
        removal = str(get("removalPolicy") or "retain").lower()
        if removal not in ("retain", "destroy"):
            raise ValueError(
                f"context removalPolicy: must be retain or destroy; got {get('removalPolicy')!r}"
            )
        use_kms = _bool("useKms", get("useKms"), False)
        kms_key_arn = get("kmsKeyArn")
        if kms_key_arn is not None and (
            not isinstance(kms_key_arn, str) or not _KMS_KEY_ARN.match(kms_key_arn)
        ):
            raise ValueError(
                f"context kmsKeyArn: must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<uuid>); "
                f"got {kms_key_arn!r}"
            )
        vpc_id = get("vpcId")
        if vpc_id is not None and (not isinstance(vpc_id, str) or not _VPC_ID.match(vpc_id)):
            raise ValueError(f"context vpcId: must look like vpc-0123456789abcdef0; got {vpc_id!r}")
        compute = get("buildComputeType")
        if compute is not None and str(compute).lower() not in _COMPUTE_TYPES:
            raise ValueError(
                f"context buildComputeType: must be one of {', '.join(_COMPUTE_TYPES)}; got {compute!r}"
            )
        build_timeout = get("buildTimeoutMinutes")
        if build_timeout is not None:
            try:
                build_timeout = int(str(build_timeout))
            except ValueError:
                build_timeout = -1
            if not 5 <= build_timeout <= 2160:
                raise ValueError(
                    f"context buildTimeoutMinutes: must be an integer in [5, 2160]; got {get('buildTimeoutMinutes')!r}"
                )
        base_account = get("baseImageAccount")
        if base_account is not None:
            base_account = str(base_account)
            if not _ACCOUNT.match(base_account):
                raise ValueError(
                    f"context baseImageAccount: must be the 12-digit account of the region's AWS Deep Learning "
                    f"Containers registry; got {get('baseImageAccount')!r}"
                )
        return cls(
            stack_name=stack_name,
            region=region,
            removal_policy=RemovalPolicy.DESTROY if removal == "destroy" else RemovalPolicy.RETAIN,
            use_kms=use_kms or kms_key_arn is not None,
            kms_key_arn=kms_key_arn,
            vpc_id=vpc_id,
            build_compute_type=_COMPUTE_TYPES[str(compute).lower()] if compute is not None else None,
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
            "build_compute_type": self.build_compute_type,
            "build_timeout_minutes": self.build_timeout_minutes,
            "base_image_account": self.base_image_account,
            "workflow": self.workflow,
        }


@dataclass(frozen=True)
class WorkflowSettings:
    """Settings of the training workflow (``TrainingWorkflow``) from context; see README "Training workflow"."""

    max_instance_count: int = 4
    max_capacity_retries: int = 3
    capacity_retry_wait_minutes: int = 10
    timeout_hours: int = 168
    default_instance_type: str = DEFAULT_INSTANCE_TYPE
    default_precision: str = HYPERPARAMETERS_BY_NAME["precision"].default
    notifications: bool = False
    trigger: bool = False
    event_bus_name: str | None = None
    trigger_source: str = "blackwell-training"
    trigger_detail_type: str = "Start training job"

    @classmethod
    def from_context(cls, get: Callable[[str], Any]) -> WorkflowSettings:
        instance_type = get("defaultInstanceType") or cls.default_instance_type
        if instance_type not in GPU_INSTANCE_TYPES:
            raise ValueError(
                f"context defaultInstanceType: must be one of {', '.join(GPU_INSTANCE_TYPES)}; got {instance_type!r}"
            )
        precision = get("defaultPrecision") or cls.default_precision
        if precision not in PRECISIONS:
            raise ValueError(
                f"context defaultPrecision: must be one of {', '.join(PRECISIONS)}; got {precision!r}"
            )
        if not GPU_INSTANCE_TYPES[instance_type].supports(precision):
            raise ValueError(
                f"context defaultPrecision: {precision} cannot run on defaultInstanceType {instance_type}; "
                f"it needs one of {', '.join(instance_types_supporting(precision))}"
            )
        bus = get("eventBusName")
        if bus is not None and (not isinstance(bus, str) or not _EVENT_BUS_NAME.match(bus)):
            raise ValueError(f"context eventBusName: must match {_EVENT_BUS_NAME.pattern}; got {bus!r}")
        texts = {}
        for key, default in (
            ("triggerSource", cls.trigger_source),
            ("triggerDetailType", cls.trigger_detail_type),
        ):
            value = get(key) or default
            if not isinstance(value, str) or not 1 <= len(value) <= 256:
                raise ValueError(f"context {key}: must be a string of 1 to 256 characters; got {value!r}")
            texts[key] = value
        return cls(
            max_instance_count=_int(
                "maxInstanceCount", get("maxInstanceCount"), cls.max_instance_count, 1, 64
            ),
            max_capacity_retries=_int(
                "maxCapacityRetries", get("maxCapacityRetries"), cls.max_capacity_retries, 0, 20
            ),
            capacity_retry_wait_minutes=_int(
                "capacityRetryWaitMinutes",
                get("capacityRetryWaitMinutes"),
                cls.capacity_retry_wait_minutes,
                1,
                1440,
            ),
            timeout_hours=_int(
                "workflowTimeoutHours", get("workflowTimeoutHours"), cls.timeout_hours, 1, 8760
            ),
            default_instance_type=instance_type,
            default_precision=precision,
            notifications=_bool("notifications", get("notifications"), False),
            trigger=_bool("workflowTrigger", get("workflowTrigger"), False),
            event_bus_name=bus,
            trigger_source=texts["triggerSource"],
            trigger_detail_type=texts["triggerDetailType"],
        )


def _int(key: str, value: Any, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    try:
        number = int(str(value)) if not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise ValueError(f"context {key}: must be an integer in [{low}, {high}]; got {value!r}")
    return number


def _bool(key: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"context {key}: must be true or false; got {value!r}")
