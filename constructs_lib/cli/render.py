"""What ``blackwell-training`` prints: rich tables of a plan and of a run's result, the one-line status of a
watched run, and the list of a request's problems. No AWS call here."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any

from constructs_lib.cli.progress import format_duration
from constructs_lib.cli.records import Snapshot
from training.contract.settings_parse import format_setting
from training.plan.report import instances_text, network_line


def say(out: Any, text: str, indent: str = "  ") -> None:
    """``text`` in lines that fit the terminal (``out``'s width), broken between words only: a word longer than a
    line (a URL) stays whole on a line of its own; the lines after the first indented by ``indent``."""
    lines = textwrap.wrap(text, width=max(20, out.width), subsequent_indent=indent, break_long_words=False,
                          break_on_hyphens=False)  # fmt: skip
    for line in lines or [""]:
        out.print(line, markup=False, soft_wrap=True)


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


def records_line(planned: dict[str, Any], records: dict[str, Any]) -> str:
    """What the local tuning records did to the plan (``plan --measurements``): how many were read, and whether
    one stands for this request (the workflow's rules: the same settings, instance, GPU and image)."""
    read = f"tuning records: {records['read']} read from {', '.join(records['files'])}"
    if records["image_tag"] is None:
        return f"{read}; no image given (--image): a record stands only for the image the request would run"
    if planned.get("throughput_basis") == "measured":
        return (
            f"{read}; one stands for this request (image {records['image_tag']}): the throughput is measured"
        )
    return (
        f"{read}; none stands for this request on image {records['image_tag']} (a record must have its settings, "
        "instance type and count, the GPU and the image)"
    )


def _between(band: dict[str, Any] | None, key: str, text: Any) -> str:
    """An estimate's low-high spread of ``key`` (the plan's ``throughput_spread``), or nothing."""
    if not band or band.get(key) is None:
        return ""
    return f" ({text(band[key][0])}-{text(band[key][1])})"


def print_plan(out: Any, planned: dict[str, Any]) -> None:
    """The plan (``training.plan``) as a rich table: memory by part, then throughput, time and cost."""
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
    band = planned.get("throughput_spread")
    cost = (
        "unknown (no on-demand price)"
        if planned["cost_usd"] is None
        else f"${planned['cost_usd']:,.2f}{_between(band, 'cost_usd', '${:,.2f}'.format)}{instances_text(planned)} "
        "(on-demand prices of "
        f"{planned.get('price_source', 'unknown date')})"
    )
    basis = planned.get("throughput_basis", "estimate")
    say(out, f"{planned['world_size']} GPUs{_layout(planned)}: ~{planned['tokens_per_sec_per_gpu']:,}"
        f"{_between(band, 'tokens_per_sec_per_gpu', '{:,}'.format)} tokens/s per GPU ({basis})")  # fmt: skip
    say(out, f"step {planned['step_seconds']:.3f} s{_between(band, 'step_seconds', '{:.3f}'.format)}; run "
        f"{format_duration(planned['run_seconds'])}{_between(band, 'run_seconds', format_duration)}")  # fmt: skip
    say(out, f"cost {cost}")
    say(out, f"throughput {basis}: {planned['throughput_source']}")
    if band:
        say(out, f"its spread: {band['assumptions']}")
    net = network_line(planned)
    if net:
        say(out, net)
    records = planned.get("records")
    if records is not None:
        say(out, records_line(planned, records))
    for key, label in (("step", "step"), ("data", "data"), ("preference", "preference tuning (dpo)")):
        if planned.get(key):
            say(out, f"{label}: {planned[key]['summary']}")
    check = planned.get("memory_check")
    if check:
        say(
            out,
            f"memory estimate against {check['records']} stored measurement(s) of this instance and image: mean "
            f"error {check['mean_abs_error_pct']}%, largest {check['max_abs_error_pct']}%"
            + (
                f", this request {check['this_request_error_pct']:+}%"
                if check["this_request_error_pct"] is not None
                else ""
            )
            + (
                f"; {check['oom_predicted_to_fit']} predicted to fit ran out of memory"
                if check["oom_predicted_to_fit"]
                else ""
            ),
        )
    if planned["warning"]:
        say(out, f"warning: {planned['warning']}")
    for note in planned.get("notes", []):
        say(out, f"note: {note}")
    if planned["advice"]:
        say(out, "fits with: " + "; ".join(planned["advice"]))


def _layout(planned: dict[str, Any]) -> str:
    """The data-parallel layout of a plan (``data_parallel``): ", replicate 2 x shard 8", ", shard 8"; empty for a
    plan recorded before layouts were."""
    layout = planned.get("data_parallel")
    if not layout:
        return ""
    replicas = f"replicate {layout['replicate']} x " if layout["replicate"] > 1 else ""
    return f", {replicas}shard {layout['shard']}"


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
    band = planned.get("throughput_spread")
    speed = (
        f"{planned['tokens_per_sec_per_gpu']:,}{_between(band, 'tokens_per_sec_per_gpu', '{:,}'.format)} tokens/s "
        f"per GPU ({planned.get('throughput_basis', 'estimate')})"
    )
    if "tokens_per_sec" in measured:
        speed += f"; measured {measured['tokens_per_sec']:,.0f}"
    ignored = "yes (launched although it did not fit)" if result.get("memory_estimate_ignored") else None
    return [
        ("estimate: peak memory", peak),
        ("estimate: throughput", speed),
        ("memory estimate ignored", ignored),
    ]


def print_tune_plan(out: Any, planned: dict[str, Any]) -> None:
    """A tuning run before launch: its trials (best predicted first, the probe last) and what it costs."""
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"Tuning plan: {len(planned['trials'])} trials of {planned['considered']} combinations on "
        f"{planned['instance_count']} x {planned['instance_type']}",
    )
    # Nothing wraps or breaks: one setting a line (the column as wide as the longest), the throughput on lines of
    # its own; 80 columns hold the widest setting name.
    for heading in ("#", "settings", "tok/s per GPU", "GiB", "seconds"):
        table.add_column(heading, justify="left" if heading == "settings" else "right", no_wrap=True)
    for number, trial in enumerate(planned["trials"], start=1):
        settings = [f"{k}={format_setting(v)}" for k, v in trial["settings"].items()]
        probe = ["(probe: predicted not to fit)"] if trial["probe"] else []
        spread = trial.get("predicted_tokens_per_sec_per_gpu_spread")
        speed = [f"{trial['predicted_tokens_per_sec_per_gpu']:,}", *([f"{spread[0]:,}-{spread[1]:,}"] if spread else []),
                 trial["throughput_basis"]]  # fmt: skip
        table.add_row(str(number), Text("\n".join(settings + probe)), Text("\n".join(speed)),
                      f"{trial['predicted_peak_gib']:.1f}", str(trial["expected_seconds"]))  # fmt: skip
    out.print(table)
    say(out, "predicted for each trial: tokens/s per GPU (its low-high; an estimate, or measured), peak GiB per "
        "GPU and seconds")  # fmt: skip
    cost = (
        "unknown (no on-demand price)"
        if planned["expected_cost_usd"] is None
        else f"${planned['expected_cost_usd']:,.2f}"
    )
    bound = "" if planned["max_cost_usd"] is None else f"; at most ${planned['max_cost_usd']:,.2f}"
    say(out, f"expected {format_duration(planned['expected_seconds'])}, {cost}{bound} (the job stops after "
        f"{format_duration(planned['max_runtime_seconds'])}); {planned['cost_basis']}")  # fmt: skip
    left = [f"{planned['predicted_not_to_fit']} predicted not to fit"]
    if planned["trimmed_by_cost"]:
        left.append(f"{planned['trimmed_by_cost']} beyond max_cost_usd")
    if planned["refused_by_the_trainer_count"]:
        left.append(f"{planned['refused_by_the_trainer_count']} refused by the trainer's rules")
    out.print("left out: " + ", ".join(left), markup=False)


def print_tune_report(out: Any, report: dict[str, Any]) -> None:
    """A tuning run's ranked table (its report), where it was measured, the winner and the convergence check."""
    from rich.table import Table
    from rich.text import Text

    where = report["where"]
    hardware = (
        f"{where['world_size']} x {where['gpu']}" if where["device"] == "cuda" else f"{where['device']}"
    )
    table = Table(title=f"Tuning: measured on {hardware} for {where['instance_count']} x {where['instance_type']} "
                  f"(image {where['image_tag']}, torch {where['torch_version']}, TE {where['te_version']})")  # fmt: skip
    from training.tune.report import COLUMNS, Row, cells

    for key, heading in COLUMNS:
        table.add_column(heading, overflow="fold", min_width=24 if key == "configuration" else None)
    for row in report["rows"]:
        text = cells(Row(**row))  # the report's own cells: the same table as its table.md
        table.add_row(*(Text(text[key]) for key, _ in COLUMNS))
    out.print(table)
    for row in report["rows"]:
        if row.get("error"):
            out.print(
                f"  #{row['rank']} {row['configuration']}: {row['status']}: {row['error']}", markup=False
            )
    for note in report.get("notes", []):
        out.print(f"note: {note}", markup=False)
    for check in report.get("convergence", []):
        verdict = "passes" if check.get("passed") else "FAILS"
        out.print(
            f"convergence {check['precision']} against {check['reference']}: {verdict}: {check['why']}",
            markup=False,
        )
    winner = report.get("winner")
    out.print(
        f"winner: {json.dumps(winner['settings'])}" if winner else "no winner: no trial ran ok", markup=False
    )
    if report.get("report_uri"):
        out.print(f"report: {report['report_uri']}", markup=False)


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
