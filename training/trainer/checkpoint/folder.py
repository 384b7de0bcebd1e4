"""The folder backend: checkpoints in a folder on each node's disk (in a SageMaker job ``/opt/ml/checkpoints``,
which SageMaker copies to the run's S3 prefix and, when a job starts, copies back to every instance).

Layout under ``checkpoint_dir``::

    step_00000100/            sealed: renamed from step_00000100.tmp by each node's local rank 0 after every rank
        .metadata, __*.distcp  DCP shards of model + optimizer (resharded on load if the world size changed)
        STARTED                JSON written first (each node's local rank 0): step, world size, model shape, job
        rank_00000.pt ...      per-rank trainer state: step, data position, LR schedule, RNG states
        COMPLETE               JSON written last: world size, model shape, job, size and SHA-256 of every file
    step_00000100-2/          a later save of step 100 whose folder name was taken (never written into)
    step_00000200.tmp/        being written, or abandoned by a crash: incomplete, reported, never loaded or deleted
                              (unless every file of its save was written: then it is sealed, see below)
    step_00000050/            set aside: sealed but failed a check or its load; left exactly as it is, and
    step_00000050.unusable    this file beside it (JSON: why, which job) says so: never loaded again, never deleted

The folder itself is never moved: ``/opt/ml/checkpoints`` is mirrored to S3, where a rename would delete the
folder's objects and upload them again under a new prefix (the whole checkpoint, lost if the job ends before that
upload does). Each node's ``checkpoint_dir`` is its own disk (SageMaker syncs each to the same S3 prefix): each
node's local rank 0 writes its node's ``STARTED``, marker and records, every node's marker lists every node's files
(each rank hashes its share of its node's files), and a save is judged whole from every node's view.

A save whose files were all written is never lost to what happens next. DCP writes ``.metadata`` last, by rank 0,
once every rank's files are written (``FileSystemWriter.finish``: to a temporary name, then renamed), and each
rank's ``rank_*.pt`` is written before it joins DCP's write; so a ``step_N.tmp`` holding ``STARTED``,
``.metadata``, every file ``.metadata`` lists (of at least the size it lists) and a ``rank_*.pt`` for each of the
world size ``STARTED`` records holds a whole save. Such a folder is sealed (``COMPLETE`` written from
``STARTED``, then renamed) by the next start of a run on that folder (every node's view gathered: a folder split
over nodes is judged whole), and, on one node, already by a run that fails while its background save is written
(an exception on one rank: the node's local rank 0 seals it alone once its own write is done).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

from training.contract import container
from training.trainer.checkpoint import marker, safe_load, trainer_state
from training.trainer.checkpoint.identity import REMEDY, mismatch
from training.trainer.checkpoint.names import (
    ASIDE,
    MARKER,
    METADATA,
    NO_MARKER,
    STARTED,
    TMP,
    order,
    set_aside_name,
    state_name,
    step_dir_name,
)
from training.trainer.checkpoint.storage import Found, Pending, Storage

# -- the folder's rules, read from the disk (no collective) ---------------------------------------------------


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root`` (sealed, not set aside, every listed file of its
    listed size), oldest first."""
    return [(found[0], path) for found, path in _sealed(Path(root)) if size_problem(path) is None]


def _sealed(root: Path) -> list[tuple[tuple[int, int], Path]]:
    """((step, generation), path) of every ``step_*`` folder with a ``COMPLETE`` marker and not set aside, oldest
    first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        step = order(path.name)
        if step is not None and path.is_dir() and (path / MARKER).exists() and not _is_set_aside(path):
            found.append((step, path))
    return sorted(found)


def incomplete_folders(root: Path) -> list[Path]:
    """Interrupted writes: ``step_*`` folders without ``COMPLETE`` (and not set aside), and ``step_*.tmp``
    folders, by name."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        name = path.name.removesuffix(TMP)
        unsealed = name != path.name or not (path / MARKER).exists()
        if order(name) is not None and path.is_dir() and unsealed and not _is_set_aside(path):
            found.append(path)
    return sorted(found, key=lambda p: p.name)


def set_aside_record(folder: Path) -> Path:
    """The file that sets the checkpoint folder ``folder`` aside: ``step_00000100.unusable`` beside it."""
    return folder.with_name(set_aside_name(folder.name))


def _is_set_aside(folder: Path) -> bool:
    return set_aside_record(folder).is_file()


def set_aside_folders(root: Path) -> list[tuple[str, str]]:
    """(name, why) of every ``step_*`` folder an earlier run set aside (its ``.unusable`` record), by name."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        if order(path.name) is not None and path.is_dir() and _is_set_aside(path):
            record = set_aside_record(path)
            try:
                why = str(json.loads(record.read_text())["reason"])
            except (OSError, ValueError, KeyError, TypeError) as err:
                why = f"its record {record.name} is unreadable ({type(err).__name__})"
            found.append((path.name, why))
    return sorted(found)


def read_marker(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(``COMPLETE``'s content, None) of the checkpoint folder ``path``, or (None, why it cannot be used)."""
    try:
        text = (path / MARKER).read_text()
    except OSError as err:
        return None, marker.unreadable(err)
    return marker.parse(text)


def _present(path: Path) -> dict[str, int]:
    """{name: size} of the files of a checkpoint folder other than its marker."""
    try:
        return {p.name: p.stat().st_size for p in path.iterdir() if p.is_file() and p.name != MARKER}
    except OSError:
        return {}


def size_problem(path: Path) -> str | None:
    """Why the sealed folder ``path`` fails the checks every rank of a node shares: an unreadable marker, a listed
    file missing or of another size than listed, a file the marker does not list. None when it passes."""
    found, problem = read_marker(path)
    return problem if found is None else marker.size_problem(found, _present(path))


def checksum_problem(path: Path, names: list[str]) -> str | None:
    """The first of ``names`` (files of the sealed folder ``path``) whose SHA-256 differs from ``COMPLETE``'s, or
    None. A marker written before checksums existed has none to compare (its sizes were checked)."""
    found, problem = read_marker(path)
    if found is None:
        return problem
    return marker.checksum_problem(found, names, lambda name: file_sha256(path / name))


def shape_mismatch(
    path: Path, shape: dict[str, Any] | None, remedy: str = REMEDY["checkpoint_dir"]
) -> str | None:
    """``identity.mismatch`` of the checkpoint folder ``path`` (its marker's model identity; None when the marker
    cannot be read: verification reports it)."""
    found, _ = read_marker(path)
    return None if found is None else mismatch(path, found.get("model_shape"), shape, remedy)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _files(path: Path) -> list[str]:
    """The files of a checkpoint folder other than its marker, sorted."""
    return sorted(p.name for p in path.iterdir() if p.is_file() and p.name != MARKER)


def _digests(path: Path, names: list[str]) -> dict[str, tuple[int, str]]:
    """{name: (size, sha256)} of the files ``names`` of the folder ``path``."""
    return {name: ((path / name).stat().st_size, file_sha256(path / name)) for name in names}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_marker(tmp: Path, digests: dict[str, tuple[int, str]], facts: dict[str, Any]) -> None:
    """Write ``COMPLETE`` into ``tmp``: ``facts`` (world size, layout, step, model shape, job), every file's size and
    checksum."""
    _write_atomic(tmp / MARKER, marker.text(digests, facts))


def node_view(tmp: Path, final: Path) -> dict[str, Any]:
    """What this node holds of the save in ``tmp``: its ``STARTED`` (or None), its files and their sizes, what
    DCP's ``.metadata`` lists (the smallest size each data file must have; None without a readable one), and
    whether ``final`` (or its set-aside record) is taken."""
    view: dict[str, Any] = {"started": None, "files": {}, "listed": None}
    view["taken"] = os.path.lexists(final) or os.path.lexists(set_aside_record(final))
    try:
        view["files"] = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        view["started"] = json.loads((tmp / STARTED).read_text())
    except (OSError, ValueError):
        return view
    if METADATA in view["files"]:
        try:
            metadata = safe_load.Reader(str(tmp)).read_metadata()
            listed: dict[str, int] = {}
            for info in metadata.storage_data.values():
                end = int(info.offset) + int(info.length)
                listed[info.relative_path] = max(listed.get(info.relative_path, 0), end)
            view["listed"] = listed
        except Exception:  # noqa: BLE001 (an unreadable .metadata: the save is not whole)
            view["listed"] = None
    return view


def written_whole(views: list[dict[str, Any]]) -> str | None:
    """Why the save the nodes' ``views`` (``node_view``) describe is not whole, or None when it is: every node
    has its ``STARTED`` (all the same) and the name it would be sealed under free; some node has DCP's
    ``.metadata``; every file it lists is on some node, of at least the listed size; a ``rank_*.pt`` of every rank
    of the recorded world size is on some node."""
    if not views or any(v["started"] is None for v in views):
        return f"no readable {STARTED}"
    if any(v["started"] != views[0]["started"] for v in views) or any(v["taken"] for v in views):
        return f"{STARTED} differs between nodes, or the folder's name is taken"
    listed = next((v["listed"] for v in views if v["listed"] is not None), None)
    if listed is None:
        return "no readable .metadata: DCP's write did not finish"
    sizes: dict[str, int] = {}
    for view in views:
        sizes.update(view["files"])
    short = [name for name, size in listed.items() if sizes.get(name, -1) < size]
    ranks = [state_name(r) for r in range(int(views[0]["started"]["world_size"]))]
    missing = short + [name for name in ranks if sizes.get(name, 0) <= 0]
    return f"{missing[0]} is missing or cut short" if missing else None


def resume_channel_dir() -> Path | None:
    """The earlier run's checkpoint this job continues from (``SM_CHANNEL_RESUME``), or None."""
    folder = os.environ.get(f"SM_CHANNEL_{container.RESUME_CHANNEL.upper()}")
    return Path(folder) if folder else None


# -- the backend ------------------------------------------------------------------------------------------------


class FolderStorage(Storage):
    """The folder ``root`` on this rank's node (each node's local rank 0 writes its node's control files)."""

    def __init__(self, root: str | Path, env: Any):
        super().__init__(env)
        self.root = Path(root)
        self.node_leader = env.local_rank == 0
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))

    def where(self, name: str) -> Path:
        return self.root / name

    def __str__(self) -> str:
        return str(self.root)

    # -- finding --------------------------------------------------------------------------------------------
    def find(self) -> Found:
        """Rank 0's lists (if nodes' folders differ): the sealed folders, the incomplete ones (a ``.tmp`` folder,
        or one without ``COMPLETE``), those an earlier run set aside."""
        sealed = [p.name for _, p in _sealed(self.root)]
        incomplete = [
            (p.name, "" if p.name.endswith(TMP) else NO_MARKER) for p in incomplete_folders(self.root)
        ]
        lists = self.collective.shared((sealed, incomplete, set_aside_folders(self.root)))
        return Found(*lists)

    def adopt_written(self) -> list[tuple[str, str]]:
        """Seal every ``step_N.tmp`` folder (rank 0's list) whose save every node's files show written whole
        (``written_whole``): ``COMPLETE`` from its ``STARTED``, then renamed to ``step_N``, on every node; nothing
        pruned. Any other stays an interrupted write."""
        adopted = []
        names = self.collective.shared(
            [p.name for p in incomplete_folders(self.root) if p.name.endswith(TMP)]
        )
        for name in names:
            tmp = self.root / name
            final = tmp.with_name(name.removesuffix(TMP))
            views = self.collective.gathered(node_view(tmp, final) if self.node_leader else None)
            if written_whole([v for v in views if v is not None]) is not None:
                continue
            facts = next(v["started"] for v in views if v is not None)
            self.seal(Pending(int(facts["step"]), final.name, facts, place=tmp), adopted=True)
            adopted.append((name, final.name))
        return adopted

    # -- saving ---------------------------------------------------------------------------------------------
    def begin(self, step: int, facts: dict[str, Any]) -> Pending:
        """A fresh ``step_XXXXXXXX.tmp`` (a free name: never an existing folder) with its ``STARTED``, on every
        node."""
        name = self._free_name(step)
        tmp = self.root / (name + TMP)
        if self.node_leader:
            tmp.mkdir(parents=True)
            _write_atomic(tmp / STARTED, json.dumps(facts))
        self.collective.barrier()
        return Pending(step, name, facts, place=tmp)

    def _free_name(self, step: int) -> str:
        """The first of ``step_N``, ``step_N-2``, ... that names no file or folder on any node, with or without
        ``.tmp`` or ``.unusable`` (an incomplete or set-aside folder of that step is left as it is, never written
        into; a set-aside record never applies to a new checkpoint)."""
        generation = 0
        while True:
            generation += 1
            name = step_dir_name(step, generation)
            taken = any(os.path.lexists(self.root / other) for other in (name, name + TMP, name + ASIDE))
            if not any(self.collective.gathered(taken)):
                return name

    def write(
        self, pending: Pending, state: dict[str, Any], trainer: dict[str, Any], background: bool
    ) -> Path:
        tmp = pending.place
        trainer_state.write(trainer, tmp / state_name(self.rank))
        if background:
            pending.future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self.async_group())
        else:
            dcp.save(state, checkpoint_id=str(tmp))
        return tmp

    def written(self, pending: Pending) -> bool:
        return pending.future.done()

    def seal(self, pending: Pending, adopted: bool = False) -> Path:
        """Every rank: its write finished (a failed one raises here, as ``dcp.save`` would have), then its share of
        its node's files hashed (every node's marker lists every node's files); each node's local rank 0 writes
        ``COMPLETE`` and renames ``step_N.tmp`` to ``step_N``."""
        if pending.future is not None:
            pending.future.result()
        tmp, final = pending.place, self.root / pending.name
        self.collective.barrier()
        digests = self._node_digests(tmp)
        clash = None
        if self.node_leader and tmp.exists():
            _write_marker(tmp, digests, pending.facts)
            if os.path.lexists(final):  # appeared since the name was chosen: never replace it
                clash = f"checkpoint_dir: {final} appeared while {tmp} was written; not replacing it"
            else:
                os.rename(tmp, final)
        clash = self.collective.agree(clash)
        if clash is not None:
            raise FileExistsError(clash)
        return final

    def close(self, pending: Pending) -> None:
        """Let this rank's write finish; when the whole world is this node, its local rank 0 seals the save alone
        if every file of it was written (no collective: another rank may be gone)."""
        try:
            pending.future.result()
        except (Exception, CheckpointException):  # the run is failing already; the write is not whole
            return
        if self.node_leader and self.local_world == self.world_size:
            tmp, final = pending.place, self.root / pending.name
            with contextlib.suppress(OSError):
                view = node_view(tmp, final)
                if written_whole([view]) is None:
                    _write_marker(tmp, _digests(tmp, _files(tmp)), view["started"])
                    os.rename(tmp, final)

    def _my_share(self, path: Path) -> list[str]:
        """The files of ``path`` this rank hashes: the node's local ranks take turns over the sorted names."""
        return _files(path)[self.local_rank :: self.local_world]

    def _node_digests(self, path: Path) -> dict[str, tuple[int, str]]:
        """{name: (size, sha256)} of every file of the checkpoint, on every node (each rank hashes its share of
        its node's files)."""
        parts = self.collective.gathered(_digests(path, self._my_share(path)))
        return {k: v for part in parts for k, v in part.items()}

    def prune(self, keep: int, ours: set[str], job: str | None) -> None:
        """Each node's local rank 0 prunes its own disk (sealed is enough: on a node of a multi-node job the other
        nodes' files are on their disks)."""
        if not self.node_leader:
            return
        candidates = [path for _, path in _sealed(self.root) if path.name in ours or _same_job(path, job)]
        for path in candidates[:-keep]:
            (path / MARKER).unlink()
            shutil.rmtree(path)

    # -- resuming -------------------------------------------------------------------------------------------
    def read_marker(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        return read_marker(self.where(name))

    def verify(self, name: str, found: dict[str, Any]) -> str | None:
        """The checks every rank of a node shares (files, sizes), then the checksums of this rank's share."""
        path = self.where(name)
        problem = marker.size_problem(found, _present(path))
        if problem is not None:
            return problem
        problem = marker.checksum_problem(found, self._my_share(path), lambda n: file_sha256(path / n))
        return f"rank {self.rank}: {problem}" if problem is not None else None

    def load(self, name: str, state: dict[str, Any]) -> None:
        path = self.where(name)
        dcp.load(state, storage_reader=safe_load.Reader(str(path)), planner=safe_load.Planner(path))

    def read_trainer_state(self, name: str, file: str) -> dict[str, Any]:
        return trainer_state.read(self.where(name) / file)

    def set_aside(self, name: str, reason: str, job: str | None) -> None:
        """Each node's local rank 0 writes the record beside the folder. The folder is neither moved nor changed,
        so SageMaker's S3 mirror of ``checkpoint_dir`` deletes and re-uploads nothing."""
        path = self.where(name)
        record = set_aside_record(path)
        if self.node_leader and path.exists() and not os.path.lexists(record):
            _write_atomic(record, json.dumps({"reason": reason, "job": job, "folder": path.name}) + "\n")
        self.collective.barrier()  # every node's record is there before anything else reads the folder


def _same_job(path: Path, job: str | None) -> bool:
    found, _ = read_marker(path)
    return job is not None and found is not None and found.get("job") == job
