"""The exit-status contract: a refusal before training is one ``error:`` line and exit status 2; a failure during
training is exit status 1 with its reason as the SageMaker job's failure reason. See docs/exit-status.md.

Two kinds of refusal reach here:

* before the process group: any ``settings_table.ContractError`` (a bad setting, a failed preflight check). Each process
  decides it alone. Under ``torchrun`` every worker decides the same, so only the node's first worker
  (``LOCAL_RANK`` 0, or a process not under torchrun) prints the line; the others wait ``QUIET_WAIT_SECONDS`` for
  it to go first (torchrun then stops them) and print their own line only if it did not.
* after the process group: a ``Refusal`` (``checkpoint.CheckpointShapeError``, ``UnusableCheckpointsError``, or
  any new subclass), raised on every rank together, after the ranks agreed. Rank 0 prints the line, each node's
  local rank 0 writes the failure file, and every rank waits at a barrier until both are out.

Either way the processes that speak (each node's first worker) record the reason in ``$TRAINER_REFUSAL_FILE``
(when set) and in torchrun's per-worker error file (``TORCHELASTIC_ERROR_FILE``): the first tells
``training.trainer.distributed.launch`` and the container's ``entrypoint.sh`` that the workers refused (so they exit 2, where
torchrun and the toolkit would exit 1), the second puts the reason into torchrun's own failure report under a bare
``torchrun``. The other workers write neither and leave after them: torchrun names as its root cause the failure
with the earliest timestamp (the error file's, in whole seconds; for a worker without one, when torchrun saw it
end), so a silent worker that reached the refusal first, or was stopped by torchrun (exit -15), never takes the
speaking worker's place in the report, whichever process is faster.

A failure every rank learns together during training (``TrainingFailure``: a bad token id in the next batch, a
non-finite loss) ends the same way with exit status 1: one ``error:`` line from rank 0, the job's failure reason,
``$TRAINER_FAILURE_FILE`` for the launcher (which then adds nothing to the line) and torchrun's error file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from training.trainer import sagemaker_job

REFUSED = 2
"""Exit status of a refusal before training (nothing was trained or written)."""

FAILED = 1
"""Exit status of a failure during training (Python's own status for an uncaught exception)."""

MARKER_ENV = "TRAINER_REFUSAL_FILE"
"""Environment variable naming the file a refusing process writes its reason into (set by ``training.trainer.distributed.launch``
and ``entrypoint.sh``; unset: nothing is written)."""

FAILURE_MARKER_ENV = "TRAINER_FAILURE_FILE"
"""Environment variable naming the file rank 0 writes the reason of a ``TrainingFailure`` into (set by
``training.trainer.distributed.launch``; unset: nothing is written)."""

QUIET_WAIT_SECONDS = 60.0
"""How long a worker that stays silent waits for its node's first worker to print the line and exit (torchrun then
stops it at once with SIGTERM: before the process group nothing has replaced SIGTERM's default action; after it,
``checkpoint.stop.wait_for_sigterm`` restores it for the wait). Only a first worker that never gets there (it hung)
makes the wait run out; it is long so that a first worker slowed by a busy machine still speaks first."""


class TrainingFailure(Exception):
    """A reason to stop training that every rank learnt together after step 1 (a bad token id in the next batch, a
    non-finite loss): raised on every rank together, once the ranks agree and the checkpoints written so far are
    sealed. ``training.trainer.__main__`` turns it into one ``error:`` line and exit status 1 (a failure during
    training, not a refusal)."""


class Refusal(Exception):
    """A reason not to train found after the process group exists (for example a checkpoint of another model
    shape). Raise it on every rank together, once the ranks agree (e.g. after an ``all_gather_object`` of each
    rank's verdict): ``training.trainer.__main__`` turns it into one ``error:`` line and exit status 2. A rank that
    raises it alone leaves the others waiting in their next collective."""


def speaking_process() -> bool:
    """Whether this process prints a refusal found before the process group: the node's first worker under
    torchrun (``LOCAL_RANK`` 0), or a process not under torchrun."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def record(message: str, marker_env: str = MARKER_ENV) -> None:
    """Record a refusal (or, with ``marker_env=FAILURE_MARKER_ENV``, a failure every rank agreed on) where a
    launcher can see it: the file ``$marker_env`` names and torchrun's error file."""
    marker = os.environ.get(marker_env)
    if marker:
        _write_quietly(Path(marker), message.strip() + "\n")
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if (
        error_file
    ):  # torchrun's report shows it as the worker's traceback (the format of torch's ErrorHandler)
        text = message.strip()
        info = {"py_callstack": text, "timestamp": str(int(time.time()))}
        _write_quietly(Path(error_file), json.dumps({"message": {"message": text, "extraInfo": info}}))


def refused(marker_env: str = MARKER_ENV) -> str | None:
    """The reason in ``$TRAINER_REFUSAL_FILE`` (or the file ``marker_env`` names), or None when no process has
    recorded one."""
    marker = os.environ.get(marker_env)
    try:
        return Path(marker).read_text().strip() if marker else None
    except OSError:
        return None


def refuse(message: str, *, report: bool | None = None) -> int:
    """A refusal before the process group: ``error: <message>`` on stderr from the speaking process (``report``
    overrides who speaks), the job's failure reason under SageMaker, the records for a launcher; returns
    ``REFUSED``. A silent worker waits for the speaking one first, recording nothing meanwhile (see the module
    doc), and speaks after all if it is still running."""
    if report is None:
        report = speaking_process()
        if not report:
            time.sleep(QUIET_WAIT_SECONDS)  # torchrun stops this worker once the speaking one has exited
            report = True
    record(message)
    if report:
        print(f"error: {message}", file=sys.stderr, flush=True)
    sagemaker_job.write_failure(message)
    return REFUSED


def fail(message: str, *, report: bool) -> int:
    """A ``TrainingFailure`` on a node's first worker: ``error: <message>`` on stderr when ``report`` (rank 0), the
    job's failure reason under SageMaker, the records for a launcher; returns ``FAILED``."""
    record(message, FAILURE_MARKER_ENV)
    if report:
        print(f"error: {message}", file=sys.stderr, flush=True)
    sagemaker_job.write_failure(message)
    return FAILED


def fail_before_group(message: str) -> int:
    """A failure each worker finds alone before the process group exists (a host lost after the roll call,
    ``cluster.JoinError``): as :func:`fail`, spoken by the node's first worker; the others wait for it as for a
    refusal (torchrun stops them once it has exited), so that the line, the failure file and the launcher's record
    are written once and torchrun's root cause is the worker that wrote them."""
    if not speaking_process():
        time.sleep(QUIET_WAIT_SECONDS)
    return fail(message, report=True)


def failure_reason(err: BaseException) -> str:
    """One line for the job's failure reason: which rank (``RANK``) and what failed (the traceback stays on
    stderr)."""
    text = (str(err).strip().splitlines() or [""])[0]
    return f"training failed on rank {os.environ.get('RANK', '0')}: {type(err).__name__}: {text}"[:1000]


def _write_quietly(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:  # the line is still printed; only the launcher's view of it is lost
        print(f"note: could not record the refusal in {path}: {err.strerror or err}", file=sys.stderr)
