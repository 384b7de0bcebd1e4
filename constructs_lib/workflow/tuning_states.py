"""The workflow's states after a tuning job: the same launch loop ran it (``states.launch_loop``: the same image,
instance type and count, capacity modes and relaunches as a training run, with the request check's tuning
hyperparameters), and a completed job comes here instead of the training summary.

``Tuning run?`` (the decision's ``tune`` is set) -> ``Read tuning winner`` (its report's ``winner.json``, which the
job wrote into its checkpoint folder and SageMaker uploaded) -> ``Store tuning measurements`` (its
``measurements.json`` copied to ``<tuning prefix>measurements/<image tag>/<segment>/<execution>.json``, where the
request check reads them for every later request's plan) -> ``Summarize tuning`` (the report's S3 location, the
winner, the records' place, the tuning plan) -> ``Tuning job completed``. A missing winner or a failed copy is
reported in the summary, never a failed execution: the job itself completed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from training.request.contract import TUNE_REPORT_FOLDER

TRAINING_ONLY_SUMMARY = (
    "model_artifacts",
    "hugging_face_model",
    "plan",
    "memory_estimate_ignored",
    "resumed_from",
)
"""Fields of the training summary that say nothing about a tuning job (it trains no model to keep)."""


def report_objects(bucket: s3.IBucket, runs_prefix: str) -> str:
    """The ARN pattern of every tuning report file of the workflow's runs (``<runs_prefix><execution>/tune/*``)."""
    return bucket.arn_for_objects(f"{runs_prefix}*/{TUNE_REPORT_FOLDER}/*")


def record_objects(bucket: s3.IBucket, measurements_prefix: str) -> str:
    return bucket.arn_for_objects(f"{measurements_prefix}*")


def after_job(
    workflow: Construct,
    *,
    bucket: s3.IBucket,
    runs_prefix: str,
    measurements_prefix: str,
    summary: Mapping[str, Any],
    training: sfn.IChainable,
) -> sfn.Choice:
    """``Tuning run?``: a tuning job's states (above), or ``training`` (the training summary). ``summary`` is the
    training summary's parameters (the tuning summary keeps those that apply)."""
    read_winner = tasks.CallAwsService(
        workflow,
        "Read tuning winner",
        comment="The winner the tuning job wrote into its report (its checkpoint folder's tune/winner.json).",
        service="s3",
        action="getObject",
        parameters={"Bucket.$": "$.tune.bucket", "Key.$": "$.tune.winner_key"},
        iam_action="s3:GetObject",  # the action's canonical name (the default would be s3:getObject)
        iam_resources=[report_objects(bucket, runs_prefix)],
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
        iam_resources=[record_objects(bucket, measurements_prefix)],
        additional_iam_statements=[
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[report_objects(bucket, runs_prefix)])
        ],
        result_selector={"etag.$": "$.CopyObjectResult.ETag"},
        result_path="$.records",
    )
    kept = {k: v for k, v in summary.items() if k.removesuffix(".$") not in TRAINING_ONLY_SUMMARY}
    summarize = sfn.Pass(
        workflow,
        "Summarize tuning",
        comment="The tuning job's result: where its report is, the winner, where its measurements were stored.",
        parameters={
            **kept,
            "tune": {
                "report_uri.$": "$.tune.report_uri",
                "winner.$": "$.winner",
                "measurements.$": "$.records",
                "records_key.$": "$.tune.records_key",
                "plan.$": "$.tune.plan",
            },
        },
    ).next(sfn.Succeed(workflow, "Tuning job completed"))
    read_winner.add_catch(store, errors=["States.ALL"], result_path="$.winner")
    store.add_catch(summarize, errors=["States.ALL"], result_path="$.records")
    read_winner.next(store).next(summarize)
    choice = sfn.Choice(workflow, "Tuning run?", comment="A tuning job's summary reads its report.")
    choice.when(
        sfn.Condition.and_(sfn.Condition.is_present("$.tune"), sfn.Condition.is_not_null("$.tune")),
        read_winner,
    )
    choice.otherwise(training)
    return choice
