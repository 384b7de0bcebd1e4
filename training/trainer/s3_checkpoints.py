"""The S3 checkpoint backend's collective steps: every rank writes its own shards straight to the run's prefix
(in the background when asked), rank 0 seals a save only once every rank's upload has completed, and a resume
verifies and reads, on each rank, only the objects that rank's state needs.

All ranks call each method together (``group``: the run's gloo group for small host-side collectives). Rank 0
alone lists the prefix and writes the control objects (``STARTED``, ``COMPLETE``, ``.unusable``); the listing it
saw is broadcast, so every rank acts on the same names. A save:

1. ``begin``: the first free name (no object under it, no set-aside record), ``STARTED`` created by rank 0.
2. ``write``: each rank creates its trainer-state object, then hands the model and optimizer state to DCP with
   s3torchconnector's writer (``dcp.async_save`` when ``background``: the state is copied to host memory and the
   step goes on while a thread uploads); when a rank's upload has completed it creates its receipt.
3. ``seal``: every rank waits for its own upload, the ranks' ``{object: (size, sha256)}`` are gathered, and rank
   0 creates ``COMPLETE`` listing them all. A rank whose upload failed makes every rank raise; nothing is sealed.

A resume (``verify`` then ``load``): the marker's sizes against one listing; then the SHA-256 of every object,
each object read by one rank (a rank its own shards), so the world reads the checkpoint once to verify it; then
DCP loads through s3torchconnector's reader, each rank fetching only the byte ranges its own state needs
(``shards_needed`` names the objects they lie in).
"""

from __future__ import annotations

import hashlib
import json
import re
from concurrent.futures import Future
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner

from training.trainer import s3_store
from training.trainer.s3_dcp import DEFAULT_TUNING, HashingS3Writer, Tuning
from training.trainer.s3_store import MARKER, STARTED, Listing, S3Store

SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
"""A DCP shard object: ``__<rank>_<n>.distcp``, written by that rank."""


def step_name(step: int, generation: int = 1) -> str:
    return f"step_{step:08d}" + (f"-{generation}" if generation > 1 else "")


class S3Checkpoints:
    """The run's prefix ``uri`` seen by one rank of ``world_size``; ``group`` carries the agreements."""

    def __init__(
        self, uri: str, rank: int, world_size: int, group: Any = None, tuning: Tuning = DEFAULT_TUNING
    ):
        self.store = S3Store(uri, tuning)
        self.rank, self.world_size, self.group = rank, world_size, group
        self._writer: HashingS3Writer | None = (
            None  # the save in flight on this rank (its writer records digests)
        )
        self._future: Future | None = None
        self._state_digest: tuple[str, tuple[int, str]] | None = None
        self._async_group: Any = None  # DCP's own gloo group for background saves (made once, collectively)

    # -- agreement -------------------------------------------------------------------------------------------
    def shared(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def agree(self, reason: str | None) -> str | None:
        """None when no rank has a reason, else every distinct one (each rank raises, or none does)."""
        reasons: list[Any] = [None] * self.world_size
        dist.all_gather_object(reasons, reason, group=self.group)
        failed = [r for r in reasons if r is not None]
        return "; ".join(dict.fromkeys(failed)) if failed else None

    def listing(self) -> Listing:
        """Rank 0's listing of the prefix, on every rank."""
        return self.shared(self.store.listing() if self.rank == 0 else None)

    # -- saving ----------------------------------------------------------------------------------------------
    def begin(self, step: int, facts: dict[str, Any]) -> str:
        """The first free name for a save of ``step`` (``step_N``, ``step_N-2``, ...), its ``STARTED`` created
        by rank 0 (a name taken meanwhile is skipped: ``STARTED`` is never overwritten)."""
        name = None
        if self.rank == 0:
            found, generation = self.store.listing(), 1
            while True:
                candidate = step_name(step, generation)
                if not found.taken(candidate) and self.store.create(f"{candidate}/{STARTED}", _json(facts)):
                    name = candidate
                    break
                generation += 1
        return self.shared(name)

    def write(self, name: str, state: dict[str, Any], trainer_state: bytes, background: bool) -> None:
        """This rank's trainer state, then its shards of ``state`` (DCP), into the checkpoint ``name``."""
        own = s3_store.state_name(self.rank)
        if not self.store.create(f"{name}/{own}", trainer_state):
            raise FileExistsError(f"{self.store.uri(name)}/{own} exists already; not overwriting it")
        self._state_digest = (own, _digest(trainer_state))
        self._writer = self.store.writer(name)
        if not background:
            dcp.save(state, storage_writer=self._writer)
            self._receipt(name)
            return
        if self._async_group is None:
            self._async_group = dist.new_group(backend="gloo")
        future = dcp.async_save(state, storage_writer=self._writer, process_group=self._async_group)
        # torch >= 2.10 may return a response holding the upload's future; 2.9 returns the future itself
        future = getattr(future, "upload_completion", future)
        future.add_done_callback(lambda done: None if done.exception() else self._receipt(name))
        self._future = future

    def written(self) -> bool | None:
        """None without a save in flight, else whether this rank's upload has ended."""
        return None if self._future is None else self._future.done()

    def _digests(self) -> dict[str, tuple[int, str]]:
        assert self._writer is not None and self._state_digest is not None
        return {**self._writer.digests, self._state_digest[0]: self._state_digest[1]}

    def _receipt(self, name: str) -> None:
        """Create this rank's receipt (what it uploaded): a whole save can be sealed later without it running."""
        digests = {key: list(entry) for key, entry in sorted(self._digests().items())}
        self.store.create(f"{name}/{s3_store.receipt_name(self.rank)}", _json(digests))

    def seal(self, name: str, facts: dict[str, Any]) -> str:
        """Wait for this rank's upload; when every rank's has completed, rank 0 creates ``COMPLETE`` listing every
        object (the receipts too) with its size and SHA-256. Raises on every rank when any upload failed."""
        failure = None
        if self._future is not None:
            try:
                self._future.result()
                self._receipt(name)  # its callback may not have run yet (a second creation changes nothing)
            except BaseException as err:  # noqa: BLE001 (DCP's CheckpointException is a BaseException)
                failure = f"rank {self.rank}: upload failed: {_root_cause(err, self.rank)}"
        self._future = None
        failure = self.agree(failure)
        if failure is not None:
            raise RuntimeError(f"checkpoint {self.store.uri(name)} not sealed: {failure}")
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, self._digests(), group=self.group)
        digests = {key: entry for part in gathered for key, entry in part.items()}
        if self.rank == 0:
            for rank in range(self.world_size):  # every receipt was created when its rank's upload ended
                receipt = s3_store.receipt_name(rank)
                digests[receipt] = _digest(self.store.read(f"{name}/{receipt}"))
            digests[STARTED] = _digest(self.store.read(f"{name}/{STARTED}"))
            created = self.store.create(f"{name}/{MARKER}", s3_store.marker_text(digests, facts))
            problem = (
                None if created else f"{self.store.uri(name)}/{MARKER} appeared meanwhile; not replacing it"
            )
        else:
            problem = None
        problem = self.agree(problem)
        if problem is not None:
            raise FileExistsError(problem)
        return name

    def adopt(self, name: str, objects: dict[str, int]) -> str | None:
        """Seal the unsealed checkpoint ``name`` from its receipts when they show a whole save (rank 0 reads
        them; nothing is uploaded again); why it is not whole otherwise."""
        problem = None
        if self.rank == 0:
            started = self.store.read_json(f"{name}/{STARTED}") if STARTED in objects else None
            receipts = {}
            for rank in range(started["world_size"] if isinstance(started, dict) else 0):
                if s3_store.receipt_name(rank) in objects:
                    body = self.store.read_json(f"{name}/{s3_store.receipt_name(rank)}")
                    receipts[rank] = {k: (int(v[0]), str(v[1])) for k, v in (body or {}).items()}
            problem = s3_store.written_whole(objects, receipts, started)
            if problem is None:
                digests = {k: v for receipt in receipts.values() for k, v in receipt.items()}
                for extra in [STARTED, *(s3_store.receipt_name(r) for r in receipts)]:
                    digests[extra] = _digest(self.store.read(f"{name}/{extra}"))
                if not self.store.create(f"{name}/{MARKER}", s3_store.marker_text(digests, started)):
                    problem = f"{MARKER} appeared meanwhile"
        return self.shared(problem)

    # -- resuming --------------------------------------------------------------------------------------------
    def marker(self, name: str) -> dict[str, Any] | None:
        """The checkpoint's ``COMPLETE`` (rank 0 reads it), or None when unreadable."""
        return self.shared(
            s3_store.parse_marker(self.store.read(f"{name}/{MARKER}")) if self.rank == 0 else None
        )

    def verify(self, name: str, marker: dict[str, Any] | None, objects: dict[str, int]) -> str | None:
        """Why the sealed checkpoint ``name`` fails on some rank (every rank's reason), or None: sizes against
        the listing, then the SHA-256 of every object, each read by one rank (``share``), so that the world
        reads the checkpoint once to verify it, spread evenly."""
        problem = s3_store.size_problem(marker, objects)
        if problem is None:
            assert marker is not None
            for needed in self.share(sorted(marker["files"])):
                if self.store.sha256(f"{name}/{needed}")[1] != marker["sha256"][needed]:
                    problem = f"rank {self.rank}: checksum mismatch in {needed}"
                    break
        return self.agree(problem)

    def share(self, names: list[str]) -> list[str]:
        """The objects of ``names`` this rank checks: rank r's shards (``__r_*``) on rank r (of the world it is
        read into, modulo its size), the rest in turns."""
        mine, others = [], []
        for name in names:
            match = SHARD.match(name)
            if match is not None:
                if int(match.group(1)) % self.world_size == self.rank:
                    mine.append(name)
            else:
                others.append(name)
        return mine + others[self.rank :: self.world_size]

    def state_to_read(self, marker: dict[str, Any]) -> str:
        """The trainer-state object this rank resumes from: its own on the same world size, else rank 0's."""
        return s3_store.state_name(self.rank if marker.get("world_size") == self.world_size else 0)

    def shards_needed(self, name: str, state: Any) -> list[str]:
        """The shard objects DCP will read for this rank's ``state`` (its load plan's files)."""
        metadata = self.store.reader(name).read_metadata()
        planner = DefaultLoadPlanner()
        planner.set_up_planner(state, metadata, self.rank == 0)
        plan = planner.create_local_plan()
        return sorted({metadata.storage_data[item.storage_index].relative_path for item in plan.items})

    def load(self, name: str, state: dict[str, Any]) -> None:
        """DCP's load of ``state`` from the checkpoint ``name`` (each rank fetches only the ranges it needs)."""
        dcp.load(state, storage_reader=self.store.reader(name))

    def read_state(self, name: str, marker: dict[str, Any]) -> bytes:
        return self.store.read(f"{name}/{self.state_to_read(marker)}")

    def set_aside(self, name: str, reason: str, job: str | None) -> None:
        """Rank 0 creates ``step_N.unusable`` beside the checkpoint (why, which job); its objects stay."""
        if self.rank == 0:
            record = {"reason": reason, "job": job, "folder": name}
            self.store.create(f"{name}{s3_store.ASIDE}", (json.dumps(record) + "\n").encode())
        dist.barrier(group=self.group)

    def prune(self, names: list[str], listing: Listing) -> None:
        """Rank 0 deletes the checkpoints ``names`` (the caller's own, beyond its keep count), marker first."""
        if self.rank == 0:
            for name in names:
                self.store.delete_checkpoint(name, sorted(listing.checkpoints.get(name, {})))
        dist.barrier(group=self.group)


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def _digest(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


def _root_cause(err: BaseException, rank: int) -> str:
    """``Type: first line`` of an error; for DCP's CheckpointException, of the error it caught on ``rank``."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = failures.get(rank, next(iter(failures.values())))
        err = inner[0] if isinstance(inner, tuple) else inner
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text[:300]}"
