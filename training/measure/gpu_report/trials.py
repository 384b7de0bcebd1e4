"""The sweep phase: our trainer's trials, each through the tuning driver (``training.tune.driver.run_trial``: a fresh
``train.sh``, so a fresh ``torchrun`` and worker, in a process group of its own with a hard timeout, warm-up steps
left out of the timing), in the order :mod:`sweep` decides, each started only when its predicted time (calibrated
by the trials before it) fits what is left of the phase; and each trial's row: measured against the plan.

A row: tokens/s per GPU from the median step time, MFU (PaLM's model FLOPs per token, ``shapes.flops_per_token``,
against the GPU's published dense bf16 peak), the step times' spread, the allocated and reserved peaks (max over
ranks), the plan's predicted peak and live tensors with their errors, the attention kernel the trainer's probe
found (its ``levers`` line), the time to the first step and (compile on) compile's warm-up: that time less the
median of the trials without compile.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from training.contract import settings_parse, shapes
from training.measure.gpu_report import sweep
from training.measure.gpu_report.context import Context, say, tail
from training.tune import driver
from training.tune.outcome import TrialResult

GB_PER_GIB = 2**30 / 1e9
KILL_MARGIN_SECONDS = 5.0
"""Kept free of each step's hard limit for the kill and the pipe to close."""


def job_for(settings: Mapping[str, Any], *, warmup: int, measured: int) -> driver.Job:
    """The tuning driver's job over the base ``settings``: fixed step counts (no early stop, so every trial times
    the same steps), checked by the driver's own parser."""
    argv = ["--tune_trials", "batch_size=1", "--tune_warmup_steps", str(warmup),
            "--tune_max_measured_steps", str(measured), "--tune_window_steps", str(min(3, measured)),
            "--tune_cv_target", "0"]  # fmt: skip
    for key, value in settings.items():
        argv += [f"--{key}", settings_parse.format_setting(value)]
    return driver.parse_args(argv)


def base_settings(ctx: Context) -> dict[str, Any]:
    """The sweep's base: the mode's common settings, its model and sequence length."""
    return {**ctx.mode.base_settings, **ctx.mode.model, "seq_length": ctx.mode.seq_length}


def levers_of(log: str | None) -> dict[str, str]:
    """The trainer's ``levers key=value ...`` line (what each lever resolved to), from a trial's log."""
    for line in tail(log, 10_000):
        if line.startswith("levers "):
            return dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
    return {}


def row_of(ctx: Context, candidate: sweep.Candidate, result: TrialResult) -> dict[str, Any]:
    """One trial's row (the module's doc)."""
    shape = ctx.mode.shape()
    levers = levers_of(result.log)
    row: dict[str, Any] = {
        "source": "ours", "trial": result.index, "role": candidate.role, "configuration": candidate.describe(),
        "settings": dict(candidate.settings), "status": result.status, "error": result.error,
        "attention": levers.get("attention"), "compile": levers.get("compile"),
        "predicted_step_s": candidate.step_seconds, "predicted_tokens_per_sec": candidate.tokens_per_sec,
        "predicted_peak_gb": candidate.peak_gib * GB_PER_GIB, "predicted_tensors_gb": candidate.tensors_gib * GB_PER_GIB,
        "max_allocated_gb": result.summary.get("max_allocated_gb"),
        "max_reserved_gb": result.summary.get("max_reserved_gb"), "alloc_retries": result.summary.get("alloc_retries"),
        "first_step_s": result.first_step_seconds, "seconds": result.seconds, "log_tail": tail(result.log),
    }  # fmt: skip
    if result.spread is not None:
        row.update(step=result.spread.as_dict())
    if result.ran and result.spread is not None:
        tokens = int(candidate.settings["batch_size"]) * ctx.mode.seq_length
        row["tokens_per_sec"] = tokens / result.spread.median
        if ctx.gpu is not None:
            flops = shapes.flops_per_token(shape, ctx.mode.seq_length)
            row["mfu"] = row["tokens_per_sec"] * flops / (ctx.gpu.bf16_peak_tflops * 1e12)
    peak, reserved, allocated = row["predicted_peak_gb"], row["max_reserved_gb"], row["max_allocated_gb"]
    if reserved:
        row["peak_error_pct"] = 100.0 * (peak - reserved) / reserved
    if allocated and ctx.gpu is not None:  # a CPU's figure is the resident set, not tensors
        row["tensors_error_pct"] = 100.0 * (row["predicted_tensors_gb"] - allocated) / allocated
    return row


def compile_warmups(rows: list[dict[str, Any]]) -> None:
    """Compile's warm-up of each compiled trial: its time to the first step less the median of the trials
    without compile (their start-up alone)."""
    eager = [r["first_step_s"] for r in rows if r.get("compile") == "false" and r.get("first_step_s")]
    if not eager:
        return
    start = statistics.median(eager)
    for row in rows:
        if row.get("compile") == "true" and row.get("first_step_s"):
            row["compile_warmup_s"] = row["first_step_s"] - start


def run(ctx: Context) -> list[dict[str, Any]]:
    """Every trial that fits the phase, in order; their rows (also added to ``ctx.records['sweep']``)."""
    mode = ctx.mode
    order = sweep.ordered(mode, ctx.plan_gpu)
    steps = mode.warmup_steps + mode.measured_steps
    job = job_for(base_settings(ctx), warmup=mode.warmup_steps, measured=mode.measured_steps)
    logs = ctx.scratch / "sweep"
    pending, rows, index = list(order), [], 0
    memory = ctx.gpu.memory_gb if ctx.gpu else None
    while pending and (ctx.max_trials is None or index < ctx.max_trials):
        left = ctx.clock.phase_left() - KILL_MARGIN_SECONDS
        fitting = [c for c in pending if ctx.calibration.seconds(c, steps) <= left]
        if not fitting:
            break
        candidate = fitting[0]
        pending.remove(candidate)
        index += 1
        predicted = ctx.calibration.seconds(candidate, steps)
        job.options["tune_trial_timeout_seconds"] = max(5, int(min(left, max(3 * predicted, predicted + 60))))
        say(f"trial {index}: {candidate.describe()} [{candidate.role}], predicted {predicted:.0f} s, "
            f"{left:.0f} s left in the phase")  # fmt: skip
        result = driver.run_trial(job, index, candidate.settings, logs, gpu_memory_gb=memory, save=False)
        row = row_of(ctx, candidate, result)
        row["predicted_trial_s"] = predicted
        rows.append(row)
        ctx.append_log(f"trial {index}: {candidate.describe()}", result.log)
        if result.ran:
            ctx.calibration.learn(
                candidate, result.first_step_seconds, result.spread.median if result.spread else None
            )
        if result.status == "timeout":
            ctx.clock.current.cut = True  # type: ignore[union-attr]
        compile_warmups(rows)
        ctx.records["sweep"] = rows
        say(_said(row))
        ctx.write()
    left_out = [f"{c.describe()} [{c.role}]" for c in pending]
    if left_out:
        ctx.records["sweep_left_out"] = left_out
        note = f"{len(left_out)} planned trial(s) left out: the phase's time was spent"
        if ctx.max_trials is not None and index >= ctx.max_trials:
            note = f"{len(left_out)} planned trial(s) left out: --max-trials {ctx.max_trials}"
        ctx.clock.current.notes.append(note)  # type: ignore[union-attr]
    return rows


def _said(row: Mapping[str, Any]) -> str:
    text = f"trial {row['trial']} {row['status']}"
    if row.get("tokens_per_sec"):
        text += f": {row['tokens_per_sec']:,.0f} tokens/s"
        if row.get("mfu") is not None:
            text += f", MFU {row['mfu']:.1%}"
    if row.get("error"):
        text += f" ({row['error']})"
    return text


def fastest(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in rows if r["status"] == "ok" and r.get("tokens_per_sec")]
    return max(ok, key=lambda r: r["tokens_per_sec"]) if ok else None
