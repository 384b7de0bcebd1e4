"""Checkpoints (torch.distributed.checkpoint), the SIGTERM stop flag, and the final model file.

Layout under ``checkpoint_dir``::

    step_00000100/            complete: renamed from step_00000100.tmp by rank 0 after every rank finished
        .metadata, __*.distcp  DCP shards of model + optimizer (resharded on load if the world size changed)
        rank_00000.pt ...      per-rank trainer state: step, data position, LR scheduler, RNG states
        COMPLETE               JSON written last: world size and the size of every file above
    step_00000200.tmp/        being written (or abandoned by a crash): never loaded, never deleted

A run that continues an earlier one (the workflow's ``resume_from``) gets that run's newest complete checkpoint as
the read-only ``resume`` input channel; it is loaded only while ``checkpoint_dir`` has no complete checkpoint of
its own (after a spot interruption the run's own, newer ones win), and never written to.

A directory counts as complete only if its name has no suffix, COMPLETE exists and every listed file has the
listed size, so a half-written or truncated checkpoint is skipped. Only complete ``step_*`` directories beyond
the newest ``keep`` are deleted; nothing else in the folder is touched.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from training import contract

MARKER = "COMPLETE"
_NAME = re.compile(r"^step_(\d{8})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_dir() and _is_complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def _is_complete(path: Path) -> bool:
    try:
        files = json.loads((path / MARKER).read_text())["files"]
        return all((path / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def resume_channel_dir() -> Path | None:
    """The earlier run's checkpoint this job continues from (``SM_CHANNEL_RESUME``), or None."""
    folder = os.environ.get(f"SM_CHANNEL_{contract.RESUME_CHANNEL.upper()}")
    return Path(folder) if folder else None


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class CheckpointManager:
    """Saves and restores the full training state; all ranks call ``save``/``load`` together."""

    def __init__(self, root: str, keep: int, env, resume_dir: str | Path | None = None):
        """``env`` is the run's ``parallel.DistEnv``; ``resume_dir`` a read-only complete checkpoint of an earlier
        run, loaded only while ``root`` has none."""
        self.root, self.keep = Path(root), keep
        self.resume_dir = Path(resume_dir) if resume_dir is not None else None
        self.rank, self.world_size, self.device = env.rank, env.world_size, env.device
        self.node_leader, self.cpu_group = env.local_rank == 0, env.cpu_group

    def save(self, step: int, model, optimizer, trainer_state: dict[str, Any]) -> Path:
        """Write ``step_XXXXXXXX.tmp``, then (after a barrier) each node's local rank 0 seals and renames it
        (each node's ``/opt/ml/checkpoints`` is its own disk, synced to the same S3 prefix); returns the path."""
        final = self.root / step_dir_name(step)
        tmp = final.with_name(final.name + ".tmp")
        if self.node_leader:
            shutil.rmtree(tmp, ignore_errors=True)  # a leftover from a crash at this same step
            tmp.mkdir(parents=True, exist_ok=True)
        dist.barrier(group=self.cpu_group)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        torch.save({**trainer_state, "rng": rng_state(self.device)}, tmp / f"rank_{self.rank:05d}.pt")
        dist.barrier(group=self.cpu_group)
        if self.node_leader and tmp.exists():
            files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
            _write_atomic(
                tmp / MARKER, json.dumps({"world_size": self.world_size, "step": step, "files": files})
            )
            if final.exists():  # an older save of this step, e.g. before a resume: replace it whole
                shutil.rmtree(final)
            os.replace(tmp, final)
            self._prune()
        dist.barrier(group=self.cpu_group)
        return final

    def _prune(self) -> None:
        for _, path in complete_checkpoints(self.root)[: -self.keep]:
            shutil.rmtree(path)

    def load_latest(self, model, optimizer) -> dict[str, Any] | None:
        """Restore model, optimizer and RNG from the newest complete checkpoint; return its trainer state
        (step, data position, scheduler), or None when there is none. Every rank picks the same one."""
        found = complete_checkpoints(self.root)
        earlier = -1
        if not found and self.resume_dir is not None and _is_complete(self.resume_dir):
            earlier = int(json.loads((self.resume_dir / MARKER).read_text())["step"])
        chosen = torch.tensor([found[-1][0] if found else -1, earlier])
        dist.broadcast(chosen, src=0, group=self.cpu_group)  # rank 0's choice, in case nodes' folders differ
        step, earlier = int(chosen[0].item()), int(chosen[1].item())
        if step < 0 and earlier < 0:
            return None
        path = self.root / step_dir_name(step) if step >= 0 else self.resume_dir
        assert path is not None
        if not _is_complete(path):
            raise FileNotFoundError(f"checkpoint_dir: rank {self.rank} has no complete {path} (rank 0 does)")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        saved_world = json.loads((path / MARKER).read_text())["world_size"]
        own = path / f"rank_{self.rank:05d}.pt"
        trainer_state = torch.load(
            own if saved_world == self.world_size else path / "rank_00000.pt", weights_only=False
        )
        if saved_world == self.world_size:
            set_rng_state(trainer_state["rng"], self.device)
        trainer_state["path"], trainer_state["same_world_size"] = str(path), saved_world == self.world_size
        return trainer_state


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_model(model, model_dir: str, step: int, config: dict[str, Any], rank: int) -> Path | None:
    """Gather the full model state dict on rank 0 (CPU) and write ``model.pt`` (torch.save of
    ``{"config", "step", "state_dict"}``) via a temporary name. An existing ``model.pt`` is never overwritten:
    the new one is then named ``model_step_XXXXXXXX.pt``. Returns the path on rank 0, None elsewhere."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return None
    directory = Path(model_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "model.pt"
    if target.exists():
        target = directory / f"model_step_{step:08d}.pt"
    tmp = target.with_name(target.name + ".tmp")
    torch.save({"config": config, "step": step, "state_dict": state}, tmp)
    if target.exists():
        raise FileExistsError(f"model_dir: {target} already exists; not overwriting it")
    os.replace(tmp, target)
    return target


PID_DIR_ENV = "TRAINER_PID_DIR"
"""Where each worker registers its PID, so the container's PID-1 entry point (training/entrypoint.sh) can forward
SageMaker's SIGTERM to the workers directly."""


class StopFlag:
    """Set by SIGTERM (SageMaker's StopTrainingJob / spot reclaim; about 120 s before SIGKILL); the loop checks
    ``agreed()`` at each step boundary, which all-reduces the flag so every rank stops at the same step."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.received = False
        signal.signal(signal.SIGTERM, self._handle)
        pid_dir = os.environ.get(PID_DIR_ENV)
        if pid_dir:
            pid_file = Path(pid_dir) / str(os.getpid())
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid_file.touch()
            atexit.register(pid_file.unlink, missing_ok=True)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = True

    def agreed(self) -> bool:
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())
