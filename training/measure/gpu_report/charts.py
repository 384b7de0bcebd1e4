"""The report's charts (matplotlib, PNG): ``throughput.png`` (tokens/s per GPU of every trial and torchtitan run,
with the step times' spread, the plan's prediction and MFU), ``memory.png`` (the plan's predicted peak and tensors
against the measured reserved and allocated peaks, the GPU's memory drawn) and ``numerics.png`` (the bf16 and fp32
loss curves with the tuner's tolerance band, and the SDPA backends' errors against fp32)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from training.measure.gpu_report.context import Context
from training.tune import convergence

COLORS = {"ok": "#2a7ab0", "near-oom": "#e0a030", "oom": "#c0392b", "timeout": "#8e44ad", "failed": "#7f8c8d",
          "not-run": "#bdc3c7"}  # fmt: skip
TITAN = "#27ae60"
FILES = ("throughput.png", "memory.png", "numerics.png")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def label(row: Mapping[str, Any]) -> str:
    s = row["settings"]
    text = f"mb{s['batch_size']} AC {s['activation_checkpointing']} {'compiled' if s.get('compile') == 'true' else 'eager'}"
    if row["source"] == "torchtitan":
        return "torchtitan " + text
    return f"#{row['trial']} {text} {s.get('attention_backend', '')}"


def throughput(ctx: Context, path: Path) -> None:
    plt = _pyplot()
    rows = [*ctx.records.get("sweep", []), *ctx.records.get("torchtitan", [])]
    per = "per GPU" if ctx.on_gpu else "per process (CPU)"
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.45 * max(len(rows), 1)))
    for y, row in enumerate(rows):
        value = row.get("tokens_per_sec") or 0.0
        color = TITAN if row["source"] == "torchtitan" and value else COLORS.get(row["status"], "#7f8c8d")
        ax.barh(y, value, color=color)
        step = row.get("step")
        if value and step and step.get("p10") and step.get("p90"):
            tokens = value * step["median"]
            ax.plot([tokens / step["p90"], tokens / step["p10"]], [y, y], color="black", linewidth=1.5)
        if row.get("predicted_tokens_per_sec") and ctx.on_gpu:  # the plan speaks of a GPU, not of this CPU
            ax.plot(row["predicted_tokens_per_sec"], y, marker="D", color="#e67e22", markersize=6)
        text = f"{value:,.0f}" + (f"  MFU {row['mfu']:.1%}" if row.get("mfu") is not None else "")
        ax.text(value, y, f"  {text if value else row['status']}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [label(r) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(
        f"tokens/s {per} (median step; black: p10-p90 of the steps; orange diamond: the plan's prediction)"
    )
    ax.set_title(f"{_where(ctx)}: throughput, ours and torchtitan's (green)", fontsize=10)
    ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory(ctx: Context, path: Path) -> None:
    plt = _pyplot()
    rows = [r for r in ctx.records.get("sweep", []) if r.get("predicted_peak_gb")]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.5 * max(len(rows), 1)))
    height = 0.2
    series = (("predicted_peak_gb", "plan: peak (tensors + allowance)", "#e67e22"),
              ("max_reserved_gb", "measured: reserved", "#2a7ab0"),
              ("predicted_tensors_gb", "plan: live tensors", "#f5cba7"),
              ("max_allocated_gb", "measured: allocated" if ctx.on_gpu else "measured: resident set (CPU)", "#85c1e9"))  # fmt: skip
    for offset, (key, name, color) in enumerate(series):
        ax.barh([y + (offset - 1.5) * height for y in range(len(rows))], [r.get(key) or 0.0 for r in rows],
                height=height, color=color, label=name)  # fmt: skip
    if ctx.gpu is not None:
        ax.axvline(ctx.gpu.memory_gb, color="#c0392b", linestyle="--", label=f"{ctx.gpu.name} memory")
    ax.set_yticks(range(len(rows)), [label(r) + f" ({r['status']})" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GB (10^9 bytes) per GPU")
    ax.set_title(f"{_where(ctx)}: the memory plan against the measured peaks", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def numerics(ctx: Context, path: Path) -> None:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    conv = ctx.records.get("convergence") or {}
    runs = conv.get("runs", {})
    reference = runs.get("fp32", {}).get("losses") or []
    if reference:
        steps, losses = zip(*reference, strict=True)
        band = [convergence.tolerance(v) * abs(v) for v in losses]
        left.fill_between(steps, [v - b for v, b in zip(losses, band, strict=True)],
                          [v + b for v, b in zip(losses, band, strict=True)], color="#d5dbdb", label="tolerance")  # fmt: skip
    for precision, color, style, width in (("fp32", "black", "--", 2.4), ("bf16", "#2a7ab0", "-", 1.2)):
        curve = runs.get(precision, {}).get("losses") or []
        if curve:
            left.plot(
                *zip(*curve, strict=True), color=color, linestyle=style, label=precision, linewidth=width
            )
    verdict = (conv.get("comparison") or {}).get("why", "not run")
    left.set_title(f"bf16 against fp32: {verdict}"[:90], fontsize=9)
    left.set_xlabel("step")
    left.set_ylabel("training loss")
    left.legend(fontsize=8)
    _sdpa(right, ctx.records.get("kernel_checks") or {})
    fig.suptitle(f"{_where(ctx)}: numerics", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sdpa(ax: Any, checks: Mapping[str, Any]) -> None:
    rows = [r for r in checks.get("sdpa", []) if r.get("ran")]
    names = ("out", "dq", "dk", "dv")
    width = 0.2
    for offset, name in enumerate(names):
        ax.bar([x + (offset - 1.5) * width for x in range(len(rows))], [max(r["errors"][name], 1e-9) for r in rows],
               width=width, label=name)  # fmt: skip
    if checks.get("bf16_limit"):
        ax.axhline(checks["bf16_limit"], color="#c0392b", linestyle="--", label="pass limit")
    ax.set_xticks(range(len(rows)), [r["backend"] for r in rows])
    ax.set_yscale("log")
    missing = [r["backend"] for r in checks.get("sdpa", []) if not r.get("ran")]
    ax.set_title("SDPA in bf16 against math on fp32" + (f" (did not run: {', '.join(missing)})" if missing else ""),
                 fontsize=9)  # fmt: skip
    ax.set_ylabel("relative error")
    ax.legend(fontsize=8)


def _where(ctx: Context) -> str:
    gpu = ctx.records.get("where", {}).get("gpu")
    return gpu or "CPU (smoke)"


def draw(ctx: Context, names: Sequence[str] = FILES) -> list[str]:
    """Every chart; the problems drawing any of them (a chart that fails never costs the report)."""
    problems = []
    for name, function in zip(FILES, (throughput, memory, numerics), strict=True):
        if name not in names:
            continue
        try:
            function(ctx, ctx.out / name)
        except Exception as error:  # noqa: BLE001 - a broken chart must not lose the measurements
            problems.append(f"{name}: {type(error).__name__}: {error}")
    return problems
