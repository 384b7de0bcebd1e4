"""The request check's part for a tuning run: an execution input with a ``tune`` block runs one SageMaker job
whose driver (``training.tune`` in the image) tries the candidates the plan picks, instead of a training run.

Decided here, before anything launches (``training.request.tuning`` does the work): the block's fields, the
candidates (none that fits: refused), the cost (a ``max_cost_usd`` below one trial: refused; otherwise it keeps the
top trials that fit in it and bounds the job's ``MaxRuntimeInSeconds``), and the job's ``tune_*``
hyperparameters. The decision's ``tune`` names where the job's report will be (its checkpoint folder's ``tune/``,
which SageMaker uploads) and where the workflow stores its measurement records (the ``tuning/`` prefix, which
:func:`read_measurements` lists for every later request's plan).

Pure Python, no aws_cdk: part of the request check's Lambda asset (``request_function``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training.request import measured, tuning
from training.request.rules import RequestRules

MAX_RECORD_FILES = 100
"""At most this many tuning runs' record files (the newest) are read per request (the Lambda has 30 seconds)."""


@dataclass
class TuneDecision:
    """``problems`` (empty: it runs), the tuning job's whole ``hyperparameters`` map, its run-time bound and the
    decision's ``tune`` part (paths and the tuning plan)."""

    problems: list[str]
    hyperparameters: dict[str, str] = field(default_factory=dict)
    max_runtime_seconds: int | None = None
    tune: dict[str, Any] | None = None


def decide_tune(
    config: Mapping[str, Any],
    rules: RequestRules,
    hyperparameters: Mapping[str, str],
    architecture: Mapping[str, Any] | None = None,
    *,
    measurements: Sequence[Mapping[str, Any]],
    execution: str | None,
) -> TuneDecision:
    """The tuning run of a request whose other fields are valid (``config`` merged, ``hyperparameters`` its
    rendered trainer settings, ``architecture`` the ``init_from`` model's settings when it has one)."""
    if config["init_from"] is not None and architecture is None:
        return TuneDecision(
            [
                "tune: with init_from, the candidates are planned with the model's config.json, which is read before "
                "launch (blackwell-training tune --deployed, or the workflow itself)"
            ]  # fmt: skip
        )
    if config["resume_from"] is not None:
        return TuneDecision(
            [
                f"tune: a tuning run starts every trial afresh, it resumes nothing; set resume_from to null (got "
                f"{json.dumps(config['resume_from'])})"
            ]  # fmt: skip
        )
    settings, problems = tuning.parse_tune(config["tune"], config["instance_type"])
    if settings is None:
        return TuneDecision(problems)
    tuned = tuning.plan_tuning(
        config,
        settings,
        max_runtime_seconds=config["max_runtime_seconds"],
        measurements=measurements,
        image_tag=rules.image_tag(),
        architecture=architecture,
    )
    if tuned.problems:
        return TuneDecision(tuned.problems)
    extra = tuning.job_hyperparameters(
        tuned, instance_type=config["instance_type"], image_uri=rules.image_uri
    )
    paths = rules.tuning_paths(execution) if execution else {}
    return TuneDecision(
        [], {**hyperparameters, **extra}, tuned.max_runtime_seconds, {**paths, "plan": tuned.to_dict()}
    )


def read_measurements(s3: Any, rules: RequestRules) -> list[dict[str, Any]]:
    """The stored measurement records of the workflow's image (``rules.measurements_prefix``), newest files first,
    at most ``MAX_RECORD_FILES`` of them; none when the image or the bucket is not known or S3 refuses (the plan
    then uses the published figures, and says so)."""
    prefix = rules.measurements_prefix()
    if prefix is None or rules.bucket_name is None:
        return []
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415 - in the Lambda runtime and the CLI

    try:
        listed = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=rules.bucket_name, Prefix=prefix):
            listed += [item for item in page.get("Contents", []) if item["Key"].endswith(".json")]
        listed.sort(key=lambda item: item["LastModified"], reverse=True)
        records = []
        for item in listed[:MAX_RECORD_FILES]:
            body = s3.get_object(Bucket=rules.bucket_name, Key=item["Key"])["Body"].read()
            try:
                listed_records = json.loads(body).get("records", [])
            except (ValueError, AttributeError):
                continue  # not a record file: skipped, never fatal to a request
            if isinstance(listed_records, list):
                records += [r for r in listed_records if measured.well_formed(r)]  # malformed records skipped
        return records
    except (ClientError, BotoCoreError):
        return []
