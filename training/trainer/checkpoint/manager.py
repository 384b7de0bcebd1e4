"""Saving and resuming a run's full training state, the same rules whichever backend keeps it (``storage``: a
folder, ``folder.FolderStorage``; the run's S3 prefix, ``s3.S3Storage``; chosen by ``open_storage``).

One rule for a sealed checkpoint (``COMPLETE`` present): ``COMPLETE`` is written last, so any failed check -- an
unreadable marker, a listed file missing or of another size, a file it does not list, a checksum that differs, a
load error on any rank -- is damage, and every rank agrees to set the checkpoint aside (a ``step_N.unusable``
record beside it) and try the previous one; each is reported with its reason. A set-aside checkpoint is left
exactly as it is; a later run skips it without checking it again and names it only when nothing else loads. An
unsealed one is an interrupted write: reported as incomplete, left as it is, never loaded, unless every file of its
save was written (then the next start seals it: ``Storage.adopt_written``). An asynchronous save of a run that ends
with the ranks together (SIGTERM, a bad token id, a non-finite loss) is waited for and sealed as usual; the next save
and the run's end wait for the previous one.

A run that continues an earlier one (the workflow's ``resume_from``) gets that run's newest complete checkpoint as
the read-only ``resume`` input channel, a folder; it is tried only when ``checkpoint_dir`` holds no checkpoint that
loads (after a spot interruption the run's own, newer ones win), is verified like the others, and is never written
to or renamed.

A save never writes into an existing checkpoint: when ``step_N`` (or its ``.tmp`` or ``.unusable``) exists it
writes ``step_N-2`` (and so on). ``keep_checkpoints`` counts only the complete checkpoints this run wrote or loaded
(and, inside a SageMaker job, those an earlier launch of the same job wrote): older ones are deleted, ``COMPLETE``
first; set-aside, incomplete and other checkpoints are never touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from training.trainer import sagemaker_job
from training.trainer.checkpoint import trainer_state
from training.trainer.checkpoint.folder import FolderStorage
from training.trainer.checkpoint.identity import REMEDY, mismatch
from training.trainer.checkpoint.names import INCOMPLETE, MARKER, set_aside_name, state_name
from training.trainer.checkpoint.storage import Collective, Pending, Storage, error_line
from training.trainer.refusal import Refusal

S3_SCHEME = "s3://"
BACKENDS = ("auto", "folder", "s3")
"""``checkpoint_backend``: ``folder`` (a folder on each node's disk), ``s3`` (the run's S3 prefix, each rank
directly), ``auto`` (``s3`` when ``checkpoint_dir`` is an ``s3://`` URI, else ``folder``)."""


class CheckpointShapeError(Refusal, ValueError):
    """The checkpoint holds a model of another shape (or position encoding) than the run's settings (raised on
    every rank together: a refusal, exit status 2)."""


class UnusableCheckpointsError(Refusal, RuntimeError):
    """``on_unusable_checkpoints=fail``: ``checkpoint_dir`` holds checkpoints and none of them is usable (raised on
    every rank together: a refusal, exit status 2)."""


def backend_of(checkpoint_dir: str, backend: str = "auto") -> str:
    """The backend that keeps checkpoints in ``checkpoint_dir`` (``auto`` resolved by its scheme)."""
    if backend == "auto":
        return "s3" if checkpoint_dir.startswith(S3_SCHEME) else "folder"
    return backend


def open_storage(checkpoint_dir: str, env: Any, backend: str = "auto") -> Storage:
    """The backend of ``checkpoint_dir`` for this rank (``env``: the run's ``parallel.DistEnv``)."""
    if backend_of(checkpoint_dir, backend) == "s3":
        from training.trainer.checkpoint.s3 import S3Storage  # imports s3torchconnector: only when used

        return S3Storage(checkpoint_dir, env)
    return FolderStorage(checkpoint_dir, env)


class CheckpointManager:
    """Saves and restores the full training state; all ranks call ``save``/``load_latest`` together.

    ``shape`` (the run's ``identity.model_identity``: shape and position settings) is stored in every checkpoint
    and checked before a load.
    After ``load_latest``, ``skipped`` lists (checkpoint, reason) of every checkpoint it did not load: those it set
    aside, the incomplete ones, a resume channel that failed; ``touched_model`` says whether a failed load may have
    written into the model or optimizer."""

    def __init__(
        self,
        root: str,
        keep: int,
        env,
        shape: dict[str, int] | None = None,
        resume_dir: str | Path | None = None,
        backend: str = "auto",
        storage: Storage | None = None,
    ):
        """``env`` is the run's ``parallel.DistEnv``; ``resume_dir`` a read-only complete checkpoint of an earlier
        run (a folder), tried only when ``root`` has none that loads; ``backend``: ``checkpoint_backend``;
        ``storage``: a backend made by the caller instead (the measurement's S3 tuning)."""
        self.storage = storage or open_storage(str(root), env, backend)
        self.keep, self.shape, self.env = keep, shape, env
        self.resume_dir = Path(resume_dir) if resume_dir is not None else None
        # LoRA (the identity has "lora"): only what trains is saved and loaded, the adapters and their optimizer
        # state (DCP's load needs every one of them); the frozen base comes again from the reference the identity
        # records, so the model's own load_state_dict is not strict about the base's entries
        adapters_only = bool((shape or {}).get("lora"))
        self._options = StateDictOptions(ignore_frozen_params=adapters_only, strict=not adapters_only)
        self.rank, self.world_size, self.device = env.rank, env.world_size, env.device
        self.layout = [getattr(env, "replicate", 1), env.world_size // getattr(env, "replicate", 1)]
        self.collective = Collective(env.world_size, env.cpu_group)
        self.job = sagemaker_job.job_name()
        self.set_aside: list[tuple[str, str]] = []
        self.incomplete: list[tuple[str, str]] = []
        self.touched_model = False
        self.loaded: Path | str | None = None  # the checkpoint load_latest restored, if any
        self.newest: Path | str | None = None  # the newest complete checkpoint this run loaded or sealed
        self.adopted: list[tuple[str, str]] = []  # (found as, sealed as) of saves found written whole
        self._ours: set[str] = set()  # the checkpoints this run loaded or wrote: the only ones pruning counts
        self._pending: Pending | None = None  # a background save

    @property
    def skipped(self) -> list[tuple[str, str]]:
        """(checkpoint, reason) of every one ``load_latest`` did not load: set aside or failed, then incomplete."""
        return [*self.set_aside, *self.incomplete]

    # -- saving ---------------------------------------------------------------------------------------------
    def save(
        self, step: int, model, optimizer, trainer_state_: dict[str, Any], background: bool = False
    ) -> Path | str:
        """Write a save of ``step`` under a free name (never an existing checkpoint), seal it once every rank's
        write is done, then prune. Returns the sealed checkpoint.

        ``background`` (``async_checkpoint``): DCP's ``async_save`` copies the model and optimizer state to host
        memory and returns; a thread writes it (over a gloo group of its own, so the main thread's collectives
        never interleave with its), and it is sealed by ``seal_pending`` once every rank's write has finished (the
        loop asks at each step boundary; the next save and the run's end wait for it). Returns where it is being
        written. The files, their checksums and the ``COMPLETE`` rules are those of a synchronous save."""
        self.seal_pending()  # an earlier save still in flight is finished and sealed first
        pending = self.storage.begin(step, self._facts(step))
        model_sd, optim_sd = get_state_dict(model, optimizer, options=self._options)
        state = {**trainer_state_, "rng": trainer_state.rng_state(self.device)}
        written = self.storage.write(pending, {"model": model_sd, "optim": optim_sd}, state, background)
        if background:
            self._pending = pending
            return written
        return self._seal(pending)

    @property
    def pending(self) -> bool:
        """Whether a background save is being written (or written and not sealed yet)."""
        return self._pending is not None

    def pending_written(self) -> bool | None:
        """This rank's view: None without a background save, else whether its write has finished."""
        return None if self._pending is None else self.storage.written(self._pending)

    def seal_pending(self) -> list[Path | str]:
        """Wait for the background save (if any) on every rank, then seal it as ``save`` does (a collective);
        the sealed checkpoint, or nothing."""
        if self._pending is None:
            return []
        pending, self._pending = self._pending, None
        return [self._seal(pending)]

    def close(self) -> None:
        """At the end of a run that failed: let a background write finish and seal it when it can be seen whole
        from here (no collective: another rank may be gone); otherwise it stays an interrupted write, which the
        next start seals if it is whole."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.storage.close(pending)

    def _facts(self, step: int) -> dict[str, Any]:
        """What a save of ``step`` by this run records (``STARTED``, then ``COMPLETE``)."""
        return {"world_size": self.world_size, "data_parallel": self.layout, "step": step, "model_shape": self.shape,
                "job": self.job}  # fmt: skip

    def _seal(self, pending: Pending) -> Path | str:
        """Seal a save of this run: it counts as the run's own, and prunes."""
        self._ours.add(pending.name)
        sealed = self.storage.seal(pending)
        self.storage.prune(self.keep, self._ours, self.job)
        self.newest = sealed
        return sealed

    # -- resuming -------------------------------------------------------------------------------------------
    def load_latest(self, model, optimizer) -> dict[str, Any] | None:
        """Restore model, optimizer and RNG from the newest checkpoint that verifies and loads on every rank;
        return its trainer state (step, data position, schedule), or None when there is none.

        Every rank tries the same sealed checkpoints (rank 0's list), newest first. One that fails a check or its
        load on any rank is set aside (its ``.unusable`` record written, the checkpoint left as it is) and the
        previous one is tried. Incomplete ones are listed in ``incomplete`` and left alone. When none of the run's
        own loads, the read-only ``resume_dir`` (an earlier run's) is tried, and skipped with its reason if it
        fails (never marked); when that fails too, the checkpoints earlier runs set aside join ``set_aside`` (so
        "nothing usable" names every one). A checkpoint of another model shape raises CheckpointShapeError naming
        both shapes.

        First, every unsealed save that was written whole is sealed (``Storage.adopt_written``)."""
        self.adopted += self.storage.adopt_written()
        found = self.storage.find()
        self.incomplete += [(name, INCOMPLETE.format(why=why)) for name, why in found.incomplete]
        for name in reversed(found.sealed):
            state, reason = self._try_load(self.storage, name, model, optimizer)
            if reason is None:
                self._ours.add(name)
                self.loaded = self.newest = self.storage.where(name)
                return state
            self.storage.set_aside(name, reason, self.job)
            record = set_aside_name(name)
            self.set_aside.append((name, f"{reason}; set aside, left as it is: {record} says why"))
        state = self._load_resume_channel(model, optimizer)
        if state is None:
            self.set_aside.extend((name, f"set aside earlier: {why}") for name, why in found.set_aside)
        return state

    def _load_resume_channel(self, model, optimizer) -> dict[str, Any] | None:
        """The earlier run's checkpoint (read-only): its trainer state, or None (absent, or skipped with why)."""
        if self.resume_dir is None or not self.resume_dir.exists():
            return None
        channel = FolderStorage(self.resume_dir.parent, self.env)
        sealed = self.collective.shared((self.resume_dir / MARKER).exists())
        reason = None if sealed else f"no {MARKER} marker"
        if reason is None:
            state, reason = self._try_load(
                channel, self.resume_dir.name, model, optimizer, field="resume_from"
            )
            if reason is None:
                self.loaded = self.resume_dir
                return state
        self.set_aside.append((str(self.resume_dir), f"{reason}; read-only, left as it is"))
        return None

    def _try_load(
        self, storage: Storage, name: str, model, optimizer, field: str = "checkpoint_dir"
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(trainer state, None) when the checkpoint ``name`` of ``storage`` verifies and loads on every rank,
        else (None, every rank's reason). A checkpoint of another model shape raises CheckpointShapeError naming
        ``field``, the setting the user changes: ``checkpoint_dir`` for the run's own, ``resume_from`` for an
        earlier run's (the resume channel)."""
        found, problem = storage.read_marker(name)
        stored = None if found is None else found.get("model_shape")
        where = storage.where(name)
        mismatched = self.collective.agree(mismatch(where, stored, self.shape, REMEDY[field]))  # all, or none
        if mismatched is not None:
            raise CheckpointShapeError(f"{field}: {mismatched}")
        reason = self.collective.agree(problem if found is None else storage.verify(name, found))
        if reason is not None:
            return None, reason
        assert found is not None
        try:
            state, failure = self._load(storage, name, found, model, optimizer), None
        except (Exception, CheckpointException) as err:  # any load failure on any rank: agreed on below
            state, failure = None, f"load failed on rank {self.rank}: {error_line(err, self.rank)}"
        reason = self.collective.agree(failure)
        if reason is not None:
            self.touched_model = True  # a partial load may have written into the model or optimizer
            return None, reason
        return state, None

    def _load(self, storage: Storage, name: str, found: dict[str, Any], model, optimizer) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=self._options)
        state = {"model": model_sd, "optim": optim_sd}
        storage.load(name, state)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=self._options)  # fmt: skip
        saved_world = found["world_size"]
        same = saved_world == self.world_size
        loaded = storage.read_trainer_state(name, state_name(self.rank if same else 0))
        if same:
            trainer_state.set_rng_state(loaded["rng"], self.device)
        loaded["path"], loaded["same_world_size"] = str(storage.where(name)), same
        loaded["layout"] = found.get("data_parallel") or [1, saved_world]
        return loaded
