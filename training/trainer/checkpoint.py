"""Checkpoints (torch.distributed.checkpoint), the SIGTERM stop flag, and the final model file.

Layout under ``checkpoint_dir``::

    step_00000100/            complete: renamed from step_00000100.tmp by rank 0 after every rank finished
        .metadata, __*.distcp  DCP shards of model + optimizer (resharded on load if the world size changed)
        rank_00000.pt ...      per-rank trainer state: step, data position, LR schedule, RNG states
        COMPLETE               JSON written last: world size, model shape, size and SHA-256 of every file above
    step_00000200.tmp/        being written (or abandoned by a crash): never loaded, never deleted
    step_00000050.unusable/   set aside: failed its checksums or its load; never loaded again, never deleted

A run that continues an earlier one (the workflow's ``resume_from``) gets that run's newest complete checkpoint as
the read-only ``resume`` input channel; it is tried only when ``checkpoint_dir`` holds no checkpoint that loads
(after a spot interruption the run's own, newer ones win), is verified like the others, and is never written to
or renamed.

A directory counts as complete only if its name has no suffix, COMPLETE exists and every listed file has the
listed size, so a half-written or truncated checkpoint is skipped. Before a complete checkpoint is loaded every
file's SHA-256 is checked against COMPLETE (the ranks of a node share the hashing); if any rank finds a mismatch
or fails to load it, all ranks agree to set it aside (rename) and try the previous one. Only complete ``step_*``
directories beyond the newest ``keep`` are deleted; nothing else in the folder is touched.
"""

from __future__ import annotations

import atexit
import hashlib
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
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception
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


class CheckpointShapeError(ValueError):
    """The checkpoint holds a model of another shape (or position encoding) than the run's settings."""


class CheckpointManager:
    """Saves and restores the full training state; all ranks call ``save``/``load_latest`` together.

    ``shape`` (the run's ``model_identity``: shape and position settings) is stored in every checkpoint and
    checked before a load.
    After ``load_latest``, ``set_aside`` lists (folder, reason) of the checkpoints it renamed and
    ``touched_model`` says whether a failed load may have written into the model or optimizer."""

    def __init__(
        self,
        root: str,
        keep: int,
        env,
        shape: dict[str, int] | None = None,
        resume_dir: str | Path | None = None,
    ):
        """``env`` is the run's ``parallel.DistEnv``; ``resume_dir`` a read-only complete checkpoint of an earlier
        run, tried only when ``root`` has none that loads."""
        self.root, self.keep, self.shape = Path(root), keep, shape
        self.resume_dir = Path(resume_dir) if resume_dir is not None else None
        self.rank, self.world_size, self.device = env.rank, env.world_size, env.device
        self.local_rank, self.cpu_group = env.local_rank, env.cpu_group
        self.node_leader = env.local_rank == 0
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
        self.set_aside: list[tuple[str, str]] = []
        self.touched_model = False

    def save(self, step: int, model, optimizer, trainer_state: dict[str, Any]) -> Path:
        """Write ``step_XXXXXXXX.tmp``, then (after a barrier) hash it and have each node's local rank 0 seal and
        rename it (each node's ``/opt/ml/checkpoints`` is its own disk, synced to the same S3 prefix)."""
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
        digests = self._node_digests(tmp)
        if self.node_leader and tmp.exists():
            files = {name: size for name, (size, _) in sorted(digests.items())}
            sums = {name: digest for name, (_, digest) in sorted(digests.items())}
            marker = {"world_size": self.world_size, "step": step, "model_shape": self.shape}
            _write_atomic(tmp / MARKER, json.dumps({**marker, "files": files, "sha256": sums}))
            if final.exists():  # an older save of this step, e.g. before a resume: replace it whole
                shutil.rmtree(final)
            os.replace(tmp, final)
            self._prune()
        dist.barrier(group=self.cpu_group)
        return final

    def _my_share(self, path: Path) -> list[str]:
        """The files of ``path`` this rank hashes: the node's local ranks take turns over the sorted names."""
        names = sorted(p.name for p in path.iterdir() if p.is_file() and p.name != MARKER)
        return names[self.local_rank :: self.local_world]

    def _node_digests(self, path: Path) -> dict[str, tuple[int, str]]:
        """{name: (size, sha256)} of every file in ``path`` on this node (each rank hashes its share)."""
        mine = {
            name: ((path / name).stat().st_size, file_sha256(path / name)) for name in self._my_share(path)
        }
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, (self.rank - self.local_rank, mine), group=self.cpu_group)
        node = self.rank - self.local_rank
        return {k: v for owner, part in gathered if owner == node for k, v in part.items()}

    def _prune(self) -> None:
        for _, path in complete_checkpoints(self.root)[: -self.keep]:
            shutil.rmtree(path)

    def load_latest(self, model, optimizer) -> dict[str, Any] | None:
        """Restore model, optimizer and RNG from the newest checkpoint that verifies and loads on every rank;
        return its trainer state (step, data position, schedule), or None when there is none.

        Every rank tries the same checkpoints (rank 0's list). One that fails its checksums or its load on any
        rank is set aside on every node (renamed ``.unusable``, never deleted) and the previous one is tried.
        When none of the run's own loads, the read-only ``resume_dir`` (an earlier run's) is tried, and skipped
        with its reason if it fails (never renamed). A checkpoint of another model shape raises
        CheckpointShapeError naming both shapes."""
        found = [step for step, _ in complete_checkpoints(self.root)]
        steps: list[Any] = [found]
        dist.broadcast_object_list(
            steps, src=0, group=self.cpu_group
        )  # rank 0's list, if nodes' folders differ
        for step in reversed(steps[0]):
            path = self.root / step_dir_name(step)
            state, reason = self._try_load(path, model, optimizer)
            if reason is None:
                return state
            self._set_aside(path, reason)
        earlier = [self.resume_dir is not None and _is_complete(self.resume_dir)]
        dist.broadcast_object_list(earlier, src=0, group=self.cpu_group)
        if earlier[0] and self.resume_dir is not None:
            state, reason = self._try_load(self.resume_dir, model, optimizer, field="resume_from")
            if reason is None:
                return state
            self.set_aside.append((str(self.resume_dir), f"{reason}; read-only, left as it is"))
        return None

    def _try_load(
        self, path: Path, model, optimizer, field: str = "checkpoint_dir"
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(trainer state, None) when ``path`` verifies and loads on every rank, else (None, every rank's reason).
        A checkpoint of another model shape raises CheckpointShapeError naming ``field``, the setting the user
        changes: ``checkpoint_dir`` for the run's own, ``resume_from`` for an earlier run's (the resume channel)."""
        self._check_shape(path, field)
        reason = self._agree(self._verify(path))
        if reason is not None:
            return None, reason
        try:
            state, failure = self._load(path, model, optimizer), None
        except (Exception, CheckpointException) as err:  # any load failure on any rank: agreed on below
            state, failure = None, f"load failed on rank {self.rank}: {_one_line(err, self.rank)}"
        reason = self._agree(failure)
        if reason is not None:
            self.touched_model = True  # a partial load may have written into the model or optimizer
            return None, reason
        return state, None

    def _check_shape(self, path: Path, field: str) -> None:
        message = shape_mismatch(path, self.shape, REMEDY[field])
        if message:
            raise CheckpointShapeError(f"{field}: {message}")

    def _verify(self, path: Path) -> str | None:
        """Why this rank's share of ``path`` fails its checksums, or None."""
        if not _is_complete(path):
            return f"rank {self.rank} has no complete copy"
        try:
            sums = json.loads((path / MARKER).read_text()).get("sha256")
            if sums is None:
                return None  # written before checksums existed: sizes were checked
            for name in self._my_share(path):
                if name not in sums:
                    return f"rank {self.rank}: {name} is not listed in {MARKER}"
                if file_sha256(path / name) != sums[name]:
                    return f"rank {self.rank}: checksum mismatch in {name}"
        except (OSError, ValueError, AttributeError) as err:
            return f"rank {self.rank}: cannot verify: {err}"
        return None

    def _agree(self, reason: str | None) -> str | None:
        """All ranks' verdicts: None if every rank succeeded, else every failing rank's reason."""
        reasons: list[Any] = [None] * self.world_size
        dist.all_gather_object(reasons, reason, group=self.cpu_group)
        failed = [r for r in reasons if r is not None]
        return "; ".join(dict.fromkeys(failed)) if failed else None

    def _set_aside(self, path: Path, reason: str) -> None:
        target = path.with_name(path.name + ".unusable")
        index = 1
        while target.exists():
            index += 1
            target = path.with_name(f"{path.name}.unusable-{index}")
        dist.barrier(group=self.cpu_group)
        if self.node_leader and path.exists():
            os.replace(path, target)
        dist.barrier(group=self.cpu_group)
        self.set_aside.append((path.name, f"{reason}; set aside as {target.name}"))

    def _load(self, path: Path, model, optimizer) -> dict[str, Any]:
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


def _one_line(err: BaseException, rank: int) -> str:
    """``Type: first line`` of a load error; for DCP's CheckpointException, of the error on ``rank`` itself."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = failures.get(rank, next(iter(failures.values())))
        err = inner[0] if isinstance(inner, tuple) else inner
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text[:300]}"


REMEDY = {
    "checkpoint_dir": "use another checkpoint_dir or the checkpoint's model settings",
    "resume_from": "continue a run of this model shape, or give this run the earlier run's model settings",
}
"""What the user can change when a checkpoint's model shape differs, by the setting that chose the checkpoint."""


POSITION_SETTINGS = ("position_encoding", "rope_theta")
"""Model settings recorded next to the shape: a model trained with one cannot continue with another."""

LEGACY_MODEL_SETTINGS: dict[str, Any] = {"position_encoding": "none"}
"""What a checkpoint written before a setting was recorded holds: every model before RoPE was NoPE."""


def model_identity(cfg) -> dict[str, Any]:
    """What a checkpoint of ``cfg``'s model records and a resume must match: the shape (``MODEL_DIM_NAMES``),
    ``position_encoding`` and, with RoPE, ``rope_theta``."""
    identity: dict[str, Any] = {name: getattr(cfg.shape, name) for name in contract.MODEL_DIM_NAMES}
    identity["position_encoding"] = cfg.position_encoding
    if cfg.position_encoding == "rope":
        identity["rope_theta"] = float(cfg.rope_theta)
    return identity


def shape_mismatch(
    path: Path, shape: dict[str, Any] | None, remedy: str = REMEDY["checkpoint_dir"]
) -> str | None:
    """A one-line message when the checkpoint at ``path`` holds a model of another shape than ``shape``, or one
    trained with other position settings (``POSITION_SETTINGS``; a checkpoint without them was NoPE)."""
    try:
        stored = json.loads((path / MARKER).read_text()).get("model_shape")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable marker: verification reports it
    if shape is None or not isinstance(stored, dict):
        return None
    stored = {**LEGACY_MODEL_SETTINGS, **stored}
    dims = [name for name in shape if name not in POSITION_SETTINGS]
    stored_dims = {name: stored.get(name) for name in dims}
    if stored_dims != {name: shape[name] for name in dims}:
        return (
            f"{path} holds a model of shape {_shape_text(stored_dims)}, but this run's shape is "
            f"{_shape_text({name: shape[name] for name in dims})}; {remedy}"
        )
    if "position_encoding" not in shape:
        return None
    ours = {name: shape[name] for name in POSITION_SETTINGS if name in shape}
    theirs = {name: stored[name] for name in POSITION_SETTINGS if name in stored}
    if ours == theirs:
        return None
    return (
        f"{path} holds a model trained with {_settings_text(theirs)}, but this run has {_settings_text(ours)}; "
        f"{remedy}"
    )


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _shape_text(shape: dict[str, int]) -> str:
    return "(" + ", ".join(f"{key}={value}" for key, value in shape.items()) + ")"


def _settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(
        f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
        for key, value in settings.items()
    )


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


def model_files(model_dir: str) -> list[Path]:
    """The model files ``save_model`` wrote into ``model_dir`` (``model.pt``, ``model_step_*.pt``)."""
    directory = Path(model_dir)
    return sorted(directory.glob("model*.pt")) if directory.is_dir() else []


def save_model(
    model, model_dir: str, step: int, config: dict[str, Any], rank: int, data: dict[str, Any] | None = None
) -> Path | None:
    """Gather the full model state dict on rank 0 (CPU) and write ``model.pt`` (torch.save of
    ``{"config", "step", "state_dict", "data"}``; ``data``: what ``export_hf`` needs to know about the run's data
    and tokenizer) via a temporary name. An existing ``model.pt`` is never overwritten: the new one is then named
    ``model_step_XXXXXXXX.pt``. Returns the path on rank 0, None elsewhere."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return None
    directory = Path(model_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "model.pt"
    if target.exists():
        target = directory / f"model_step_{step:08d}.pt"
    tmp = target.with_name(target.name + ".tmp")
    torch.save({"config": config, "step": step, "state_dict": state, "data": data}, tmp)
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
            self._pid_file: Path | None = pid_file
            atexit.register(pid_file.unlink, missing_ok=True)
        else:
            self._pid_file = None

    def close(self) -> None:
        """Unregister this worker's PID (the run is over; the entry point has nothing left to signal)."""
        if self._pid_file is not None:
            self._pid_file.unlink(missing_ok=True)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = True

    def agreed(self) -> bool:
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())
