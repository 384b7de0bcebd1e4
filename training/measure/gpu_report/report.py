"""The report folder's text files, rewritten after every step (so a run cut short keeps what it measured):
``report.md`` (every section, each figure saying where it comes from), ``rows.csv`` (every throughput row: our
trials and torchtitan's runs) and ``records.json`` (every raw record). The charts are :mod:`charts`'s."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from training.measure.gpu_report.context import Context

REPORT, ROWS, RECORDS = "report.md", "rows.csv", "records.json"
CSV_FIELDS = (
    "source", "trial", "role", "configuration", "status", "tokens_per_sec", "mfu", "titan_mfu", "step_median_s",
    "step_p10_s", "step_p90_s", "step_cv", "timed_steps", "max_allocated_gb", "max_reserved_gb",
    "predicted_peak_gb", "peak_error_pct", "predicted_tensors_gb", "tensors_error_pct", "alloc_retries",
    "attention", "first_step_s", "compile_warmup_s", "predicted_step_s", "predicted_tokens_per_sec",
    "predicted_trial_s", "seconds", "parameters", "error",
)  # fmt: skip


def num(value: Any, fmt: str, dash: str = "-") -> str:
    return dash if value is None else format(value, fmt)


def pct(value: Any) -> str:
    return "-" if value is None else f"{value:+.0f}%"


def step_cell(row: Mapping[str, Any]) -> str:
    s = row.get("step")
    if not s:
        return "-"
    cv = "-" if s.get("cv") is None else f"{s['cv']:.1%}"
    return f"{s['median']:.3f} [{s['p10']:.3f}-{s['p90']:.3f}] cv {cv} ({s['steps']})"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return lines + [""]


def where_lines(ctx: Context) -> list[str]:
    w = ctx.records.get("where", {})
    gpu = w.get("gpu") or "no GPU (CPU)"
    ran = ctx.records.get("kernel_checks") or ctx.records.get("profile") or {}
    w = {**w, "cuda": w.get("cuda") or ran.get("cuda")}  # read by a worker that imported torch
    return [
        f"- Measured on: {gpu}; torch {w.get('torch')}, CUDA {w.get('cuda') or '-'}, driver {w.get('driver') or '-'}; "
        f"host {w.get('host')}; {w.get('date')}",
        f"- Mode: `{ctx.mode.name}`; model {_settings(ctx.mode.model)}, sequence {ctx.mode.seq_length}, bf16; "
        f"budget {ctx.clock.budget:.0f} s from this process's start (every process start counted)",
        "- MFU: PaLM's model FLOPs per token (6N + 12 L H S, `shapes.flops_per_token`) x tokens/s over the GPU's "
        "published dense bf16 peak (`hardware.PEAK_TFLOPS`, NVIDIA's datasheet: 989 TFLOP/s for H100 and H200)",
        "- Predicted figures are the plan's (`training/plan/`: memory in closed form; throughput from the "
        "estimate scaled from the source article's two measured 8x B200 configurations, with its low-high band): "
        "measured against them here for the first time",
    ]


def _settings(settings: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items())


def phases_lines(ctx: Context) -> list[str]:
    shares = {s.name: s for s in ctx.clock.shares}
    rows = []
    for record in ctx.clock.records:
        share = shares[record.name]
        rows.append([record.name, f"{share.seconds:.0f}", num(record.used, ".0f", "running"),
                     "cut" if record.cut else "no", "; ".join(record.notes) or share.what])  # fmt: skip
    done = {r.name for r in ctx.clock.records}
    rows += [
        [s.name, f"{s.seconds:.0f}", "not reached", "-", s.what]
        for s in ctx.clock.shares
        if s.name not in done
    ]
    return ["## The run's phases", "", f"Total so far: {ctx.clock.now():.0f} s of {ctx.clock.budget:.0f} s.", "",
            *table(["phase", "share s", "used s", "cut", "what / notes"], rows)]  # fmt: skip


def sweep_lines(ctx: Context) -> list[str]:
    rows = ctx.records.get("sweep", [])
    out = ["## Our trainer, tuned (one fresh process per trial, through the tuning driver)", ""]
    if not rows:
        return [*out, "No trial ran.", ""]
    header = ["#", "configuration", "role", "status", "tokens/s/GPU", "MFU", "step s median [p10-p90]",
              "allocated GB", "reserved GB", "plan peak GB (vs reserved)", "plan tensors GB (vs allocated)",
              "attention", "first step s", "compile warm-up s"]  # fmt: skip
    body = [[str(r["trial"]), r["configuration"], r["role"], r["status"], num(r.get("tokens_per_sec"), ",.0f"),
             num(r.get("mfu"), ".1%"), step_cell(r), num(r.get("max_allocated_gb"), ".2f"),
             num(r.get("max_reserved_gb"), ".2f"), f"{r['predicted_peak_gb']:.2f} ({pct(r.get('peak_error_pct'))})",
             f"{r['predicted_tensors_gb']:.2f} ({pct(r.get('tensors_error_pct'))})", r.get("attention") or "-",
             num(r.get("first_step_s"), ".1f"), num(r.get("compile_warmup_s"), ".1f")] for r in rows]  # fmt: skip
    out += table(header, body)
    out += effects(rows)
    failed = [r for r in rows if r.get("error")]
    if failed:
        out += [
            "Why not ok:",
            "",
            *[f"- trial {r['trial']} ({r['configuration']}): {r['error']}" for r in failed],
            "",
        ]
    left = ctx.records.get("sweep_left_out")
    if left:
        out += [
            f"Planned but left out ({len(left)}): "
            + "; ".join(left[:12])
            + (" ..." if len(left) > 12 else ""),
            "",
        ]
    return out


def effects(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each lever's measured effect: a one-at-a-time trial against the base."""
    base = next((r for r in rows if r["role"] == "base" and r.get("tokens_per_sec")), None)
    levers = [r for r in rows if r["role"].startswith("lever") and r.get("tokens_per_sec")]
    if base is None or not levers:
        return []
    lines = [
        f"Each lever against the base ({base['configuration']}, {base['tokens_per_sec']:,.0f} tokens/s):",
        "",
    ]
    for r in levers:
        change = 100.0 * (r["tokens_per_sec"] / base["tokens_per_sec"] - 1.0)
        lines.append(f"- {r['role'].removeprefix('lever ')} -> {r['configuration']}: {change:+.1f}% tokens/s")
    return [*lines, ""]


def titan_lines(ctx: Context) -> list[str]:
    rows = ctx.records.get("torchtitan", [])
    out = ["## torchtitan side by side", ""]
    if not rows:
        return [*out, "Not reached.", ""]
    header = ["configuration", "status", "tokens/s/GPU", "MFU (ours / torchtitan's)", "step s median [p10-p90]",
              "reserved GB", "parameters", "first step s"]  # fmt: skip
    body = [[r["configuration"], r["status"], num(r.get("tokens_per_sec"), ",.0f"),
             f"{num(r.get('mfu'), '.1%')} / {num(r.get('titan_mfu'), '.1%')}", step_cell(r),
             num(r.get("max_reserved_gb"), ".2f"), num(r.get("parameters"), ",d"), num(r.get("first_step_s"), ".1f")]
            for r in rows]  # fmt: skip
    out += table(header, body)
    out += [f"- {r['configuration']}: {r['error']}" for r in rows if r.get("error")]
    for ratio in ctx.records.get("ratios", []):
        value = (
            f"{ratio['ratio']:.2f}"
            if ratio["ratio"] is not None
            else (
                "n/a (no matching ok trial of ours)"
                if ratio["ours"] is None
                else "n/a (torchtitan did not run)"
            )
        )
        out.append(f"- ours / torchtitan tokens/s: {value} ({ratio['ours']} against {ratio['torchtitan']})")
    out += ["", "On one GPU torchtitan does not shard (FSDP only for more than one shard: bf16 by autocast over fp32 "
            "weights); ours runs FSDP2 on a one-rank mesh. Its Llama has an output layer of its own (Llama 3.2 1B "
            "ties it to the embedding): more parameters and optimizer work, the same FLOPs per token. Both train "
            "our trainer's synthetic tokens.", ""]  # fmt: skip
    return out


def profile_lines(ctx: Context) -> list[str]:
    p = ctx.records.get("profile")
    out = ["## Where the time goes (torch.profiler, the fastest trial's settings)", ""]
    if not p:
        return [*out, "Not reached.", ""]
    out.append(f"- {_settings(p.get('settings', {}))}: {p.get('status')}")
    if "top" not in p:
        return [*out, f"- {p.get('error', 'no table')}", ""]
    shares = p["shares"]
    out += [f"- {p['steps_recorded']} steps recorded, window {p['window_ms']:.1f} ms, {p['kernels']} {p['unit']}: "
            + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()),
            "- attention kernels seen: " + (", ".join(p.get("attention_kernels") or []) or "none"), ""]  # fmt: skip
    out += table(["kernel", "ms", "calls", "share of window"],
                 [[t["name"][:90], f"{t['ms']:.2f}", str(t["calls"]), f"{t['share']:.1%}"] for t in p["top"]])  # fmt: skip
    return out


def numerics_lines(ctx: Context) -> list[str]:
    out = ["## Numerics on this device", ""]
    conv = ctx.records.get("convergence")
    if conv:
        c = conv["comparison"]
        out += [f"- bf16 against fp32, {conv['steps']} steps of {_settings(conv['model'])}, same seed, weights and "
                f"data ({conv['rule']}): {'PASSES' if c.get('passed') else 'FAILS'}: {c.get('why')}"]  # fmt: skip
    checks = ctx.records.get("kernel_checks")
    if checks and "loss" in checks:
        loss = checks["loss"]
        out += [f"- chunked loss (chunk {loss['shape']['chunk']}) against unchunked, bf16, {loss['shape']['tokens']} "
                f"tokens, vocabulary {loss['shape']['vocab']}: relative difference "
                + ", ".join(f"{k} {v:.2e}" for k, v in loss["chunked_vs_unchunked"].items())
                + "; against fp32: chunked " + ", ".join(f"{k} {v:.2e}" for k, v in loss["chunked_vs_fp32"].items())
                + "; unchunked " + ", ".join(f"{k} {v:.2e}" for k, v in loss["unchunked_vs_fp32"].items()), ""]  # fmt: skip
        rows = [[r["backend"], "yes" if r["ran"] else "no",
                 ", ".join(f"{k} {v:.2e}" for k, v in r["errors"].items()) if r["ran"] else r["why"],
                 ("pass" if r["passed"] else "FAIL") if r["ran"] else "-"] for r in checks["sdpa"]]  # fmt: skip
        out += [f"SDPA backends in bf16 against math on fp32 copies (relative error; pass: at most "
                f"{checks['bf16_limit']:g}):", ""]  # fmt: skip
        out += table(["backend", "ran", "relative error (out, dq, dk, dv) or why not", "verdict"], rows)
    elif checks:
        out.append(f"- kernel checks: {checks.get('status')}")
    return out if len(out) > 2 else [*out, "Not reached.", ""]


def unmeasurable_lines(ctx: Context) -> list[str]:
    out = ["## What one GPU cannot measure, and what the plan uses instead", ""]
    out += [
        f"- **{i['what']}**: {i['why']}. Instead: {i['instead']}."
        for i in ctx.records.get("unmeasurable", [])
    ]
    return [*out, ""]


def markdown(ctx: Context) -> str:
    lines = [
        f"# GPU report ({ctx.records.get('where', {}).get('gpu') or 'CPU smoke run'})",
        "",
        *where_lines(ctx),
        "",
    ]
    for section in (
        phases_lines,
        sweep_lines,
        titan_lines,
        profile_lines,
        numerics_lines,
        unmeasurable_lines,
    ):
        lines += section(ctx)
    return "\n".join(lines) + "\n"


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        s = row.get("step") or {}
        writer.writerow({**row, "step_median_s": s.get("median"), "step_p10_s": s.get("p10"),
                         "step_p90_s": s.get("p90"), "step_cv": s.get("cv"), "timed_steps": s.get("steps")})  # fmt: skip
    return buffer.getvalue()


def write(ctx: Context) -> None:
    """Every text file of the report, from what is there now (written to a temporary name, then renamed). A file
    that cannot be rendered (a record of a shape this code did not foresee) says why in its place and costs
    neither the other files nor the run: this is called after every step, and the phases after it still run."""
    ctx.records["phases"] = [r.as_dict() for r in ctx.clock.records]
    rows = [*ctx.records.get("sweep", []), *ctx.records.get("torchtitan", [])]
    renderers = ((REPORT, lambda: markdown(ctx)), (ROWS, lambda: csv_text(rows)),
                 (RECORDS, lambda: json.dumps(ctx.records, indent=1, default=str) + "\n"))  # fmt: skip
    for name, render in renderers:
        try:
            text = render()
        except Exception as error:  # noqa: BLE001 - the measurements must survive a rendering bug
            text = f"{name} could not be rendered: {type(error).__name__}: {error} (records.json has every record)\n"
        _replace(ctx.out / name, text)


def _replace(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
