"""Checkpoints (torch.distributed.checkpoint), the SIGTERM stop flag, and the final model file.

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

One rule for a sealed folder (``COMPLETE`` present): ``COMPLETE`` is written last, so any failed check -- an
unreadable marker, a listed file missing or of another size, a file it does not list, a checksum that differs, a
load error on any rank -- is damage, and every rank agrees to set the folder aside (each node's local rank 0 writes
its ``.unusable`` record) and try the previous one; each is reported with its reason. The folder itself is never
moved: ``/opt/ml/checkpoints`` is mirrored to S3, where a rename would delete the folder's objects and upload them
again under a new prefix (the whole checkpoint, lost if the job ends before that upload does). A later run skips a set-aside folder
without checking it again and names it only when nothing else loads. A ``step_*`` folder without ``COMPLETE``
(and a ``.tmp`` one) is an interrupted write: reported as incomplete, left as it is, never loaded.

A save whose files were all written is never lost to what happens next. DCP writes ``.metadata`` last, by rank 0,
once every rank's files are written (``FileSystemWriter.finish``: to a temporary name, then renamed), and each
rank's ``rank_*.pt`` is written before it joins DCP's write; so a ``step_N.tmp`` holding ``STARTED``,
``.metadata``, every file ``.metadata`` lists (of at least the size it lists) and a ``rank_*.pt`` for each of the
world size ``STARTED`` records holds a whole save. Such a folder is sealed (``COMPLETE`` written from
``STARTED``, then renamed) by the next start of a run on that folder (every node's view gathered: a folder split
over nodes is judged whole), and, on one node, already by a run that fails while its background save is written
(an exception on one rank: the node's local rank 0 seals it alone once its own write is done). An asynchronous save
of a run that ends with the ranks together (SIGTERM, a bad token id, a non-finite loss) is waited for and sealed
as usual. Nothing is deleted on the way: sealing a found folder prunes nothing.

A run that continues an earlier one (the workflow's ``resume_from``) gets that run's newest complete checkpoint as
the read-only ``resume`` input channel; it is tried only when ``checkpoint_dir`` holds no checkpoint that loads
(after a spot interruption the run's own, newer ones win), is verified like the others, and is never written to
or renamed.

A save never writes into an existing folder: when ``step_N``, ``step_N.tmp`` or ``step_N.unusable`` exists it
writes ``step_N-2`` (and so on). ``keep_checkpoints`` counts only the complete checkpoints this run wrote or loaded
(and, inside a SageMaker job, those an earlier launch of the same job wrote): older ones are deleted, ``COMPLETE``
first; set-aside, incomplete and other folders are never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
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

from training.contract import checkpoint_identity, container
from training.trainer import sagemaker_job
from training.trainer.checkpoint import safe_load
from training.trainer.model import lora
from training.trainer.refusal import Refusal

MARKER = "COMPLETE"
STARTED = "STARTED"
"""Written into a save's folder before anything else: what its ``COMPLETE`` will record (step, world size, model
shape, job), so that a save written whole but never sealed can be sealed later with the writer's facts."""
_NAME = container.CHECKPOINT_DIR_NAME
_TMP = ".tmp"
_ASIDE = container.SET_ASIDE_SUFFIX


def step_dir_name(step: int, generation: int = 1) -> str:
    """``step_00000100``, or ``step_00000100-2`` for the second folder of that step."""
    return f"step_{step:08d}" + (f"-{generation}" if generation > 1 else "")


def _order(name: str) -> tuple[int, int] | None:
    """(step, generation) of a checkpoint folder name, or None for any other name."""
    match = _NAME.match(name)
    return (int(match.group(1)), int(match.group(2) or 1)) if match else None


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root`` (sealed, not set aside, every listed file of its
    listed size), oldest first."""
    return [(order[0], path) for order, path in _sealed(Path(root)) if size_problem(path) is None]


def _sealed(root: Path) -> list[tuple[tuple[int, int], Path]]:
    """((step, generation), path) of every ``step_*`` folder with a ``COMPLETE`` marker and not set aside, oldest
    first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        order = _order(path.name)
        if order is not None and path.is_dir() and (path / MARKER).exists() and not _is_set_aside(path):
            found.append((order, path))
    return sorted(found)


def incomplete_folders(root: Path) -> list[Path]:
    """Interrupted writes: ``step_*`` folders without ``COMPLETE`` (and not set aside), and ``step_*.tmp``
    folders, by name."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        name = path.name.removesuffix(_TMP)
        unsealed = name != path.name or not (path / MARKER).exists()
        if _order(name) is not None and path.is_dir() and unsealed and not _is_set_aside(path):
            found.append(path)
    return sorted(found, key=lambda p: p.name)


def set_aside_record(folder: Path) -> Path:
    """The file that sets the checkpoint folder ``folder`` aside: ``step_00000100.unusable`` beside it."""
    return folder.with_name(folder.name + _ASIDE)


def _is_set_aside(folder: Path) -> bool:
    return set_aside_record(folder).is_file()


def set_aside_folders(root: Path) -> list[tuple[str, str]]:
    """(name, why) of every ``step_*`` folder an earlier run set aside (its ``.unusable`` record), by name."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        if _order(path.name) is not None and path.is_dir() and _is_set_aside(path):
            record = set_aside_record(path)
            try:
                why = str(json.loads(record.read_text())["reason"])
            except (OSError, ValueError, KeyError, TypeError) as err:
                why = f"its record {record.name} is unreadable ({type(err).__name__})"
            found.append((path.name, why))
    return sorted(found)


def _read_marker(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(COMPLETE's content, None), or (None, why it cannot be used)."""
    try:
        marker = json.loads((path / MARKER).read_text())
        files = marker["files"]
        if not isinstance(files, dict) or not all(isinstance(size, int) for size in files.values()):
            raise TypeError("'files' is not a map of names to sizes")
        return marker, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return None, f"unreadable {MARKER} marker ({type(err).__name__}: {str(err)[:200]})"


def size_problem(path: Path) -> str | None:
    """Why the sealed folder ``path`` fails the checks every rank of a node shares: an unreadable marker, a listed
    file missing or of another size than listed, a file the marker does not list. None when it passes."""
    marker, problem = _read_marker(path)
    if marker is None:
        return problem
    for name, size in marker["files"].items():
        try:
            actual = (path / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} bytes, {MARKER} lists {size}"
    for name in _files(path):
        if name not in marker["files"]:
            return f"{name} is not listed in {MARKER}"
    return None


def checksum_problem(path: Path, names: list[str]) -> str | None:
    """The first of ``names`` (files of the sealed folder ``path``) whose SHA-256 differs from ``COMPLETE``'s, or
    None. A marker written before checksums existed has none to compare (its sizes were checked)."""
    marker, problem = _read_marker(path)
    if marker is None:
        return problem
    sums = marker.get("sha256")
    if sums is None:
        return None
    for name in names:
        try:
            if file_sha256(path / name) != sums.get(name):
                return f"checksum mismatch in {name}"
        except OSError as err:
            return f"cannot read {name}: {err.strerror or err}"
    return None


def _files(path: Path) -> list[str]:
    """The files of a checkpoint folder other than its marker, sorted."""
    return sorted(p.name for p in path.iterdir() if p.is_file() and p.name != MARKER)


def resume_channel_dir() -> Path | None:
    """The earlier run's checkpoint this job continues from (``SM_CHANNEL_RESUME``), or None."""
    folder = os.environ.get(f"SM_CHANNEL_{container.RESUME_CHANNEL.upper()}")
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


class CheckpointShapeError(Refusal, ValueError):
    """The checkpoint holds a model of another shape (or position encoding) than the run's settings (raised on
    every rank together: a refusal, exit status 2)."""


class UnusableCheckpointsError(Refusal, RuntimeError):
    """``on_unusable_checkpoints=fail``: ``checkpoint_dir`` holds checkpoints and none of them is usable (raised on
    every rank together: a refusal, exit status 2)."""


INCOMPLETE = "incomplete: {why}an interrupted write; left as it is"
"""The reason given for an unsealed folder (``{why}``: what is missing)."""


class CheckpointManager:
    """Saves and restores the full training state; all ranks call ``save``/``load_latest`` together.

    ``shape`` (the run's ``model_identity``: shape and position settings) is stored in every checkpoint and
    checked before a load.
    After ``load_latest``, ``skipped`` lists (folder, reason) of every folder it did not load: those it set aside,
    the incomplete ones, a resume channel that failed; ``touched_model`` says whether a failed load may have
    written into the model or optimizer."""

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
        # LoRA (the identity has "lora"): only what trains is saved and loaded, the adapters and their optimizer
        # state (DCP's load needs every one of them); the frozen base comes again from the reference the identity
        # records, so the model's own load_state_dict is not strict about the base's entries
        adapters_only = bool((shape or {}).get("lora"))
        self._options = StateDictOptions(ignore_frozen_params=adapters_only, strict=not adapters_only)
        self.rank, self.world_size, self.device = env.rank, env.world_size, env.device
        self.local_rank, self.cpu_group = env.local_rank, env.cpu_group
        self.layout = [getattr(env, "replicate", 1), env.world_size // getattr(env, "replicate", 1)]
        self.node_leader = env.local_rank == 0
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
        self.job = sagemaker_job.job_name()
        self.set_aside: list[tuple[str, str]] = []
        self.incomplete: list[tuple[str, str]] = []
        self.touched_model = False
        self.loaded: Path | None = None  # the checkpoint load_latest restored, if any
        self.newest: Path | None = None  # the newest complete checkpoint this run loaded or sealed
        self.adopted: list[tuple[str, str]] = []  # (.tmp folder, sealed name) of saves found written whole
        self._ours: set[str] = set()  # the checkpoints this run loaded or wrote: the only ones pruning counts
        self._async_group: dist.ProcessGroup | None = None  # made by the first background save (a collective)
        self._pending: tuple[int, Path, Path, Any] | None = (
            None  # (step, final, tmp, future) of a background save
        )

    @property
    def skipped(self) -> list[tuple[str, str]]:
        """(folder, reason) of every folder ``load_latest`` did not load: set aside or failed, then incomplete."""
        return [*self.set_aside, *self.incomplete]

    def save(
        self, step: int, model, optimizer, trainer_state: dict[str, Any], background: bool = False
    ) -> Path:
        """Write a fresh ``step_XXXXXXXX.tmp`` (a free name: never an existing folder), then (after a barrier) hash
        it and have each node's local rank 0 seal and rename it (each node's ``/opt/ml/checkpoints`` is its own
        disk, synced to the same S3 prefix), then prune. Returns the sealed folder.

        ``background`` (``async_checkpoint``): DCP's ``async_save`` copies the model and optimizer state to host
        memory and returns; a thread writes the files (over a gloo group of its own, so the main thread's
        collectives never interleave with its), and the folder is sealed by ``seal_pending`` once every rank's
        write has finished (the loop asks at each step boundary). Returns the ``.tmp`` folder being written. The
        files, their checksums and the ``COMPLETE`` rules are those of a synchronous save."""
        self.seal_pending()  # an earlier save still in flight is finished and sealed first
        final = self.root / self._free_name(step)
        tmp = final.with_name(final.name + _TMP)
        if self.node_leader:
            tmp.mkdir(parents=True)
            _write_atomic(tmp / STARTED, json.dumps(self._facts(step)))
        dist.barrier(group=self.cpu_group)
        model_sd, optim_sd = get_state_dict(model, optimizer, options=self._options)
        torch.save({**trainer_state, "rng": rng_state(self.device)}, tmp / f"rank_{self.rank:05d}.pt")
        if background:
            if self._async_group is None:
                self._async_group = dist.new_group(backend="gloo")
            future = dcp.async_save(
                {"model": model_sd, "optim": optim_sd},
                checkpoint_id=str(tmp),
                process_group=self._async_group,
            )
            self._pending = (step, final, tmp, future)
            return tmp
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        return self._seal(step, final, tmp)

    @property
    def pending(self) -> bool:
        """Whether a background save is being written (or written and not sealed yet)."""
        return self._pending is not None

    def pending_written(self) -> bool | None:
        """This rank's view: None without a background save, else whether its write has finished."""
        return None if self._pending is None else self._pending[3].done()

    def seal_pending(self) -> list[Path]:
        """Wait for the background save (if any) on every rank, then seal it as ``save`` does (a collective);
        the sealed folder, or nothing."""
        if self._pending is None:
            return []
        step, final, tmp, future = self._pending
        self._pending = None
        future.result()  # a failed write raises here, as dcp.save would have
        return [self._seal(step, final, tmp)]

    def close(self) -> None:
        """At the end of a run that failed: let a background write finish, and, when the whole world is this node,
        have its local rank 0 seal it alone if every file of the save was written (no collective: another rank may
        be gone). Otherwise the folder stays an interrupted write, which the next start seals if it is whole."""
        if self._pending is not None:
            _, final, tmp, future = self._pending
            self._pending = None
            try:
                future.result()
            except (Exception, CheckpointException):  # the run is failing already; the write is not whole
                return
            if self.node_leader and self.local_world == self.world_size:
                with contextlib.suppress(OSError):
                    view = _node_view(tmp, final)
                    if written_whole([view]) is None:
                        _write_marker(tmp, _digests(tmp, _files(tmp)), view["started"])
                        os.rename(tmp, final)

    def _facts(self, step: int) -> dict[str, Any]:
        """What a save of ``step`` by this run records (``STARTED``, then ``COMPLETE``)."""
        return {"world_size": self.world_size, "data_parallel": self.layout, "step": step, "model_shape": self.shape,
                "job": self.job}  # fmt: skip

    def _seal(self, step: int, final: Path, tmp: Path, facts: dict[str, Any] | None = None) -> Path:
        """Every rank: hash its share of its node's files (every node's marker lists every node's files); each
        node's local rank 0 writes
        ``COMPLETE`` and renames ``tmp`` to ``final``. A save of this run (no ``facts``) then counts as this run's
        and prunes; one found written whole (``facts``: its writer's ``STARTED``) neither counts nor prunes."""
        own = facts is None
        dist.barrier(group=self.cpu_group)
        digests = self._node_digests(tmp)
        if own:
            self._ours.add(final.name)
        clash = None
        if self.node_leader and tmp.exists():
            _write_marker(tmp, digests, facts or self._facts(step))
            if os.path.lexists(final):  # appeared since the name was chosen: never replace it
                clash = f"checkpoint_dir: {final} appeared while {tmp} was written; not replacing it"
            else:
                os.rename(tmp, final)
                if own:
                    self._prune()
        clash = self._agree(
            clash
        )  # every rank raises, or none (a rank raising alone would leave the rest waiting)
        if clash is not None:
            raise FileExistsError(clash)
        if own:
            self.newest = final
        return final

    def _free_name(self, step: int) -> str:
        """The first of ``step_N``, ``step_N-2``, ... that names no file or folder on any node, with or without
        ``.tmp`` or ``.unusable`` (an incomplete or set-aside folder of that step is left as it is, never written
        into; a set-aside record never applies to a new checkpoint)."""
        generation = 0
        while True:
            generation += 1
            name = step_dir_name(step, generation)
            taken = any(os.path.lexists(self.root / other) for other in (name, name + _TMP, name + _ASIDE))
            verdicts: list[Any] = [None] * self.world_size
            dist.all_gather_object(verdicts, taken, group=self.cpu_group)
            if not any(verdicts):
                return name

    def _my_share(self, path: Path) -> list[str]:
        """The files of ``path`` this rank hashes: the node's local ranks take turns over the sorted names."""
        return _files(path)[self.local_rank :: self.local_world]

    def _node_digests(self, path: Path) -> dict[str, tuple[int, str]]:
        """{name: (size, sha256)} of every file of the checkpoint, on every node (each rank hashes its share of
        its node's files): each node's ``checkpoint_dir`` is its own disk (SageMaker syncs each to the same S3
        prefix), so every node's marker lists every node's files, the same marker on each."""
        mine = _digests(path, self._my_share(path))
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine, group=self.cpu_group)
        return {k: v for part in gathered for k, v in part.items()}

    def _prune(self) -> None:
        """Delete the complete checkpoints this run loaded or wrote (or this SageMaker job wrote in an earlier
        launch) beyond the newest ``keep``; ``COMPLETE`` goes first, so an interrupted deletion leaves an
        unsealed folder, never a sealed one with files missing."""
        ours = [  # sealed is enough: on a node of a multi-node job the other nodes' files are on their disks
            path for _, path in _sealed(self.root) if path.name in self._ours or self._same_job(path)
        ]
        for path in ours[: -self.keep]:
            (path / MARKER).unlink()
            shutil.rmtree(path)

    def _same_job(self, path: Path) -> bool:
        marker, _ = _read_marker(path)
        return self.job is not None and marker is not None and marker.get("job") == self.job

    def load_latest(self, model, optimizer) -> dict[str, Any] | None:
        """Restore model, optimizer and RNG from the newest checkpoint that verifies and loads on every rank;
        return its trainer state (step, data position, schedule), or None when there is none.

        Every rank tries the same sealed folders (rank 0's list), newest first. One that fails a check or its
        load on any rank is set aside on every node (its ``.unusable`` record written, the folder left as it is)
        and the previous one is tried. Incomplete folders are listed in ``incomplete`` and left alone. When none
        of the run's own loads, the read-only ``resume_dir`` (an earlier run's) is tried, and skipped with its
        reason if it fails (never marked); when that fails too, the folders earlier runs set aside join
        ``set_aside`` (so "nothing usable" names every one). A checkpoint of another model shape raises
        CheckpointShapeError naming both shapes.

        First, every ``step_N.tmp`` that holds a whole save is sealed (``adopt_written``)."""
        self.adopt_written()
        found: list[Any] = [
            (
                [p.name for _, p in _sealed(self.root)],
                incomplete_folders(self.root),
                set_aside_folders(self.root),
            )
        ]
        dist.broadcast_object_list(
            found, src=0, group=self.cpu_group
        )  # rank 0's lists, if nodes' folders differ
        sealed, incomplete, earlier = found[0]
        for path in incomplete:
            why = "" if path.name.endswith(_TMP) else f"no {MARKER} marker, "
            self.incomplete.append((path.name, INCOMPLETE.format(why=why)))
        for name in reversed(sealed):
            path = self.root / name
            state, reason = self._try_load(path, model, optimizer)
            if reason is None:
                self._ours.add(name)
                self.loaded = self.newest = path
                return state
            self._set_aside(path, reason)
        state = self._load_resume_channel(model, optimizer)
        if state is None:
            self.set_aside.extend((name, f"set aside earlier: {why}") for name, why in earlier)
        return state

    def adopt_written(self) -> None:
        """Seal every ``step_N.tmp`` folder (rank 0's list) whose save every node's files show written whole
        (``written_whole``): ``COMPLETE`` from its ``STARTED``, then renamed to ``step_N``, on every node; nothing
        pruned. Listed in ``adopted``; any other stays an interrupted write."""
        names: list[Any] = [[p.name for p in incomplete_folders(self.root) if p.name.endswith(_TMP)]]
        dist.broadcast_object_list(names, src=0, group=self.cpu_group)
        for name in names[0]:
            tmp = self.root / name
            final = tmp.with_name(name.removesuffix(_TMP))
            views: list[Any] = [None] * self.world_size
            view = _node_view(tmp, final) if self.node_leader else None
            dist.all_gather_object(views, view, group=self.cpu_group)
            if written_whole([v for v in views if v is not None]) is not None:
                continue
            facts = next(v["started"] for v in views if v is not None)
            self._seal(int(facts["step"]), final, tmp, facts=facts)
            self.adopted.append((name, final.name))

    def _load_resume_channel(self, model, optimizer) -> dict[str, Any] | None:
        """The earlier run's checkpoint (read-only): its trainer state, or None (absent, or skipped with why)."""
        if self.resume_dir is None or not self.resume_dir.exists():
            return None
        sealed = [(self.resume_dir / MARKER).exists()]
        dist.broadcast_object_list(sealed, src=0, group=self.cpu_group)
        reason = None if sealed[0] else f"no {MARKER} marker"
        if reason is None:
            state, reason = self._try_load(self.resume_dir, model, optimizer, field="resume_from")
            if reason is None:
                self.loaded = self.resume_dir
                return state
        self.set_aside.append((str(self.resume_dir), f"{reason}; read-only, left as it is"))
        return None

    def _try_load(
        self, path: Path, model, optimizer, field: str = "checkpoint_dir"
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(trainer state, None) when ``path`` verifies and loads on every rank, else (None, every rank's reason).
        A checkpoint of another model shape raises CheckpointShapeError naming ``field``, the setting the user
        changes: ``checkpoint_dir`` for the run's own, ``resume_from`` for an earlier run's (the resume channel)."""
        mismatch = self._agree(shape_mismatch(path, self.shape, REMEDY[field]))  # every rank raises, or none
        if mismatch is not None:
            raise CheckpointShapeError(f"{field}: {mismatch}")
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

    def _verify(self, path: Path) -> str | None:
        """Why ``path`` fails on this rank: the checks every rank of a node shares (marker, files, sizes), then
        the checksums of this rank's share of the files. None when it passes."""
        problem = size_problem(path)
        if problem is not None:
            return problem
        problem = checksum_problem(path, self._my_share(path))
        return f"rank {self.rank}: {problem}" if problem is not None else None

    def _agree(self, reason: str | None) -> str | None:
        """All ranks' verdicts: None if every rank succeeded, else every distinct failing reason."""
        reasons: list[Any] = [None] * self.world_size
        dist.all_gather_object(reasons, reason, group=self.cpu_group)
        failed = [r for r in reasons if r is not None]
        return "; ".join(dict.fromkeys(failed)) if failed else None

    def _set_aside(self, path: Path, reason: str) -> None:
        """Set the sealed folder ``path`` aside on every node: each node's local rank 0 writes the record
        ``step_N.unusable`` beside it (the reason all ranks agreed on, the job). The folder is neither moved nor
        changed, so SageMaker's S3 mirror of ``checkpoint_dir`` deletes and re-uploads nothing."""
        record = set_aside_record(path)
        if self.node_leader and path.exists() and not os.path.lexists(record):
            _write_atomic(record, json.dumps({"reason": reason, "job": self.job, "folder": path.name}) + "\n")
        dist.barrier(
            group=self.cpu_group
        )  # every node's record is there before anything else reads the folder
        self.set_aside.append((path.name, f"{reason}; set aside, left as it is: {record.name} says why"))

    def _load(self, path: Path, model, optimizer) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=self._options)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, storage_reader=safe_load.Reader(str(path)), planner=safe_load.Planner(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=self._options)  # fmt: skip
        marker = json.loads((path / MARKER).read_text())
        saved_world = marker["world_size"]
        own = path / f"rank_{self.rank:05d}.pt"
        trainer_state = safe_load.load(own if saved_world == self.world_size else path / "rank_00000.pt")
        if saved_world == self.world_size:
            set_rng_state(trainer_state["rng"], self.device)
        trainer_state["path"], trainer_state["same_world_size"] = str(path), saved_world == self.world_size
        trainer_state["layout"] = marker.get("data_parallel") or [1, saved_world]
        return trainer_state


def _one_line(err: BaseException, rank: int) -> str:
    """``Type: first line`` of a load error; for DCP's CheckpointException, of the error on ``rank`` itself."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = failures.get(rank, next(iter(failures.values())))
        err = inner[0] if isinstance(inner, tuple) else inner
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text[:300]}"


REMEDY = checkpoint_identity.REMEDY
"""What the user can change when a checkpoint's model shape differs, by the setting that chose the checkpoint
(the contract's: the request check says the same of ``resume_from`` before launch)."""


def model_identity(cfg) -> dict[str, Any]:
    """What a checkpoint of ``cfg``'s model records and a resume must match (``checkpoint_identity.model_identity``),
    with LoRA's frozen base the adapters refer to (``lora.identity``)."""
    identity = checkpoint_identity.model_identity(cfg.as_dict())
    if getattr(cfg, "lora_rank", 0):
        identity["lora"] = lora.identity(cfg)  # the adapters' settings and the frozen base they refer to
    return identity


def shape_mismatch(
    path: Path, shape: dict[str, Any] | None, remedy: str = REMEDY["checkpoint_dir"]
) -> str | None:
    """A one-line message when the checkpoint at ``path`` holds a model this run cannot continue
    (``checkpoint_identity.mismatch``: another shape, position settings or LoRA adapters), in the words the
    request check uses before launch."""
    try:
        stored = json.loads((path / MARKER).read_text()).get("model_shape")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable marker: verification reports it
    return checkpoint_identity.mismatch(str(path), stored, shape, remedy)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


def _digests(path: Path, names: list[str]) -> dict[str, tuple[int, str]]:
    """{name: (size, sha256)} of the files ``names`` of the folder ``path``."""
    return {name: ((path / name).stat().st_size, file_sha256(path / name)) for name in names}


def _write_marker(tmp: Path, digests: dict[str, tuple[int, str]], facts: dict[str, Any]) -> None:
    """Write ``COMPLETE`` into ``tmp``: ``facts`` (world size, layout, step, model shape, job), every file's size and
    checksum."""
    files = {name: size for name, (size, _) in sorted(digests.items())}
    sums = {name: digest for name, (_, digest) in sorted(digests.items())}
    marker = {key: facts.get(key) for key in ("world_size", "data_parallel", "step", "model_shape", "job")}
    _write_atomic(tmp / MARKER, json.dumps({**marker, "files": files, "sha256": sums}))


def _node_view(tmp: Path, final: Path) -> dict[str, Any]:
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
    if ".metadata" in view["files"]:
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
    """Why the save the nodes' ``views`` (``_node_view``) describe is not whole, or None when it is: every node
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
    ranks = [f"rank_{r:05d}.pt" for r in range(int(views[0]["started"]["world_size"]))]
    missing = short + [name for name in ranks if sizes.get(name, 0) <= 0]
    return f"{missing[0]} is missing or cut short" if missing else None


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
    state = {name: safe_load.plain(value) for name, value in state.items()}
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

    def agreed(self, written: bool | None = None, problem: Any = None) -> tuple[bool, bool, list[Any]]:
        """(whether any rank received SIGTERM, whether every rank's background save has been written, every
        rank's ``problem`` that is not None: a reason to stop, ``guard.Problem``); one host-side all-reduce on the
        gloo group, and a gather of the problems when a rank has one. ``written``: this rank's
        ``pending_written()``."""
        flags = torch.tensor(
            [1 if self.received else 0, 0 if written else 1, 0 if problem is None else 1], dtype=torch.int32
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        problems: list[Any] = []
        if flags[2].item():
            gathered: list[Any] = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(gathered, problem, group=self.group)
            problems = [found for found in gathered if found is not None]
        return bool(flags[0].item()), not bool(flags[1].item()), problems
