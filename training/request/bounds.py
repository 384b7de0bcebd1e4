"""The decision's size: what keeps the workflow's state under Step Functions' limit for any input.

Step Functions passes at most 256 KiB from one state to the next, and an execution whose state outgrows it ends
with ``States.DataLimitExceeded``, which no Catch handles: the user would get no reason at all. The request check's
result becomes the workflow's state (``Decision.state``), and after the job the job's description joins it (it
repeats the hyperparameters and the environment), so the decision keeps well under the limit:

* a refusal's ``cause`` lists the problems up to :data:`CAUSE_LIMIT_CHARS` (each line at most
  :data:`PROBLEM_LIMIT_CHARS`), then says how many more there are; every one of them is in the check's log and in
  what ``blackwell-training validate`` prints for the same input (:func:`bounded_cause`);
* a tuning run's plan carries the count of the combinations the trainer's rules refuse and the first few
  (``tuning.LISTED_REFUSALS``; ``blackwell-training tune --dry-run`` lists them all), and a search space has at
  most ``tuning.MAX_COMBINATIONS`` combinations;
* a request whose decided state could take more than :data:`STATE_LIMIT_BYTES` is refused naming its largest fields
  (:func:`size_problems`). The estimate is the same offline and in the workflow (it reads nothing): the fields, the
  ``HyperParameters`` map, the channels and the job's per-execution fields as decided, the evaluation's part for the
  longest execution name and instance type, and fixed allowances for the parts whose size the request does not set
  (the plan, a tuning run's trials, ``resume_from``'s checkpoint). It is never below what the workflow's state
  becomes (``tests/request/test_request_bounds.py``).

Pure Python, standard library only; part of the request check's Lambda asset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from training.contract.hardware import GPU_INSTANCE_TYPES
from training.request import evaluate_block, job
from training.request.rules import RequestRules

if TYPE_CHECKING:
    from training.request.value import Fields, Request

KIB = 1024
STATE_LIMIT_BYTES = 64 * KIB
"""The most the decided state may take as JSON: a quarter of Step Functions' 256 KiB, so that the states after the
job (the decision, plus the job's description, which repeats the hyperparameters and the environment) stay well
under the limit too."""
CAUSE_LIMIT_CHARS = 16 * KIB
"""The most a refusal's ``cause`` takes (Step Functions' Fail state keeps at most 32,768 characters of cause)."""
PROBLEM_LIMIT_CHARS = 2 * KIB
"""The most one problem line takes in the ``cause`` (a line listing every unknown name of a large input is cut)."""
PLAN_BYTES = 8 * KIB
"""Allowance for the memory, time and cost plan (its parts, advice and basis: about 3 KiB)."""
TUNE_BYTES = 24 * KIB
"""Allowance for a tuning run's part: at most ``tuning.MAX_TRIALS_LIMIT`` trials and the probe, whose settings fit
one SageMaker hyperparameter (2,500 characters), with their figures (about 200 bytes each), the first refused
combinations with their reasons (``tuning.LISTED_REFUSALS``), its paths: about 17 KiB at most."""
RESUME_BYTES = 3 * KIB
"""Allowance for ``resume_from``'s checkpoint (its step and URI) and its channel."""
LONGEST_EXECUTION_NAME = "x" * 80
"""Step Functions' longest execution name: the job's tags and MLflow run name carry the execution's."""
LONGEST_S3_URI = "s3://" + "x" * 1019
"""SageMaker's longest ``S3Uri`` (1,024 characters): an evaluated job's model archive."""
LONGEST_INSTANCE_TYPE = max(GPU_INSTANCE_TYPES, key=len)


def bounded_cause(problems: Sequence[str]) -> str:
    """``problems`` joined by ``"; "`` (the workflow's cause), at most :data:`CAUSE_LIMIT_CHARS`: each line cut at
    :data:`PROBLEM_LIMIT_CHARS`, and the lines that do not fit counted at the end."""
    kept: list[str] = []
    used = 0
    for index, problem in enumerate(problems):
        line = problem if len(problem) <= PROBLEM_LIMIT_CHARS else problem[: PROBLEM_LIMIT_CHARS - 3] + "..."
        left = len(problems) - index
        tail = (
            f"; and {left} more problems (the request check's log and blackwell-training validate --deployed on "
            "this input list every one)"
        )
        if used + len(line) + 2 + (len(tail) if left > 1 else 0) > CAUSE_LIMIT_CHARS:
            return "; ".join(kept) + tail
        kept.append(line)
        used += len(line) + 2
    return "; ".join(kept)


def estimated_state_bytes(request: Request, fields: Fields, rules: RequestRules) -> int:
    """At least what the decided state of ``request`` (valid, with ``fields`` decided) takes as JSON in the
    workflow, whatever its execution's name and whatever S3 holds (see the module's description)."""
    parts: dict[str, Any] = {
        "valid": True,
        "cause": "",
        "config": fields.as_dict(),
        "hyperparameters": dict(request.settings.hyperparameters),
        "channels": job.channels(fields),
        "request": job.job_fields(fields, rules, LONGEST_EXECUTION_NAME),
        "evaluation": _evaluation_bound(request, fields, rules),
        "evaluation_only": False,
    }
    size = len(json.dumps(parts)) + PLAN_BYTES
    size += len(json.dumps(job.with_checkpoint_place({}, "s3", rules, LONGEST_EXECUTION_NAME)))  # S3 direct's
    size += TUNE_BYTES if request.tune is not None else 0
    return size + (RESUME_BYTES if fields.resume_from is not None else 0)


def _evaluation_bound(request: Request, fields: Fields, rules: RequestRules) -> dict[str, Any] | None:
    """The evaluation's decided part for the longest execution name, instance type and model archive."""
    block = request.evaluate
    if block is None:
        return None
    facts = None
    if block.training_job is not None:
        facts = {
            "run": LONGEST_EXECUTION_NAME,
            "training_job": block.training_job,
            "model_uri": LONGEST_S3_URI,
        }
    return evaluate_block.decided(
        fields, block, rules, LONGEST_EXECUTION_NAME, facts, instance_type=LONGEST_INSTANCE_TYPE
    )


def size_problems(request: Request, fields: Fields, rules: RequestRules) -> list[str]:
    """The problem of a request whose decided state could outgrow :data:`STATE_LIMIT_BYTES`, naming its largest
    fields (a valid request's, ``fields`` decided)."""
    estimate = estimated_state_bytes(request, fields, rules)
    if estimate <= STATE_LIMIT_BYTES:
        return []
    return [
        f"input: its decision would take about {_kib(estimate)} of the workflow's state, more than the "
        f"{_kib(STATE_LIMIT_BYTES)} kept for it (Step Functions passes at most 256 KiB between states, and the job's "
        f"description, which repeats the hyperparameters and the environment, joins it after the job); its largest "
        f"fields: {largest_fields(fields.as_dict())}; shorten them"
    ]


def largest_fields(values: Mapping[str, Any], count: int = 3) -> str:
    """The ``count`` largest of ``values`` as JSON, with their sizes (``hyperparameters 80.1 KiB, ...``)."""
    sizes = sorted(((len(json.dumps(v)), k) for k, v in values.items()), reverse=True)[:count]
    return ", ".join(f"{name} {_kib(size)}" for size, name in sizes)


def state_problems(state: Mapping[str, Any]) -> list[str]:
    """The last guard, on the state itself: one the estimate let through and that still outgrows the limit (never
    expected: the estimate is an upper bound) is refused rather than failing the execution without a reason."""
    size = len(json.dumps(state))
    if size <= STATE_LIMIT_BYTES:
        return []
    config = state.get("config") or {}
    return [
        f"input: its decision takes {_kib(size)} of the workflow's state, more than the {_kib(STATE_LIMIT_BYTES)} "
        f"kept for it (Step Functions passes at most 256 KiB between states); its largest fields: "
        f"{largest_fields(config)}; shorten them"
    ]


def _kib(size: int) -> str:
    return f"{size / KIB:.1f} KiB"
