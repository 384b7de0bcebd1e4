"""The report's wall clock: one budget from the moment this process started (its interpreter's own start read from
/proc, so every process start counts), cut into time-boxed phases, each with its stated share.

A phase ends at the global deadline less the shares of the phases still to come: what an earlier phase leaves
unused flows to the later ones, and a later phase always keeps its own share. Inside a phase every step (a trial,
a run) gets as hard limit what is left of the phase; a step that would need more than is left is not started, and
a phase whose last step ran over is reported as cut. Nothing here imports torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


def process_age_seconds() -> float:
    """Seconds since this process was started (its interpreter's start included), from /proc; 0 where /proc is
    not there."""
    try:
        stat = Path(f"/proc/{os.getpid()}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    started_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22: starttime, in clock ticks
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class Share:
    """One phase's name, its share of the budget (seconds) and what it does, in words (the report shows it)."""

    name: str
    seconds: float
    what: str


@dataclass
class PhaseRecord:
    """What a phase used: its share, when it started and ended (seconds since the process started), its end as
    allowed, and whether it was cut (a step killed at the phase's end, or steps left out for lack of time)."""

    name: str
    share: float
    allowed_end: float
    started: float
    ended: float | None = None
    cut: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def used(self) -> float | None:
        return None if self.ended is None else self.ended - self.started

    def as_dict(self) -> dict[str, object]:
        return {
            "phase": self.name,
            "share_s": round(self.share, 1),
            "started_s": round(self.started, 1),
            "ended_s": None if self.ended is None else round(self.ended, 1),
            "used_s": None if self.used is None else round(self.used, 1),
            "allowed_end_s": round(self.allowed_end, 1),
            "cut": self.cut,
            "notes": list(self.notes),
        }


class Clock:
    """The global budget and its phases (``shares``, in the order they run)."""

    def __init__(self, budget_seconds: float, shares: Sequence[Share], *, age: float | None = None) -> None:
        self.budget = budget_seconds
        self.shares = list(shares)
        self._origin = time.monotonic() - (process_age_seconds() if age is None else age)
        self.records: list[PhaseRecord] = []
        self.current: PhaseRecord | None = None

    def now(self) -> float:
        """Seconds since the process started."""
        return time.monotonic() - self._origin

    def left(self) -> float:
        """Seconds left of the whole budget."""
        return self.budget - self.now()

    def begin(self, name: str) -> PhaseRecord:
        """Start phase ``name``: it may run until the deadline less the shares of the phases after it."""
        index = [s.name for s in self.shares].index(name)
        later = sum(s.seconds for s in self.shares[index + 1 :])
        record = PhaseRecord(name, self.shares[index].seconds, self.budget - later, self.now())
        self.records.append(record)
        self.current = record
        return record

    def phase_left(self) -> float:
        """Seconds left of the current phase."""
        assert self.current is not None
        return self.current.allowed_end - self.now()

    def end(self, *, cut: bool = False, note: str | None = None) -> PhaseRecord:
        assert self.current is not None
        record, self.current = self.current, None
        record.ended = self.now()
        record.cut = record.cut or cut or record.ended > record.allowed_end + 1.0
        if note:
            record.notes.append(note)
        return record
