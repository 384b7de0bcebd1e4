"""The tuning job's states: a job kind of its own (``states.TUNING``) through the same capacity states and launch
loop as training (``states.capacity_states``, ``states.launch_loop``: the same image, instance type and count,
capacity modes and relaunches, with the request check's tuning hyperparameters and run-time bound), entered
straight after the request is decided when it has a ``tune`` block.

After the job completes: ``Read tuning winner`` (its report's ``winner.json``, which the job wrote into its
checkpoint folder and SageMaker uploaded) -> ``Store tuning measurements`` (its ``measurements.json`` copied to
``<tuning prefix>measurements/<image tag>/<segment>/<execution>.json``, where the request check reads them for every
later request's plan) -> ``Tuning winner?`` (a one-line ``outcome``: the winner, or none when no trial ran ok, naming the
report's S3 location) -> ``Summarize (tuning)`` (the job's summary fields, the outcome, the report's S3 location,
the winner, where the records went, the tuning plan) -> ``Tuning job completed``. A missing winner or a failed copy is
reported in the summary, never a failed execution: the job itself completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from constructs_lib.workflow.states import TUNING, capacity_states, job_summary, launch_loop, loop_start
from training.contract.tuning import TUNE_REPORT_FOLDER

TUNING_CARRY = ("config", "launch_count", "tune")
"""What the tuning's ``Normalize result`` keeps beside the job for its summary."""


@dataclass(frozen=True)
class TuningStorage:
    """Where a tuning job's report is read (its runs' checkpoint folders) and its records stored."""

    bucket: s3.IBucket
    runs_prefix: str
    measurements_prefix: str


def report_objects(bucket: s3.IBucket, runs_prefix: str) -> str:
    """The ARN pattern of every tuning report file of the workflow's runs (``<runs_prefix><execution>/tune/*``)."""
    return bucket.arn_for_objects(f"{runs_prefix}*/{TUNE_REPORT_FOLDER}/*")


def record_objects(bucket: s3.IBucket, measurements_prefix: str) -> str:
    return bucket.arn_for_objects(f"{measurements_prefix}*")


def tuning_states(
    workflow: Construct,
    launch_params: dict[str, Any],
    resources: dict[str, Any],
    *,
    retries: int,
    retry_wait: int,
    pending: int,
    launch_retry_backoff: int,
    storage: TuningStorage,
) -> sfn.IChainable:
    """The tuning job's entry (``Prepare launch (tuning)``), its capacity states and launch loop, and the states
    after it (above)."""
    prepare = sfn.Pass(
        workflow,
        TUNING.name("Prepare launch"),
        parameters={
            "config.$": "$.config",
            "hyperparameters.$": "$.hyperparameters",
            "channels.$": "$.channels",
            "request.$": "$.request",
            "tune.$": "$.tune",
            **loop_start(launch_retry_backoff),
        },
    )
    loop = launch_loop(
        workflow,
        launch_params,
        retries=retries,
        retry_wait=retry_wait,
        after=_after_job(workflow, storage),
        kind=TUNING,
        carry=TUNING_CARRY,
    )
    return prepare.next(capacity_states(workflow, resources, pending=pending, launch=loop.entry, kind=TUNING))


def _after_job(workflow: Construct, storage: TuningStorage) -> sfn.IChainable:
    """Read the winner, store the records, summarize: each read or write that fails is reported, not fatal."""
    reports = report_objects(storage.bucket, storage.runs_prefix)
    read_winner = tasks.CallAwsService(
        workflow,
        "Read tuning winner",
        comment="The winner the tuning job wrote into its report (its checkpoint folder's tune/winner.json).",
        service="s3",
        action="getObject",
        parameters={"Bucket.$": "$.tune.bucket", "Key.$": "$.tune.winner_key"},
        iam_action="s3:GetObject",  # the action's canonical name (the default would be s3:getObject)
        iam_resources=[reports],
        result_selector={"value.$": "States.StringToJson($.Body)"},
        result_path="$.winner",
    )
    store = tasks.CallAwsService(
        workflow,
        "Store tuning measurements",
        comment="Copy the job's measurement records to where the request check reads them for every plan.",
        service="s3",
        action="copyObject",
        parameters={
            "Bucket.$": "$.tune.bucket",
            "Key.$": "$.tune.records_key",
            "CopySource.$": "$.tune.records_source",
        },
        iam_action="s3:PutObject",
        iam_resources=[record_objects(storage.bucket, storage.measurements_prefix)],
        additional_iam_statements=[iam.PolicyStatement(actions=["s3:GetObject"], resources=[reports])],
        result_selector={"etag.$": "$.CopyObjectResult.ETag"},
        result_path="$.records",
    )
    summarize = sfn.Pass(
        workflow,
        TUNING.name("Summarize"),
        comment="The tuning job's result: where its report is, the winner, where its measurements were stored.",
        parameters={
            **job_summary(workflow, "$.job.CheckpointConfig.S3Uri"),  # a tuning job keeps the folder backend
            "tune": {
                "outcome.$": "$.outcome.text",
                "report_uri.$": "$.tune.report_uri",
                "winner.$": "$.winner",
                "measurements.$": "$.records",
                "records_key.$": "$.tune.records_key",
                "plan.$": "$.tune.plan",
            },
        },
    ).next(sfn.Succeed(workflow, "Tuning job completed"))
    outcome = _outcome(workflow, summarize)
    read_winner.add_catch(store, errors=["States.ALL"], result_path="$.winner")
    store.add_catch(outcome, errors=["States.ALL"], result_path="$.records")
    read_winner.next(store).next(outcome)
    return read_winner


def _outcome(workflow: Construct, summarize: sfn.IChainable) -> sfn.IChainable:
    """One line for the summary: the winner, or no winner (no trial ran ok: the report, every trial's status and
    error, is at the report's S3 location), or no ``winner.json`` read at all."""

    def line(name: str, text: str, *paths: str) -> sfn.Chain:
        return sfn.Pass(
            workflow,
            name,
            parameters={"text.$": f"States.Format('{text}', {', '.join(paths)})"},
            result_path="$.outcome",
        ).next(summarize)

    winner = line("Tuning outcome: winner", "winner: trial {}; the report is at {}", "$.winner.value.trial",
                  "$.tune.report_uri")  # fmt: skip
    none = line(
        "Tuning outcome: no winner",
        "no winner: no trial ran ok; the status, error and log of every trial are in the report at {}",
        "$.tune.report_uri",
    )
    unread = line(
        "Tuning outcome: no report",
        "no winner read: the job left no {}winner.json (see its logs)",
        "$.tune.report_uri",
    )
    return (
        sfn.Choice(workflow, "Tuning winner?")
        .when(
            sfn.Condition.and_(
                sfn.Condition.is_present("$.winner.value.trial"),
                sfn.Condition.is_not_null("$.winner.value.trial"),
            ),
            winner,
        )  # fmt: skip
        .when(sfn.Condition.is_present("$.winner.value"), none)
        .otherwise(unread)
    )
