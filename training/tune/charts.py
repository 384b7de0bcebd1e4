"""The tuning report's charts (matplotlib, PNG): throughput (with each trial's spread, the unstable ones marked)
and, on a GPU, peak memory per configuration, in the spirit of the source article's Figure 1; on a GPU,
throughput against peak memory (measured and predicted, the GPU's limit); and the convergence runs' loss curves
overlaid. What carries nothing on the hardware the trials ran on is left out (a CPU process's resident set is not
a GPU's memory)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from training.tune.report import Row, Where

STATUS_COLORS = {
    "ok": "#2a7ab0",
    "near-oom": "#e0a030",
    "oom": "#c0392b",
    "timeout": "#8e44ad",
    "failed": "#7f8c8d",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(row: Row) -> str:
    """A short label: ``bs16 AC full bf16`` (with the other settings the trial changes)."""
    parts = []
    for key, value in row.settings.items():
        if key == "batch_size":
            parts.append(f"bs{value}")
        elif key == "activation_checkpointing":
            parts.append(f"AC {value}")
        elif key in ("precision", "fp8_recipe"):
            parts.append(str(value))
        elif key == "seq_length":
            parts.append(f"seq {value}")
        elif key == "grad_accum_steps":
            parts.append(f"x{value}")
        else:
            parts.append(f"{key}={value}")
    return f"#{row.rank} " + " ".join(parts)


def _hardware(where: Where) -> str:
    device = (
        f"{where.world_size} x {where.gpu}"
        if where.device == "cuda"
        else f"CPU, {where.world_size} processes"
    )
    return f"measured on {device} for {where.instance_count} x {where.instance_type}"


def _per(where: Where) -> str:
    return "per GPU" if where.device == "cuda" else "per process"


def _memory_axis(where: Where) -> str:
    return (
        "peak memory allocated, max over ranks (GB)"
        if where.device == "cuda"
        else "peak resident set, max over ranks (GB)"
    )


def _speed_errors(rows: Sequence[Row], xs: list[float]) -> tuple[list[float], list[float], list[list[float]]]:
    """The bars that have a range: their x, height and distance down and up to the tokens/s at their p90 and p10
    step time."""
    at, heights, low, high = [], [], [], []
    for x, row in zip(xs, rows, strict=True):
        span, middle = row.tokens_per_sec_range(), row.measured_tokens_per_sec
        if span and middle:
            at.append(x)
            heights.append(middle)
            low.append(max(0.0, middle - span[0]))
            high.append(max(0.0, span[1] - middle))
    return at, heights, [low, high]


def throughput_and_memory(rows: Sequence[Row], where: Where, path: Path, gpu_memory_gb: float | None) -> Path:
    """Bars per configuration, best first: measured tokens/s per GPU with the range of its timed steps (p90 to p10
    step time), hatched when the trial never met the stability target (the plan's prediction marked on a GPU), and,
    on a GPU, peak memory (right, with the GPU's memory; on a CPU a process's resident set says nothing, so no
    memory bars); a configuration that did not run shows its status instead."""
    plt = _pyplot()
    gpu = where.device == "cuda"
    fig, speed = plt.subplots(figsize=(max(7.0, 1.0 * len(rows) + 3), 5.6))
    memory = speed.twinx() if gpu else None
    xs = list(range(len(rows)))
    offset, width = (0.2, 0.4) if gpu else (0.0, 0.6)
    tps = [row.measured_tokens_per_sec or 0.0 for row in rows]
    speed.bar([x - offset for x in xs], tps, width=width, color=[STATUS_COLORS.get(r.status, "#7f8c8d") for r in rows],
              hatch=["//" if r.stable is False else "" for r in rows], edgecolor="white")  # fmt: skip
    at, heights, errors = _speed_errors(rows, [x - offset for x in xs])
    if at:
        speed.errorbar(at, heights, yerr=errors, fmt="none", ecolor="black", elinewidth=1, capsize=4,
                       label="range: tokens/s at the p90 and p10 step time")  # fmt: skip
    ends = {x: h + up for x, h, up in zip(at, heights, errors[1], strict=True)}
    top = max([*tps, *ends.values()], default=0.0) or 1.0
    for x, row in zip(xs, rows, strict=True):
        if not row.measured_tokens_per_sec:
            speed.annotate(row.status.upper(), (x, top * 0.03), ha="center", va="bottom", fontsize=9,
                           fontweight="bold", color=STATUS_COLORS.get(row.status, "black"))  # fmt: skip
            continue
        y = ends.get(x - offset, row.measured_tokens_per_sec)  # above its range
        speed.annotate(f"{row.measured_tokens_per_sec:,.0f}", (x - offset, y), xytext=(0, 3),
                       textcoords="offset points", ha="center", va="bottom", fontsize=8)  # fmt: skip
        if memory is not None:
            memory.annotate(f"{row.measured_allocated_gb or 0.0:.2f}", (x + offset, row.measured_allocated_gb or 0.0),
                            ha="center", va="bottom", fontsize=8, color="#555555")  # fmt: skip
    if memory is not None:
        top = _gpu_layers(rows, xs, speed, memory, top, gpu_memory_gb)
    speed.set_xticks(xs, [_label(r) for r in rows], rotation=25, ha="right", fontsize=8)
    speed.set_ylabel(f"tokens/s {_per(where)} (median step, warm-up excluded)")
    speed.set_ylim(0, top * 1.2)
    from matplotlib.patches import Patch

    handles = [Patch(color=STATUS_COLORS["ok"], label=f"measured tokens/s {_per(where)} (color: status)")]
    handles += speed.get_legend_handles_labels()[0] + (
        memory.get_legend_handles_labels()[0] if memory else []
    )

    for status in dict.fromkeys(r.status for r in rows if r.measured_tokens_per_sec and r.status != "ok"):
        handles.append(Patch(color=STATUS_COLORS.get(status, "black"), label=f"{status} (ran, not chosen)"))
    if any(r.stable is False for r in rows):
        handles.append(Patch(facecolor=STATUS_COLORS["ok"], hatch="//", edgecolor="white",
                             label="hatched: never met the stability target"))  # fmt: skip
    fig.legend(
        handles, [h.get_label() for h in handles], loc="lower center", ncol=2, fontsize=8, frameon=False
    )
    what = "Throughput and peak memory" if gpu else "Throughput"
    fig.suptitle(f"{what} per configuration, best first", fontsize=11)
    speed.set_title(_hardware(where), fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _gpu_layers(
    rows: Sequence[Row], xs: list[int], speed: Any, memory: Any, top: float, gpu_memory_gb: float | None
) -> float:
    """On a GPU: the memory bars, the plan's predicted tokens/s and the GPU's memory; returns the speed axis' top."""
    peaks = [row.measured_allocated_gb or 0.0 for row in rows]
    memory.bar([x + 0.2 for x in xs], peaks, width=0.4, color="#95a5a6",
               label="peak memory allocated, max over ranks (GB)")  # fmt: skip
    predicted = [
        (x - 0.2, r.predicted_tokens_per_sec)
        for x, r in zip(xs, rows, strict=True)
        if r.predicted_tokens_per_sec
    ]
    speed.scatter([x for x, _ in predicted], [y for _, y in predicted], marker="_", s=400, color="black",
                  label="predicted tokens/s per GPU (plan)", zorder=3)  # fmt: skip
    if gpu_memory_gb:
        memory.axhline(gpu_memory_gb, color="#c0392b", linestyle="--", linewidth=1, label="GPU memory")
    memory.set_ylabel("peak memory allocated, max over ranks (GB)")
    memory.set_ylim(0, max([*peaks, gpu_memory_gb or 0.0, 1e-9]) * 1.2)
    return max([top, *(y for _, y in predicted)])


def throughput_vs_memory(rows: Sequence[Row], where: Where, path: Path, gpu_memory_gb: float | None) -> Path:
    """Each configuration that ran at (peak memory, tokens/s): measured (filled) and the plan's prediction
    (hollow, joined to it); the winner starred."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 5.8))
    ran = [r for r in rows if r.measured_tokens_per_sec and r.measured_allocated_gb]
    for order, row in enumerate(sorted(ran, key=lambda r: r.measured_tokens_per_sec or 0.0)):
        color = STATUS_COLORS.get(row.status, "black")
        marker = "*" if row.rank == 1 and row.status == "ok" else "o"
        ax.scatter(row.measured_allocated_gb, row.measured_tokens_per_sec, color=color, marker=marker,
                   s=180 if marker == "*" else 50, zorder=3,
                   facecolors="none" if row.stable is False else color)  # fmt: skip
        if span := row.tokens_per_sec_range():
            ax.vlines(row.measured_allocated_gb, span[0], span[1], color=color, linewidth=1, zorder=2)
        ax.annotate(_label(row), (row.measured_allocated_gb, row.measured_tokens_per_sec), fontsize=8,
                    xytext=(6, 4) if order % 2 else (6, -11), textcoords="offset points")  # fmt: skip
    if where.device == "cuda":  # predicted against measured only means something on the target hardware
        for row in ran:
            if row.predicted_tensors_gb and row.predicted_tokens_per_sec:
                ax.scatter(row.predicted_tensors_gb, row.predicted_tokens_per_sec, facecolors="none",
                           edgecolors="gray", s=50, zorder=2, label="predicted (plan)" if row is ran[0] else None)  # fmt: skip
                ax.plot([row.predicted_tensors_gb, row.measured_allocated_gb],
                        [row.predicted_tokens_per_sec, row.measured_tokens_per_sec], color="gray", linewidth=0.6)  # fmt: skip
        if gpu_memory_gb:
            ax.axvline(gpu_memory_gb, color="#c0392b", linestyle="--", linewidth=1, label="GPU memory")
            ax.legend(fontsize=8)
    failed = [r for r in rows if not r.measured_tokens_per_sec]
    if failed:
        text = "; ".join(f"{_label(r)}: {r.status}" for r in failed)
        ax.text(
            0.01, 0.01, "did not run: " + text, transform=ax.transAxes, fontsize=7, va="bottom", wrap=True
        )
    ax.set_xlabel(_memory_axis(where))
    ax.set_ylabel(f"tokens/s {_per(where)} (median step)")
    xs = [r.measured_allocated_gb or 0.0 for r in ran] + [
        gpu_memory_gb or 0.0 if where.device == "cuda" else 0.0
    ]
    ys = [r.measured_tokens_per_sec or 0.0 for r in ran]
    if where.device == "cuda":
        xs += [r.predicted_tensors_gb or 0.0 for r in ran]
        ys += [r.predicted_tokens_per_sec or 0.0 for r in ran]
    ax.set_xlim(0, max([*xs, 1e-9]) * 1.25)
    ax.set_ylim(0, max([*ys, 1e-9]) * 1.2)
    ax.grid(alpha=0.3)
    fig.suptitle("Throughput against peak memory (the winner starred; lines: p90 to p10 step time; hollow: never "
                 "stable)", fontsize=10)  # fmt: skip
    ax.set_title(_hardware(where), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def loss_curves(
    curves: Mapping[str, Sequence[tuple[int, float]]],
    reference: str,
    skip_fraction: float,
    tolerance: Callable[[float], float],
    title: str,
    path: Path,
) -> Path:
    """The convergence runs' losses per step, one line per precision (above), and each one's relative difference
    from the ``reference`` run with the tolerance band of the reference's loss (below); the first
    ``skip_fraction`` of the steps (not compared) shaded in both."""
    plt = _pyplot()
    fig, (loss_ax, diff_ax) = plt.subplots(2, 1, figsize=(8.5, 7), sharex=True, height_ratios=(3, 2))
    ref = dict(curves.get(reference, ()))
    last = 0
    for name, points in curves.items():
        if not points:
            continue
        loss_ax.plot([s for s, _ in points], [v for _, v in points], label=name, linewidth=1.4,
                     linestyle="-" if name == reference else "--")  # fmt: skip
        last = max(last, points[-1][0])
        if name != reference and ref:
            common = [(s, v) for s, v in points if s in ref]
            diff_ax.plot([s for s, _ in common], [(v - ref[s]) / ref[s] for s, v in common], label=f"{name}")
    if ref:
        steps = sorted(ref)
        band = [tolerance(ref[s]) for s in steps]
        diff_ax.fill_between(
            steps, [-b for b in band], band, color="#2ecc71", alpha=0.15, label="tolerance", step="mid"
        )
    for ax in (loss_ax, diff_ax):
        if last:
            ax.axvspan(0, skip_fraction * last, color="gray", alpha=0.12)
        ax.grid(alpha=0.3)
    loss_ax.set_ylabel("training loss")
    diff_ax.set_ylabel(f"(loss - {reference}) / {reference}")
    diff_ax.set_xlabel(f"step (shaded: the first {skip_fraction:.0%}, not compared)")
    diff_ax.yaxis.set_major_formatter(lambda value, _pos: f"{value:.1%}")
    loss_ax.legend(fontsize=8)
    diff_ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
