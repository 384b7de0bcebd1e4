"""The workflow's job states after the request is decided (``request_states``): the launch preparation, capacity
mode, and the launch loop (launch with or without input data, refused-request and capacity relaunches, failure),
and the training summary. Every kind of job goes through the same ``capacity_states`` and ``launch_loop``, named by
its ``JobKind`` (training's names have no suffix; evaluation's end in `` (evaluation)``, tuning's in
`` (tuning)``): a new kind adds its own entry and summary states and calls these two (``evaluation_states`` and
``tuning_states`` do). Each function adds its states to the
scope it is given and returns them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from constructs_lib._shared import console_links
from constructs_lib._shared.asl import format_intrinsic
from constructs_lib.workflow import launch_retry
from training.contract.container import HF_EXPORT_DIR

CREATE_TRAINING_JOB_SYNC = "arn:aws:states:::sagemaker:createTrainingJob.sync"
CAPACITY_ERROR_MARKER = "CapacityError"


WARM_POOL = {"KeepAlivePeriodInSeconds.$": "$.config.keep_alive_seconds"}
"""On-demand and training-plan jobs keep their instances this long after the job (0: not at all); spot jobs
cannot have a warm pool, so their request leaves the field out."""

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


def prepare_state(workflow: Construct, *, launch_retry_backoff: int) -> sfn.Pass:
    """After the request is decided: its parts, the launch counters (the first refused-launch backoff is
    ``launch_retry_backoff`` seconds) and the defaults of the result."""
    return sfn.Pass(
        workflow,
        "Prepare launch",
        parameters={
            "config.$": "$.config",
            "hyperparameters.$": "$.hyperparameters",
            "channels.$": "$.channels",
            "resume.$": "$.resume",
            "request.$": "$.request",
            "plan.$": "$.plan",
            "evaluation.$": "$.evaluation",
            **loop_start(launch_retry_backoff),
        },
    )


def loop_start(launch_retry_backoff: int) -> dict[str, Any]:
    """The launch loop's own starting fields: the launch counters and the defaults of the result and of a
    failed job's description."""
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
    return {
        "launch_count": 1,
        **launch_retry.initial_state(launch_retry_backoff),
        "result_defaults": _with_nulls(result_defaults),
        "failure_defaults": _with_nulls(failure_defaults),
    }


EXECUTION_REGION = "States.ArrayGetItem(States.StringSplit($$.Execution.Id, ':'), 3)"
"""The region, read from the execution's ARN (so the definition holds no deploy-time token for it)."""


def summary_links(region: str | None) -> dict[str, str]:
    """Parameters of the summary's ``links``: the console addresses of the execution, the job and its logs."""
    host = console_links.console_host_of_region(region)

    def link(template: str, argument: str) -> str:
        text = template.format(host=host, region="{}", execution_arn="{}", job="{}")
        return format_intrinsic(text, EXECUTION_REGION, argument)

    return {
        "execution.$": link(console_links.EXECUTION, "$$.Execution.Id"),
        "training_job.$": link(console_links.TRAINING_JOB, "$.job.TrainingJobName"),
        "logs.$": link(console_links.LOGS, "$.job.TrainingJobName"),
    }


@dataclass(frozen=True)
class JobKind:
    """One kind of job the workflow launches through the same launch loop (training, evaluation, ...): its word,
    and the suffix that keeps its copies of the loop's shared state names unique in the state machine (training's
    names, the first kind's, have none)."""

    label: str
    suffix: str = ""

    def name(self, base: str) -> str:
        """``Count launch`` for training, ``Count launch (evaluation)`` for evaluation."""
        return f"{base}{self.suffix}"

    @property
    def title(self) -> str:
        return self.label.capitalize()


TRAINING = JobKind("training")
EVALUATION = JobKind("evaluation", " (evaluation)")
TUNING = JobKind("tuning", " (tuning)")


@dataclass(frozen=True)
class LaunchLoop:
    """What :func:`launch_loop` built: its entry and its launch states."""

    entry: sfn.Choice
    """``Input data?`` (picks ``launch`` or ``launch_without_data``), or, with S3-direct checkpoints, ``Checkpoint
    backend?`` before it."""
    launch: sfn.CustomState
    """``createTrainingJob.sync`` with ``InputDataConfig`` from ``$.channels``."""
    launch_without_data: sfn.CustomState
    """The same without ``InputDataConfig`` (SageMaker refuses an empty one)."""
    s3_launches: tuple[sfn.CustomState, ...] = ()
    """With S3-direct checkpoints: the two launches without ``CheckpointConfig`` (with and without input data)."""


S3_CHECKPOINTS = sfn.Condition.and_(
    sfn.Condition.is_present("$.hyperparameters.checkpoint_backend"),
    sfn.Condition.string_equals("$.hyperparameters.checkpoint_backend", "s3"),
)
"""The decided request keeps its checkpoints in S3 directly (``training.request.job.with_checkpoint_place``): its
trainer writes to the run's prefix itself, so the request has no ``CheckpointConfig``."""


TRAINING_CARRY = ("config", "launch_count", "resume", "plan", "evaluation")
"""What training's ``Normalize result`` keeps beside the job for its summary."""


def job_summary(workflow: Construct, checkpoint_uri: str) -> dict[str, Any]:
    """The summary fields of any job that ran through the launch loop: its name, status, times, checkpoint
    prefix (``checkpoint_uri``: the run's, the same for both checkpoint backends), metrics, image, instances,
    launches and console links."""
    return {
        "job_name.$": "$.job.TrainingJobName",
        "status.$": "$.job.TrainingJobStatus",
        "training_seconds.$": "$.job.TrainingTimeInSeconds",
        "billable_seconds.$": "$.job.BillableTimeInSeconds",
        "checkpoint_uri.$": checkpoint_uri,
        "final_metrics.$": "$.job.FinalMetricDataList",
        "image_uri.$": "$.job.AlgorithmSpecification.TrainingImage",
        "instance_type.$": "$.config.instance_type",
        "instance_count.$": "$.config.instance_count",
        "launches.$": "$.launch_count",
        "links": summary_links(Stack.of(workflow).region),
    }


def training_summary(workflow: Construct, checkpoint_uri: str) -> sfn.Pass:
    """``Summarize``: a training job's compact, readable result (the execution's output when nothing follows);
    ``evaluation`` is the evaluation still to run (its decided parts), or null. ``checkpoint_uri``: the run's
    checkpoint prefix (an intrinsic of the execution's name: ``request.run_checkpoint_uri``)."""
    return sfn.Pass(
        workflow,
        "Summarize",
        comment="A compact, readable result.",
        parameters={
            **job_summary(workflow, checkpoint_uri),
            "model_artifacts.$": "$.job.ModelArtifacts.S3ModelArtifacts",
            # the trainer's Hugging Face export inside that archive (position_encoding=rope, the default)
            "hugging_face_model": {
                "archive.$": "$.job.ModelArtifacts.S3ModelArtifacts",
                "folder": f"{HF_EXPORT_DIR}/",
            },
            "resumed_from.$": "$.resume",
            "plan.$": "$.plan",
            "memory_estimate_ignored.$": "$.config.ignore_memory_estimate",
            "evaluation.$": "$.evaluation",
        },
    )


def launch_loop(
    workflow: Construct,
    launch_params: dict[str, Any],
    *,
    retries: int,
    retry_wait: int,
    after: sfn.IChainable,
    kind: JobKind = TRAINING,
    carry: tuple[str, ...] = TRAINING_CARRY,
    s3_checkpoints: bool = False,
) -> LaunchLoop:
    """The launch loop of one kind of job: ``Input data?`` picks the launch with or without ``InputDataConfig``
    (``s3_checkpoints``: first ``Checkpoint backend?``, for a request whose trainer keeps its checkpoints in S3
    directly, the same two launches without ``CheckpointConfig``); then relaunch (at most ``retries`` capacity
    relaunches, ``retry_wait`` seconds apart) and failure states; a
    job that completes goes through ``Normalize result`` (its description over the result defaults, with the
    ``carry`` fields of the state) to ``after``. The state it starts from holds ``config``, ``hyperparameters``,
    ``channels``, ``request``, the launch counters and the result and failure defaults (``prepare_state``)."""
    normalize_result = sfn.Pass(
        workflow,
        kind.name("Normalize result"),
        parameters={
            "job.$": "States.JsonMerge($.result_defaults, $.job, false)",
            **{f"{key}.$": f"$.{key}" for key in carry},
        },
    ).next(after)

    def launch_state(name: str, channels: bool, params: dict[str, Any] = launch_params) -> sfn.CustomState:
        return sfn.CustomState(
            workflow,
            name,
            state_json={
                "Type": "Task",
                "Comment": "CreateTrainingJob and wait for it to end (stopping the execution stops the job).",
                "Resource": CREATE_TRAINING_JOB_SYNC,
                "Parameters": {**params, **({"InputDataConfig.$": "$.channels"} if channels else {})},
                "ResultPath": "$.job",
            },
        )

    with_data = launch_state(f"Run {kind.label} job", True)
    without_data = launch_state(f"Run {kind.label} job (no input data)", False)
    launch_data = sfn.Choice(
        workflow, kind.name("Input data?"), comment="SageMaker refuses an empty InputDataConfig."
    )
    launch_data.when(sfn.Condition.is_present("$.channels[0]"), with_data)
    launch_data.otherwise(without_data)
    launches, entry = [with_data, without_data], launch_data
    s3_launches: tuple[sfn.CustomState, ...] = ()
    if s3_checkpoints:
        direct = {k: v for k, v in launch_params.items() if k != "CheckpointConfig"}
        s3_data = launch_state(f"Run {kind.label} job (S3 checkpoints)", True, direct)
        s3_no_data = launch_state(f"Run {kind.label} job (S3 checkpoints, no input data)", False, direct)
        s3_launch_data = sfn.Choice(
            workflow,
            kind.name("Input data? (S3 checkpoints)"),
            comment="SageMaker refuses an empty InputDataConfig.",
        )
        s3_launch_data.when(sfn.Condition.is_present("$.channels[0]"), s3_data)
        s3_launch_data.otherwise(s3_no_data)
        entry = sfn.Choice(
            workflow,
            kind.name("Checkpoint backend?"),
            comment="S3-direct checkpoints: each rank writes to the run's prefix itself, so no CheckpointConfig "
            "(SageMaker would copy the whole prefix to every instance at start).",
        )
        entry.when(S3_CHECKPOINTS, s3_launch_data)
        entry.otherwise(launch_data)
        s3_launches = (s3_data, s3_no_data)
        launches += s3_launches
    launch_failed = sfn.Fail(
        workflow,
        kind.name("Launch failed"),
        comment="CreateTrainingJob was refused, or the integration failed in another way.",
        error="LaunchFailed",
        cause_path=format_intrinsic("{}: {}", "$.failure.Error", "$.failure.Cause"),
    )
    failure = _failure_states(workflow, kind, retries=retries, retry_wait=retry_wait, relaunch=entry)
    inspect_failure = sfn.Choice(workflow, kind.name("Job description in cause?"))
    inspect_failure.when(
        sfn.Condition.and_(
            sfn.Condition.is_string("$.failure.Cause"),
            sfn.Condition.string_matches("$.failure.Cause", "{*"),
        ),
        failure,
    )
    inspect_failure.otherwise(launch_failed)
    refused = launch_retry.api_error_states(
        workflow, relaunch=entry, launch_failed=launch_failed, suffix=kind.suffix
    )
    for launch in launches:
        launch_retry.add_quota_retry(launch)
        launch.add_catch(refused, errors=[launch_retry.API_ERROR], result_path="$.failure")
        launch.add_catch(inspect_failure, errors=["States.TaskFailed"], result_path="$.failure")
        launch.add_catch(launch_failed, errors=["States.ALL"], result_path="$.failure")
        launch.next(normalize_result)
    return LaunchLoop(entry, with_data, without_data, s3_launches)


def _failure_states(
    workflow: Construct, kind: JobKind, *, retries: int, retry_wait: int, relaunch: sfn.IChainable
) -> sfn.IChainable:
    """A job that ended Failed or Stopped (its description in the failure's cause): relaunched after a capacity
    error while relaunches are left, else the kind's job-failed or ``No capacity`` end."""
    job_failed = sfn.Fail(
        workflow,
        f"{kind.title} job failed",
        error=f"{kind.title}JobFailed",
        cause_path=format_intrinsic(
            f"{kind.title} job {{}} ended {{}}: {{}}",
            "$.failed_job.TrainingJobName",
            "$.failed_job.TrainingJobStatus",
            "$.failed_job.FailureReason",
        ),
    )
    no_capacity = sfn.Fail(
        workflow,
        kind.name("No capacity"),
        error="CapacityError",
        cause_path=format_intrinsic(
            "Gave up after {} launches without capacity; last job {}: {}",
            "$.launch_count",
            "$.failed_job.TrainingJobName",
            "$.failed_job.FailureReason",
        ),
    )
    count_launch = sfn.Pass(
        workflow,
        kind.name("Count launch"),
        parameters={"value.$": "States.MathAdd($.launch_count, 1)"},
        result_path="$.launch_count_next",
    )
    store_count = sfn.Pass(
        workflow,
        kind.name("Store launch count"),
        input_path="$.launch_count_next.value",
        result_path="$.launch_count",
    )
    wait = sfn.Wait(
        workflow,
        kind.name("Wait for capacity"),
        comment="Same execution name, so the relaunch uses the same checkpoint prefix and resumes.",
        time=sfn.WaitTime.duration(Duration.seconds(retry_wait)),
    )
    wait.next(count_launch).next(store_count).next(relaunch)
    capacity = sfn.Choice(workflow, kind.name("Capacity error?"))
    is_capacity = sfn.Condition.string_matches("$.failed_job.FailureReason", f"*{CAPACITY_ERROR_MARKER}*")
    capacity.when(
        sfn.Condition.and_(is_capacity, sfn.Condition.number_less_than_equals("$.launch_count", retries)),
        wait,
    )
    capacity.when(is_capacity, no_capacity)
    capacity.otherwise(job_failed)
    parse_failure = sfn.Pass(
        workflow,
        kind.name("Read failed job"),
        parameters={
            "value.$": "States.JsonMerge($.failure_defaults, States.StringToJson($.failure.Cause), false)"
        },
        result_path="$.failed_job_raw",
    )
    pick_failure = sfn.Pass(
        workflow,
        kind.name("Keep failed job"),
        input_path="$.failed_job_raw.value",
        result_path="$.failed_job",
    )
    return parse_failure.next(pick_failure).next(capacity)


def capacity_states(
    workflow: Construct,
    resources: dict[str, Any],
    *,
    pending: int,
    launch: sfn.IChainable,
    kind: JobKind = TRAINING,
) -> sfn.Choice:
    """Capacity mode and node count states that fill ``$.launch``, then ``launch`` (returns ``Capacity mode``).
    ``resources`` is the ``ResourceConfig`` before the mode's fields; ``pending`` the training-plan jobs'
    ``MaxPendingTimeInSeconds``."""
    multi_node = sfn.Choice(workflow, kind.name("Several instances?"))
    multi_node.when(
        sfn.Condition.number_greater_than("$.config.instance_count", 1),
        sfn.Pass(
            workflow,
            kind.name("Encrypt traffic between nodes"),
            result=sfn.Result.from_boolean(True),
            result_path="$.launch.encrypt_inter_node",
        ).next(launch),
    )
    multi_node.otherwise(
        sfn.Pass(
            workflow,
            kind.name("One node"),
            result=sfn.Result.from_boolean(False),
            result_path="$.launch.encrypt_inter_node",
        ).next(launch)
    )

    def capacity_pass(name: str, extra_resource: dict, extra_stopping: dict, spot: bool) -> sfn.Pass:
        return sfn.Pass(
            workflow,
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

    mode = sfn.Choice(workflow, kind.name("Capacity mode"))
    mode.when(
        sfn.Condition.not_(sfn.Condition.is_null("$.config.training_plan_arn")),
        capacity_pass(
            kind.name("Training plan capacity"),
            {"TrainingPlanArn.$": "$.config.training_plan_arn", **WARM_POOL},
            {"MaxPendingTimeInSeconds": pending},
            False,
        ).next(multi_node),
    )
    mode.when(
        sfn.Condition.boolean_equals("$.config.use_spot", True),
        capacity_pass(
            kind.name("Managed spot capacity"),
            {},
            {"MaxWaitTimeInSeconds.$": "$.config.max_wait_seconds"},
            True,
        ).next(multi_node),
    )
    mode.otherwise(capacity_pass(kind.name("On-demand capacity"), WARM_POOL, {}, False).next(multi_node))

    return mode
