"""The closed-form plan (``training.request.plan``) of model presets on one or more instances, as a Markdown table:
for each preset, instance count and activation-checkpointing setting, the largest micro-batch (of 1, 2, 4, 8, 16,
32) whose estimated per-GPU peak fits, with that peak, the moment it is reached, and the plan's throughput.

    python -m training.measure.preset_plans --presets llama3.1-8b,llama3.1-70b --seq 8192 --instances 1,2

Pure closed form (no tracing); the memory model's agreement with traced steps is ``training.measure.plan_agreement``.
Throughput is the plan's estimate (scaled from the seed article's published B200 figures), not a measurement.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from training.request import contract, plan

BATCHES = (1, 2, 4, 8, 16, 32)


def request(preset: str, seq: int, instances: int, ac: bool, batch: int, precision: str) -> dict[str, Any]:
    return {
        "hyperparameters": {"model_preset": preset},
        "seq_length": seq,
        "batch_size": batch,
        "activation_checkpointing": ac,
        "precision": precision,
        "instance_type": contract.DEFAULT_INSTANCE_TYPE,
        "instance_count": instances,
    }


def row(preset: str, seq: int, instances: int, ac: bool, precision: str) -> dict[str, Any]:
    """The largest micro-batch that fits (or batch 1 when none does) and its plan."""
    chosen = None
    for batch in BATCHES:
        candidate = plan.make_plan(request(preset, seq, instances, ac, batch, precision))
        if chosen is None or candidate.memory.fits:
            chosen = candidate
        if not candidate.memory.fits:
            break
    assert chosen is not None
    m, t, s = chosen.memory, chosen.timing, chosen.setup
    return {
        "preset": preset,
        "instances": instances,
        "gpus": s.world_size,
        "ac": ac,
        "batch": s.batch_size,
        "peak_gib": round(m.peak_gib, 1),
        "limit_gib": round(m.limit_gib, 1),
        "fits": m.fits,
        "moment": m.moment,
        "tokens_per_sec_per_gpu": round(t.tokens_per_sec_per_gpu),
        "step_seconds": round(t.step_seconds, 2),
    }


def format_table(rows: Sequence[dict[str, Any]], seq: int) -> str:
    lines = [
        f"| preset | instances (GPUs) | AC | largest micro-batch ({seq} tokens) | peak GiB per GPU (limit) | fits "
        "| peak at | tokens/s per GPU (plan) | step s |",
        "|---|---:|---|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['instances']} ({r['gpus']}) | {'on' if r['ac'] else 'off'} | {r['batch']} "
            f"| {r['peak_gib']:.1f} ({r['limit_gib']:.1f}) | {'yes' if r['fits'] else 'no'} | {r['moment']} "
            f"| {r['tokens_per_sec_per_gpu']:,} | {r['step_seconds']:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.preset_plans", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--presets", default="llama3.1-8b,llama3.1-70b", help="comma-separated model presets")
    parser.add_argument("--seq", type=int, default=8192, help="seq_length")
    parser.add_argument(
        "--instances", default="1,2", help=f"comma-separated counts of {contract.DEFAULT_INSTANCE_TYPE}"
    )
    parser.add_argument("--precision", default="bf16", help="precision")
    return parser.parse_args(argv)


def table(args: argparse.Namespace) -> str:
    rows = [
        row(preset, args.seq, int(instances), ac, args.precision)
        for preset in args.presets.split(",")
        for instances in args.instances.split(",")
        for ac in (False, True)
    ]
    return format_table(rows, args.seq)


def main(argv: Sequence[str] | None = None) -> int:
    print(table(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
