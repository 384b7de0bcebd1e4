"""The SIGTERM stop flag: SageMaker's StopTrainingJob or a spot reclaim sets it on any rank; the ranks agree on it
at each step boundary (one host-side all-reduce) so that every rank saves and stops at the same step."""

from __future__ import annotations

import atexit
import os
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

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
