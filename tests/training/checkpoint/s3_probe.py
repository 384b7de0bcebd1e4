"""Run under torchrun (gloo) by the S3 checkpoint tests: a small FSDP2 model and its Adam state, saved to and
resumed from a run's prefix on the test's S3 server through the S3 backend (``S3Storage``) step by step.

``save``: one step, a background save, one more step while the upload runs, the seal; then every rank verifies
and loads it into a fresh model and optimizer. Each rank writes what it expects (the full model state gathered,
and its loaded trainer state) to ``--out``. ``load``: verify and load the newest sealed checkpoint on this world
size, write the full model state. ``kill``: rank 0 kills itself (SIGKILL) once its first shard bytes went to the
upload."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from training.trainer.checkpoint import s3_dcp
from training.trainer.checkpoint.names import state_name
from training.trainer.checkpoint.s3 import S3Storage


def model_and_optimizer(world: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 8))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def step(model, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    loss = model(torch.randn(4, 64, generator=generator)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def full_model(model) -> dict[str, list[float]]:
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {key: value.flatten().tolist() for key, value in state.items()}


def state_of(model, optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def resume(store: S3Storage, model, optimizer) -> dict:
    """Verify and load the newest sealed checkpoint: what a resume does, by hand."""
    name = store.find().sealed[-1]
    found, problem = store.read_marker(name)
    state = state_of(model, optimizer)
    problem = store.collective.agree(problem if found is None else store.verify(name, found))
    if problem is not None:
        return {"problem": problem, "name": name}
    store.load(name, state)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    same = found["world_size"] == store.world_size
    trainer = store.read_trainer_state(name, state_name(store.rank if same else 0))
    return {"name": name, "trainer": trainer, "needed": store.shards_needed(name, state_of(model, optimizer))}


def killed_after_first_bytes() -> None:
    """Make this rank SIGKILL itself once its first shard bytes went to the upload, before it completes."""
    original = s3_dcp._HashingStream.write

    def write(self, data):
        original(self, data)
        os.kill(os.getpid(), signal.SIGKILL)

    s3_dcp._HashingStream.write = write


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["save", "load", "kill"])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    env = SimpleNamespace(
        rank=rank, world_size=world, local_rank=rank, cpu_group=dist.new_group(backend="gloo")
    )
    store = S3Storage(args.uri, env)
    model, optimizer = model_and_optimizer(world)
    out = Path(args.out)
    facts = {"world_size": world, "data_parallel": [1, world], "step": 1, "model_shape": None, "job": None}
    if args.mode == "load":
        result = resume(store, model, optimizer)
        result["model"] = full_model(model)
        (out / f"load_{world}_{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()
        return
    step(model, optimizer, 1)
    expected = full_model(model)
    pending = store.begin(1, facts)
    if args.mode == "kill" and rank == 0:
        killed_after_first_bytes()
    store.write(pending, state_of(model, optimizer), {"step": 1, "rank": rank}, background=True)
    overlapped = store.written(pending) is False  # the upload is still running while the next step starts
    step(model, optimizer, 2)  # the step goes on; its updates must not reach the checkpoint
    store.seal(pending)
    fresh, fresh_optimizer = model_and_optimizer(world)
    result = resume(store, fresh, fresh_optimizer)
    result |= {"expected": expected, "model": full_model(fresh), "overlapped": overlapped}
    (out / f"save_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
