"""The evaluation job's states: the same capacity states and launch loop as training (``states``, kind
``EVALUATION``), entered after a training job that completed (train, then evaluate) or straight after the request
is decided (evaluation only), and the summary that ends the execution.

The evaluation's decided parts come from the request check (``$.evaluation``, ``evaluate_block.decided``): its
config, settings, request fields and task channel (and, evaluation only, its model channel). After training, the
model channel is the training job's ``model.tar.gz``. The execution's output is the training summary (none when
only evaluating) with ``evaluation`` replaced by the evaluation's summary: its job, the tasks, the run evaluated and
its scores (the job's ``FinalMetricDataList``: ``eval:<task>:acc``, ``acc_stderr``, ``acc_norm``,
``acc_norm_stderr``). Another kind of job (tuning) is added the same way: its own entry states, then
``capacity_states`` and ``launch_loop`` with its ``JobKind``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from constructs_lib._shared.asl import format_intrinsic
from constructs_lib.workflow.states import (
    EVALUATION,
    capacity_states,
    launch_loop,
    loop_start,
    summary_links,
)
from training.contract.container import MODEL_CHANNEL

EVALUATION_CARRY = ("config", "launch_count", "training", "evaluated", "tasks")
"""What the evaluation's ``Normalize result`` keeps beside the job for its summary."""


@dataclass(frozen=True)
class EvaluationStates:
    """The two ways into the evaluation (the loop, its summary and ends are reached from both)."""

    after_training: sfn.IChainable
    """From a training summary whose ``evaluation`` is not null: the model channel from its model archive."""
    only: sfn.IChainable
    """From the decided request of an evaluation-only execution."""


def evaluation_summary(workflow: Construct) -> sfn.Chain:
    """``Summarize (evaluation)`` then ``Merge summaries`` (over the training summary) and the end."""
    summarize = sfn.Pass(
        workflow,
        "Summarize (evaluation)",
        comment="The evaluation's job, tasks, the run evaluated and its scores.",
        parameters={
            "part": {
                "evaluation": {
                    "job_name.$": "$.job.TrainingJobName",
                    "status.$": "$.job.TrainingJobStatus",
                    "tasks.$": "$.tasks",
                    "evaluated.$": "$.evaluated",
                    "scores.$": "$.job.FinalMetricDataList",
                    "training_seconds.$": "$.job.TrainingTimeInSeconds",
                    "billable_seconds.$": "$.job.BillableTimeInSeconds",
                    "instance_type.$": "$.config.instance_type",
                    "launches.$": "$.launch_count",
                    "results.$": format_intrinsic(
                        "{}{}/output/output.tar.gz",
                        "$.job.OutputDataConfig.S3OutputPath",
                        "$.job.TrainingJobName",
                    ),
                    "links": summary_links(Stack.of(workflow).region),
                }
            },
            "training.$": "$.training",
        },
    )
    merge = sfn.Pass(
        workflow,
        "Merge summaries",
        comment="The training summary (none when only evaluating) with the evaluation's in place of its request.",
        parameters={"value.$": "States.JsonMerge($.training, $.part, false)"},
        output_path="$.value",
    )
    return summarize.next(merge).next(sfn.Succeed(workflow, "Evaluation job completed"))


def evaluation_states(
    workflow: Construct,
    launch_params: dict[str, Any],
    resources: dict[str, Any],
    *,
    retries: int,
    retry_wait: int,
    pending: int,
    launch_retry_backoff: int,
) -> EvaluationStates:
    """The evaluation's entries, its ``Prepare evaluation`` state, capacity states and launch loop
    (``launch_params``: ``request.evaluation_job_request``; the rest as for training)."""
    loop = launch_loop(
        workflow,
        launch_params,
        retries=retries,
        retry_wait=retry_wait,
        after=evaluation_summary(workflow),
        kind=EVALUATION,
        carry=EVALUATION_CARRY,
    )
    mode = capacity_states(workflow, resources, pending=pending, launch=loop.entry, kind=EVALUATION)
    prepare = sfn.Pass(
        workflow,
        "Prepare evaluation",
        parameters={
            "config.$": "$.evaluation.config",
            "hyperparameters.$": "$.evaluation.hyperparameters",
            "channels.$": "States.Array($.evaluation.tasks_channel, $.evaluation.model_channel)",
            "request.$": "$.evaluation.request",
            "evaluated.$": "$.evaluation.evaluated",
            "tasks.$": "$.evaluation.tasks",
            "training.$": "$.training",
            **loop_start(launch_retry_backoff),
        },
    ).next(mode)
    model_channel = sfn.Pass(
        workflow,
        "Model channel",
        comment="The training job's model.tar.gz (its hf/ folder) as the evaluation's read-only model channel.",
        parameters={
            "ChannelName": MODEL_CHANNEL,
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri.$": "$.model_artifacts",
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
            "InputMode": "File",
        },
        result_path="$.evaluation.model_channel",
    )
    after_training = model_channel.next(
        sfn.Pass(
            workflow,
            "Evaluate the trained model",
            parameters={"training.$": "$", "evaluation.$": "$.evaluation"},
        )
    ).next(prepare)
    only = sfn.Pass(
        workflow,
        "Evaluate only",
        comment="Nothing is trained: the model is a finished training job's (evaluate.training_job).",
        parameters={"training": {}, "evaluation.$": "$.evaluation"},
    ).next(prepare)
    return EvaluationStates(after_training=after_training, only=only)
