"""A run's summary (``blackwell-training result``, ``TrainingRuns.result``) from what was read of it: the execution
and its jobs (:class:`~constructs_lib.cli.records.Run`) and the last job's log lines. No AWS call here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from constructs_lib.cli.evaluation import evaluation_of
from constructs_lib.cli.progress import Progress
from constructs_lib.cli.records import Job, LogEvent, Run
from training.contract.container import HF_EXPORT_DIR
from training.contract.metric_lines import restarted_from_none


def run_result(current: Run, events: list[LogEvent]) -> dict[str, Any]:
    """``TrainingRuns.result`` of the run ``current`` whose last job logged ``events``."""
    job = current.job
    summary = current.summary or {}
    progress = Progress()
    for event in events:
        progress.feed(event.message)
    final_metrics = summary.get("final_metrics")
    if isinstance(final_metrics, list):
        final_metrics = {m["MetricName"]: m.get("Value") for m in final_metrics if "MetricName" in m}
    if final_metrics is None:
        final_metrics = job.final_metrics if job else {}
    unusable = final_metrics.get(
        "final:unusable_checkpoints", (progress.summary or {}).get("unusable_checkpoints")
    )
    return {
        "name": current.name,
        "status": current.status,
        "error": current.error,
        "cause": current.cause,
        "job": job.name if job else None,
        "failure_reason": job.failure_reason if job else None,
        "final_metrics": final_metrics,
        "trainer_summary": progress.summary,
        "restarted_from": None if unusable is None else restarted_from_none(int(unusable)),
        "model_artifacts": summary.get("model_artifacts") or (job.model_artifacts if job else None),
        "hugging_face_model": _hugging_face_model(summary, job),
        "checkpoint_uri": summary.get("checkpoint_uri") or (job.checkpoint_uri if job else None),
        "training_seconds": sum(j.training_seconds or 0 for j in current.jobs if j.kind == "training"),
        "billable_seconds": current.billable_seconds,
        "instance_type": job.instance_type if job else None,
        "instance_count": job.instance_count if job else None,
        "launches": len([j for j in current.jobs if j.kind == "training"]),
        "capacity": job.capacity if job else None,
        "cost_usd": current.cost_usd,
        "duration_seconds": current.duration_seconds,
        "links": current.links,
        "plan": summary.get("plan"),
        "memory_estimate_ignored": summary.get("memory_estimate_ignored"),
        "evaluation": evaluation_of(current),
        "tune": summary.get("tune"),
    }


def _hugging_face_model(summary: Mapping[str, Any], job: Job | None) -> dict[str, Any] | None:
    """Where the run's Hugging Face folder is: the workflow summary's, or (for a run whose summary is not there
    yet) the job's model archive and the trainer's folder in it."""
    if summary.get("hugging_face_model"):
        return dict(summary["hugging_face_model"])
    archive = job.model_artifacts if job else None
    return {"archive": archive, "folder": f"{HF_EXPORT_DIR}/"} if archive else None
