"""The storage backend interface of checkpoints: what ``manager.CheckpointManager`` asks of the place a run's
checkpoints are kept, and what every backend shares (the ranks' agreements over the run's gloo group).

Two backends implement it: ``folder.FolderStorage`` (a folder on each node's disk; in a SageMaker job the checkpoint
folder that SageMaker copies to S3) and ``s3.S3Storage`` (each rank reads and writes the run's S3 prefix itself).
The manager keeps what is the same for both: which checkpoint to try, the checks and the load, setting aside,
counting the run's own checkpoints and pruning them; a backend says how names are listed, written, sealed,
verified, read and deleted where it keeps them. All ranks call every method together unless it says otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist


class Collective:
    """Small host-side agreements of ``world_size`` ranks over ``group`` (the run's gloo group)."""

    def __init__(self, world_size: int, group: Any):
        self.world_size, self.group = world_size, group

    def shared(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gathered(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value, group=self.group)
        return values

    def agree(self, reason: str | None) -> str | None:
        """All ranks' verdicts: None if every rank succeeded, else every distinct failing reason (so each rank
        raises, or none: a rank raising alone would leave the rest waiting)."""
        failed = [r for r in self.gathered(reason) if r is not None]
        return "; ".join(dict.fromkeys(failed)) if failed else None

    def barrier(self) -> None:
        dist.barrier(group=self.group)


@dataclass
class Found:
    """What a backend holds, as rank 0 saw it (the same on every rank): the sealed checkpoints not set aside, oldest
    first; the unsealed ones (name, what is missing: ``names.INCOMPLETE``'s ``why``); those an earlier run set aside
    (name, the reason its record gives)."""

    sealed: list[str] = field(default_factory=list)
    incomplete: list[tuple[str, str]] = field(default_factory=list)
    set_aside: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Pending:
    """A save being written: its step, its name, the facts it records, and (a background save) the future of this
    rank's write; ``place`` is the backend's own (the folder's ``.tmp`` path, the S3 writer)."""

    step: int
    name: str
    facts: dict[str, Any]
    future: Any = None
    place: Any = None


class Storage(ABC):
    """Where one run's checkpoints are kept, seen by one rank."""

    def __init__(self, env: Any):
        """``env``: the run's ``parallel.DistEnv`` (rank, world size, local rank, the gloo group)."""
        self.rank, self.world_size, self.local_rank = env.rank, env.world_size, env.local_rank
        self.collective = Collective(env.world_size, env.cpu_group)
        self._async_group: Any = None

    def async_group(self) -> Any:
        """DCP's own gloo group for background saves, so that its collectives never interleave with the main
        thread's (made by the first background save: a collective)."""
        if self._async_group is None:
            self._async_group = dist.new_group(backend="gloo")
        return self._async_group

    @abstractmethod
    def where(self, name: str) -> Path | str:
        """The checkpoint ``name`` as messages name it: its folder, or its URI."""

    # -- finding --------------------------------------------------------------------------------------------
    @abstractmethod
    def adopt_written(self) -> list[tuple[str, str]]:
        """Seal every unsealed save that was written whole (its writer's facts; nothing pruned): (the name it was
        found under, the name it was sealed as) of each."""

    @abstractmethod
    def find(self) -> Found:
        """The checkpoints there, as rank 0 sees them."""

    # -- saving ---------------------------------------------------------------------------------------------
    @abstractmethod
    def begin(self, step: int, facts: dict[str, Any]) -> Pending:
        """A save of ``step`` under the first free name (never an existing checkpoint's, set aside or not), its
        ``STARTED`` (``facts``) written first."""

    @abstractmethod
    def write(
        self, pending: Pending, state: dict[str, Any], trainer_state: dict[str, Any], background: bool
    ) -> Path | str:
        """This rank's trainer state, then its shards of ``state`` (DCP; in the background when asked: the state
        is copied to host memory and a thread writes it). Returns where the save is being written."""

    @abstractmethod
    def written(self, pending: Pending) -> bool:
        """Whether this rank's background write of ``pending`` has ended (no collective)."""

    @abstractmethod
    def seal(self, pending: Pending, adopted: bool = False) -> Path | str:
        """Wait for the write, then seal it: ``COMPLETE`` with every file's size and checksum, once every rank's
        write is done. Raises on every rank together when it cannot be sealed. ``adopted``: a save found written
        whole (``adopt_written``), sealed with its writer's facts."""

    @abstractmethod
    def close(self, pending: Pending) -> None:
        """The run is failing (no collective: another rank may be gone): let this rank's write end, and seal the
        save when every rank's write can be seen whole from here; else it stays an interrupted write, which the
        next start seals if it is whole."""

    @abstractmethod
    def prune(self, keep: int, ours: set[str], job: str | None) -> None:
        """Delete the sealed checkpoints this run wrote or loaded (``ours``), or this SageMaker job wrote in an
        earlier launch (``job``), beyond the newest ``keep``; the marker first, so that an interrupted deletion
        leaves an unsealed checkpoint, never a sealed one with files missing. No collective."""

    # -- resuming -------------------------------------------------------------------------------------------
    @abstractmethod
    def read_marker(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """The checkpoint's ``COMPLETE`` (``marker.parse``: the marker, or why it cannot be used)."""

    @abstractmethod
    def verify(self, name: str, found: dict[str, Any]) -> str | None:
        """Why the sealed checkpoint ``name`` (its marker ``found``) fails on this rank: the sizes against what is
        there, then the checksums of this rank's share of its files. None when it passes."""

    @abstractmethod
    def load(self, name: str, state: dict[str, Any]) -> None:
        """DCP's load of ``state`` (each rank reads what its own shards need; resharded to another layout)."""

    @abstractmethod
    def read_trainer_state(self, name: str, file: str) -> dict[str, Any]:
        """The trainer state ``file`` (``rank_00000.pt``) of the checkpoint ``name``."""

    @abstractmethod
    def set_aside(self, name: str, reason: str, job: str | None) -> None:
        """Write ``step_N.unusable`` beside the checkpoint (why, which job); the checkpoint itself is left as it
        is, never written into, loaded, counted or deleted again."""


def error_line(err: BaseException, rank: int) -> str:
    """``Type: first line`` of an error; for DCP's CheckpointException, of the error it caught on ``rank`` (every
    backend's and the manager's one line for a failed save or load)."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = failures.get(rank, next(iter(failures.values())))
        err = inner[0] if isinstance(inner, tuple) else inner
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text[:300]}"
