"""``TrainingWorkflow``: a Step Functions state machine that launches and monitors one SageMaker training job.

One execution = one validated, cost-bounded, monitored training job. The execution input (snake_case, every
field optional) is merged over the defaults, validated field by field (``constructs_lib.workflow_validation``),
turned into a ``CreateTrainingJob`` request for the capacity mode (on-demand, Flexible Training Plan or managed
spot), and run with the ``createTrainingJob.sync`` integration. A job that fails for lack of capacity is
relaunched under a new name with the same checkpoint prefix (so it resumes), a bounded number of times; any other
failure ends the execution with the job name and SageMaker's ``FailureReason``. Success ends with a summary.

Everything is JSONPath (moto's engine, used by the tests, cannot evaluate JSONata).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack, Tags
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from constructs_lib._nag import acknowledge, policy_scope, rendered
from constructs_lib.checkpoint_bucket import CHECKPOINT_PREFIX, OUTPUT_PREFIX, CheckpointBucket
from constructs_lib.execution_role import SAGEMAKER_SERVICE, SageMakerExecutionRole
from constructs_lib.workflow_request import job_tags, resource_config, training_job_request
from constructs_lib.workflow_validation import (
    JOB_NAME_PREFIX_MAX_LENGTH,
    MAX_RUNTIME_SECONDS_LIMIT,
    ValidationStates,
    check_value,
    format_intrinsic,
    input_fields,
    precision_problem,
)
from training.contract import (
    CHECKPOINT_LOCAL_PATH,
    DEFAULT_INSTANCE_TYPE,
    GPU_INSTANCE_TYPES,
    HYPERPARAMETERS_BY_NAME,
)

CREATE_TRAINING_JOB_SYNC = "arn:aws:states:::sagemaker:createTrainingJob.sync"
SYNC_EVENTS_RULE = "StepFunctionsGetEventsForSageMakerTrainingJobsRule"
"""The EventBridge rule Step Functions manages in the account to learn when a training job ends."""
TRANSIENT_SAGEMAKER_ERRORS = (
    "SageMaker.AmazonSageMakerException",
    "SageMaker.ResourceLimitExceededException",
    "SageMaker.ThrottlingException",
)
CAPACITY_ERROR_MARKER = "CapacityError"
FAILED_STATUSES = ("FAILED", "TIMED_OUT", "ABORTED")

# Hyperparameters the workflow sets from validated input fields (contract names), plus the checkpoint directory.
MANAGED_HYPERPARAMETERS = ("precision", "batch_size", "seq_length", "activation_checkpointing")
"""Always sent. ``num_layers`` is sent too when the execution (or the defaults) give one."""
CHECKPOINT_DIR_HYPERPARAMETER = "checkpoint_dir"


def _default(name: str) -> Any:
    return HYPERPARAMETERS_BY_NAME[name].default


@dataclass(frozen=True)
class WorkflowDefaults:
    """The value of every execution-input field that an execution leaves out (trainer settings from the
    contract). ``num_layers`` None means the trainer's model preset decides the depth (``model_preset`` in
    ``hyperparameters``, default 1b)."""

    precision: str = _default("precision")
    num_layers: int | None = None
    batch_size: int = _default("batch_size")
    seq_length: int = _default("seq_length")
    activation_checkpointing: bool = _default("activation_checkpointing")
    instance_type: str = DEFAULT_INSTANCE_TYPE
    instance_count: int = 1
    training_plan_arn: str | None = None
    use_spot: bool = False
    max_runtime_seconds: int = 24 * 3600
    max_wait_seconds: int | None = None
    hyperparameters: Mapping[str, str] = field(default_factory=dict)
    job_name_prefix: str = "blackwell-training"

    def as_input(self) -> dict[str, Any]:
        values = asdict(self)
        values["hyperparameters"] = dict(self.hyperparameters)
        return values


class TrainingWorkflow(Construct):
    """The training workflow: validation, launch with capacity retries, summary, logging, alarm, notifications.

    All props are keyword-only.

    :param image_uri: the training image (``<account>.dkr.ecr.<region>.amazonaws.com/<repo>:<tag>``).
    :param execution_role: the role the jobs run as: a ``SageMakerExecutionRole`` or any ``iam.IRole``. The state
        machine may pass it to SageMaker only.
    :param checkpoint_bucket: the ``CheckpointBucket`` (its ``checkpoints/`` and ``output/`` prefixes are used).
        Give either this or ``bucket``.
    :param bucket: an existing bucket instead, with ``checkpoint_prefix`` (default ``checkpoints/``) and
        ``output_prefix`` (default ``output/``). The execution role must already be allowed to use them.
    :param train_data_prefix: a key prefix of pre-tokenized data to mount as the ``train`` channel. Default: none
        (the trainer's synthetic data).
    :param defaults: ``WorkflowDefaults`` for every input field. Default: ``WorkflowDefaults()``.
    :param allowed_instance_types: instance types an execution may ask for. Default: every type in
        ``training.contract.GPU_INSTANCE_TYPES``.
    :param max_instance_count: largest ``instance_count`` an execution may ask for (1 to 64). Default 4.
    :param max_capacity_retries: relaunches after a ``CapacityError`` (0 to 20). Default 3.
    :param capacity_retry_wait: wait before each relaunch (at least 1 second). Default 10 minutes.
    :param max_pending_time: ``MaxPendingTimeInSeconds`` for training-plan jobs (2 hours to 28 days). Default
        2 days.
    :param state_machine_timeout: bound of a whole execution (1 hour to 365 days); ``max_runtime_seconds`` may
        not exceed it. Default 7 days.
    :param volume_size_gb: EBS volume per instance (1 to 16384). Default 512.
    :param internal_retry_attempts: ``RetryStrategy.MaximumRetryAttempts`` for SageMaker internal errors (1 to
        30). Default 2.
    :param vpc: run the jobs in this VPC. Default: no VPC.
    :param subnets: subnets in ``vpc``. Default: its private subnets with egress.
    :param security_groups: security groups of the jobs. Default: one is created that lets the nodes talk to
        each other.
    :param output_kms_key: customer managed key for the model artifacts. Default: the bucket's encryption.
    :param volume_kms_key: customer managed key for the training volumes. Default: AWS managed.
    :param notification_topic: an SNS topic told when an execution succeeds, fails, times out or is aborted (its
        key policy, if encrypted, must let ``events.amazonaws.com`` and ``cloudwatch.amazonaws.com`` use it).
    :param notifications: create an encrypted (KMS, rotation on) topic for that. Default False.
    :param event_pattern: start an execution for each event matching this pattern, with the event's ``detail``
        as input. Default: no trigger.
    :param event_bus: the bus of ``event_pattern``. Default: the account's default bus.
    :param log_retention: retention of the execution log group. Default six months.
    :param state_machine_name: physical name. Default: generated.
    :param tags: tags for the workflow's resources and every training job. Default: none.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        image_uri: str,
        execution_role: SageMakerExecutionRole | iam.IRole,
        checkpoint_bucket: CheckpointBucket | None = None,
        bucket: s3.IBucket | None = None,
        checkpoint_prefix: str | None = None,
        output_prefix: str | None = None,
        train_data_prefix: str | None = None,
        defaults: WorkflowDefaults | None = None,
        allowed_instance_types: Sequence[str] | None = None,
        max_instance_count: int | None = None,
        max_capacity_retries: int | None = None,
        capacity_retry_wait: Duration | None = None,
        max_pending_time: Duration | None = None,
        state_machine_timeout: Duration | None = None,
        volume_size_gb: int | None = None,
        internal_retry_attempts: int | None = None,
        vpc: ec2.IVpc | None = None,
        subnets: ec2.SubnetSelection | None = None,
        security_groups: Sequence[ec2.ISecurityGroup] | None = None,
        output_kms_key: kms.IKey | None = None,
        volume_kms_key: kms.IKey | None = None,
        notification_topic: sns.ITopic | None = None,
        notifications: bool = False,
        event_pattern: events.EventPattern | None = None,
        event_bus: events.IEventBus | None = None,
        log_retention: logs.RetentionDays | None = None,
        state_machine_name: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)

        # ---- props ------------------------------------------------------------------------------------------
        if not isinstance(image_uri, str) or not image_uri:
            raise ValueError("TrainingWorkflow: image_uri must be a non-empty image URI")
        if (checkpoint_bucket is None) == (bucket is None):
            raise ValueError("TrainingWorkflow: give exactly one of checkpoint_bucket or bucket")
        if checkpoint_bucket is not None:
            if checkpoint_prefix is not None or output_prefix is not None:
                raise ValueError(
                    "TrainingWorkflow: checkpoint_prefix and output_prefix go with bucket; a checkpoint_bucket "
                    "brings its own prefixes"
                )
            self.bucket: s3.IBucket = checkpoint_bucket.bucket
            checkpoint_prefix = checkpoint_bucket.checkpoint_prefix
            output_prefix = checkpoint_bucket.output_prefix
        else:
            assert bucket is not None
            self.bucket = bucket
            checkpoint_prefix = _prefix("checkpoint_prefix", checkpoint_prefix or CHECKPOINT_PREFIX)
            output_prefix = _prefix("output_prefix", output_prefix or OUTPUT_PREFIX)
        if train_data_prefix is not None:
            train_data_prefix = _prefix("train_data_prefix", train_data_prefix)
        self.execution_role: iam.IRole = _role_of(execution_role)

        allowed = (
            tuple(allowed_instance_types) if allowed_instance_types is not None else tuple(GPU_INSTANCE_TYPES)
        )
        unknown = [t for t in allowed if t not in GPU_INSTANCE_TYPES]
        if not allowed or unknown or len(set(allowed)) != len(allowed):
            raise ValueError(
                "TrainingWorkflow: allowed_instance_types must be distinct names from "
                f"training.contract.GPU_INSTANCE_TYPES ({', '.join(GPU_INSTANCE_TYPES)}); got {list(allowed)}"
            )
        max_count = _int_in("max_instance_count", max_instance_count, 4, 1, 64)
        retries = _int_in("max_capacity_retries", max_capacity_retries, 3, 0, 20)
        retry_wait = _seconds_in("capacity_retry_wait", capacity_retry_wait, 600, 1, 365 * 86400)
        pending = _seconds_in(
            "max_pending_time", max_pending_time, 2 * 86400, 7200, MAX_RUNTIME_SECONDS_LIMIT
        )
        timeout = _seconds_in("state_machine_timeout", state_machine_timeout, 7 * 86400, 3600, 365 * 86400)
        volume = _int_in("volume_size_gb", volume_size_gb, 512, 1, 16384)
        internal_retries = _int_in("internal_retry_attempts", internal_retry_attempts, 2, 1, 30)
        if vpc is None and (subnets is not None or security_groups is not None):
            raise ValueError("TrainingWorkflow: subnets and security_groups need vpc")
        if event_bus is not None and event_pattern is None:
            raise ValueError("TrainingWorkflow: event_bus was given without event_pattern (nothing to match)")
        tags = dict(tags or {})

        self.fields = input_fields(
            allowed_instance_types=allowed,
            max_instance_count=max_count,
            max_runtime_seconds=min(MAX_RUNTIME_SECONDS_LIMIT, timeout),
        )
        self.defaults = defaults or WorkflowDefaults()
        self._check_defaults(self.defaults, region=stack.region)
        self.allowed_instance_types = allowed
        self.max_instance_count = max_count
        self.max_capacity_retries = retries
        self.image_uri = image_uri

        vpc_config = self._vpc_config(vpc, subnets, security_groups)
        launch_params = training_job_request(
            role_arn=self.execution_role.role_arn,
            image_uri=image_uri,
            bucket_name=self.bucket.bucket_name,
            checkpoint_prefix=checkpoint_prefix,
            output_prefix=output_prefix,
            internal_retry_attempts=internal_retries,
            tags=job_tags(self.node.path, tags),
            output_kms_key_arn=output_kms_key.key_arn if output_kms_key is not None else None,
            vpc_config=vpc_config,
            train_data_prefix=train_data_prefix,
        )
        resources = resource_config(
            volume_size_gb=volume,
            volume_kms_key_arn=volume_kms_key.key_arn if volume_kms_key is not None else None,
        )

        # ---- states -----------------------------------------------------------------------------------------
        apply_defaults, merge = self._input_states()
        self._launch_loop(launch_params, retries, retry_wait)
        mode = self._capacity_states(resources, pending)
        definition = self._input_checks(stack, allowed, mode, apply_defaults, merge)

        # ---- state machine ----------------------------------------------------------------------------------
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=log_retention or logs.RetentionDays.SIX_MONTHS,
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=state_machine_name,
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            timeout=Duration.seconds(timeout),
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True
            ),
            comment="Launch and monitor one SageMaker training job per execution (see README)",
        )
        self._grant_sagemaker(stack, execution_role, volume_kms_key, output_kms_key)

        self._alarm_and_notifications(stack, notification_topic, notifications)
        self._trigger(event_pattern, event_bus)

        for key_name, value in tags.items():
            Tags.of(self).add(key_name, value)

    def _vpc_config(
        self,
        vpc: ec2.IVpc | None,
        subnets: ec2.SubnetSelection | None,
        security_groups: Sequence[ec2.ISecurityGroup] | None,
    ) -> dict[str, Any] | None:
        """``VpcConfig`` of the jobs (None without ``vpc``); creates the nodes' security group if none given."""
        self.security_groups: list[ec2.ISecurityGroup] = list(security_groups or [])
        vpc_config: dict[str, Any] | None = None
        if vpc is not None:
            if not self.security_groups:
                group = ec2.SecurityGroup(
                    self,
                    "JobSecurityGroup",
                    vpc=vpc,
                    description="Training job nodes: talk to each other (NCCL/EFA) and out to AWS APIs",
                    allow_all_outbound=True,
                )
                group.add_ingress_rule(group, ec2.Port.all_traffic(), "Training nodes talk to each other")
                self.security_groups = [group]
            vpc_config = {
                "SecurityGroupIds": [g.security_group_id for g in self.security_groups],
                "Subnets": vpc.select_subnets(
                    **(
                        {"subnet_type": ec2.SubnetType.PRIVATE_WITH_EGRESS}
                        if subnets is None
                        else _subnet_selection_kwargs(subnets)
                    )
                ).subnet_ids,
            }
        return vpc_config

    def _input_states(self) -> tuple[sfn.Pass, sfn.Pass]:
        """The first states: keep the input next to the defaults, then merge it over them."""
        result_defaults: dict[str, Any] = {
            "TrainingJobName": None,
            "TrainingJobStatus": None,
            "TrainingTimeInSeconds": None,
            "BillableTimeInSeconds": None,
            "ModelArtifacts": {"S3ModelArtifacts": None},
            "FinalMetricDataList": [],
        }
        failure_defaults = {
            "TrainingJobName": "(unknown)",
            "TrainingJobStatus": "Failed",
            "FailureReason": "(SageMaker gave no FailureReason)",
        }
        apply_defaults = sfn.Pass(
            self,
            "Apply defaults",
            comment="Keep the execution input next to the defaults (null means 'not set').",
            parameters={
                "defaults": _with_nulls(self.defaults.as_input()),
                "input.$": "$",
            },
        )
        merge = sfn.Pass(
            self,
            "Merge input over defaults",
            parameters={
                "config.$": "States.JsonMerge($.defaults, $.input, false)",
                "launch_count": 1,
                "result_defaults": _with_nulls(result_defaults),
                "failure_defaults": _with_nulls(failure_defaults),
            },
        )
        return apply_defaults, merge

    def _launch_loop(self, launch_params: dict[str, Any], retries: int, retry_wait: int) -> None:
        """The launch loop: launch (``self.launch``), capacity relaunch, failure and summary states."""
        summarize = sfn.Pass(
            self,
            "Summarize",
            comment="A compact, readable result.",
            parameters={
                "job_name.$": "$.job.TrainingJobName",
                "status.$": "$.job.TrainingJobStatus",
                "training_seconds.$": "$.job.TrainingTimeInSeconds",
                "billable_seconds.$": "$.job.BillableTimeInSeconds",
                "model_artifacts.$": "$.job.ModelArtifacts.S3ModelArtifacts",
                "checkpoint_uri.$": "$.job.CheckpointConfig.S3Uri",
                "final_metrics.$": "$.job.FinalMetricDataList",
                "image_uri.$": "$.job.AlgorithmSpecification.TrainingImage",
                "instance_type.$": "$.config.instance_type",
                "instance_count.$": "$.config.instance_count",
                "launches.$": "$.launch_count",
            },
        ).next(sfn.Succeed(self, "Training job completed"))
        normalize_result = sfn.Pass(
            self,
            "Normalize result",
            parameters={
                "job.$": "States.JsonMerge($.result_defaults, $.job, false)",
                "config.$": "$.config",
                "launch_count.$": "$.launch_count",
            },
        ).next(summarize)
        self.launch = sfn.CustomState(
            self,
            "Run training job",
            state_json={
                "Type": "Task",
                "Comment": "CreateTrainingJob and wait for it to end (stopping the execution stops the job).",
                "Resource": CREATE_TRAINING_JOB_SYNC,
                "Parameters": launch_params,
                "ResultPath": "$.job",
            },
        )
        self.launch.add_retry(
            errors=list(TRANSIENT_SAGEMAKER_ERRORS),
            interval=Duration.seconds(15),
            max_attempts=5,
            backoff_rate=2,
            max_delay=Duration.minutes(5),
            jitter_strategy=sfn.JitterType.FULL,
        )

        launch_failed = sfn.Fail(
            self,
            "Launch failed",
            comment="CreateTrainingJob was refused, or the integration failed in another way.",
            error="LaunchFailed",
            cause_path=format_intrinsic("{}: {}", "$.failure.Error", "$.failure.Cause"),
        )
        job_failed = sfn.Fail(
            self,
            "Training job failed",
            error="TrainingJobFailed",
            cause_path=format_intrinsic(
                "Training job {} ended {}: {}",
                "$.failed_job.TrainingJobName",
                "$.failed_job.TrainingJobStatus",
                "$.failed_job.FailureReason",
            ),
        )
        no_capacity = sfn.Fail(
            self,
            "No capacity",
            error="CapacityError",
            cause_path=format_intrinsic(
                "Gave up after {} launches without capacity; last job {}: {}",
                "$.launch_count",
                "$.failed_job.TrainingJobName",
                "$.failed_job.FailureReason",
            ),
        )
        count_launch = sfn.Pass(
            self,
            "Count launch",
            parameters={"value.$": "States.MathAdd($.launch_count, 1)"},
            result_path="$.launch_count_next",
        )
        store_count = sfn.Pass(
            self, "Store launch count", input_path="$.launch_count_next.value", result_path="$.launch_count"
        )
        wait = sfn.Wait(
            self,
            "Wait for capacity",
            comment="Same execution name, so the relaunch uses the same checkpoint prefix and resumes.",
            time=sfn.WaitTime.duration(Duration.seconds(retry_wait)),
        )
        wait.next(count_launch).next(store_count).next(self.launch)
        capacity = sfn.Choice(self, "Capacity error?")
        is_capacity = sfn.Condition.string_matches("$.failed_job.FailureReason", f"*{CAPACITY_ERROR_MARKER}*")
        capacity.when(
            sfn.Condition.and_(is_capacity, sfn.Condition.number_less_than_equals("$.launch_count", retries)),
            wait,
        )
        capacity.when(is_capacity, no_capacity)
        capacity.otherwise(job_failed)
        parse_failure = sfn.Pass(
            self,
            "Read failed job",
            parameters={
                "value.$": "States.JsonMerge($.failure_defaults, States.StringToJson($.failure.Cause), false)"
            },
            result_path="$.failed_job_raw",
        )
        pick_failure = sfn.Pass(
            self, "Keep failed job", input_path="$.failed_job_raw.value", result_path="$.failed_job"
        )
        inspect_failure = sfn.Choice(self, "Job description in cause?")
        inspect_failure.when(
            sfn.Condition.and_(
                sfn.Condition.is_string("$.failure.Cause"),
                sfn.Condition.string_matches("$.failure.Cause", "{*"),
            ),
            parse_failure.next(pick_failure).next(capacity),
        )
        inspect_failure.otherwise(launch_failed)
        self.launch.add_catch(inspect_failure, errors=["States.TaskFailed"], result_path="$.failure")
        self.launch.add_catch(launch_failed, errors=["States.ALL"], result_path="$.failure")
        self.launch.next(normalize_result)

    def _capacity_states(self, resources: dict[str, Any], pending: int) -> sfn.Choice:
        """Capacity mode, node count and hyperparameter states that fill ``$.launch`` before the launch."""

        def build_hyperparameters(state_name: str, names: Sequence[str]) -> sfn.Chain:
            return sfn.Pass(
                self,
                state_name,
                comment="Trainer settings as strings under the contract's names.",
                parameters={
                    **{
                        f"{name}.$": (
                            f"$.config.{name}"
                            if HYPERPARAMETERS_BY_NAME[name].kind == "choice"
                            else f"States.JsonToString($.config.{name})"
                        )
                        for name in names
                    },
                    CHECKPOINT_DIR_HYPERPARAMETER: CHECKPOINT_LOCAL_PATH,
                },
                result_path="$.launch.hyperparameters",
            ).next(self.launch)

        # num_layers is sent only when given: left out, the trainer's model preset decides the depth.
        hyperparameters = sfn.Choice(self, "num_layers given?")
        hyperparameters.when(
            sfn.Condition.is_not_null("$.config.num_layers"),
            build_hyperparameters("Build hyperparameters", (*MANAGED_HYPERPARAMETERS, "num_layers")),
        )
        hyperparameters.otherwise(
            build_hyperparameters("Build hyperparameters (preset depth)", MANAGED_HYPERPARAMETERS)
        )
        multi_node = sfn.Choice(self, "Several instances?")
        multi_node.when(
            sfn.Condition.number_greater_than("$.config.instance_count", 1),
            sfn.Pass(
                self,
                "Encrypt traffic between nodes",
                result=sfn.Result.from_boolean(True),
                result_path="$.launch.encrypt_inter_node",
            ).next(hyperparameters),
        )
        multi_node.otherwise(
            sfn.Pass(
                self,
                "One node",
                result=sfn.Result.from_boolean(False),
                result_path="$.launch.encrypt_inter_node",
            ).next(hyperparameters)
        )

        def capacity_pass(name: str, extra_resource: dict, extra_stopping: dict, spot: bool) -> sfn.Pass:
            return sfn.Pass(
                self,
                name,
                parameters={
                    "resource_config": {**resources, **extra_resource},
                    "stopping_condition": {
                        "MaxRuntimeInSeconds.$": "$.config.max_runtime_seconds",
                        **extra_stopping,
                    },
                    "spot": spot,
                },
                result_path="$.launch",
            )

        mode = sfn.Choice(self, "Capacity mode")
        mode.when(
            sfn.Condition.not_(sfn.Condition.is_null("$.config.training_plan_arn")),
            capacity_pass(
                "Training plan capacity",
                {"TrainingPlanArn.$": "$.config.training_plan_arn"},
                {"MaxPendingTimeInSeconds": pending},
                False,
            ).next(multi_node),
        )
        mode.when(
            sfn.Condition.boolean_equals("$.config.use_spot", True),
            capacity_pass(
                "Managed spot capacity", {}, {"MaxWaitTimeInSeconds.$": "$.config.max_wait_seconds"}, True
            ).next(multi_node),
        )
        mode.otherwise(capacity_pass("On-demand capacity", {}, {}, False).next(multi_node))

        return mode

    def _input_checks(
        self,
        stack: Stack,
        allowed: tuple[str, ...],
        mode: sfn.Choice,
        apply_defaults: sfn.Pass,
        merge: sfn.Pass,
    ) -> sfn.Chain:
        """The definition: defaults, merge, field-name check, field validation, then ``mode``."""
        validation = ValidationStates(
            self, fields=self.fields, region=stack.region, allowed_instance_types=allowed
        ).chain(mode)
        names = sfn.Pass(
            self,
            "Inspect field names",
            parameters={"known": {f"{f.name}.$": f"$.config.{f.name}" for f in self.fields}},
            result_path="$.probe.names",
        )
        count_names = sfn.Pass(
            self,
            "Count fields",
            comment="Same number of ','-separated parts only when the input has no other top-level field.",
            parameters={
                "known.$": "States.ArrayLength(States.StringSplit(States.JsonToString($.probe.names.known), ','))",
                "given.$": "States.ArrayLength(States.StringSplit(States.JsonToString($.config), ','))",
            },
            result_path="$.probe.names",
        )
        unknown_fields = sfn.Choice(self, "Check field names")
        unknown_fields.when(
            sfn.Condition.not_(
                sfn.Condition.number_equals_json_path("$.probe.names.given", "$.probe.names.known")
            ),
            sfn.Fail(
                self,
                "Invalid field name",
                error="InvalidInput",
                cause="input: unknown field; allowed fields: " + ", ".join(f.name for f in self.fields),
            ),
        )
        unknown_fields.otherwise(validation)
        definition = apply_defaults.next(merge).next(names).next(count_names).next(unknown_fields)
        return definition

    def _alarm_and_notifications(
        self, stack: Stack, notification_topic: sns.ITopic | None, notifications: bool
    ) -> None:
        """The executions-not-succeeded alarm, the notification topic and the execution-ended rule."""
        sm = self.state_machine
        self.alarm = cloudwatch.Alarm(
            self,
            "ExecutionsNotSucceeded",
            alarm_description="A training workflow execution failed, timed out or was aborted",
            metric=cloudwatch.MathExpression(
                expression="failed + timedOut + aborted",
                using_metrics={
                    "failed": sm.metric_failed(statistic="Sum"),
                    "timedOut": sm.metric_timed_out(statistic="Sum"),
                    "aborted": sm.metric_aborted(statistic="Sum"),
                },
                period=Duration.minutes(5),
                label="Executions not succeeded",
            ),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        self.notification_topic: sns.ITopic | None = notification_topic
        self.notification_key: kms.IKey | None = None
        if notification_topic is None and notifications:
            key = kms.Key(
                self,
                "NotificationKey",
                description="Encrypts the training workflow notifications",
                enable_key_rotation=True,
            )
            key.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="AllowEventBridgeAndCloudWatchToPublish",
                    principals=[
                        iam.ServicePrincipal("events.amazonaws.com"),
                        iam.ServicePrincipal("cloudwatch.amazonaws.com"),
                    ],
                    actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                    resources=["*"],
                    conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
                )
            )
            self.notification_key = key
            self.notification_topic = sns.Topic(
                self,
                "Notifications",
                display_name="Training workflow",
                master_key=key,
                enforce_ssl=True,
            )
        if self.notification_topic is not None:
            self.alarm.add_alarm_action(cloudwatch_actions.SnsAction(self.notification_topic))
            # An EventBridge rule (not sns:Publish states) so that timeouts and aborts, which never reach a
            # state of the machine, are reported too.
            self.status_rule = events.Rule(
                self,
                "ExecutionEnded",
                description="Tell the notification topic when a training workflow execution ends",
                event_pattern=events.EventPattern(
                    source=["aws.states"],
                    detail_type=["Step Functions Execution Status Change"],
                    detail={
                        "stateMachineArn": [sm.state_machine_arn],
                        "status": ["SUCCEEDED", *FAILED_STATUSES],
                    },
                ),
                targets=[
                    targets.SnsTopic(
                        self.notification_topic,
                        message=events.RuleTargetInput.from_object(
                            {
                                "execution": events.EventField.from_path("$.detail.name"),
                                "status": events.EventField.from_path("$.detail.status"),
                                "error": events.EventField.from_path("$.detail.error"),
                                "cause": events.EventField.from_path("$.detail.cause"),
                                "output": events.EventField.from_path("$.detail.output"),
                                "executionArn": events.EventField.from_path("$.detail.executionArn"),
                            }
                        ),
                    )
                ],
            )

    def _trigger(self, event_pattern: events.EventPattern | None, event_bus: events.IEventBus | None) -> None:
        """The EventBridge rule that starts an execution per matching event (``self.trigger_rule``)."""
        sm = self.state_machine
        self.trigger_rule: events.Rule | None = None
        if event_pattern is not None:
            self.trigger_rule = events.Rule(
                self,
                "Trigger",
                description="Start a training workflow execution with the event's detail as input",
                event_bus=event_bus,
                event_pattern=event_pattern,
                targets=[
                    targets.SfnStateMachine(sm, input=events.RuleTargetInput.from_event_path("$.detail"))
                ],
            )

    # ------------------------------------------------------------------------------------------------------------
    @property
    def state_machine_arn(self) -> str:
        return self.state_machine.state_machine_arn

    def _check_defaults(self, defaults: WorkflowDefaults, *, region: str | None) -> None:
        values = defaults.as_input()
        concrete_region = None if region is None or re.search(r"\$\{Token", region) else region
        for f in self.fields:
            problem = check_value(f, values[f.name], region=concrete_region)
            if problem:
                raise ValueError(f"TrainingWorkflow: defaults.{problem}")
        problem = precision_problem(defaults.precision, defaults.instance_type)
        if problem:
            raise ValueError(
                f"TrainingWorkflow: defaults.{problem}; got instance_type {defaults.instance_type}"
            )
        if defaults.use_spot and defaults.training_plan_arn is not None:
            raise ValueError(
                "TrainingWorkflow: defaults.use_spot cannot be combined with defaults.training_plan_arn"
            )
        if defaults.max_wait_seconds is not None and not defaults.use_spot:
            raise ValueError(
                "TrainingWorkflow: defaults.max_wait_seconds is only allowed with defaults.use_spot"
            )
        if defaults.max_wait_seconds is not None and defaults.max_wait_seconds < defaults.max_runtime_seconds:
            raise ValueError(
                "TrainingWorkflow: defaults.max_wait_seconds must be >= defaults.max_runtime_seconds"
            )
        if len(defaults.job_name_prefix) > JOB_NAME_PREFIX_MAX_LENGTH:
            raise ValueError(
                f"TrainingWorkflow: defaults.job_name_prefix must be at most {JOB_NAME_PREFIX_MAX_LENGTH} characters"
            )

    def _grant_sagemaker(
        self,
        stack: Stack,
        execution_role: SageMakerExecutionRole | iam.IRole,
        volume_kms_key: kms.IKey | None,
        output_kms_key: kms.IKey | None,
    ) -> None:
        """What ``createTrainingJob.sync`` needs (CustomState grants nothing by itself)."""
        role = self.state_machine.role
        training_jobs = stack.format_arn(
            service="sagemaker",
            resource="training-job",
            resource_name="*",
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="RunTrainingJobs",
                actions=[
                    "sagemaker:CreateTrainingJob",
                    "sagemaker:DescribeTrainingJob",
                    "sagemaker:StopTrainingJob",
                    "sagemaker:AddTags",
                    "sagemaker:ListTags",
                ],
                resources=[training_jobs],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="SyncIntegrationEventsRule",
                actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
                resources=[
                    stack.format_arn(service="events", resource="rule", resource_name=SYNC_EVENTS_RULE)
                ],
            )
        )
        if isinstance(execution_role, SageMakerExecutionRole):
            execution_role.grant_pass_role(role)
        else:
            iam.Grant.add_to_principal(
                grantee=role,
                actions=["iam:PassRole"],
                resource_arns=[execution_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": SAGEMAKER_SERVICE}},
            )
        if volume_kms_key is not None:
            for grantee in (role, self.execution_role):
                volume_kms_key.grant(grantee, "kms:CreateGrant", "kms:DescribeKey")
        if output_kms_key is not None:
            # SSE-KMS uploads of the model artifacts (named actions: no kms:ReEncrypt*/GenerateDataKey* wildcards).
            output_kms_key.grant(
                self.execution_role, "kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"
            )

        scope = policy_scope(role)
        acknowledge(
            scope,
            f"IAM5[Resource::{rendered(self, training_jobs)}]",
            "Training job names are generated per execution (<prefix>-<UUID>), so the state machine may "
            "create, describe, stop and tag only training jobs of this account and region.",
        )
        acknowledge(
            scope,
            "IAM5[Resource::*]",
            "Step Functions log delivery (logs:*LogDelivery, DescribeLogGroups, ...) and X-Ray "
            "(PutTraceSegments, PutTelemetryRecords, GetSampling*) accept only Resource '*'.",
        )


JSON_NULL = "States.StringToJson('null')"
"""A JSON null in Parameters (CDK drops ``None`` values)."""


def _with_nulls(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as Parameters: ``None`` becomes ``"<key>.$": States.StringToJson('null')``."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        if item is None:
            out[f"{key}.$"] = JSON_NULL
        elif isinstance(item, Mapping) and item:
            out[key] = _with_nulls(item)
        else:
            out[key] = item
    return out


def _role_of(execution_role: SageMakerExecutionRole | iam.IRole) -> iam.IRole:
    if isinstance(execution_role, SageMakerExecutionRole):
        return execution_role.role
    if hasattr(execution_role, "role_arn") and hasattr(execution_role, "grant_pass_role"):
        return execution_role
    raise ValueError("TrainingWorkflow: execution_role must be a SageMakerExecutionRole or an iam.IRole")


def _prefix(name: str, value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9!_.()-]+(/[A-Za-z0-9!_.()-]+)*/", value or ""):
        raise ValueError(
            f"TrainingWorkflow: {name} must be a relative S3 key prefix ending in '/' (letters, digits, "
            f"!_.()- and '/'), such as 'checkpoints/'; got {value!r}"
        )
    return value


def _int_in(name: str, value: int | None, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"TrainingWorkflow: {name} must be an integer in [{low}, {high}]; got {value!r}")
    return value


def _seconds_in(name: str, value: Duration | None, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if not isinstance(value, Duration):
        raise ValueError(f"TrainingWorkflow: {name} must be a Duration; got {value!r}")
    seconds = int(value.to_seconds())
    if not low <= seconds <= high:
        raise ValueError(f"TrainingWorkflow: {name} must be between {low} and {high} seconds; got {seconds}")
    return seconds


def _subnet_selection_kwargs(selection: ec2.SubnetSelection) -> dict[str, Any]:
    return {
        key: getattr(selection, key)
        for key in (
            "availability_zones",
            "one_per_az",
            "subnet_filters",
            "subnet_group_name",
            "subnet_type",
            "subnets",
        )
        if getattr(selection, key, None) is not None
    }
