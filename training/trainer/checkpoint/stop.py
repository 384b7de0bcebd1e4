"""The SIGTERM stop flag: SageMaker's StopTrainingJob or a spot reclaim sets it on any rank; the ranks agree on it
at each step boundary (one host-side all-reduce) so that every rank saves and stops at the same step. Once a worker
has nothing left to save and only waits to be stopped, SIGTERM ends it again (``wait_for_sigterm``)."""

from __future__ import annotations

import atexit
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

PID_DIR_ENV = "TRAINER_PID_DIR"
"""Where each worker registers its PID, so the container's PID-1 entry point (training/entrypoint.sh) can forward
SageMaker's SIGTERM to the workers directly."""


_received = False
"""Whether a ``StopFlag`` of this process has received SIGTERM (``wait_for_sigterm`` reads it once the flag is no
longer read)."""


class StopFlag:
    """Set by SIGTERM (SageMaker's StopTrainingJob / spot reclaim; about 120 s before SIGKILL); the loop checks
    ``agreed()`` at each step boundary, which all-reduces the flag so every rank stops at the same step."""

    def __init__(self, group: dist.ProcessGroup):
        global _received
        self.group = group
        self.received = _received = False
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
        global _received
        self.received = _received = True

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


def wait_for_sigterm(seconds: float) -> None:
    """Wait up to ``seconds`` for SIGTERM to end this process: a worker with nothing left to save (its process group
    destroyed) that waits for torchrun to stop it once its node's first worker has exited. SIGTERM's default action
    comes back first: the flag's handler only sets a flag nothing reads any more, so the worker would outlive
    torchrun's SIGTERM and torchrun would wait its close timeout (30 s, ``torch.distributed.elastic.multiprocessing``)
    before SIGKILL. A SIGTERM the flag took before (torchrun's, while the worker was still leaving the process group)
    ends it now. Returns when none came; the handler is then back."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        if _received:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(seconds)
    finally:
        signal.signal(signal.SIGTERM, previous)
