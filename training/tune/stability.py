"""Step-time statistics of a trial: median, spread and the coefficient of variation (CV), and the rule that says a
trial's step time is stable (the CV of its last window of timed steps under a target), which ends it early."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation: the sample standard deviation over the mean (inf for fewer than 2 values)."""
    if len(values) < 2:
        return math.inf
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else math.inf


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between the two nearest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Spread:
    """Step times (seconds) of the timed steps of one trial."""

    steps: int
    median: float
    p10: float
    p90: float
    cv: float

    @classmethod
    def of(cls, times: Sequence[float]) -> Spread | None:
        if not times:
            return None
        return cls(
            len(times), statistics.median(times), percentile(times, 10), percentile(times, 90), cv(times)
        )

    def as_dict(self) -> dict[str, float | None]:
        """The figures for the report; a CV that has no value (fewer than 2 steps) is None, JSON's null."""
        cv_value = self.cv if math.isfinite(self.cv) else None
        return {"steps": self.steps, "median": self.median, "p10": self.p10, "p90": self.p90, "cv": cv_value}


@dataclass(frozen=True)
class Stability:
    """When a trial may stop: ``window`` timed steps whose CV is below ``cv_target`` (0: never early)."""

    window: int
    cv_target: float

    def stable(self, times: Sequence[float]) -> bool:
        if self.cv_target <= 0 or len(times) < self.window:
            return False
        return cv(times[-self.window :]) < self.cv_target


WINDOW_ENV = "BLACKWELL_TUNE_WINDOW"
CV_ENV = "BLACKWELL_TUNE_CV"
"""How the driver tells a trial's processes its :class:`Stability` (environment variables of the trial)."""


def from_environment(environ: dict[str, str]) -> Stability:
    return Stability(int(environ.get(WINDOW_ENV, "8")), float(environ.get(CV_ENV, "0")))
