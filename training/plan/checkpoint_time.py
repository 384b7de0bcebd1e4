"""The plan's checkpoint figures: how long a save holds the step, how long its upload runs behind the steps, and how
long a resume takes, for each backend (``checkpoint_backend``: S3 direct, or the folder SageMaker copies), from
published rates. ``python -m training.plan.checkpoint_time`` prints the table for 8B and 70B on one and two
instances.

Every rate is an assumption with its source (none can be measured here: no GPU, no S3):

* the state: fp32 weights and Adam's two fp32 moments, 12 bytes a trained parameter (what the trainer saves; a 70B
  model's is about 850 GB; a LoRA run's, its adapters' only);
* the save pause (background saves, ``async_checkpoint``): each GPU's shard copied into host memory at most at
  PCIe 5.0 x16's rate (PCI-SIG: 32 GT/s a lane, about 63 GB/s each way for 16 lanes), a lower bound; PyTorch's
  measurement of the same mechanism (a 7B model's checkpoint downtime from 148.8 s to 6.3 s) shows what a real
  copy costs on top;
* S3 per rank: s3torchconnector's client aims at 10 Gbit/s by default (``S3ClientConfig.throughput_target_gbps``)
  and each rank has its own, so an instance of 8 GPUs moves at most 80 Gbit/s (10 GB/s); per prefix, S3 serves at
  least 3,500 PUT and 5,500 GET requests a second (Amazon S3 user guide, "Best practices design patterns:
  optimizing Amazon S3 performance"): with 8 MiB parts, 29 GB/s up and 46 GB/s down for the run's prefix;
* hashing: SHA-256 at 0.65 GB/s a core (measured on the development machine: hashlib, OpenSSL 3.0 with SHA-NI,
  AMD EPYC). The folder backend hashes every file on the training thread when it seals a save (the step waits),
  and again when it verifies one on resume; S3 direct hashes the bytes as they upload (behind the step: a rank's
  upload goes at the slower of its S3 and hashing rates), and on resume each object is read and hashed once by
  one rank;
* SageMaker's checkpoint folder: when a job starts, every instance downloads the whole prefix (every checkpoint
  kept, SageMaker's ``CheckpointConfig``) before the trainer runs; its rate is not published and is assumed to be
  the connector's 10 GB/s an instance.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from training.contract import container

BYTES_PER_PARAMETER = 12
"""fp32 weights, and Adam's two fp32 moments."""

HOST_COPY_GBPS = 63.0
"""PCIe 5.0 x16, one direction (GB/s): the fastest a GPU's shard reaches host memory."""

S3_RANK_GBPS = 10.0 / 8
"""s3torchconnector's default throughput target per client (10 Gbit/s), in GB/s."""

HASH_GBPS = 0.65
"""SHA-256 per core (GB/s), measured on the development machine (hashlib, OpenSSL 3.0, SHA-NI)."""

PART_BYTES = 8 * 1024 * 1024
PREFIX_PUTS, PREFIX_GETS = 3500, 5500
"""S3's request rates per partitioned prefix, per second."""

SOURCES = (
    "state 12 bytes a trained parameter (fp32 weights, Adam's two moments); save pause: each GPU's shard copied to "
    "host memory at PCIe 5.0 x16's 63 GB/s (PCI-SIG), a lower bound (PyTorch blog 'Reducing Model Checkpointing "
    "Times by Over 10x', 2024: a 7B save's downtime 148.8 s synchronous, 6.3 s asynchronous); S3: "
    "s3torchconnector's default 10 Gbit/s a rank (S3ClientConfig.throughput_target_gbps), at most 3,500 PUT and "
    "5,500 GET requests a second per prefix of 8 MiB parts (Amazon S3 user guide, optimizing performance); SHA-256 "
    "at 0.65 GB/s a rank (measured on the development machine); SageMaker's checkpoint folder: the whole prefix "
    "(every kept checkpoint) copied to every instance at start (SageMaker CheckpointConfig), at an assumed 10 GB/s"
)

ASSUMED = (
    "12 bytes a trained parameter; host copy 63 GB/s (PCIe 5.0 x16, PCI-SIG); S3 1.25 GB/s a rank "
    "(s3torchconnector's default target), at most 3,500 PUT and 5,500 GET a second per prefix (Amazon S3 user "
    "guide); SHA-256 0.65 GB/s a rank (measured on the development machine); SageMaker's folder copy 10 GB/s an "
    "instance (assumed, not published)"
)
"""``SOURCES`` in short, as a plan carries it."""

MODELS = {"8B (Llama 3.1)": 8.03e9, "70B (Llama 3.1)": 70.6e9}
"""The models of the docs' table (parameters)."""


@dataclass(frozen=True)
class CheckpointTimes:
    """Seconds, for one backend: ``pause`` (the step held by a background save: the copy to host memory, and for
    the folder its seal, every file hashed on the training thread), ``upload`` (behind the steps: to S3 for S3
    direct, to the local disk for the folder, which SageMaker then copies to S3 in the background), ``resume``
    (before the first step: S3 direct verifies every object once across the ranks and each rank reads its shards;
    the folder waits for SageMaker's copy of every kept checkpoint to each instance, then each node hashes it all)."""

    backend: str
    state_gb: float
    pause: float
    upload: float
    resume: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "state_gb": round(self.state_gb, 1),
            "save_pause_seconds": round(self.pause, 1),
            "upload_seconds": round(self.upload),
            "resume_seconds": round(self.resume),
            "assumptions": ASSUMED,
        }


def checkpoint_times(
    parameters: float, instances: int, backend: str, gpus: int = 8, keep: int = 3
) -> CheckpointTimes:
    """The figures for ``parameters`` trained parameters on ``instances`` of ``gpus`` GPUs, ``keep`` checkpoints
    kept (``keep_checkpoints``), ``backend`` ``s3`` or ``folder``."""
    state = parameters * BYTES_PER_PARAMETER / 1e9  # GB
    ranks = instances * gpus
    share = state / ranks  # each rank's part of a save (DCP spreads replicated tensors over the ranks)
    staging = share / HOST_COPY_GBPS
    if (
        backend == "s3"
    ):  # each upload stream is hashed as it goes: a rank sends at the slower of the two rates
        up = min(ranks * min(S3_RANK_GBPS, HASH_GBPS), PREFIX_PUTS * PART_BYTES / 1e9)
        down = min(ranks * S3_RANK_GBPS, PREFIX_GETS * PART_BYTES / 1e9)
        verify = state / min(ranks * min(S3_RANK_GBPS, HASH_GBPS), PREFIX_GETS * PART_BYTES / 1e9)
        return CheckpointTimes("s3", state, staging, state / up, verify + state / down)
    copy = keep * state / (gpus * S3_RANK_GBPS)  # every instance downloads the whole prefix, at once
    hashed = state / gpus / HASH_GBPS  # each node's ranks hash its whole copy
    return CheckpointTimes("folder", state, staging + share / HASH_GBPS, 0.0, copy + hashed)


def plan_times(values: dict[str, Any] | Any, parameters: float, instances: int, gpus: int) -> CheckpointTimes:
    """The figures of a request: its trained parameters (``parameters``), its instances, its decided backend
    (``checkpoint_backend`` for a workflow's job: ``container.job_checkpoint_backend``) and ``keep_checkpoints``."""
    backend = container.job_checkpoint_backend(values.get("checkpoint_backend", "auto"), instances)
    return checkpoint_times(
        parameters, instances, backend, gpus=gpus, keep=int(values.get("keep_checkpoints", 3))
    )


def line(d: dict[str, Any]) -> str:
    """The plan's checkpoint line (of ``CheckpointTimes.to_dict``)."""
    name = "S3 direct" if d["backend"] == "s3" else "the folder SageMaker copies"
    upload = (
        f"upload {d['upload_seconds']} s behind the steps"
        if d["backend"] == "s3"
        else "written to local disk behind the steps, then copied to S3 by SageMaker"
    )
    return (
        f"checkpoints ({name}, checkpoint_backend): {d['state_gb']:g} GB a save, the step held "
        f"~{d['save_pause_seconds']:g} s a save, {upload}, resume ~{d['resume_seconds']} s "
        f"(assumes {d['assumptions']})"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The plan's checkpoint figures, both backends side by side.")
    parser.add_argument(
        "--keep", type=int, default=3, help="keep_checkpoints (the folder copies every kept one)"
    )
    return parser.parse_args(argv)


def table(args: argparse.Namespace, models: dict[str, float] | None = None) -> str:
    """The docs' table (Markdown): each model on one and two instances, both backends side by side."""
    lines = [
        "| model | instances | state | S3 direct: step held | S3 direct: upload behind the steps | "
        "S3 direct: resume | folder: step held | folder: resume |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, parameters in (models or MODELS).items():
        for instances in (1, 2):
            s3 = checkpoint_times(parameters, instances, "s3", keep=args.keep)
            folder = checkpoint_times(parameters, instances, "folder", keep=args.keep)
            lines.append(
                f"| {name} | {instances} | {s3.state_gb:.0f} GB | {s3.pause:.1f} s | {s3.upload:.0f} s | "
                f"{s3.resume:.0f} s | {folder.pause:.1f} s | {folder.resume:.0f} s |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    arguments = parse_args()
    print(table(arguments))
    print(f"keep_checkpoints={arguments.keep}; {SOURCES}")
