"""One report run's shared state: its mode and GPU, the clock, the report folder, the folder of every process's log,
the records gathered so far (written out after every step, so a run cut short keeps what it measured), and the
environment every child process gets."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.measure.gpu_report.budget import Clock
from training.measure.gpu_report.modes import GPUS, Gpu, Mode
from training.measure.gpu_report.sweep import Calibration

LOG_FILE = "logs.txt"
TAIL_LINES = 25


@dataclass
class Context:
    """What every phase reads and adds to."""

    mode: Mode
    gpu: Gpu | None
    """The GPU found (None: a CPU run, the smoke mode)."""
    clock: Clock
    out: Path
    scratch: Path
    """Every process's own log and scratch files (not part of the report; their tails go into it)."""
    calibration: Calibration
    site: Path | None = None
    """Where the carried wheels were installed (put on every child's PYTHONPATH)."""
    records: dict[str, Any] = field(default_factory=dict)
    max_trials: int | None = None
    writer: Callable[[Context], None] | None = None
    """Writes the report of what is there so far (called after every step)."""

    @property
    def plan_gpu(self) -> Gpu:
        """The GPU the plan is asked about: the one found, or (on a CPU) an H100 stand-in for the smoke mode."""
        return self.gpu or GPUS["H100"]

    @property
    def on_gpu(self) -> bool:
        return self.gpu is not None

    def prepare_environment(self) -> None:
        """Every process this run starts (the tuning driver's trials take this process's environment): unbuffered
        output, the repository and the carried wheels on the path."""
        root = str(Path(__file__).resolve().parents[3])
        paths = [root, *([str(self.site)] if self.site else []), os.environ.get("PYTHONPATH", "")]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
        os.environ["PYTHONUNBUFFERED"] = "1"
        os.environ.setdefault("PYTHON", sys.executable)

    def write(self) -> None:
        if self.writer is not None:
            self.writer(self)

    def add(self, section: str, record: Any) -> None:
        self.records.setdefault(section, []).append(record)

    def append_log(self, title: str, path: Path | str | None, text: str | None = None) -> None:
        """A process's whole log (or ``text``) appended to the report's one log file, under ``title``."""
        body = text if text is not None else (Path(path).read_text(errors="replace") if path and
                                              Path(path).is_file() else "(no log)\n")  # fmt: skip
        with open(self.out / LOG_FILE, "a", encoding="utf-8") as log:
            log.write(f"==== {title} (at {self.clock.now():.0f} s)\n{body}")
            if not body.endswith("\n"):
                log.write("\n")


def tail(path: Path | str | None, lines: int = TAIL_LINES) -> list[str]:
    if not path or not Path(path).is_file():
        return []
    return Path(path).read_text(errors="replace").splitlines()[-lines:]


def say(line: str) -> None:
    print(f"gpu-report: {line}", flush=True)
