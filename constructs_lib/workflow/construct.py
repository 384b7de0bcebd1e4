"""``TrainingWorkflow``: a Step Functions state machine that launches and monitors one SageMaker training job.

One execution = one validated, cost-bounded, monitored training job. The execution input (snake_case, every
field optional) is decided before anything launches by the workflow's ``RequestValidator`` Lambda function
(``training.request.decision``: every field, the trainer's settings and rules from the contract, SageMaker's
limits, the data location, ``resume_from``, the ``init_from`` model folder's config.json), turned into a ``CreateTrainingJob`` request for the capacity mode (on-demand,
Flexible Training Plan or managed spot), and run with the ``createTrainingJob.sync`` integration. A refused request
ends at once (``launch_retry``); a job that fails for lack of capacity is relaunched under a new name with the same
checkpoint prefix (so it resumes), a bounded number of times; any other failure ends the execution with the job
name and SageMaker's ``FailureReason``. Success ends with a summary; with an ``evaluate`` block, an evaluation job
(lm-evaluation-harness on the run's Hugging Face export, network-isolated, the same launch loop:
``evaluation_states``) runs first and its scores join the summary; ``evaluate.training_job`` evaluates a finished
run without training (docs/evaluation.md). Checkpoints live under
``<checkpoint_prefix><run_segment>/<execution name>/``: the per-workflow segment keeps workflows sharing a bucket
apart.

Everything is JSONPath (moto's engine, used by the tests, cannot evaluate JSONata).

This module checks the props and composes the parts of this package, each a function or construct that takes what
it uses and returns what it builds: the request (``request``), what an execution may ask for (``rules``, from the
``defaults``), its check (the Lambda function ``request_function`` running ``request_check``, the states that call
it ``request_states``), the states (``states``, ``evaluation_states``, ``launch_retry``), the jobs' network
(``job_network``), observability (``observability``, ``dashboard``), and its IAM (``permissions``); ``props`` checks
the props. Only this module holds the workflow's attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aws_cdk import Duration, RemovalPolicy, Stack, Tags
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from constructs_lib._shared.log_keys import keyed_log_group
from constructs_lib.identity.execution_role import SageMakerExecutionRole
from constructs_lib.storage.checkpoint_bucket import (
    CHECKPOINT_PREFIX,
    OUTPUT_PREFIX,
    TUNING_PREFIX,
    CheckpointBucket,
)
from constructs_lib.workflow.dashboard import dashboard_url, training_dashboard
from constructs_lib.workflow.defaults import WorkflowDefaults
from constructs_lib.workflow.evaluation_states import evaluation_states
from constructs_lib.workflow.job_network import vpc_config as job_vpc_config
from constructs_lib.workflow.observability import alarm_and_notifications, trigger
from constructs_lib.workflow.permissions import (
    data_prefixes,
    grant_data_sources,
    grant_mlflow,
    grant_remote_debug,
    grant_sagemaker,
    grant_tuning_reads,
    trust_only_this_state_machine,
)
from constructs_lib.workflow.props import (
    checked_remote_debug,
    dashboard_prefixes,
    int_in,
    key_prefix,
    mlflow_arn,
    removal_and_isolation,
    role_of,
    run_segment_of,
    seconds_in,
    state_machine_name_of,
)
from constructs_lib.workflow.request import evaluation_job_request, resource_config, training_job_request
from constructs_lib.workflow.request_function import RequestValidator
from constructs_lib.workflow.request_states import decide_request_states
from constructs_lib.workflow.rules import request_rules
from constructs_lib.workflow.states import (
    CREATE_TRAINING_JOB_SYNC,
    capacity_states,
    launch_loop,
    prepare_state,
    training_summary,
)
from constructs_lib.workflow.tuning_states import TuningStorage, record_objects, report_objects, tuning_states
from training.contract.hardware import GPU_INSTANCE_TYPES
from training.request.rules import (
    MAX_RUNTIME_SECONDS_LIMIT,
    WORKFLOW_TAG,
    measurements_root,
)

__all__ = [
    "CREATE_TRAINING_JOB_SYNC",
    "TrainingWorkflow",
]
"""``CREATE_TRAINING_JOB_SYNC`` is ``states``'s, re-exported for the tests that read the definition."""


class TrainingWorkflow(Construct):
    """The training workflow: validation, launch with capacity retries, summary, logging, alarm, notifications.

    All props are keyword-only.

    :param image_uri: the training image (``<account>.dkr.ecr.<region>.amazonaws.com/<repo>:<tag>``).
    :param execution_role: the role the jobs run as: a ``SageMakerExecutionRole`` or any ``iam.IRole``. The state
        machine may pass it to SageMaker only.
    :param checkpoint_bucket: the ``CheckpointBucket`` (its ``checkpoints/`` and ``output/`` prefixes are used).
        Give either this or ``bucket``.
    :param bucket: an existing bucket instead, with ``checkpoint_prefix`` (default ``checkpoints/``),
        ``output_prefix`` (default ``output/``) and ``tuning_prefix`` (default ``tuning/``: where the workflow
        stores tuning measurements). The execution role must already be allowed to use the first two.
    :param train_data_prefix: a key prefix of the bucket with pre-tokenized data to mount as the ``train``
        channel when an execution gives no ``train_data_uri`` (added to ``data_sources``). Default: none (the
        trainer's synthetic data).
    :param data_sources: where an execution's ``train_data_uri``, ``init_from`` and ``evaluate.task_data_uri`` may
        point: ``s3://bucket/prefix/`` URIs or key prefixes of the bucket; the jobs' role is granted read on exactly
        these. Default ``("data/",)``.
    :param run_segment: the workflow's folder under the checkpoint prefix (letters, digits, ``_.-``): two
        workflows sharing a bucket must differ. Default: the construct path with ``/`` as ``-``.
    :param launch_retry_backoff: first wait before relaunching a throttled ``CreateTrainingJob`` (doubled each
        time, at most 5 minutes). Default 15 seconds.
    :param defaults: ``WorkflowDefaults`` for every input field. Default: ``WorkflowDefaults()``.
    :param allowed_instance_types: instance types an execution may ask for. Default: every type in
        ``training.contract.hardware.GPU_INSTANCE_TYPES``.
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
    :param volume_kms_key: customer managed key for the training volumes (``VolumeKmsKeyId``). SageMaker refuses it
        for instance types with NVMe instance storage (every type in ``GPU_INSTANCE_TYPES``; their storage is
        encrypted by the instance), so executions on those are refused. Default: none.
    :param max_keep_alive_seconds: the largest ``keep_alive_seconds`` an execution may ask for (a warm pool after
        the job, 0 to SageMaker's maximum read from botocore); 0 turns warm pools off. Default 3600.
    :param remote_debug: let executions ask for ``remote_debug`` (``RemoteDebugConfig``): grants the execution role
        exactly ``ssmmessages:CreateControlChannel``, ``CreateDataChannel``, ``OpenControlChannel`` and
        ``OpenDataChannel``. Not with ``network_isolation``. Default False (nothing granted).
    :param notification_topic: an SNS topic told when an execution succeeds, fails, times out or is aborted (its
        key policy, if encrypted, must let ``events.amazonaws.com`` and ``cloudwatch.amazonaws.com`` use it).
    :param notifications: create an encrypted topic for that (with ``encryption_key``, else a key created with
        rotation on). Only the workflow's own rule and alarm may publish to it (``aws:SourceArn``). Default False.
    :param encryption_key: customer managed key for the execution log group, the state machine's execution data
        (Step Functions ``EncryptionConfiguration``) and a created notification topic; its policy gets what
        CloudWatch Logs, Step Functions log delivery, EventBridge and CloudWatch alarms need (a no-op on an
        imported key, whose own policy must allow them). Default: AWS owned keys for logs and state machine.
    :param network_isolation: run the training jobs with ``EnableNetworkIsolation`` (no outbound network from the
        container; SageMaker still moves the data, checkpoints and output). Evaluation jobs always run with it,
        whatever this says. Default False.
    :param removal_policy: of the log group and a created notification key: ``RETAIN`` (default) or ``DESTROY``.
    :param event_pattern: start an execution for each event matching this pattern, with the event's ``detail``
        as input. Default: no trigger.
    :param event_bus: the bus of ``event_pattern``. Default: the account's default bus.
    :param log_retention: retention of the execution log group. Default six months.
    :param state_machine_name: physical name (1 to 80 of letters, digits, ``-`` and ``_``: the executions are
        logged to CloudWatch Logs, which Step Functions allows only for such names). Default: made from
        the construct path (``<stack><path><hash>``, the same at every deployment), so that the IAM conditions
        can name the exact state machine: its role's trust (``aws:SourceArn``) and the key's use
        (``kms:EncryptionContext:aws:states:stateMachineArn``).
    :param tags: tags for the workflow's resources and every training job. Default: none.
    :param dashboard: build a CloudWatch dashboard of the workflow (loss and val_loss, tokens/s, MFU, peak memory
        of its jobs, GPU and GPU-memory utilization per host, executions); ``dashboard_url`` is its address. Its job
        widgets find jobs by the words of ``defaults.job_name_prefix`` (CloudWatch search has no prefix match): an
        execution with another prefix is not on it, another workflow's job with the same words in a row is
        (``constructs_lib.workflow.dashboard``). Default True.
    :param dashboard_job_name_prefixes: further ``job_name_prefix`` values whose jobs the dashboard shows (those
        executions set themselves), at most 9. Only with ``dashboard``. Default: none.
    :param tensorboard: give every job a ``TensorBoardOutputConfig``: the trainer's event files go to
        ``s3://<bucket>/<output_prefix>tensorboard/<run_segment>/<execution name>/`` while it trains. Default True.
    :param mlflow_tracking_server_arn: a SageMaker managed MLflow tracking server (or MLflow app) ARN: the training
        jobs log their settings and metrics there (experiment: ``run_segment``; run: the execution name), and the
        execution role may call the ``sagemaker-mlflow`` actions the trainer uses on that ARN only. Needs network
        access (not with ``network_isolation``). Evaluation jobs, always network-isolated, log nothing there: their
        scores are in the summary, the job metrics (dashboard) and ``result``. Default: no MLflow.
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
        tuning_prefix: str | None = None,
        train_data_prefix: str | None = None,
        data_sources: Sequence[str] | None = None,
        run_segment: str | None = None,
        launch_retry_backoff: Duration | None = None,
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
        max_keep_alive_seconds: int | None = None,
        remote_debug: bool = False,
        notification_topic: sns.ITopic | None = None,
        notifications: bool = False,
        encryption_key: kms.IKey | None = None,
        network_isolation: bool = False,
        removal_policy: RemovalPolicy | None = None,
        event_pattern: events.EventPattern | None = None,
        event_bus: events.IEventBus | None = None,
        log_retention: logs.RetentionDays | None = None,
        state_machine_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        dashboard: bool = True,
        dashboard_job_name_prefixes: Sequence[str] = (),
        tensorboard: bool = True,
        mlflow_tracking_server_arn: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)

        # ---- props ------------------------------------------------------------------------------------------
        if not isinstance(image_uri, str) or not image_uri:
            raise ValueError("TrainingWorkflow: image_uri must be a non-empty image URI")
        if (checkpoint_bucket is None) == (bucket is None):
            raise ValueError("TrainingWorkflow: give exactly one of checkpoint_bucket or bucket")
        checkpoint_prefix, output_prefix, tuning_prefix = self._bucket_prefixes(
            checkpoint_bucket, bucket, (checkpoint_prefix, output_prefix, tuning_prefix)
        )
        self.measurements_prefix = measurements_root(tuning_prefix)
        """Where the workflow stores the tuning runs' measurement records (``<tuning_prefix>measurements/``)."""
        if train_data_prefix is not None:
            train_data_prefix = key_prefix("train_data_prefix", train_data_prefix)
        self.execution_role: iam.IRole = role_of(execution_role)

        allowed = (
            tuple(allowed_instance_types) if allowed_instance_types is not None else tuple(GPU_INSTANCE_TYPES)
        )
        unknown = [t for t in allowed if t not in GPU_INSTANCE_TYPES]
        if not allowed or unknown or len(set(allowed)) != len(allowed):
            raise ValueError(
                "TrainingWorkflow: allowed_instance_types must be distinct names from "
                f"training.contract.hardware.GPU_INSTANCE_TYPES ({', '.join(GPU_INSTANCE_TYPES)}); got {list(allowed)}"
            )
        max_count = int_in("max_instance_count", max_instance_count, 4, 1, 64)
        retries = int_in("max_capacity_retries", max_capacity_retries, 3, 0, 20)
        retry_wait = seconds_in("capacity_retry_wait", capacity_retry_wait, 600, 1, 365 * 86400)
        pending = seconds_in("max_pending_time", max_pending_time, 2 * 86400, 7200, MAX_RUNTIME_SECONDS_LIMIT)
        timeout = seconds_in("state_machine_timeout", state_machine_timeout, 7 * 86400, 3600, 365 * 86400)
        volume = int_in("volume_size_gb", volume_size_gb, 512, 1, 16384)
        internal_retries = int_in("internal_retry_attempts", internal_retry_attempts, 2, 1, 30)
        if vpc is None and (subnets is not None or security_groups is not None):
            raise ValueError("TrainingWorkflow: subnets and security_groups need vpc")
        if event_bus is not None and event_pattern is None:
            raise ValueError("TrainingWorkflow: event_bus was given without event_pattern (nothing to match)")
        tags = dict(tags or {})
        policy = removal_and_isolation(removal_policy, network_isolation)
        self.mlflow_tracking_server_arn = mlflow_arn(mlflow_tracking_server_arn, network_isolation)
        self.launch_retry_backoff = seconds_in("launch_retry_backoff", launch_retry_backoff, 15, 1, 300)
        self.run_segment = run_segment_of(run_segment, self.node.path)
        name = state_machine_name_of(state_machine_name, self)
        self.runs_prefix = f"{checkpoint_prefix}{self.run_segment}/"
        self.defaults = defaults or WorkflowDefaults()
        limits = (allowed, max_count, min(MAX_RUNTIME_SECONDS_LIMIT, timeout), retries)
        self.remote_debug = checked_remote_debug(remote_debug, network_isolation)
        self.request_rules, self.data_sources = request_rules(
            stack,
            self.bucket,
            self.run_segment,
            self.defaults,
            data_sources,
            train_data_prefix,
            checkpoint_prefix,
            limits,
            max_keep_alive_seconds=max_keep_alive_seconds,
            remote_debug=self.remote_debug,
            network_isolation=network_isolation,
            volume_kms_key=volume_kms_key is not None,
            workflow_path=self.node.path,
            tags=tags,
            mlflow_tracking_server_arn=self.mlflow_tracking_server_arn,
            image_uri=image_uri,
            tuning_prefix=tuning_prefix,
        )
        self.allowed_instance_types = allowed
        self.max_instance_count = max_count
        self.max_capacity_retries = retries
        self.image_uri = image_uri

        self.security_groups, vpc_config = job_vpc_config(self, vpc, subnets, security_groups)
        launch_params = self._launch_params(
            output_prefix, internal_retries, output_kms_key, vpc_config, network_isolation, tensorboard
        )
        resources = resource_config(
            volume_size_gb=volume,
            volume_kms_key_arn=volume_kms_key.key_arn if volume_kms_key is not None else None,
        )

        # ---- states -----------------------------------------------------------------------------------------
        self.encryption_key = encryption_key
        self.removal_policy = policy
        definition = self._definition(launch_params, resources, retries, retry_wait, pending, log_retention)

        # ---- state machine ----------------------------------------------------------------------------------
        self.log_group = self._log_group(stack, encryption_key, log_retention, policy)
        self.state_machine = self._state_machine(definition, name, timeout, encryption_key)
        trust_only_this_state_machine(self.state_machine, name)
        self._grant(execution_role, checkpoint_bucket, volume_kms_key, output_kms_key)
        self.dashboard_job_name_prefixes = dashboard_prefixes(dashboard_job_name_prefixes, dashboard)
        self._observability(notification_topic, notifications, event_pattern, event_bus, dashboard)
        if self.mlflow_tracking_server_arn is not None:
            grant_mlflow(self.execution_role, self.mlflow_tracking_server_arn)

        for key_name, value in tags.items():
            Tags.of(self).add(key_name, value)

    def _bucket_prefixes(
        self,
        checkpoint_bucket: CheckpointBucket | None,
        bucket: s3.IBucket | None,
        given: tuple[str | None, str | None, str | None],
    ) -> tuple[str, str, str]:
        """The bucket (``self.bucket``) and its checkpoint, output and tuning prefixes: a ``CheckpointBucket``'s
        own, or those given with ``bucket`` (defaults ``checkpoints/``, ``output/``, ``tuning/``)."""
        if checkpoint_bucket is not None:
            if any(prefix is not None for prefix in given):
                raise ValueError(
                    "TrainingWorkflow: checkpoint_prefix, output_prefix and tuning_prefix go with bucket; a "
                    "checkpoint_bucket brings its own prefixes"
                )
            self.bucket: s3.IBucket = checkpoint_bucket.bucket
            cb = checkpoint_bucket
            return cb.checkpoint_prefix, cb.output_prefix, cb.tuning_prefix
        assert bucket is not None
        self.bucket = bucket
        names = ("checkpoint_prefix", "output_prefix", "tuning_prefix")
        defaults = (CHECKPOINT_PREFIX, OUTPUT_PREFIX, TUNING_PREFIX)
        checkpoint, output, tuning = (
            key_prefix(name, prefix or default)
            for name, prefix, default in zip(names, given, defaults, strict=True)
        )
        return checkpoint, output, tuning

    def _grant(
        self,
        execution_role: SageMakerExecutionRole | iam.IRole,
        checkpoint_bucket: CheckpointBucket | None,
        volume_kms_key: kms.IKey | None,
        output_kms_key: kms.IKey | None,
    ) -> None:
        """The state machine's permissions, and the jobs' data sources and remote debugging (``permissions``)."""
        grant_sagemaker(
            self,
            role=self.state_machine.role,
            execution_role=execution_role,
            job_role=self.execution_role,
            validator_function=self.validator.function,
            max_keep_alive_seconds=self.request_rules.max_keep_alive_seconds,
            volume_kms_key=volume_kms_key,
            output_kms_key=output_kms_key,
        )
        grant_data_sources(
            self,
            data_sources=self.data_sources,
            bucket=self.bucket,
            job_role=self.execution_role,
            execution_role=execution_role,
            checkpoint_bucket=checkpoint_bucket,
        )
        if self.remote_debug:
            grant_remote_debug(self, self.execution_role)
        grant_tuning_reads(
            self,
            role=self.state_machine.role,
            bucket=self.bucket,
            report_objects=report_objects(self.bucket, self.runs_prefix),
            record_objects=record_objects(self.bucket, self.measurements_prefix),
        )

    def _launch_params(
        self,
        output_prefix: str,
        internal_retries: int,
        output_kms_key: kms.IKey | None,
        vpc_config: dict[str, Any] | None,
        network_isolation: bool,
        tensorboard: bool,
    ) -> dict[str, Any]:
        """The ``createTrainingJob.sync`` parameters (``request.training_job_request``) of this workflow."""
        return training_job_request(
            role_arn=self.execution_role.role_arn,
            image_uri=self.image_uri,
            bucket_name=self.bucket.bucket_name,
            checkpoint_prefix=self.runs_prefix,
            output_prefix=output_prefix,
            internal_retry_attempts=internal_retries,
            output_kms_key_arn=output_kms_key.key_arn if output_kms_key is not None else None,
            vpc_config=vpc_config,
            network_isolation=network_isolation,
            tensorboard_segment=self.run_segment if tensorboard else None,
            mlflow_resource_arn=self.mlflow_tracking_server_arn,
            mlflow_experiment=self.run_segment,
        )

    def _observability(
        self,
        notification_topic: sns.ITopic | None,
        notifications: bool,
        event_pattern: events.EventPattern | None,
        event_bus: events.IEventBus | None,
        dashboard: bool,
    ) -> None:
        """The alarm, the notifications, the trigger (``observability``) and the dashboard (``dashboard``, also
        searching ``dashboard_job_name_prefixes``), kept as attributes."""
        self.dashboard: cloudwatch.Dashboard | None = (
            training_dashboard(
                self,
                self.state_machine,
                job_name_prefix=self.defaults.job_name_prefix,
                more_prefixes=self.dashboard_job_name_prefixes,
            )
            if dashboard
            else None
        )
        self.dashboard_url: str | None = dashboard_url(self, self.dashboard) if self.dashboard else None
        observed = alarm_and_notifications(
            self,
            self.state_machine,
            notification_topic=notification_topic,
            notifications=notifications,
            encryption_key=self.encryption_key,
            removal_policy=self.removal_policy,
        )
        self.alarm: cloudwatch.Alarm = observed.alarm
        self.notification_topic: sns.ITopic | None = observed.topic
        self.notification_key: kms.IKey | None = observed.key
        self.status_rule: events.Rule | None = observed.status_rule
        self.trigger_rule: events.Rule | None = trigger(
            self,
            self.state_machine,
            event_pattern=event_pattern,
            event_bus=event_bus,
            encryption_key=self.encryption_key,
        )

    def _state_machine(
        self, definition: sfn.IChainable, name: str, timeout: int, key: kms.IKey | None
    ) -> sfn.StateMachine:
        """The state machine ``name``: X-Ray, every event logged with its data, execution data encrypted with
        ``key``. CDK grants its role ``kms:Decrypt`` and ``kms:GenerateDataKey`` on ``key`` with the condition
        ``kms:EncryptionContext:aws:states:stateMachineArn`` = ``arn:...:stateMachine:<physical name>`` (what Step
        Functions needs to start and run an execution, docs/security.md): hence the name is always given."""
        return sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=name,
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            timeout=Duration.seconds(timeout),
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True
            ),
            comment="Launch and monitor one SageMaker training job per execution (see README)",
            encryption_configuration=(
                sfn.CustomerManagedEncryptionConfiguration(key) if key is not None else None
            ),
        )

    def _log_group(
        self,
        stack: Stack,
        encryption_key: kms.IKey | None,
        retention: logs.RetentionDays | None,
        policy: RemovalPolicy,
    ) -> logs.LogGroup:
        """The execution log group; with a key, named (so that the key policy can name exactly it) and encrypted."""
        return keyed_log_group(
            self,
            encryption_key,
            retention or logs.RetentionDays.SIX_MONTHS,
            policy,
            "/aws/vendedlogs/states/",
        )

    # ------------------------------------------------------------------------------------------------------------
    @property
    def state_machine_arn(self) -> str:
        return self.state_machine.state_machine_arn

    def _definition(
        self,
        launch_params: dict[str, Any],
        resources: dict[str, Any],
        retries: int,
        retry_wait: int,
        pending: int,
        log_retention: logs.RetentionDays | None,
    ) -> sfn.IChainable:
        """Decide the request (``self.validator``); then the training job (prepare, capacity mode, launch loop,
        summary) and, when asked, the evaluation job after it; or the evaluation job only."""
        self.validator = RequestValidator(
            self,
            "RequestValidator",
            bucket=self.bucket,
            runs_prefix=self.runs_prefix,
            data_prefixes=data_prefixes(self, self.data_sources, self.bucket),
            training_job_tag=(WORKFLOW_TAG, self.node.path),
            measurements_prefix=self.measurements_prefix,
            log_retention=log_retention,
            encryption_key=self.encryption_key,
            removal_policy=self.removal_policy,
        )
        evaluation = evaluation_states(
            self,
            evaluation_job_request(launch_params),
            resources,
            retries=retries,
            retry_wait=retry_wait,
            pending=pending,
            launch_retry_backoff=self.launch_retry_backoff,
        )
        then = sfn.Choice(self, "Evaluate after training?")
        then.when(sfn.Condition.is_null("$.evaluation"), sfn.Succeed(self, "Training job completed"))
        then.otherwise(evaluation.after_training)
        checkpoint_uri = launch_params["CheckpointConfig"]["S3Uri.$"]  # the run's prefix, for both backends
        loop = launch_loop(
            self,
            launch_params,
            retries=retries,
            retry_wait=retry_wait,
            after=training_summary(self, checkpoint_uri).next(then),
            s3_checkpoints=True,
        )
        self.launch: sfn.CustomState = loop.launch
        self.launch_without_data: sfn.CustomState = loop.launch_without_data
        mode = capacity_states(self, resources, pending=pending, launch=loop.entry)
        prepare = prepare_state(self, launch_retry_backoff=self.launch_retry_backoff)
        tuning = tuning_states(
            self,
            launch_params,
            resources,
            retries=retries,
            retry_wait=retry_wait,
            pending=pending,
            launch_retry_backoff=self.launch_retry_backoff,
            storage=TuningStorage(self.bucket, self.runs_prefix, self.measurements_prefix),
        )
        route = sfn.Choice(
            self,
            "Train first?",
            comment="A tuning run (tune) runs its tuning job instead; an evaluation-only request "
            "(evaluate.training_job) skips training.",
        )
        route.when(
            sfn.Condition.and_(sfn.Condition.is_present("$.tune"), sfn.Condition.is_not_null("$.tune")),
            tuning,
        )
        route.when(sfn.Condition.boolean_equals("$.evaluation_only", True), evaluation.only)
        route.otherwise(prepare.next(mode))
        return decide_request_states(
            self,
            validator=self.validator,
            rules_json=self.request_rules.to_json(),
            next_state=route,
        )
