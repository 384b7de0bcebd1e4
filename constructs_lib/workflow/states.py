"""The training workflow's states after the request is decided (``request_states``): the launch preparation,
capacity mode, and the launch loop (launch with or without input data, refused-request and capacity relaunches,
failure and summary). Each function adds its states to the scope it is given and returns them."""

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
from training.request.contract import HF_EXPORT_DIR

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
            "tune.$": "$.tune",
            "launch_count": 1,
            **launch_retry.initial_state(launch_retry_backoff),
            "result_defaults": _with_nulls(result_defaults),
            "failure_defaults": _with_nulls(failure_defaults),
        },
    )


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
class LaunchLoop:
    """What :func:`launch_loop` built: its entry and its two launch states."""

    entry: sfn.Choice
    """``Input data?``: picks ``launch`` or ``launch_without_data``."""
    launch: sfn.CustomState
    """``createTrainingJob.sync`` with ``InputDataConfig`` from ``$.channels``."""
    launch_without_data: sfn.CustomState
    """The same without ``InputDataConfig`` (SageMaker refuses an empty one)."""


def summary_parameters(workflow: Construct) -> dict[str, Any]:
    """The parameters of ``Summarize``: a job's compact, readable result (the tuning summary keeps those that
    apply to a tuning job, ``tuning_states``)."""
    return {
        "job_name.$": "$.job.TrainingJobName",
        "status.$": "$.job.TrainingJobStatus",
        "training_seconds.$": "$.job.TrainingTimeInSeconds",
        "billable_seconds.$": "$.job.BillableTimeInSeconds",
        "model_artifacts.$": "$.job.ModelArtifacts.S3ModelArtifacts",
        # the trainer's Hugging Face export inside that archive (position_encoding=rope, the default)
        "hugging_face_model": {
            "archive.$": "$.job.ModelArtifacts.S3ModelArtifacts",
            "folder": f"{HF_EXPORT_DIR}/",
        },
        "checkpoint_uri.$": "$.job.CheckpointConfig.S3Uri",
        "final_metrics.$": "$.job.FinalMetricDataList",
        "image_uri.$": "$.job.AlgorithmSpecification.TrainingImage",
        "instance_type.$": "$.config.instance_type",
        "instance_count.$": "$.config.instance_count",
        "launches.$": "$.launch_count",
        "resumed_from.$": "$.resume",
        "plan.$": "$.plan",
        "memory_estimate_ignored.$": "$.config.ignore_memory_estimate",
        "links": summary_links(Stack.of(workflow).region),
    }


def training_summary(workflow: Construct) -> sfn.IChainable:
    """``Summarize`` a training job, then ``Training job completed``."""
    return sfn.Pass(
        workflow, "Summarize", comment="A compact, readable result.", parameters=summary_parameters(workflow)
    ).next(sfn.Succeed(workflow, "Training job completed"))


def launch_loop(
    workflow: Construct,
    launch_params: dict[str, Any],
    *,
    retries: int,
    retry_wait: int,
    after: sfn.IChainable | None = None,
) -> LaunchLoop:
    """The launch loop: ``Input data?`` picks the launch with or without ``InputDataConfig``; then relaunch (at
    most ``retries`` capacity relaunches, ``retry_wait`` seconds apart) and failure states; a job that completes
    goes through ``Normalize result`` to ``after`` (default: :func:`training_summary`; the construct passes
    ``tuning_states.after_job``, which summarizes a tuning job its own way and a training job with it)."""
    normalize_result = sfn.Pass(
        workflow,
        "Normalize result",
        parameters={
            "job.$": "States.JsonMerge($.result_defaults, $.job, false)",
            "config.$": "$.config",
            "launch_count.$": "$.launch_count",
            "resume.$": "$.resume",
            "plan.$": "$.plan",
            "tune.$": "$.tune",
        },
    ).next(after if after is not None else training_summary(workflow))

    def launch_state(name: str, channels: bool) -> sfn.CustomState:
        return sfn.CustomState(
            workflow,
            name,
            state_json={
                "Type": "Task",
                "Comment": "CreateTrainingJob and wait for it to end (stopping the execution stops the job).",
                "Resource": CREATE_TRAINING_JOB_SYNC,
                "Parameters": {**launch_params, **({"InputDataConfig.$": "$.channels"} if channels else {})},
                "ResultPath": "$.job",
            },
        )

    with_data = launch_state("Run training job", True)
    without_data = launch_state("Run training job (no input data)", False)
    launch_data = sfn.Choice(workflow, "Input data?", comment="SageMaker refuses an empty InputDataConfig.")
    launch_data.when(sfn.Condition.is_present("$.channels[0]"), with_data)
    launch_data.otherwise(without_data)

    launch_failed = sfn.Fail(
        workflow,
        "Launch failed",
        comment="CreateTrainingJob was refused, or the integration failed in another way.",
        error="LaunchFailed",
        cause_path=format_intrinsic("{}: {}", "$.failure.Error", "$.failure.Cause"),
    )
    job_failed = sfn.Fail(
        workflow,
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
        workflow,
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
        workflow,
        "Count launch",
        parameters={"value.$": "States.MathAdd($.launch_count, 1)"},
        result_path="$.launch_count_next",
    )
    store_count = sfn.Pass(
        workflow, "Store launch count", input_path="$.launch_count_next.value", result_path="$.launch_count"
    )
    wait = sfn.Wait(
        workflow,
        "Wait for capacity",
        comment="Same execution name, so the relaunch uses the same checkpoint prefix and resumes.",
        time=sfn.WaitTime.duration(Duration.seconds(retry_wait)),
    )
    wait.next(count_launch).next(store_count).next(launch_data)
    capacity = sfn.Choice(workflow, "Capacity error?")
    is_capacity = sfn.Condition.string_matches("$.failed_job.FailureReason", f"*{CAPACITY_ERROR_MARKER}*")
    capacity.when(
        sfn.Condition.and_(is_capacity, sfn.Condition.number_less_than_equals("$.launch_count", retries)),
        wait,
    )
    capacity.when(is_capacity, no_capacity)
    capacity.otherwise(job_failed)
    parse_failure = sfn.Pass(
        workflow,
        "Read failed job",
        parameters={
            "value.$": "States.JsonMerge($.failure_defaults, States.StringToJson($.failure.Cause), false)"
        },
        result_path="$.failed_job_raw",
    )
    pick_failure = sfn.Pass(
        workflow, "Keep failed job", input_path="$.failed_job_raw.value", result_path="$.failed_job"
    )
    inspect_failure = sfn.Choice(workflow, "Job description in cause?")
    inspect_failure.when(
        sfn.Condition.and_(
            sfn.Condition.is_string("$.failure.Cause"),
            sfn.Condition.string_matches("$.failure.Cause", "{*"),
        ),
        parse_failure.next(pick_failure).next(capacity),
    )
    inspect_failure.otherwise(launch_failed)
    refused = launch_retry.api_error_states(workflow, relaunch=launch_data, launch_failed=launch_failed)
    for launch in (with_data, without_data):
        launch_retry.add_quota_retry(launch)
        launch.add_catch(refused, errors=[launch_retry.API_ERROR], result_path="$.failure")
        launch.add_catch(inspect_failure, errors=["States.TaskFailed"], result_path="$.failure")
        launch.add_catch(launch_failed, errors=["States.ALL"], result_path="$.failure")
        launch.next(normalize_result)
    return LaunchLoop(entry=launch_data, launch=with_data, launch_without_data=without_data)


def capacity_states(
    workflow: Construct, resources: dict[str, Any], *, pending: int, launch: sfn.IChainable
) -> sfn.Choice:
    """Capacity mode and node count states that fill ``$.launch``, then ``launch`` (returns ``Capacity mode``).
    ``resources`` is the ``ResourceConfig`` before the mode's fields; ``pending`` the training-plan jobs'
    ``MaxPendingTimeInSeconds``."""
    multi_node = sfn.Choice(workflow, "Several instances?")
    multi_node.when(
        sfn.Condition.number_greater_than("$.config.instance_count", 1),
        sfn.Pass(
            workflow,
            "Encrypt traffic between nodes",
            result=sfn.Result.from_boolean(True),
            result_path="$.launch.encrypt_inter_node",
        ).next(launch),
    )
    multi_node.otherwise(
        sfn.Pass(
            workflow,
            "One node",
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

    mode = sfn.Choice(workflow, "Capacity mode")
    mode.when(
        sfn.Condition.not_(sfn.Condition.is_null("$.config.training_plan_arn")),
        capacity_pass(
            "Training plan capacity",
            {"TrainingPlanArn.$": "$.config.training_plan_arn", **WARM_POOL},
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
    mode.otherwise(capacity_pass("On-demand capacity", WARM_POOL, {}, False).next(multi_node))

    return mode
