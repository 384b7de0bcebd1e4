"""The decision's part for a tuning run: an execution input with a ``tune`` block runs one SageMaker job whose
driver (``training.tune`` in the image) tries the candidates the plan picks, instead of a training run.

Decided here, before anything launches (``training.request.tuning`` does the work), from the request read once
(``value.Request``: its parsed settings and its ``tune`` block parsed): the candidates (none that fits: refused),
the cost (a ``max_cost_usd`` below one trial: refused; otherwise it keeps the top trials that fit in it and bounds
the job's ``MaxRuntimeInSeconds``), and the job's ``tune_*`` hyperparameters. The decision's ``tune`` names where
the job's report will be (its checkpoint folder's ``tune/``, which SageMaker uploads) and where the workflow stores
its measurement records (the ``tuning/`` prefix, which ``reads.read_measurements`` lists for every later request's
plan).

Pure Python, no aws_cdk: part of the request check's Lambda asset (``request_function``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training.contract import batch
from training.request import fine_tuning, tuning_plan
from training.request.rules import RequestRules, size_problems
from training.request.value import Request


@dataclass
class TuneDecision:
    """``problems`` (empty: it runs), the tuning job's whole ``hyperparameters`` map, its run-time bound and the
    decision's ``tune`` part (paths and the tuning plan)."""

    problems: list[str]
    hyperparameters: dict[str, str] = field(default_factory=dict)
    max_runtime_seconds: int | None = None
    tune: dict[str, Any] | None = None
    refused: list[str] = field(default_factory=list)
    """Every combination the trainer's rules refuse, with its reason (``tune`` lists the first few)."""


def decide_tune(
    request: Request,
    rules: RequestRules,
    *,
    measurements: Sequence[Mapping[str, Any]],
    execution: str | None,
) -> TuneDecision:
    """The tuning run of a request whose other fields and settings are valid."""
    fields, block = request.fields, request.tune
    assert block is not None
    if fields.resume_from is not None:
        return TuneDecision(
            [
                f"tune: a tuning run starts every trial afresh, it resumes nothing; set resume_from to null (got "
                f"{json.dumps(fields.resume_from)})"
            ]  # fmt: skip
        )
    if block.settings is None:
        return TuneDecision(list(block.problems))
    if request.settings.values is None:
        # init_from before its config.json is read (offline): the candidates wait for the model's shape, and the
        # decision says this check was skipped (``decision.skipped_checks``)
        return TuneDecision([])
    assert request.settings.values is not None
    tuned = tuning_plan.plan_tuning(
        request.settings.values,
        request.setup(),
        block.settings,
        max_runtime_seconds=fields.max_runtime_seconds,
        measurements=measurements,
        image_tag=rules.image_tag(),
        max_instance_count=rules.max_instance_count,
        instance_types=rules.allowed_instance_types,
        data_check=fine_tuning.candidate_check(request),  # conversation data: seq_length, windows per batch
        objective=fine_tuning.objective(request),
        finish=fine_tuning.candidate_plan(request),  # a DPO run's: the reference's cost, once
    )
    if tuned.problems:
        return TuneDecision(tuned.problems)
    extra = tuning_plan.job_hyperparameters(
        tuned, instance_type=fields.instance_type, image_uri=rules.image_uri
    )
    paths = rules.tuning_paths(execution) if execution else {}
    hyperparameters = {**_batch_in_windows(request), **extra}
    return TuneDecision(
        size_problems(hyperparameters, rules),
        hyperparameters,
        tuned.max_runtime_seconds,
        {**paths, "plan": tuned.to_dict()},
        list(tuned.found.refused),
    )


def _batch_in_windows(request: Request) -> dict[str, str]:
    """The request's ``HyperParameters`` with a batch given in tokens as the ``batch_size`` it made on the job's GPUs
    (``batch.resolve``, in the request's settings): the tuning job's trials set their own ``batch_size`` (and
    ``grad_accum_steps``, keeping the base's tokens per step), which ``batch_tokens`` may not come with."""
    settings = dict(request.settings.hyperparameters)
    if settings.pop(batch.TOKENS, None) is not None:
        assert request.settings.values is not None
        settings[batch.WINDOWS] = str(request.settings.values[batch.WINDOWS])
    return settings
