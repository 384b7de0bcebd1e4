"""Process group, device mesh, and FSDP2 sharding (``fully_shard`` per block, then at the root).

NCCL on GPUs, gloo on CPU. Works under ``torchrun`` (reads RANK/WORLD_SIZE/LOCAL_RANK) and, for the benchmark,
as a single process (world size 1 on a free local port).

The mesh: 1-D over every rank (every state sharded over every GPU), or, with ``data_parallel_replicate`` R above
1, hybrid sharding's 2-D ``(dp_replicate, dp_shard)`` mesh of R x world/R ranks, given to ``fully_shard`` as
is: each parameter ``(Replicate(), Shard(0))``, gathered and reduce-scattered within its shard group (torchrun
numbers a node's ranks consecutively, so a shard group of at most one node's GPUs stays on NVLink), gradients
all-reduced across the replicas (torchtitan's ``dp_replicate`` x ``dp_shard``). Data parallelism is over both
dimensions: every rank reads its own batch. ``auto`` resolves with the plan's memory estimate
(``data_parallel_replicate``).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.contract import hardware, settings_table
from training.plan import inputs, network
from training.trainer.distributed import cluster
from training.trainer.model.decoder import Transformer

MESH_DIMS = ("dp_replicate", "dp_shard")
"""The names of hybrid sharding's mesh dimensions (torchtitan's)."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh
    cpu_group: dist.ProcessGroup
    """A gloo group for small host-side agreements (the stop flag) that must not sync the GPU stream."""
    replicate: int = 1
    """Replicas of hybrid sharding (1: the mesh is 1-D, every state sharded over every rank)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def shard(self) -> int:
        """Ranks each state is sharded over."""
        return self.world_size // self.replicate

    @property
    def dp_group(self) -> Any:
        """Every data-parallel rank's group (both mesh dimensions: the whole world)."""
        return self.mesh.get_group() if self.mesh.ndim == 1 else dist.group.WORLD

    def describe(self) -> str:
        return (
            f"replicate {self.replicate} x shard {self.shard}"
            if self.replicate > 1
            else f"shard {self.shard}"
        )


def init_distributed(replicate: int = 1) -> DistEnv:
    """Start the default process group (NCCL if a GPU is visible, else gloo) and the mesh: 1-D over all ranks, or
    ``(replicate, world / replicate)`` for hybrid sharding."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local_rank = int(os.environ["LOCAL_RANK"])
    meet_the_other_hosts()
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    if replicate == 1:
        mesh = init_device_mesh(device.type, (world,))
    else:
        mesh = init_device_mesh(device.type, (replicate, world // replicate), mesh_dim_names=MESH_DIMS)
    cpu_group = dist.new_group(backend="gloo") if device.type == "cuda" else dist.group.WORLD
    return DistEnv(dist.get_rank(), world, local_rank, device, mesh, cpu_group, replicate)


def meet_the_other_hosts() -> None:
    """On several hosts under torchrun, every worker checks in on torchrun's store before the process group, so
    that a host lost after the roll call is named within ``HOST_JOIN_TIMEOUT`` (``cluster.workers_meet``) instead
    of leaving the others in ``init_process_group`` for torch's process-group timeout. Raises
    ``cluster.JoinError``. Nothing to do on one host, or outside torchrun's agent store."""
    world = int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
    if world == local_world or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    hosts = cluster.Hosts.read()
    bound = cluster.join_timeout()
    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=timedelta(seconds=bound), wait_for_workers=False,
        )  # fmt: skip
    except RuntimeError:  # torch's DistNetworkError: the first host's agent does not answer within the bound
        raise cluster.JoinError(cluster.lost_after_roll_call(hosts, [0], world, local_world, bound)) from None
    cluster.workers_meet(
        store, hosts, int(os.environ["RANK"]), world, local_world, bound,
        os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
    )  # fmt: skip


def data_parallel_replicate(cfg, world_size: int, local_world_size: int) -> tuple[int, str]:
    """The replicas this run's mesh has, and why: ``cfg.data_parallel_replicate`` as set (refused by name when it
    does not divide ``world_size``), or ``auto``: the number of nodes when the plan says one node's GPUs hold the
    sharded states with room for the step (``memory.Setup.replicate``, on the instance type SageMaker names), else 1.
    Raises ``settings_table.ContractError`` (before any process group)."""
    setting = cfg.data_parallel_replicate
    nodes = world_size // local_world_size if local_world_size and world_size % local_world_size == 0 else 1
    if setting != "auto":
        problem = network.layout_problem(int(setting), world_size)
        if problem:
            raise settings_table.ContractError(
                "data_parallel_replicate",
                f"{problem} ({nodes} node(s) x {local_world_size} processes); or auto",
            )
        return int(setting), "set"
    if nodes == 1:
        return 1, "auto: one node"
    instance_type = cluster.current_instance_type()
    if instance_type not in hardware.GPU_INSTANCE_TYPES:
        return (
            1,
            f"auto: instance type {instance_type or 'unknown'} has no memory figures, so every state is sharded",
        )
    settings = {k: v for k, v in cfg.as_dict().items() if k in settings_table.HYPERPARAMETERS_BY_NAME}
    settings.pop("init_from", None)  # its shape is in the settings already
    setup = inputs.setup_from_request(
        {"instance_type": instance_type, "instance_count": nodes, "hyperparameters": settings}
    )
    held = "holds" if setup.replicate > 1 else "does not hold"
    return (
        setup.replicate,
        f"auto: one {instance_type}'s GPUs {held} the sharded states (the plan's estimate)",
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def mixed_precision(dtype: torch.dtype) -> MixedPrecisionPolicy:
    """Compute in ``dtype``, keep fp32 primary weights, reduce gradients in fp32."""
    if dtype == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard_model(
    model: Transformer, mesh: DeviceMesh, policy: MixedPrecisionPolicy, device: torch.device
) -> None:
    """``fully_shard`` each block (its own all-gather/reduce-scatter unit), then the root (embedding, norm, head),
    and materialize each rank's shard of the meta-device model's non-TE modules on ``device`` (uninitialized).

    The last block keeps its parameters gathered after forward (backward needs them right away). Transformer
    Engine modules stay on meta here: ``weights.initialize`` has their own ``reset_parameters`` materialize
    (and, under ``quantized_model_init``, quantize) each shard with the values it gives, and fills the rest.
    Attributes TE keeps on its parameters are carried across ``fully_shard``, which replaces every parameter by
    a DTensor.
    """
    te_attrs = {name: dict(vars(p)) for name, p in model.named_parameters() if _is_te_param(model, name)}
    for index, block in enumerate(model.layers):
        shard_block(block, mesh, policy, reshard_after_forward=index < len(model.layers) - 1)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for name, param in model.named_parameters():
        for key, value in te_attrs.get(name, {}).items():
            setattr(param, key, value)
    for module in model.modules():
        if hasattr(module, "param_init_meta"):
            continue
        if any(p.is_meta for p in module.parameters(recurse=False)):
            module.to_empty(device=device, recurse=False)


def shard_block(
    block: torch.nn.Module, mesh: DeviceMesh, policy: MixedPrecisionPolicy, reshard_after_forward: bool = True
) -> None:
    """``fully_shard`` one block as ``shard_model`` does (also ``compile.warm_up``'s stand-in block)."""
    # Blocks take their input as it comes (already in the compute dtype: the embedding's output) and, above all,
    # the rotary frequencies in fp32: FSDP2 would otherwise cast every floating-point argument to param_dtype,
    # and bf16 angles (position x frequency, up to seq_length radians) are off by whole radians.
    block_policy = dataclasses.replace(policy, cast_forward_inputs=False)
    fully_shard(block, mesh=mesh, mp_policy=block_policy, reshard_after_forward=reshard_after_forward)


def _is_te_param(model: Transformer, name: str) -> bool:
    owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    return hasattr(owner, "param_init_meta")
