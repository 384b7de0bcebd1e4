"""Print the seed-comparison table of docs/measurements.md: the source article's three peak-memory figures next to
the memory plan's estimate (``training.plan``) for the same settings.

    python -m training.measure.seed_comparison

The source article is the AWS Machine Learning blog post "Optimize model training on Amazon SageMaker AI with NVIDIA
Blackwell" (https://aws.amazon.com/blogs/machine-learning/optimize-model-training-on-amazon-sagemaker-ai-with-nvidia-blackwell/, June 2026; Figure 1: a 1B model, MXFP8, 8K tokens, 8x B200). Here: the ``1b`` preset (32,000-token
vocabulary) and the contract's other defaults (the loss chunked in ``loss_chunk_tokens``), one
ml.p6-b200.48xlarge. Figures in GB (10^9 bytes, as the article); closed form only (no torch), so the docs test
recomputes the whole table.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from training.plan import inputs, memory_terms
from training.plan import memory as plan_memory

SEED_FIGURES: tuple[tuple[str, bool, int, float], ...] = (
    ("no AC, batch 1", False, 1, 15.5),
    ("AC, batch 1", True, 1, 2.3),
    ("AC, batch 16", True, 16, 22.8),
)
"""(configuration, activation checkpointing, micro-batch, the article's peak memory in GB)."""
PARTS_SHOWN = 4
GB = 1e9


def request(ac: bool, batch: int) -> dict[str, Any]:
    return {"precision": "mxfp8", "batch_size": batch, "activation_checkpointing": ac, "seq_length": 8192}


def row(label: str, ac: bool, batch: int, seed_gb: float) -> str:
    memory = plan_memory.estimate_memory(inputs.setup_from_request(request(ac, batch)))
    peak, tensors, allowance = (
        x * memory_terms.GIB / GB for x in (memory.peak_gib, memory.tensors_gib, memory.allowance_gib)
    )
    largest = sorted(memory.parts.items(), key=lambda kv: -kv[1])[:PARTS_SHOWN]
    parts = ", ".join(f"{name} {gib * memory_terms.GIB / GB:.1f}" for name, gib in largest)
    return (
        f"| {label} | {seed_gb:.1f} | {peak:.1f} ({tensors:.1f} + {allowance:.1f}) | "
        f"{100 * (peak / seed_gb - 1):+.0f}% / {100 * (tensors / seed_gb - 1):+.0f}% | {parts} |"
    )


def table() -> str:
    lines = [
        "| configuration | the article (GB) | this estimate: tensors + allowance (GB) | difference "
        "(with / without the allowance) | largest parts here (GB) |",
        "|---|---:|---:|---:|---|",
    ]
    return "\n".join(lines + [row(*figure) for figure in SEED_FIGURES])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.seed_comparison", description=__doc__.splitlines()[0]
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parse_args(argv)
    print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
