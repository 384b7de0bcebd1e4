"""The training workflow's states: input defaults and checks, capacity mode, and the launch loop (launch,
capacity relaunch, failure and summary). Each function adds states to the ``TrainingWorkflow`` it is given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_stepfunctions as sfn

from constructs_lib.workflow_validation import ValidationStates, format_intrinsic
from training.contract import CHECKPOINT_LOCAL_PATH, HYPERPARAMETERS_BY_NAME

if TYPE_CHECKING:
    from constructs_lib.training_workflow import TrainingWorkflow
CREATE_TRAINING_JOB_SYNC = "arn:aws:states:::sagemaker:createTrainingJob.sync"
TRANSIENT_SAGEMAKER_ERRORS = (
    "SageMaker.AmazonSageMakerException",
    "SageMaker.ResourceLimitExceededException",
    "SageMaker.ThrottlingException",
)
CAPACITY_ERROR_MARKER = "CapacityError"

# Hyperparameters the workflow sets from validated input fields (contract names), plus the checkpoint directory.
MANAGED_HYPERPARAMETERS = ("precision", "batch_size", "seq_length", "activation_checkpointing")
"""Always sent. ``num_layers`` is sent too when the execution (or the defaults) give one."""
CHECKPOINT_DIR_HYPERPARAMETER = "checkpoint_dir"


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


def input_states(workflow: TrainingWorkflow) -> tuple[sfn.Pass, sfn.Pass]:
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
        workflow,
        "Apply defaults",
        comment="Keep the execution input next to the defaults (null means 'not set').",
        parameters={
            "defaults": _with_nulls(workflow.defaults.as_input()),
            "input.$": "$",
        },
    )
    merge = sfn.Pass(
        workflow,
        "Merge input over defaults",
        parameters={
            "config.$": "States.JsonMerge($.defaults, $.input, false)",
            "launch_count": 1,
            "result_defaults": _with_nulls(result_defaults),
            "failure_defaults": _with_nulls(failure_defaults),
        },
    )
    return apply_defaults, merge


def launch_loop(
    workflow: TrainingWorkflow, launch_params: dict[str, Any], retries: int, retry_wait: int
) -> None:
    """The launch loop: launch (``workflow.launch``), capacity relaunch, failure and summary states."""
    summarize = sfn.Pass(
        workflow,
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
    ).next(sfn.Succeed(workflow, "Training job completed"))
    normalize_result = sfn.Pass(
        workflow,
        "Normalize result",
        parameters={
            "job.$": "States.JsonMerge($.result_defaults, $.job, false)",
            "config.$": "$.config",
            "launch_count.$": "$.launch_count",
        },
    ).next(summarize)
    workflow.launch = sfn.CustomState(
        workflow,
        "Run training job",
        state_json={
            "Type": "Task",
            "Comment": "CreateTrainingJob and wait for it to end (stopping the execution stops the job).",
            "Resource": CREATE_TRAINING_JOB_SYNC,
            "Parameters": launch_params,
            "ResultPath": "$.job",
        },
    )
    workflow.launch.add_retry(
        errors=list(TRANSIENT_SAGEMAKER_ERRORS),
        interval=Duration.seconds(15),
        max_attempts=5,
        backoff_rate=2,
        max_delay=Duration.minutes(5),
        jitter_strategy=sfn.JitterType.FULL,
    )

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
    wait.next(count_launch).next(store_count).next(workflow.launch)
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
    workflow.launch.add_catch(inspect_failure, errors=["States.TaskFailed"], result_path="$.failure")
    workflow.launch.add_catch(launch_failed, errors=["States.ALL"], result_path="$.failure")
    workflow.launch.next(normalize_result)


def capacity_states(workflow: TrainingWorkflow, resources: dict[str, Any], pending: int) -> sfn.Choice:
    """Capacity mode, node count and hyperparameter states that fill ``$.launch`` before the launch."""

    def build_hyperparameters(state_name: str, names: Sequence[str]) -> sfn.Chain:
        return sfn.Pass(
            workflow,
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
        ).next(workflow.launch)

    # num_layers is sent only when given: left out, the trainer's model preset decides the depth.
    hyperparameters = sfn.Choice(workflow, "num_layers given?")
    hyperparameters.when(
        sfn.Condition.is_not_null("$.config.num_layers"),
        build_hyperparameters("Build hyperparameters", (*MANAGED_HYPERPARAMETERS, "num_layers")),
    )
    hyperparameters.otherwise(
        build_hyperparameters("Build hyperparameters (preset depth)", MANAGED_HYPERPARAMETERS)
    )
    multi_node = sfn.Choice(workflow, "Several instances?")
    multi_node.when(
        sfn.Condition.number_greater_than("$.config.instance_count", 1),
        sfn.Pass(
            workflow,
            "Encrypt traffic between nodes",
            result=sfn.Result.from_boolean(True),
            result_path="$.launch.encrypt_inter_node",
        ).next(hyperparameters),
    )
    multi_node.otherwise(
        sfn.Pass(
            workflow,
            "One node",
            result=sfn.Result.from_boolean(False),
            result_path="$.launch.encrypt_inter_node",
        ).next(hyperparameters)
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


def input_checks(
    workflow: TrainingWorkflow,
    stack: Stack,
    allowed: tuple[str, ...],
    mode: sfn.Choice,
    apply_defaults: sfn.Pass,
    merge: sfn.Pass,
) -> sfn.Chain:
    """The definition: defaults, merge, field-name check, field validation, then ``mode``."""
    validation = ValidationStates(
        workflow, fields=workflow.fields, region=stack.region, allowed_instance_types=allowed
    ).chain(mode)
    names = sfn.Pass(
        workflow,
        "Inspect field names",
        parameters={"known": {f"{f.name}.$": f"$.config.{f.name}" for f in workflow.fields}},
        result_path="$.probe.names",
    )
    count_names = sfn.Pass(
        workflow,
        "Count fields",
        comment="Same number of ','-separated parts only when the input has no other top-level field.",
        parameters={
            "known.$": "States.ArrayLength(States.StringSplit(States.JsonToString($.probe.names.known), ','))",
            "given.$": "States.ArrayLength(States.StringSplit(States.JsonToString($.config), ','))",
        },
        result_path="$.probe.names",
    )
    unknown_fields = sfn.Choice(workflow, "Check field names")
    unknown_fields.when(
        sfn.Condition.not_(
            sfn.Condition.number_equals_json_path("$.probe.names.given", "$.probe.names.known")
        ),
        sfn.Fail(
            workflow,
            "Invalid field name",
            error="InvalidInput",
            cause="input: unknown field; allowed fields: " + ", ".join(f.name for f in workflow.fields),
        ),
    )
    unknown_fields.otherwise(validation)
    definition = apply_defaults.next(merge).next(names).next(count_names).next(unknown_fields)
    return definition
