"""The data-parallel layouts of a request on several instances, side by side: for each ``data_parallel_replicate``
worth comparing (1: every state sharded over every GPU; the instance count: one replica per instance, its states
sharded over the instance's GPUs), the plan's per-GPU memory, the step's collective traffic and how much of it
the compute hides (:mod:`training.plan.network`), throughput, time and cost. ``auto`` picks the second
whenever it fits (``memory.Setup.replicate``).

    python -m training.plan.layouts --preset llama3.1-8b --seq 8192 --batch 2 --nodes 1,2,4

prints the Markdown table docs/multi-node.md shows. Pure closed form (standard library, ``contract``, ``plan``):
the memory is the plan's estimate; the throughput the plan's estimate (its centre scaled from the source article's
two measured single-instance configurations, its low-high band from ``band.mfu_band``'s stated MFU band) with the
network's exposed time added, and the step time, hours and cost that follow, each with its band; the network figures
from published link rates (``network.INTERCONNECTS``) at an assumed ``network.LINK_EFFICIENCY``. Nothing here is
measured.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from training.contract import hardware, settings_table, shapes
from training.plan import estimate, inputs, memory

TOKENS_BUDGET = 1e9
"""The table's time and cost are for training this many tokens (one figure comparable across instance counts,
whose global batches differ)."""


def replicate_choices(instance_count: int, gpus: int) -> tuple[int, ...]:
    """The layouts worth comparing on ``instance_count`` instances of ``gpus`` GPUs: full sharding, and one replica
    per instance (the same when there is one instance)."""
    return tuple(dict.fromkeys((1, instance_count)))


@dataclass(frozen=True)
class Row:
    """One layout of one request: its plan, and whether ``auto`` would choose it."""

    planned: estimate.Plan
    auto: bool

    @property
    def setup(self) -> memory.Setup:
        return self.planned.setup

    def hours_and_cost(
        self, tokens: float = TOKENS_BUDGET, tokens_per_sec_per_gpu: float | None = None
    ) -> tuple[float, float | None]:
        """Wall-clock hours and on-demand cost (None without a price) to train ``tokens`` tokens at the plan's
        throughput (or at ``tokens_per_sec_per_gpu``: one end of its band)."""
        s, t = self.setup, self.planned.timing
        seconds = tokens / ((tokens_per_sec_per_gpu or t.tokens_per_sec_per_gpu) * s.world_size)
        return seconds / 3600.0, hardware.estimate_cost_usd(s.instance_type, s.instance_count, seconds)

    def bands(self) -> dict[str, tuple[float, float] | None] | None:
        """The (least, most) tokens/s per GPU, step seconds, hours and cost of an estimate (``timing.Spread``); None
        for the article's own (``published``) configurations."""
        spread = self.planned.timing.spread
        if spread is None:
            return None
        slow, fast = (self.hours_and_cost(tokens_per_sec_per_gpu=v) for v in spread.tokens_per_sec_per_gpu)
        return {
            "tokens_per_sec_per_gpu": spread.tokens_per_sec_per_gpu,
            "step_seconds": spread.step_seconds,
            "hours": (fast[0], slow[0]),
            "cost": None if fast[1] is None or slow[1] is None else (fast[1], slow[1]),
        }


def compare(request: Mapping[str, Any], architecture: Mapping[str, Any] | None = None) -> list[Row]:
    """Every layout of ``replicate_choices`` for ``request`` (a plain execution input, parsed once), planned."""
    values, base = inputs.parse_request(request, architecture)
    chosen = base.replicate if base.data_parallel_replicate == "auto" else None
    rows = []
    for replicate in replicate_choices(base.instance_count, base.gpus_per_instance):
        layout = {**values, "data_parallel_replicate": replicate}
        planned = estimate.plan_of(replace(base, data_parallel_replicate=replicate), layout)
        rows.append(Row(planned, auto=chosen == replicate))
    return rows


def _request(args: argparse.Namespace, nodes: int) -> dict[str, Any]:
    return {
        "instance_type": args.instance_type,
        "instance_count": nodes,
        "precision": args.precision,
        "seq_length": args.seq,
        "batch_size": args.batch,
        "activation_checkpointing": args.ac,
        "hyperparameters": {"model_preset": args.preset, "grad_accum_steps": args.grad_accum},
    }


HEADER = (
    "| instances (GPUs) | layout | peak GiB per GPU (limit) | tokens/s per GPU, estimate (low-high) | step s "
    "(low-high) | EFA GB per instance per step | network busy s | exposed s | network share | hours per 1B tokens "
    "(low-high) | $ per 1B tokens (low-high) |",
    "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
)


def _with_band(value: float, key: str, text: str, bands: Mapping[str, Any] | None, basis: str) -> str:
    """``value`` and its estimate's low-high band, each formatted by ``text``; the basis instead without a band."""
    if bands is None:
        return f"{text.format(value)} ({basis})"
    band = bands[key]
    return text.format(value) + ("" if band is None else f" ({text.format(band[0])}-{text.format(band[1])})")


def format_row(row: Row) -> str:
    s, m, t = row.setup, row.planned.memory, row.planned.timing
    net = t.network
    hours, cost = row.hours_and_cost()
    bands = row.bands()
    layout = ("replicate " + f"{s.replicate} x " if s.replicate > 1 else "") + f"shard {s.shard_size}"
    layout += " (auto)" if row.auto else ""
    fits = "" if m.fits else ", does not fit"
    cells = [
        f"{s.instance_count} ({s.world_size})",
        layout,
        f"{m.peak_gib:.1f} ({m.limit_gib:.1f}){fits}",
        _with_band(t.tokens_per_sec_per_gpu, "tokens_per_sec_per_gpu", "{:,.0f}", bands, t.basis),
        _with_band(t.step_seconds, "step_seconds", "{:.3f}", bands, t.basis),
        "n/a" if net is None else f"{net.node_bytes / 1e9:.1f}",
        "n/a" if net is None else f"{net.busy_seconds:.3f}",
        "n/a" if net is None else f"{net.exposed_seconds:.3f}",
        "n/a" if net is None else f"{100 * net.share:.1f}%",
        _with_band(hours, "hours", "{:.2f}", bands, t.basis),
        "n/a" if cost is None else _with_band(cost, "cost", "{:,.0f}", bands, t.basis),
    ]
    return "| " + " | ".join(cells) + " |"


def table(args: argparse.Namespace) -> str:
    rows = [row for nodes in args.nodes for row in compare(_request(args, nodes))]
    return "\n".join([*HEADER, *(format_row(row) for row in rows)])


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of instance counts; got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"instance counts are at least 1; got {text!r}")
    return counts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.plan.layouts", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--preset", default="llama3.1-8b", choices=sorted(shapes.MODEL_PRESETS))
    parser.add_argument("--nodes", type=_counts, default=[1, 2, 4], help="instance counts, comma-separated")
    parser.add_argument("--instance-type", default=hardware.DEFAULT_INSTANCE_TYPE,
                        choices=sorted(hardware.GPU_INSTANCE_TYPES))  # fmt: skip
    parser.add_argument("--precision", default="bf16", choices=hardware.PRECISIONS)
    parser.add_argument("--seq", type=int, default=8192, help="seq_length")
    parser.add_argument("--batch", type=int, default=1, help="batch_size (micro-batch per GPU)")
    parser.add_argument(
        "--ac", default="none", choices=settings_table.AC_MODES, help="activation_checkpointing"
    )
    parser.add_argument("--grad-accum", type=int, default=1, help="grad_accum_steps")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(table(args))
    except settings_table.ContractError as err:
        print(f"error: invalid setting {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
