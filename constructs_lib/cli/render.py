"""What ``blackwell-training`` prints: rich tables of a plan and of a run's result, the one-line status of a
watched run, and the list of a request's problems. No AWS call here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from constructs_lib.cli.progress import format_duration
from constructs_lib.cli.records import Snapshot


def print_problems(problems: Sequence[str], err: Any, json_out: Any) -> None:
    """Every problem on standard error, one line each (and as JSON on ``json_out`` with ``--json``)."""
    if json_out is not None:
        json_out.print(json.dumps({"valid": False, "problems": list(problems)}, indent=2), markup=False)
    err.print(f"invalid request ({len(problems)} problem{'s' if len(problems) != 1 else ''}):", markup=False)
    for problem in problems:
        err.print(f"  - {problem}", markup=False)


def status_line(snapshot: Snapshot) -> str:
    run = snapshot.run
    job = run.jobs[-1] if run.jobs else None  # the job running now: training, then its evaluation
    parts = [run.status]
    if job is None:
        parts.append("no training job yet")
    else:
        secondary = (
            f"/{job.secondary_status}" if job.secondary_status and job.secondary_status != job.status else ""
        )
        word = "evaluation job" if job.kind == "evaluation" else "job"
        parts.append(f"{word} {job.name} {job.status}{secondary}")
        launches = len([j for j in run.jobs if j.kind == job.kind])
        if launches > 1:
            parts.append(f"launch {launches}")
    parts.append(snapshot.progress.describe())
    return " | ".join(parts)


def cost_text(cost: float | None, capacity: str | None) -> str:
    if capacity == "training plan":
        return "training plan"
    return "-" if cost is None else f"${cost:,.2f}"


def _hf_text(model: dict[str, Any] | None) -> str | None:
    return f"{model['folder']} in {model['archive']}" if model and model.get("archive") else None


def print_result(out: Any, result: dict[str, Any], loss_sparkline: str = "") -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(show_header=False, title=f"Run {result['name']}: {result['status']}")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, Any]] = [
        ("job", result["job"]),
        ("instances", f"{result['instance_count']} x {result['instance_type']}" if result["job"] else None),
        ("launches", result["launches"]),
        ("error", f"{result['error']}: {result['cause']}" if result["error"] else None),
        ("restarted from", result["restarted_from"]),
        ("model artifacts", result["model_artifacts"]),
        ("Hugging Face model", _hf_text(result.get("hugging_face_model"))),
        ("checkpoints", result["checkpoint_uri"]),
        ("training time", format_duration(result["training_seconds"])),
        ("billable time", format_duration(result["billable_seconds"])),
        ("cost (est.)", cost_text(result["cost_usd"], result["capacity"])),
    ]
    rows += [
        (f"metric {k}", f"{v:.6g}" if isinstance(v, float) else v)
        for k, v in (result["final_metrics"] or {}).items()
    ]
    trainer = dict(result["trainer_summary"] or {})
    if "final_loss" in trainer and loss_sparkline:  # the loss of every logged step, all launches, beside it
        rows.append(("trainer final_loss", f"{trainer.pop('final_loss'):.6g}  {loss_sparkline}"))
    elif loss_sparkline:  # still running, or stopped before its summary line
        rows.append(("loss so far", loss_sparkline))
    rows += [(f"trainer {k}", f"{v:.6g}") for k, v in trainer.items()]
    rows += _estimate_rows(result)
    rows += evaluation_rows(result.get("evaluation"))
    rows += [(f"link {k}", v) for k, v in result["links"].items()]
    for key, value in rows:
        if value is not None:  # Text: a failure reason's "[/opt/ml/...]" is not rich markup
            table.add_row(Text(key), Text(str(value)))
    out.print(table)


def print_plan(out: Any, planned: dict[str, Any]) -> None:
    """The plan (``training.request.plan``) as a rich table: memory by part, then throughput, time and cost."""
    from rich.table import Table
    from rich.text import Text

    verdict = "fits" if planned["fits"] else "DOES NOT FIT"
    table = Table(
        title=f"Plan: {planned['peak_gib']:.1f} GiB per GPU of {planned['limit_gib']:.1f} GiB allowed ({verdict})"
    )
    table.add_column("part (at " + planned["moment"] + ")")
    table.add_column("GiB per GPU", justify="right")
    for name, gib in sorted(planned["parts_gib"].items(), key=lambda kv: -kv[1]):
        table.add_row(Text(name), f"{gib:.2f}")
    table.add_row(
        Text("allowance: CUDA context, workspaces, NCCL, fragmentation"), f"{planned['allowance_gib']:.2f}"
    )
    table.add_row(Text("estimated peak", style="bold"), Text(f"{planned['peak_gib']:.2f}", style="bold"))
    out.print(table)
    cost = (
        "unknown (no on-demand price)"
        if planned["cost_usd"] is None
        else f"${planned['cost_usd']:,.2f} (on-demand prices of {planned.get('price_source', 'unknown date')})"
    )
    out.print(
        f"{planned['world_size']} GPUs; ~{planned['tokens_per_sec_per_gpu']:,} tokens/s per GPU; step "
        f"{planned['step_seconds']:.3f} s; run {format_duration(planned['run_seconds'])}; cost {cost} "
        f"(throughput from the {planned['throughput_source']})",
        markup=False,
    )
    if planned["warning"]:
        out.print(f"warning: {planned['warning']}", markup=False)
    if planned["advice"]:
        out.print("fits with: " + "; ".join(planned["advice"]), markup=False)


def _estimate_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The plan the run was launched with, next to what the trainer measured (estimate against actual)."""
    planned = result.get("plan")
    if not isinstance(planned, dict):
        return []
    measured = result.get("trainer_summary") or {}
    tensors_gb = planned["tensors_gib"] * 2**30 / 1e9  # torch.cuda.max_memory_allocated counts tensors, in GB
    peak = f"{tensors_gb:.1f} GB of tensors ({planned['peak_gib']:.1f} GiB with the allowance)"
    if "peak_mem_gb" in measured:
        peak += f"; measured {measured['peak_mem_gb']:.1f} GB"
    speed = f"{planned['tokens_per_sec_per_gpu']:,} tokens/s per GPU"
    if "tokens_per_sec" in measured:
        speed += f"; measured {measured['tokens_per_sec']:,.0f}"
    ignored = "yes (launched although it did not fit)" if result.get("memory_estimate_ignored") else None
    return [
        ("estimate: peak memory", peak),
        ("estimate: throughput", speed),
        ("memory estimate ignored", ignored),
    ]


def score_text(values: dict[str, float], field: str) -> str | None:
    """``0.612 ± 0.011`` (the score and its standard error), or None when the task has no such score."""
    if field not in values:
        return None
    error = values.get(f"{field}_stderr")
    return f"{values[field]:.3f}" + (f" ± {error:.3f}" if error is not None else "")


def evaluation_rows(evaluation: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The evaluation's job, the run it evaluated, and each task's acc and acc_norm against chance."""
    from constructs_lib.cli.evaluation import chance

    if not evaluation:
        return []
    evaluated = (evaluation.get("evaluated") or {}).get("run")
    rows: list[tuple[str, Any]] = [
        ("evaluation job", f"{evaluation['job']} ({evaluation.get('status')})"),
        ("evaluated run", evaluated),
        ("evaluation failure", evaluation.get("failure_reason")),
    ]
    for task, values in sorted(evaluation["scores"].items()):
        parts = [f"{f} {text}" for f in ("acc", "acc_norm") if (text := score_text(values, f))]
        level = chance(task)
        rows.append((f"score {task}", ", ".join(parts) + (f" (chance {level:.2f})" if level else "")))
    return rows


def print_compare(out: Any, rows: list[dict[str, Any]]) -> None:
    """Runs side by side: precision, max_steps, final and validation loss, then each task's acc / acc_norm."""
    from rich.table import Table
    from rich.text import Text

    from constructs_lib.cli.evaluation import chance

    tasks = sorted({task for row in rows for task in row["scores"]})
    table = Table(title="Runs compared (acc / acc_norm ± standard error; chance in the header)")
    for column in ("run", "precision", "max_steps", "final loss", "val loss"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for task in tasks:
        level = chance(task)
        table.add_column(f"{task}" + (f" (chance {level:.2f})" if level else ""), justify="right")
    for row in rows:
        cells = [row["run"] + (f" (of {row['trained_run']})" if row["trained_run"] != row["run"] else "")]
        cells += [str(row["precision"] or "-"), str(row["max_steps"] or "-")]
        cells += [f"{row[k]:.4f}" if row[k] is not None else "-" for k in ("final_loss", "val_loss")]
        for task in tasks:
            values = row["scores"].get(task, {})
            texts = [score_text(values, f) or "-" for f in ("acc", "acc_norm")]
            cells.append(" / ".join(texts) if values else "-")
        table.add_row(*(Text(c) for c in cells))
    out.print(table)
