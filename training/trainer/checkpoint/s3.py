"""The S3 backend: every rank writes its own shards straight to the run's prefix (``checkpoint_dir`` =
``s3://bucket/checkpoints/<segment>/<run>/``), in the background when asked; rank 0 seals a save only once every
rank's upload has completed; a resume verifies, then each rank reads only the byte ranges its own state needs.

Rank 0 alone lists the prefix and writes the control objects (``STARTED``, ``COMPLETE``, ``.unusable``); the
listing it saw is broadcast, so every rank acts on the same names. A save:

1. ``begin``: the first free name (no object under it, no set-aside record), ``STARTED`` created by rank 0.
2. ``write``: each rank creates its trainer-state object, then hands the model and optimizer state to DCP with
   s3torchconnector's writer (``dcp.async_save`` when ``background``: the state is copied to host memory and the
   step goes on while a thread uploads); when a rank's upload has completed it creates its receipt.
3. ``seal``: every rank waits for its own upload, the ranks' ``{object: (size, sha256)}`` are gathered, and rank
   0 creates ``COMPLETE`` listing them all. A rank whose upload failed makes every rank raise; nothing is sealed.

A resume (``verify`` then ``load``): the marker's sizes against the listing; then the SHA-256 of every object,
each object read by one rank (a rank its own shards), so the world reads the checkpoint once to verify it; then DCP
loads through s3torchconnector's reader, each rank fetching only the byte ranges its own state needs. An unsealed
checkpoint whose every rank's receipt is there with every object at its size is sealed from the receipts by the
next start (``adopt_written``: nothing uploaded or hashed again). Every control object and trainer state is created
only when absent (S3's conditional write): nothing is ever overwritten.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner

from training.trainer.checkpoint import marker, s3_store, safe_load, trainer_state
from training.trainer.checkpoint.names import (
    MARKER,
    NO_MARKER,
    STARTED,
    receipt_name,
    set_aside_name,
    state_name,
    step_dir_name,
)
from training.trainer.checkpoint.s3_dcp import DEFAULT_TUNING, Tuning
from training.trainer.checkpoint.s3_store import Listing, S3Store
from training.trainer.checkpoint.storage import Found, Pending, Storage, error_line

SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
"""A DCP shard object: ``__<rank>_<n>.distcp``, written by that rank."""


class S3Storage(Storage):
    """The run's prefix ``uri`` seen by one rank."""

    def __init__(self, uri: str, env: Any, tuning: Tuning = DEFAULT_TUNING):
        super().__init__(env)
        self.store = S3Store(uri, tuning)
        self._listing = Listing()  # rank 0's listing as last shared (``find``)

    def where(self, name: str) -> str:
        return self.store.uri(name)

    def __str__(self) -> str:
        return self.store.uri()

    def listing(self) -> Listing:
        """Rank 0's listing of the prefix, on every rank."""
        return self.collective.shared(self.store.listing() if self.rank == 0 else None)

    # -- finding --------------------------------------------------------------------------------------------
    def find(self) -> Found:
        self._listing = listing = self.listing()
        earlier = None
        if self.rank == 0:
            names = sorted(n for n in listing.set_aside if n in listing.checkpoints)
            earlier = [(name, self._set_aside_reason(name)) for name in names]
        return Found(
            listing.sealed(), [(n, NO_MARKER) for n in listing.incomplete()], self.collective.shared(earlier)
        )

    def _set_aside_reason(self, name: str) -> str:
        record = set_aside_name(name)
        try:
            return str(json.loads(self.store.read(record))["reason"])
        except Exception as err:  # noqa: BLE001 (unreadable or not JSON: named, never fatal)
            return f"its record {record} is unreadable ({type(err).__name__})"

    def adopt_written(self) -> list[tuple[str, str]]:
        """Seal every unsealed checkpoint whose receipts show a whole save (rank 0 reads them; nothing is uploaded
        again): its name does not change."""
        adopted = None
        if self.rank == 0:
            listing = self.store.listing()
            adopted = [(n, n) for n in listing.incomplete() if self._adopted(n, listing.checkpoints[n])]
        return self.collective.shared(adopted)

    def _adopted(self, name: str, objects: dict[str, int]) -> bool:
        """Rank 0: whether ``_adopt`` sealed ``name``; a read that fails leaves it unsealed (reported incomplete by
        the resume, never a crash of rank 0 while the others wait)."""
        try:
            return self._adopt(name, objects) is None
        except Exception:  # noqa: BLE001 (botocore's errors: the checkpoint stays an interrupted write)
            return False

    def _adopt(self, name: str, objects: dict[str, int]) -> str | None:
        """Rank 0: seal the unsealed checkpoint ``name`` from its receipts when they show a whole save; why it is
        not whole otherwise."""
        started = self.store.read_json(f"{name}/{STARTED}") if STARTED in objects else None
        world = started.get("world_size") if isinstance(started, dict) else None
        receipts = {}
        for rank in range(world if isinstance(world, int) else 0):  # a STARTED without one: not whole, below
            if receipt_name(rank) in objects:
                body = self.store.read_json(f"{name}/{receipt_name(rank)}")
                try:
                    receipts[rank] = {str(k): (int(v[0]), str(v[1])) for k, v in body.items()}
                except (AttributeError, TypeError, ValueError, IndexError):  # not a receipt: as if missing
                    continue
        problem = s3_store.written_whole(objects, receipts, started)
        if problem is not None:
            return problem
        digests = {k: v for receipt in receipts.values() for k, v in receipt.items()}
        for extra in [STARTED, *(receipt_name(r) for r in receipts)]:
            digests[extra] = _digest(self.store.read(f"{name}/{extra}"))
        created = self.store.create(f"{name}/{MARKER}", marker.text(digests, started).encode())
        return None if created else f"{MARKER} appeared meanwhile"

    # -- saving ---------------------------------------------------------------------------------------------
    def begin(self, step: int, facts: dict[str, Any]) -> Pending:
        """The first free name for a save of ``step`` (``step_N``, ``step_N-2``, ...), its ``STARTED`` created
        by rank 0 (a name taken meanwhile is skipped: ``STARTED`` is never overwritten)."""
        name = None
        if self.rank == 0:
            found, generation = self.store.listing(), 1
            while True:
                candidate = step_dir_name(step, generation)
                if not found.taken(candidate) and self.store.create(f"{candidate}/{STARTED}", _json(facts)):
                    name = candidate
                    break
                generation += 1
        return Pending(step, self.collective.shared(name), facts)

    def write(
        self, pending: Pending, state: dict[str, Any], trainer: dict[str, Any], background: bool
    ) -> str:
        """This rank's trainer state, then its shards of ``state`` (DCP), into the checkpoint."""
        name, own = pending.name, state_name(self.rank)
        data = trainer_state.encode(trainer)
        if not self.store.create(f"{name}/{own}", data):
            raise FileExistsError(f"{self.store.uri(name)}/{own} exists already; not overwriting it")
        writer = self.store.writer(name)
        pending.place = (writer, {own: _digest(data)})
        if not background:
            dcp.save(state, storage_writer=writer)
            self._receipt(pending)
            return self.where(name)
        future = dcp.async_save(state, storage_writer=writer, process_group=self.async_group())
        # torch >= 2.10 may return a response holding the upload's future; 2.9 returns the future itself
        future = getattr(future, "upload_completion", future)
        future.add_done_callback(lambda done: None if done.exception() else self._receipt(pending))
        pending.future = future
        return self.where(name)

    def written(self, pending: Pending) -> bool:
        return pending.future.done()

    def _digests(self, pending: Pending) -> dict[str, tuple[int, str]]:
        writer, own = pending.place
        return {**writer.digests, **own}

    def _receipt(self, pending: Pending) -> None:
        """Create this rank's receipt (what it uploaded): a whole save can be sealed later without it running."""
        digests = {key: list(entry) for key, entry in sorted(self._digests(pending).items())}
        self.store.create(f"{pending.name}/{receipt_name(self.rank)}", _json(digests))

    def seal(self, pending: Pending, adopted: bool = False) -> str:
        """Wait for this rank's upload; when every rank's has completed, rank 0 creates ``COMPLETE`` listing every
        object (the receipts and ``STARTED`` too) with its size and SHA-256. Raises on every rank when any upload
        failed, or when ``COMPLETE`` appeared meanwhile (never replaced)."""
        name, failure = pending.name, None
        if pending.future is not None:
            try:
                pending.future.result()
                self._receipt(
                    pending
                )  # its callback may not have run yet (a second creation changes nothing)
            except BaseException as err:  # noqa: BLE001 (DCP's CheckpointException is a BaseException)
                failure = f"rank {self.rank}: upload failed: {error_line(err, self.rank)}"
        failure = self.collective.agree(failure)
        if failure is not None:
            raise RuntimeError(f"checkpoint {self.store.uri(name)} not sealed: {failure}")
        digests = {k: v for part in self.collective.gathered(self._digests(pending)) for k, v in part.items()}
        problem = None
        if self.rank == 0:
            for rank in range(self.world_size):  # every receipt was created when its rank's upload ended
                digests[receipt_name(rank)] = _digest(self.store.read(f"{name}/{receipt_name(rank)}"))
            digests[STARTED] = _digest(self.store.read(f"{name}/{STARTED}"))
            if not self.store.create(f"{name}/{MARKER}", marker.text(digests, pending.facts).encode()):
                problem = (
                    f"checkpoint_dir: {self.store.uri(name)}/{MARKER} appeared meanwhile; not replacing it"
                )
        problem = self.collective.agree(problem)
        if problem is not None:
            raise FileExistsError(problem)
        return self.where(name)

    def close(self, pending: Pending) -> None:
        """Let this rank's upload end (its receipt is created then); rank 0 then seals the save from the receipts
        when every rank's is there already (with one rank, always), else the next start does."""
        try:
            pending.future.result()
        except BaseException:  # noqa: BLE001 (the run is failing already; the upload is not whole)
            return
        self._receipt(pending)
        if self.rank == 0:
            try:
                objects = self.store.listing().checkpoints.get(pending.name, {})
                if MARKER not in objects:
                    self._adopt(pending.name, objects)
            except Exception:  # noqa: BLE001 (nothing sealed: the next start judges it)
                return

    def prune(self, keep: int, ours: set[str], job: str | None) -> None:
        """Rank 0 deletes the checkpoints of this run (or job) beyond ``keep``, marker first."""
        if self.rank != 0:
            return
        listing = self.store.listing()
        candidates = [n for n in listing.sealed() if n in ours or self._same_job(n, job)]
        for name in candidates[:-keep]:
            self.store.delete_checkpoint(name, sorted(listing.checkpoints.get(name, {})))

    def _same_job(self, name: str, job: str | None) -> bool:
        if job is None:
            return False
        found, _ = marker.parse(self.store.read(f"{name}/{MARKER}"))
        return found is not None and found.get("job") == job

    # -- resuming -------------------------------------------------------------------------------------------
    def read_marker(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """The checkpoint's ``COMPLETE``, read by rank 0."""
        found: Any = None
        if self.rank == 0:
            try:
                found = marker.parse(self.store.read(f"{name}/{MARKER}"))
            except Exception as err:  # noqa: BLE001 (gone, or unreadable: damage, named)
                found = (None, marker.unreadable(err))
        return self.collective.shared(found)

    def verify(self, name: str, found: dict[str, Any]) -> str | None:
        """The marker's sizes against the listing, then the SHA-256 of this rank's share of the objects."""
        objects = {k: v for k, v in self._listing.checkpoints.get(name, {}).items() if k != MARKER}
        problem = marker.size_problem(found, objects)
        if problem is not None:
            return problem
        problem = marker.checksum_problem(
            found, self.share(sorted(found["files"])), self._object_sha256(name)
        )
        return f"rank {self.rank}: {problem}" if problem is not None else None

    def _object_sha256(self, name: str):
        def digest(file: str) -> str:
            try:
                return self.store.sha256(f"{name}/{file}")[1]
            except Exception as err:  # noqa: BLE001 (the connector's S3Exception: read as "cannot read")
                raise OSError(str(err).splitlines()[0] if str(err) else type(err).__name__) from err

        return digest

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

    def shards_needed(self, name: str, state: Any) -> list[str]:
        """The shard objects DCP will read for this rank's ``state`` (its load plan's files)."""
        metadata = self.store.reader(name).read_metadata()
        planner = DefaultLoadPlanner()
        planner.set_up_planner(state, metadata, self.rank == 0)
        plan = planner.create_local_plan()
        return sorted({metadata.storage_data[item.storage_index].relative_path for item in plan.items})

    def load(self, name: str, state: dict[str, Any]) -> None:
        reader = self.store.reader(name)
        dcp.load(state, storage_reader=reader, planner=safe_load.Planner(self.store.uri(name)))

    def read_trainer_state(self, name: str, file: str) -> dict[str, Any]:
        return trainer_state.read(self.store.read(f"{name}/{file}"), self.store.uri(f"{name}/{file}"))

    def set_aside(self, name: str, reason: str, job: str | None) -> None:
        """Rank 0 creates ``step_N.unusable`` beside the checkpoint (why, which job); its objects stay."""
        if self.rank == 0:
            record = {"reason": reason, "job": job, "folder": name}
            self.store.create(set_aside_name(name), (json.dumps(record) + "\n").encode())
        self.collective.barrier()


# -- what preflight reads before any process group (no collective) ----------------------------------------------


def reach_problem(uri: str) -> str | None:
    """Why the prefix ``uri`` cannot be listed (no bucket, no permission, no endpoint), or None."""
    try:
        store = S3Store(uri)
        store.client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix, MaxKeys=1)
    except Exception as err:  # noqa: BLE001 (botocore's errors, a missing region: said in one line)
        return f"{uri} cannot be listed: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"
    return None


def newest_sealed(uri: str) -> tuple[str, dict[str, Any]] | None:
    """(URI, marker) of the newest sealed checkpoint under ``uri`` that is not set aside and whose objects are
    there at the sizes its marker lists (what a resume would try first), or None."""
    store = S3Store(uri)
    listing = store.listing()
    for name in reversed(listing.sealed()):
        try:
            found, _ = marker.parse(store.read(f"{name}/{MARKER}"))
        except Exception:  # noqa: BLE001 (unreadable: the resume reports it)
            continue
        objects = {k: v for k, v in listing.checkpoints[name].items() if k != MARKER}
        if found is not None and marker.size_problem(found, objects) is None:
            return store.uri(name), found
    return None


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def _digest(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()
