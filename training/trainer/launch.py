"""torchrun with the trainer's exit-status contract (docs/exit-status.md); ``train.sh`` starts the workers with it:

    python -m training.trainer.launch --standalone --nproc-per-node=8 -m training.trainer --max_steps 100 ...

It runs torch's own torchrun program in this process (``torch.distributed.run.main``, unchanged: the same options,
agent and worker environment) and changes only how the end is reported. torchrun ends every failed run the same
way, whatever its workers' exit statuses: ``launch_agent`` raises ``ChildFailedError``, torchrun's ``main`` (under
``@record``) re-raises it, and Python prints a traceback and a block with each worker's exit code, then exits 1
(torch/distributed/launcher/api.py, torch/distributed/elastic/multiprocessing/errors/__init__.py). Here:

* the workers refused: they recorded the reason in ``$TRAINER_REFUSAL_FILE`` (set here unless the container's
  entry point set it) and exited 2, and torchrun stopped any still running (SIGTERM, then SIGKILL). Exit 2 and
  print nothing more: one worker printed the ``error:`` line, and torchrun's log lines about stopping the workers
  are dropped once a refusal is recorded;
* the workers stopped together on a failure during training (``refusal.TrainingFailure``: a bad token id, a
  non-finite loss): rank 0 recorded it in ``$TRAINER_FAILURE_FILE`` (set here) and printed its ``error:`` line, every
  failed worker exited 1 or was stopped by torchrun. Exit 1 and print nothing more, as for a refusal;
* any other failure: torchrun's block, without the traceback through torchrun's own code, and exit 1;
* success: exit 0.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from training.trainer import refusal

AGENT_LOGGERS = (
    "torch.distributed.elastic.multiprocessing.api",
    "torch.distributed.elastic.multiprocessing.errors.error_handler",
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
)
"""The loggers torchrun's agent reports a failed worker through ("Sending process ... closing signal SIGTERM",
"failed (exitcode: 2) local_rank: 0 ...", the error-file copy)."""

STOPPED_BY_TORCHRUN = frozenset({-signal.SIGTERM, -signal.SIGKILL})
"""Exit codes torchrun records for the workers it stopped after the first one failed."""


class _QuietAfterRefusal(logging.Filter):
    """Drops the agent's records once a worker has recorded a refusal (its line already says everything)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return refusal.refused() is None and refusal.refused(refusal.FAILURE_MARKER_ENV) is None


def is_refusal(err: ChildFailedError) -> bool:
    """Whether the failed run is the workers' refusal: one recorded, every failed worker exited 2 or was stopped by
    torchrun, at least one exited 2."""
    codes = {failure.exitcode for failure in err.failures.values()}
    return (
        refusal.refused() is not None
        and refusal.REFUSED in codes
        and codes <= {refusal.REFUSED, *STOPPED_BY_TORCHRUN}
    )


def is_failure_together(err: ChildFailedError) -> bool:
    """Whether the failed run is a ``TrainingFailure`` the workers stopped on together: one recorded, every failed
    worker exited 1 or was stopped by torchrun, at least one exited 1."""
    codes = {failure.exitcode for failure in err.failures.values()}
    return (
        refusal.refused(refusal.FAILURE_MARKER_ENV) is not None
        and refusal.FAILED in codes
        and codes <= {refusal.FAILED, *STOPPED_BY_TORCHRUN}
    )


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv`` (its own options, then the program); return the contract's exit status."""
    argv = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="trainer-launch-") as private:
        marker = Path(os.environ.setdefault(refusal.MARKER_ENV, str(Path(private) / "refused")))
        marker.unlink(missing_ok=True)  # train.sh's check passed: nothing has refused yet
        failure = Path(os.environ.setdefault(refusal.FAILURE_MARKER_ENV, str(Path(private) / "failed")))
        failure.unlink(missing_ok=True)
        quiet = _QuietAfterRefusal()
        for name in AGENT_LOGGERS:
            logging.getLogger(name).addFilter(quiet)
        try:
            torchrun.main(argv)
        except ChildFailedError as err:
            if is_refusal(err):
                return refusal.REFUSED
            if is_failure_together(err):
                return refusal.FAILED
            print(str(err).strip("\n"), file=sys.stderr, flush=True)
            return refusal.FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
