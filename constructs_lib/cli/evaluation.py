"""Evaluation for ``blackwell-training``: the execution input that evaluates a finished run (``evaluate``), a run's
scores (``result``), and runs side by side with their final losses (``compare``), or local results folders side by
side (``compare`` of folders: no AWS at all). No AWS call here but through the ``TrainingRuns`` passed in.

A run's scores are its evaluation job's final metrics (``eval:<task>:<field>``, read by SageMaker from the job's
``evaluation task=...`` lines): the evaluation of its own execution (train, then evaluate), of an evaluation-only
execution (the run named is that execution), or the newest evaluation job tagged as evaluating it (an evaluation
started later with ``blackwell-training evaluate``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from constructs_lib.cli.errors import OperatorError
from constructs_lib.cli.records import Job, Run
from training.contract.evaluation import EVALUATION_METRICS, STANDARD_TASK_CHANCE
from training.contract.settings_table import HYPERPARAMETERS_BY_NAME
from training.request.evaluate_block import EVALUATED_TAG

TrainingRuns = Any
"""A ``constructs_lib.cli.api.TrainingRuns`` (not imported: the API imports this module)."""

METRIC = re.compile(r"^eval:(.+):([a-z_]+)$")


def scores_from_metrics(metrics: Mapping[str, Any] | list[Any]) -> dict[str, dict[str, float]]:
    """``{"eval:piqa:acc": 0.6, ...}`` (or a ``FinalMetricDataList``) -> ``{"piqa": {"acc": 0.6, ...}}``."""
    if isinstance(metrics, list):
        metrics = {m["MetricName"]: m.get("Value") for m in metrics if "MetricName" in m}
    scores: dict[str, dict[str, float]] = {}
    for name, value in metrics.items():
        match = METRIC.match(name)
        if match and match.group(2) in EVALUATION_METRICS and value is not None:
            scores.setdefault(match.group(1), {})[match.group(2)] = float(value)
    return scores


def evaluation_of(current: Run) -> dict[str, Any] | None:
    """The run's own evaluation: its execution summary's, or (not ended, or a direct run) its evaluation job's."""
    summary = (current.summary or {}).get("evaluation")
    job = current.evaluation_job
    if isinstance(summary, dict) and summary.get("job_name"):
        return {
            "job": summary["job_name"],
            "status": summary.get("status"),
            "tasks": summary.get("tasks"),
            "evaluated": summary.get("evaluated"),
            "scores": scores_from_metrics(summary.get("scores") or []),
            "results": summary.get("results"),
        }
    if job is None:
        return None
    return {"job": job.name, "status": job.status, "tasks": job.hyperparameters.get("tasks", "").split(","),
            "evaluated": None, "scores": scores_from_metrics(job.final_metrics), "results": None,
            "failure_reason": job.failure_reason}  # fmt: skip


def later_evaluation(runs: TrainingRuns, run: str) -> dict[str, Any] | None:
    """The newest completed evaluation job tagged as evaluating ``run`` (SageMaker Search by that tag); None when
    there is none, or the caller may not search (``sagemaker:Search``: ``result`` then shows no later scores)."""
    from botocore.exceptions import ClientError

    try:
        found = runs.client("sagemaker").search(
            Resource="TrainingJob",
            SearchExpression={
                "Filters": [{"Name": f"Tags.{EVALUATED_TAG}", "Operator": "Equals", "Value": run}]
            },
            SortBy="CreationTime",
            SortOrder="Descending",
            MaxResults=20,
        )["Results"]
    except ClientError:
        return None
    for item in found:
        described = item["TrainingJob"]
        if described.get("TrainingJobStatus") == "Completed":
            job = Job(name=described["TrainingJobName"])
            job.update(described)
            return {"job": job.name, "status": job.status, "tasks": job.hyperparameters.get("tasks", "").split(","),
                    "evaluated": {"run": run}, "scores": scores_from_metrics(job.final_metrics), "results": None}  # fmt: skip
    return None


def with_later_evaluation(runs: TrainingRuns, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` (``TrainingRuns.result``) with the newest later evaluation of the run when it has none of its
    own (asked only of a run that trained and succeeded)."""
    if result.get("evaluation") is None and result["status"] == "SUCCEEDED" and result.get("job"):
        result["evaluation"] = later_evaluation(runs, result["name"])
    return result


def evaluation_input(current: Run, options: Mapping[str, Any]) -> dict[str, Any]:
    """The execution input that evaluates the finished run ``current`` (``options``: the ``evaluate`` block's
    fields given on the command line); refused with the reason when the run has no exported model to evaluate."""
    job = current.job
    if current.status not in ("SUCCEEDED", "Completed") or job is None or job.status != "Completed":
        state = (
            f"{current.status}{f', its training job {job.name} {job.status}' if job else ', no training job'}"
        )
        raise OperatorError(
            f"run {current.name} has no exported model to evaluate ({state}): only a run whose training job "
            "completed wrote one"
        )
    if str(job.hyperparameters.get("position_encoding", "rope")).lower() != "rope":
        raise OperatorError(
            f"run {current.name} trained with position_encoding=none: it has no Hugging Face export to evaluate"
        )
    block = {key: value for key, value in options.items() if value is not None}
    request: dict[str, Any] = {"evaluate": {**block, "training_job": job.name}}
    prefix = re.fullmatch(r"(.+)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", job.name)
    if (
        prefix
    ):  # the workflow named it <job_name_prefix>-<UUID>: the evaluation job shares its prefix (dashboard)
        request["job_name_prefix"] = prefix.group(1)
    return request


def evaluation_name(run: str, now: datetime | None = None) -> str:
    """``<run>-eval-<UTC yyyymmdd-hhmmss>``, at most 80 characters (the run's name cut to fit)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{run[: 80 - len(stamp) - 6]}-eval-{stamp}"


def compare_row(runs: TrainingRuns, name: str) -> dict[str, Any]:
    """One run for ``compare``: its training (precision, steps, final and validation loss) and its scores."""
    current = runs.run(name)
    evaluation = evaluation_of(current)
    trained = current
    evaluated = (evaluation or {}).get("evaluated") or {}
    if current.job is None and evaluated.get("run"):  # an evaluation-only execution: the run it evaluated
        trained = runs.run(evaluated["run"])
    if evaluation is None or not evaluation["scores"]:
        evaluation = later_evaluation(runs, current.name) or evaluation
    job = trained.job
    metrics = (job.final_metrics if job else {}) or {}
    return {
        "run": current.name,
        "trained_run": trained.name,
        "status": current.status,
        "precision": job.hyperparameters.get("precision") if job else None,
        "max_steps": job.hyperparameters.get("max_steps", str(HYPERPARAMETERS_BY_NAME["max_steps"].default))
        if job
        else None,
        "final_loss": metrics.get("final:final_loss"),
        "val_loss": metrics.get("final:val_loss"),
        "evaluation_job": (evaluation or {}).get("job"),
        "scores": (evaluation or {}).get("scores") or {},
    }


def chance(task: str) -> float | None:
    """A standard task's accuracy by chance (``training.contract.evaluation.STANDARD_TASK_CHANCE``)."""
    return STANDARD_TASK_CHANCE.get(task)


LOCAL_SCORES = "scores.json"
"""What marks a local results folder (``python -m training.evaluate``'s output, or an evaluation job's
``output.tar.gz`` unpacked): its scores, with ``evaluation.json`` beside them when it says what was evaluated."""


def is_local(name: str) -> bool:
    """Whether ``name`` is a local results folder rather than a run's name."""
    return (Path(name) / LOCAL_SCORES).is_file()


def local_compare_row(name: str) -> dict[str, Any]:
    """One local results folder for ``compare``: its scores, the model it evaluated and what the run's
    ``settings.json`` recorded (precision, max_steps); the losses are not in a results folder (``-``)."""
    folder = Path(name)
    try:
        scores = json.loads((folder / LOCAL_SCORES).read_text())
        evaluated = (
            json.loads((folder / "evaluation.json").read_text())
            if (folder / "evaluation.json").is_file()
            else {}
        )
    except (OSError, ValueError) as error:
        raise OperatorError(f"cannot read the results in {folder}: {error}") from None
    if not isinstance(scores, dict) or not all(isinstance(v, dict) for v in scores.values()):
        raise OperatorError(f"{folder / LOCAL_SCORES} is not an evaluation's scores ({{task: {{acc: ...}}}})")
    run = evaluated.get("run") or {}
    return {
        "run": name,
        "trained_run": evaluated.get("model") or name,
        "status": "local",
        "precision": run.get("precision"),
        "max_steps": run.get("max_steps"),
        "final_loss": None,
        "val_loss": None,
        "evaluation_job": None,
        "scores": {
            task: {k: float(v) for k, v in values.items() if k in EVALUATION_METRICS}
            for task, values in scores.items()
        },
    }


def compare_rows(runs: Callable[[], TrainingRuns], names: list[str]) -> list[dict[str, Any]]:
    """``compare``'s rows: local results folders read here (no AWS), or runs through the API; not both."""
    local = [name for name in names if is_local(name)]
    if not local:
        return runs().compare(names)
    if len(local) != len(names):
        remote = ", ".join(name for name in names if name not in local)
        raise OperatorError(
            f"compare: {', '.join(local)} are local results folders but {remote} are not (no {LOCAL_SCORES} there): "
            "compare local folders with local folders, runs with runs"
        )
    return [local_compare_row(name) for name in dict.fromkeys(names)]
