"""The plan of DPO runs on one ml.p6-b200.48xlarge as a Markdown table (docs/preference-tuning.md's): Llama 3.1 8B
full DPO and 70B LoRA DPO, with the reference's cost in memory and time (``training.plan.preference``).

    python -m training.measure.dpo_plans

Pure closed form, as ``training.measure.preset_plans``: the throughput is the plan's estimate, not a measurement.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from training.contract import hardware
from training.plan.estimate import make_plan
from training.plan.preference import preference_plan

TABLE_ROWS: dict[str, dict[str, str]] = {
    "Llama 3.1 8B, full DPO": {"model_preset": "llama3.1-8b", "seq_length": "4096", "batch_size": "1"},
    "Llama 3.1 70B, LoRA DPO (rank 16)": {"model_preset": "llama3.1-70b", "seq_length": "4096", "batch_size": "1",
                                          "lora_rank": "16", "activation_checkpointing": "full"},
}  # fmt: skip
"""The configurations of the table (one ml.p6-b200.48xlarge, bf16, 4,096 tokens a window, micro-batch 1)."""
TABLE_WINDOWS = 10_000
"""The precomputed reference's pass is shown for this many windows of data (it scales with them)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.dpo_plans",
        description="The plan of DPO runs on one ml.p6-b200.48xlarge (docs/preference-tuning.md's table): Llama 3.1 "
        "8B full and 70B LoRA, the reference's cost in memory and time.",
    )
    parser.add_argument("--steps", type=int, default=1000, help="max_steps of each run (default 1000)")
    return parser.parse_args(argv)


def table(args: argparse.Namespace) -> str:
    """The Markdown table: per configuration the reference, the per-GPU peak, what a kept reference model would
    take, the step time (and its factor over a next-token step), the tokens/s per GPU, the reference's pass, and
    the run's time and on-demand cost."""
    lines = [
        "| configuration | reference | peak per GPU (GiB) | a kept reference (GiB per GPU) | step (s) | tokens/s per "
        f"GPU | reference pass | {args.steps:,} steps | cost (USD) |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for label, settings in TABLE_ROWS.items():
        planned = make_plan(
            {"hyperparameters": {**settings, "max_steps": str(args.steps), "objective": "dpo"}}
        )
        s, t = planned.setup, planned.timing
        part = preference_plan(s, reference_values(settings), t, windows=TABLE_WINDOWS)
        run = t.run_seconds + (part.reference_pass_seconds or 0.0)
        cost = hardware.estimate_cost_usd(s.instance_type, s.instance_count, run)
        passed = (
            f"{part.reference_pass_seconds / 60:.1f} min per {TABLE_WINDOWS:,} windows, once"
            if part.reference_pass_seconds is not None
            else f"every step (x{part.step_factor:.2f})"
        )
        lines.append(
            f"| {label} | {part.reference} | {planned.memory.peak_gib:.1f} of {planned.memory.limit_gib:.1f} | "
            f"{part.kept_copy_gib:.2f} (not held) | {t.step_seconds:.2f} | {t.tokens_per_sec_per_gpu:,.0f} | "
            f"{passed} | {run / 60:.0f} min | {cost:,.0f} |"
        )
    return "\n".join(lines)


def reference_values(settings: Mapping[str, str]) -> dict[str, Any]:
    return {"dpo_reference": "auto", "lora_rank": int(settings.get("lora_rank", 0))}


def main(argv: Sequence[str] | None = None) -> int:
    print(table(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
