"""The plan's checkpoint figures: how long a save holds the step, how long its upload runs behind the step, and
how long a resume takes, for the S3-direct backend and for SageMaker's checkpoint folder, from published rates.

Every rate is an assumption with its source (none can be measured here: no GPU, no S3):

* the state: fp32 weights and Adam's two fp32 moments, 12 bytes a parameter (what the trainer saves; a 70B
  model's is about 840 GB);
* the save pause (background saves): the time to copy each GPU's shard into host memory, at most PCIe 5.0 x16's
  rate (PCI-SIG: 32 GT/s a lane, about 63 GB/s each way for 16 lanes); PyTorch's measurement of the same
  mechanism (a 7B model's checkpoint downtime from 148.8 s to 6.3 s) shows what a real copy costs on top;
* S3 per rank: s3torchconnector's client aims at 10 Gbit/s by default (``S3ClientConfig.throughput_target_gbps``)
  and each rank has its own, so an instance of 8 GPUs moves at most 80 Gbit/s (10 GB/s);
* S3 per prefix: at least 3,500 PUT and 5,500 GET requests a second per partitioned prefix (Amazon S3 user guide,
  "Best practices design patterns: optimizing Amazon S3 performance"): with 8 MiB parts, 29 GB/s up and 46 GB/s
  down for the run's prefix, whatever the instance count;
* SageMaker's checkpoint folder: at start every instance downloads the whole prefix (every checkpoint kept,
  SageMaker's ``CheckpointConfig``), assumed at the same 10 GB/s an instance; and each save is sealed by hashing
  every file on the training thread (the node's ranks share the files), at the SHA-256 rate measured on this
  development machine (0.6-0.7 GB/s a core, OpenSSL 3.0 with SHA-NI, AMD EPYC), where S3 direct hashes the bytes
  as they upload, behind the step.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    "state: 12 bytes a parameter (fp32 weights, Adam's two moments); "
    "save pause: each GPU's shard copied to host memory at PCIe 5.0 x16's 63 GB/s (PCI-SIG), a lower bound "
    "(PyTorch blog 'Reducing Model Checkpointing Times by Over 10x', 2024: a 7B save's downtime 148.8 s "
    "synchronous, 6.3 s asynchronous); S3: s3torchconnector's default 10 Gbit/s a rank "
    "(S3ClientConfig.throughput_target_gbps), at most 3,500 PUT and 5,500 GET requests a second per prefix of "
    "8 MiB parts (Amazon S3 user guide, optimizing performance); SageMaker's checkpoint folder: the whole prefix "
    "copied to every instance at start (SageMaker CheckpointConfig), at the same rate, and each save hashed on the "
    "training thread at 0.65 GB/s a rank (SHA-256 measured on the development machine)"
)


@dataclass(frozen=True)
class CheckpointTimes:
    """Seconds: ``pause`` (the step held by a background save), ``folder_seal`` (the checkpoint folder's extra
    hold: its files hashed on the training thread; S3 direct has none), ``upload`` (behind the step), ``resume_s3``
    (verify and load straight from S3), ``resume_folder`` (SageMaker's copy of every kept checkpoint to each
    instance before the trainer starts; reading it back from local disk comes on top, not counted)."""

    state_gb: float
    pause: float
    folder_seal: float
    upload: float
    resume_s3: float
    resume_folder: float


def checkpoint_times(parameters: float, instances: int, gpus: int = 8, keep: int = 2) -> CheckpointTimes:
    """The figures for a model of ``parameters`` trained on ``instances`` of ``gpus`` GPUs, ``keep``
    checkpoints kept."""
    state = parameters * BYTES_PER_PARAMETER / 1e9  # GB
    ranks = instances * gpus
    up = min(ranks * S3_RANK_GBPS, PREFIX_PUTS * PART_BYTES / 1e9)
    down = min(ranks * S3_RANK_GBPS, PREFIX_GETS * PART_BYTES / 1e9)
    verify_and_load = 2 * state / down  # every object read once to verify, the shards again to load
    folder = keep * state / (gpus * S3_RANK_GBPS)  # each instance copies the whole prefix, in parallel
    return CheckpointTimes(
        state_gb=state,
        pause=state / ranks / HOST_COPY_GBPS,
        folder_seal=state / ranks / HASH_GBPS,
        upload=state / up,
        resume_s3=verify_and_load,
        resume_folder=folder,
    )


def rows(models: dict[str, float] | None = None) -> list[str]:
    """The plan's table: each model on one and two instances."""
    models = models or {"8B (Llama 3.1)": 8.03e9, "70B (Llama 3.1)": 70.6e9}
    lines = [f"{'model':16s} {'inst':>4s} {'state':>8s} {'pause':>7s} {'upload':>7s} {'resume S3':>10s} "
             f"{'resume folder':>14s} {'folder seal':>12s}"]  # fmt: skip
    for name, parameters in models.items():
        for instances in (1, 2):
            t = checkpoint_times(parameters, instances)
            lines.append(f"{name:16s} {instances:>4d} {t.state_gb:>6.0f}GB {t.pause:>6.1f}s {t.upload:>6.0f}s "
                         f"{t.resume_s3:>9.0f}s {t.resume_folder:>13.0f}s {t.folder_seal:>11.0f}s")  # fmt: skip
    return lines


if __name__ == "__main__":
    print("\n".join(rows()))
    print(SOURCES)
