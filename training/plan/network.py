"""The network of one optimizer step: the bytes FSDP2's collectives move inside an instance (NVLink) and between
instances (EFA) for a data-parallel layout, the time they take over the instance type's published link
bandwidths, and how much of that time the step's compute hides.

Pure Python (standard library only): ``training.plan`` adds the exposed time to its step
time, and ``training.plan.layouts`` compares layouts with it.

The layout is a mesh of ``replicate`` x ``shard`` GPUs (``data_parallel_replicate``; ranks are contiguous per
instance, as torchrun numbers them, so a shard group of at most one instance's GPUs stays inside it). What the
trainer's FSDP2 does per optimizer step (``training/trainer/distributed/parallel.py``: every block its own group, resharded
after forward except the last, the root never; ``training/trainer/loop.py``: gradients reduced only on the last
of ``grad_accum_steps`` micro-batches):

* per micro-batch: an all-gather of every block's and the root's sharded weights for the forward pass, and of
  every block but the last again for the backward pass, in the compute dtype (2 bytes per value in 16 bits, the
  quantized bytes with ``quantized_model_init``, 4 in fp32);
* once per step: a reduce-scatter of every gradient in fp32 (``parallel.mixed_precision``'s reduce dtype; with
  LoRA the adapters' alone: the frozen base has no gradient, FSDP2 reduces none for it) over the shard group and, with more than one replica, an all-reduce of each shard's fp32 gradient over the replicas.

Traffic of a collective over a group of ``k`` ranks on ``m`` instances, as NCCL's ring moves it: an all-gather of
``N`` bytes in total (or a reduce-scatter of ``N`` bytes per rank) takes ``k - 1`` steps, in each of which every
rank sends one ``N / k`` chunk to the next, so every edge of the ring carries ``N (k-1)/k`` (nccl-tests' bus
bandwidth is defined from that: ``busBw = algBw (k-1)/k`` for both,
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md). NCCL orders a ring by instance (its
``src/graph`` search keeps an instance's GPUs together), so a ring over several instances enters each of them
once, by the network: each instance a group has members on receives ``N (k-1)/k`` over EFA per group, whatever
the number of its members (several channels share that between NICs; they add no bytes). That is the bound
``N (m-1)/m`` (every byte from elsewhere, once) when the group has one rank per instance, as the replicas of one
replica per instance do, and about twice it with several ranks per instance on two instances: a group of 16 over
two instances of 8 moves ``N 15/16`` into each, not ``N/2``. An all-reduce is a reduce-scatter and an all-gather:
twice that. (NCCL's tuner may pick its tree for an all-reduce, whose inter-instance bytes do not grow with the
ranks per instance; the plan counts the ring, the upper of the two.) A collective takes the longer of its NVLink
time (each GPU's bytes over its NVLink bandwidth per direction) and its EFA time (the busiest instance's bytes over
its EFA bandwidth), both at ``LINK_EFFICIENCY`` of the published rates, plus NCCL's own latency estimate for a ring
with its Simple protocol (``RING_LATENCY_US``: a base, and a per-step latency over NVLink or the network; small
next to blocks of 10^8 parameters, but it counts the collectives each layout makes).

Overlap (FSDP2 prefetches one block ahead): a block's all-gather runs while the previous block computes; in the
backward pass the next block's all-gather and the previous block's reduce-scatter (and all-reduce) run while the
block computes. The first all-gather of each micro-batch and the last block's and the root's gradient reduction
are not hidden. A block's compute is its share of the step's model FLOPs (forward one third, backward two
thirds), at the throughput the plan expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Interconnect:
    """An instance type's links: ``nvlink_gbps`` each GPU's NVLink bandwidth per direction (GB/s, 10^9 bytes),
    ``efa_gbit`` the instance's EFA bandwidth (Gbit/s), and where both figures are published."""

    nvlink_gbps: float
    efa_gbit: float
    source: str

    @property
    def efa_gbps(self) -> float:
        """EFA in GB/s (10^9 bytes per second)."""
        return self.efa_gbit / 8.0


_AWS_P6 = "https://aws.amazon.com/ec2/instance-types/p6/"
_AWS_P5 = "https://aws.amazon.com/ec2/instance-types/p5/"
_AWS_P4 = "https://aws.amazon.com/ec2/instance-types/p4/"
_NVIDIA_HGX = "https://www.nvidia.com/en-us/data-center/hgx/"

INTERCONNECTS: Mapping[str, Interconnect] = {
    "ml.p6-b200.48xlarge": Interconnect(
        900.0,
        3200.0,
        f"NVLink 5: 1.8 TB/s per GPU, both directions ({_NVIDIA_HGX}, HGX B200); EFAv4 3.2 Tbps per "
        f"instance ({_AWS_P6})",
    ),
    "ml.p6-b300.48xlarge": Interconnect(
        900.0,
        6400.0,
        f"NVLink 5: 1.8 TB/s per GPU, both directions ({_NVIDIA_HGX}, HGX B300); EFAv4 6.4 Tbps per "
        f"instance ({_AWS_P6})",
    ),
    "ml.p5.48xlarge": Interconnect(
        450.0,
        3200.0,
        f"NVLink 4: 900 GB/s per GPU, both directions ({_NVIDIA_HGX}, HGX H100); EFA 3,200 Gbps per "
        f"instance ({_AWS_P5})",
    ),
    "ml.p5e.48xlarge": Interconnect(
        450.0,
        3200.0,
        f"NVLink 4: 900 GB/s per GPU, both directions ({_NVIDIA_HGX}, HGX H200); EFA 3,200 Gbps per "
        f"instance ({_AWS_P5})",
    ),
    "ml.p5en.48xlarge": Interconnect(
        450.0,
        3200.0,
        f"NVLink 4: 900 GB/s per GPU, both directions ({_NVIDIA_HGX}, HGX H200); EFAv3 3,200 Gbps per "
        f"instance ({_AWS_P5})",
    ),
    "ml.p4d.24xlarge": Interconnect(
        300.0,
        400.0,
        f"NVLink 3: 600 GB/s per GPU, both directions ({_NVIDIA_HGX}, HGX A100); EFA 400 Gbps per "
        f"instance ({_AWS_P4})",
    ),
    "ml.p4de.24xlarge": Interconnect(
        300.0,
        400.0,
        f"NVLink 3: 600 GB/s per GPU, both directions ({_NVIDIA_HGX}, HGX A100); EFA 400 Gbps per "
        f"instance ({_AWS_P4})",
    ),
}
"""Published link bandwidths of the instance types a job may span. Not listed (``UNMODELLED``):
``ml.p6e-gb200.36xlarge`` and ``ml.p5.4xlarge``: the plan gives them no network time and says why (:func:`unmodelled`)."""

UNMODELLED: Mapping[str, str] = {
    "ml.p6e-gb200.36xlarge": "its NVLink domain spans the UltraServer's instances (up to 72 GPUs), which this "
    "model of one NVLink island per instance does not describe",
    "ml.p5.4xlarge": "one GPU per instance, so every collective crosses the network, and the plan has no "
    "published EFA bandwidth for it",
}
"""Why an instance type a job may span has no network time in the plan."""


def unmodelled(instance_type: str, instance_count: int, gpus_per_instance: int) -> str | None:
    """Why the plan gives a job of ``instance_count`` x ``instance_type`` no network time, for a job that has
    collectives (more than one GPU) on an instance type without published links; None otherwise. The step time,
    run time and cost then leave the collectives out: a floor."""
    if instance_type in INTERCONNECTS or instance_count * gpus_per_instance <= 1:
        return None
    why = UNMODELLED.get(instance_type, "the plan has no published NVLink and EFA bandwidths for it")
    scope = f"{instance_count} x {instance_type}" if instance_count > 1 else instance_type
    return (
        f"not estimated for {scope}: {why}; the step time, run time and cost leave out the collectives' time "
        f"(a floor{' for ' + str(instance_count) + ' instances' if instance_count > 1 else ''})"
    )


LINK_EFFICIENCY = 0.75
"""The share of a link's published rate a large NCCL collective reaches (bus bandwidth over link rate): an
assumption, not measured here (no GPU, no EFA). Measure it on the real cluster with nccl-tests' ``all_gather_perf``
and ``reduce_scatter_perf`` across the job's instances and change it here."""


@dataclass(frozen=True)
class Layout:
    """The data-parallel mesh: ``nodes`` instances of ``gpus`` GPUs each, ``replicate`` x ``shard`` ranks."""

    nodes: int
    gpus: int
    replicate: int

    def __post_init__(self) -> None:
        if self.replicate < 1 or self.world % self.replicate:
            raise ValueError(f"replicate {self.replicate} does not divide {self.world} GPUs")

    @property
    def world(self) -> int:
        return self.nodes * self.gpus

    @property
    def shard(self) -> int:
        return self.world // self.replicate

    def describe(self) -> str:
        if self.replicate == 1:
            return f"shard {self.shard}"
        return f"replicate {self.replicate} x shard {self.shard}"


def layout_problem(replicate: int, world: int) -> str | None:
    """Why ``data_parallel_replicate`` ``replicate`` cannot run on ``world`` GPUs, or None."""
    if world % replicate:
        return f"must divide the number of GPUs ({world}); got {replicate}"
    return None


@dataclass(frozen=True)
class Model:
    """What the traffic depends on: parameters per block and outside the blocks, blocks, bytes per gathered value,
    micro-batches per optimizer step, and the parameters per block and outside the blocks that train (None: all
    of them). FSDP2 gathers every parameter but reduces only the gradients there are: with LoRA the adapters'
    alone (the frozen base has none)."""

    block_params: int
    root_params: int
    layers: int
    gather_bytes: float
    micro_batches: int = 1
    trained_block_params: int | None = None
    trained_root_params: int | None = None

    @property
    def reduced_block_params(self) -> int:
        return self.block_params if self.trained_block_params is None else self.trained_block_params

    @property
    def reduced_root_params(self) -> int:
        return self.root_params if self.trained_root_params is None else self.trained_root_params

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.root_params


REDUCE_BYTES = 4.0
"""Gradients are reduced in fp32 (``parallel.mixed_precision``: ``reduce_dtype=torch.float32``)."""

RING_LATENCY_US = {"base": 8.4, "nvlink_step": 3.4, "network_step": 9.6}
"""NCCL's latency model for a ring collective with the Simple protocol, in microseconds: a base, plus one per ring
step inside an instance (NVLink) or between instances (NCCL ``src/graph/tuning.cc``, ``baseLat`` and ``hwLat``
for Ring/Simple: https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc)."""


@dataclass(frozen=True)
class Collective:
    """One or more collectives' traffic: bytes each GPU sends over NVLink, bytes each instance sends over EFA, and
    NCCL's latency estimate (seconds)."""

    gpu_bytes: float
    node_bytes: float
    latency: float = 0.0

    def seconds(self, links: Interconnect) -> float:
        nvlink = self.gpu_bytes / (links.nvlink_gbps * 1e9 * LINK_EFFICIENCY)
        efa = self.node_bytes / (links.efa_gbps * 1e9 * LINK_EFFICIENCY)
        return self.latency + max(nvlink, efa)

    def __add__(self, other: Collective) -> Collective:
        return Collective(
            self.gpu_bytes + other.gpu_bytes, self.node_bytes + other.node_bytes, self.latency + other.latency
        )

    def times(self, count: float) -> Collective:
        return Collective(self.gpu_bytes * count, self.node_bytes * count, self.latency * count)


NONE = Collective(0.0, 0.0)


def ring_latency(size: int, span: int) -> float:
    """NCCL's latency estimate (seconds) of an all-gather or reduce-scatter ring over ``size`` ranks on ``span``
    instances: ``size - 1`` steps, ``span - 1`` of them between instances."""
    steps, network_steps = size - 1, span - 1
    us = RING_LATENCY_US
    return 1e-6 * (
        us["base"] + (steps - network_steps) * us["nvlink_step"] + network_steps * us["network_step"]
    )


def _groups(layout: Layout, size: int, consecutive: bool) -> list[range]:
    """The ranks of each group of ``size``: shard groups are ``size`` consecutive ranks, replica groups every
    ``shard``-th rank."""
    if consecutive:
        return [range(first, first + size) for first in range(0, layout.world, size)]
    return [range(first, layout.world, layout.shard) for first in range(layout.shard)]


def gather(total_bytes: float, layout: Layout, *, size: int, consecutive: bool = True) -> Collective:
    """An all-gather of ``total_bytes`` in all (or a reduce-scatter of that many bytes per rank) over groups of
    ``size`` ranks, as NCCL's ring moves it (the module's docstring): each instance receives, for each group with
    members on it that spans several instances, ``N (k-1)/k`` over EFA (its ring's one entry); the busiest
    instance counts, so a group that straddles instances unevenly (a shard of 12 over instances of 8) is not taken
    for an NVLink one. The latency counts the most instances any group spans."""
    if size <= 1:
        return NONE
    into: dict[int, float] = {}
    span = 1
    for group in _groups(layout, size, consecutive):
        members: dict[int, int] = {}
        for rank in group:
            members[rank // layout.gpus] = members.get(rank // layout.gpus, 0) + 1
        span = max(span, len(members))
        if len(members) > 1:
            for instance in members:
                into[instance] = into.get(instance, 0.0) + total_bytes * (size - 1) / size
    node = max(into.values(), default=0.0)
    return Collective(total_bytes * (size - 1) / size, node, ring_latency(size, span))


def all_reduce(bytes_per_rank: float, layout: Layout) -> Collective:
    """The replicas' all-reduce of each shard's gradient (reduce-scatter then all-gather over the replicas)."""
    return gather(bytes_per_rank, layout, size=layout.replicate, consecutive=False).times(2.0)


@dataclass(frozen=True)
class StepNetwork:
    """One optimizer step's collectives: bytes (each GPU over NVLink, each instance over EFA), the time they keep
    the links busy, the part of it the compute does not hide, and the compute it was measured against."""

    layout: Layout
    gpu_bytes: float
    node_bytes: float
    busy_seconds: float
    exposed_seconds: float
    compute_seconds: float
    source: str

    @property
    def share(self) -> float:
        """The exposed network time's share of the step (compute + exposed)."""
        total = self.compute_seconds + self.exposed_seconds
        return self.exposed_seconds / total if total > 0 else 0.0

    @property
    def hidden(self) -> float:
        """The share of the collectives' time the compute hides (1.0 when nothing is exposed)."""
        return 1.0 - self.exposed_seconds / self.busy_seconds if self.busy_seconds > 0 else 1.0

    def to_dict(self) -> dict[str, object]:
        return {
            "layout": self.layout.describe(),
            "data_parallel_replicate": self.layout.replicate,
            "nvlink_gb_per_gpu": round(self.gpu_bytes / 1e9, 3),
            "efa_gb_per_instance": round(self.node_bytes / 1e9, 3),
            "busy_seconds": round(self.busy_seconds, 4),
            "exposed_seconds": round(self.exposed_seconds, 4),
            "share": round(self.share, 4),
            "hidden": round(self.hidden, 4),
            "source": self.source,
        }


def reduction(params: int, layout: Layout) -> Collective:
    """The gradient reduction of ``params`` parameters: a reduce-scatter over the shard group, then the replicas'
    all-reduce of each shard (FSDP2's HSDP). Nothing for no parameter (a frozen group reduces nothing)."""
    if params <= 0:
        return NONE
    fp32 = params * REDUCE_BYTES
    return gather(fp32, layout, size=layout.shard) + all_reduce(fp32 / layout.shard, layout)


def step(model: Model, layout: Layout, links: Interconnect, compute_seconds: float) -> StepNetwork:
    """The collectives of one optimizer step of ``model`` on ``layout`` and how much ``compute_seconds`` (the
    step's compute, every micro-batch) hides of them."""
    shard, pb, pr = layout.shard, model.block_params, model.root_params
    a, layers = model.micro_batches, model.layers
    block_gather = gather(pb * model.gather_bytes, layout, size=shard)
    root_gather = gather(pr * model.gather_bytes, layout, size=shard)
    block_reduce = reduction(model.reduced_block_params, layout)
    root_reduce = reduction(model.reduced_root_params, layout)
    t_gather, t_reduce = block_gather.seconds(links), block_reduce.seconds(links)
    t_root_gather, t_root_reduce = root_gather.seconds(links), root_reduce.seconds(links)
    per_micro = compute_seconds / a
    block_forward = per_micro / 3.0 * pb / model.params
    block_backward = 2.0 * block_forward
    # one micro-batch: the first all-gather (root and block 0) waits; each later block's is hidden by its
    # predecessor's forward; the backward all-gathers (every block but the last) by the block before them
    forward = t_root_gather + t_gather + (layers - 1) * max(0.0, t_gather - block_forward)
    backward = (layers - 1) * max(0.0, t_gather - block_backward)
    last_backward = (layers - 1) * max(0.0, t_gather + t_reduce - block_backward) + t_reduce + t_root_reduce
    exposed = a * forward + (a - 1) * backward + last_backward
    traffic = (
        block_gather.times(a * (2 * layers - 1))
        + root_gather.times(a)
        + block_reduce.times(layers)
        + root_reduce
    )
    busy = a * ((2 * layers - 1) * t_gather + t_root_gather) + layers * t_reduce + t_root_reduce
    return StepNetwork(
        layout, traffic.gpu_bytes, traffic.node_bytes, busy, min(exposed, busy), compute_seconds, links.source
    )
