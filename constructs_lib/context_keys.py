"""The app's ``cdk.json`` context keys, once: each key's name, kind, default, allowed values and what it does
(``CONTEXT``), and the patterns the text keys are checked against. ``config`` checks a context against it; the
reference page (``make docs``) is written from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aws_cdk import aws_codebuild as codebuild

from training.contract.hardware import DEFAULT_INSTANCE_TYPE, GPU_INSTANCE_TYPES, PRECISIONS
from training.contract.settings_table import HYPERPARAMETERS_BY_NAME
from training.request.rules import DEFAULT_MAX_KEEP_ALIVE_SECONDS, RequestRules

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
