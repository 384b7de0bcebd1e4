"""The closed-form plan (``training.plan``) of model presets on one or more instances, as a Markdown table:
for each preset, instance count and activation-checkpointing setting, the largest micro-batch (of 1, 2, 4, 8, 16,
32) whose estimated per-GPU peak fits, with that peak, the moment it is reached, and the plan's throughput and step
time with their low-high band.

    python -m training.measure.preset_plans --presets llama3.1-8b,llama3.1-70b --seq 8192 --instances 1,2
    python -m training.measure.preset_plans --seq 4096 --instances 1 --lora-ranks 0,16 --batch 1

``--lora-ranks``: a row per LoRA rank (0: full fine-tuning; the column appears only then); ``--batch``: that
micro-batch in every row instead of the largest that fits (so the peaks compare).

Pure closed form (no tracing); the memory model's agreement with traced steps is ``training.measure.plan_agreement``.
Throughput is the plan's estimate, not a measurement: its centre scaled from the source article's two measured B200
configurations (``band.REFERENCE_SOURCE``), its low-high band from the MFU band ``band.mfu_band`` states (the
article's curve, torchao's and torchtitan's published peer figures, the article's 10-30% recompute overhead). Only
the article's own two configurations would read ``published`` (no band); none of these presets is one of them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from training.contract import hardware
from training.plan import estimate

BATCHES = (1, 2, 4, 8, 16, 32)


def request(
    preset: str, seq: int, instances: int, ac: bool, batch: int, precision: str, lora_rank: int = 0
) -> dict[str, Any]:
    return {
        "hyperparameters": {"model_preset": preset, **({"lora_rank": lora_rank} if lora_rank else {})},
        "seq_length": seq,
        "batch_size": batch,
        "activation_checkpointing": ac,
        "precision": precision,
        "instance_type": hardware.DEFAULT_INSTANCE_TYPE,
        "instance_count": instances,
    }


def row(
    preset: str,
    seq: int,
    instances: int,
    ac: bool,
    precision: str,
    lora_rank: int = 0,
    batch: int | None = None,
) -> dict[str, Any]:
    """The largest micro-batch that fits (or batch 1 when none does), or ``batch``, and its plan."""
    chosen = None
    for size in BATCHES if batch is None else (batch,):
        candidate = estimate.make_plan(request(preset, seq, instances, ac, size, precision, lora_rank))
        if chosen is None or candidate.memory.fits:
            chosen = candidate
        if not candidate.memory.fits:
            break
    assert chosen is not None
    m, t, s = chosen.memory, chosen.timing, chosen.setup
    return {
        "preset": preset,
        "lora_rank": lora_rank,
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
        "basis": t.basis,
        "tokens_per_sec_per_gpu_band": None if t.spread is None else t.spread.tokens_per_sec_per_gpu,
        "step_seconds_band": None if t.spread is None else t.spread.step_seconds,
    }


def with_band(value: str, band: tuple[float, float] | None, text: str, basis: str) -> str:
    """``value`` with an estimate's low-high ``band`` (each end formatted by ``text``), or its basis without one
    ("6,000 (published)")."""
    if band is None:
        return f"{value} ({basis})"
    return f"{value} ({text.format(band[0])}-{text.format(band[1])})"


def format_table(rows: Sequence[dict[str, Any]], seq: int, lora: bool = False, fixed: bool = False) -> str:
    """The Markdown table; ``lora``: with a LoRA rank column (0: full fine-tuning); ``fixed``: one micro-batch."""
    batch = "micro-batch" if fixed else "largest micro-batch"
    lines = [
        f"| preset |{' LoRA rank |' if lora else ''} instances (GPUs) | AC | {batch} ({seq} tokens) | peak GiB per "
        "GPU (limit) | fits | peak at | tokens/s per GPU, estimate (low-high) | step s, estimate (low-high) |",
        f"|---|{'---:|' if lora else ''}---:|---|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        rank = f" {r['lora_rank'] or 'full'} |" if lora else ""
        speed = with_band(
            f"{r['tokens_per_sec_per_gpu']:,}", r["tokens_per_sec_per_gpu_band"], "{:,.0f}", r["basis"]
        )
        step = with_band(f"{r['step_seconds']:.2f}", r["step_seconds_band"], "{:.2f}", r["basis"])
        lines.append(
            f"| {r['preset']} |{rank} {r['instances']} ({r['gpus']}) | {'on' if r['ac'] else 'off'} | {r['batch']} "
            f"| {r['peak_gib']:.1f} ({r['limit_gib']:.1f}) | {'yes' if r['fits'] else 'no'} | {r['moment']} "
            f"| {speed} | {step} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.preset_plans", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--presets", default="llama3.1-8b,llama3.1-70b", help="comma-separated model presets")
    parser.add_argument("--seq", type=int, default=8192, help="seq_length")
    parser.add_argument(
        "--instances", default="1,2", help=f"comma-separated counts of {hardware.DEFAULT_INSTANCE_TYPE}"
    )
    parser.add_argument("--precision", default="bf16", help="precision")
    parser.add_argument(
        "--lora-ranks", default=None, help="comma-separated lora_rank values (0: full fine-tuning)"
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="this micro-batch instead of the largest that fits"
    )
    return parser.parse_args(argv)


def table(args: argparse.Namespace) -> str:
    ranks = [int(r) for r in args.lora_ranks.split(",")] if args.lora_ranks else [0]
    rows = [
        row(preset, args.seq, int(instances), ac, args.precision, rank, args.batch)
        for preset in args.presets.split(",")
        for rank in ranks
        for instances in args.instances.split(",")
        for ac in (False, True)
    ]
    return format_table(rows, args.seq, lora=args.lora_ranks is not None, fixed=args.batch is not None)


def main(argv: Sequence[str] | None = None) -> int:
    print(table(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
