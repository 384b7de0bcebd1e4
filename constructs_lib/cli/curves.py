"""A run's training curves (loss, ``val_loss``, tokens/s) from its jobs' log lines, across all its launches.

One point per ``step=N ...`` line and per ``validation step=N ...`` line (the contract's parsers), each with four
x values: the step, the tokens trained so far (step x batch_size x seq_length x world size, from the launch's
``config`` line), the training hours (the log timestamps of each launch, launches end to end) and the on-demand
cost so far (those hours x the launch's instances x the contract's price; None on a training plan or an unpriced
instance type). A later launch (capacity relaunch, resume) continues the same curve: it starts from a checkpoint,
so the points of the earlier launch at or past its first step, which were trained again, are replaced by the new
ones. No AWS calls and no plotting here (``plots`` draws).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from constructs_lib.cli.records import Job, LogEvent
from training.contract.hardware import GPU_INSTANCE_TYPES, estimate_cost_usd
from training.contract.metric_lines import parse_config_line, parse_step_line, parse_validation_line
from training.contract.settings_table import HYPERPARAMETERS_BY_NAME

X_AXES: dict[str, str] = {
    "step": "step",
    "tokens": "tokens trained",
    "hours": "training hours (all launches)",
    "cost": "on-demand cost so far (USD, estimate)",
}
"""``--x`` choices and their axis labels."""

METRICS = ("loss", "val_loss", "tokens_per_sec")
"""What ``curves`` draws: each a field of the contract's step or validation lines."""


@dataclass(frozen=True)
class Point:
    step: int
    launch: int
    tokens: int | None
    hours: float
    cost: float | None
    values: dict[str, float]

    def x(self, axis: str) -> float | None:
        return {"step": self.step, "tokens": self.tokens, "hours": self.hours, "cost": self.cost}[axis]


@dataclass
class RunCurve:
    """One run's points in step order: ``train`` (step lines) and ``validation`` (validation lines)."""

    name: str
    launches: int = 0
    train: list[Point] = field(default_factory=list)
    validation: list[Point] = field(default_factory=list)

    def series(self, metric: str, axis: str) -> tuple[list[float], list[float]]:
        """(x values, y values) of ``metric`` against ``axis``, the points that have both."""
        points = self.validation if metric == "val_loss" else self.train
        pairs = [
            (p.x(axis), p.values[metric]) for p in points if metric in p.values and p.x(axis) is not None
        ]
        return [float(x) for x, _ in pairs if x is not None], [y for _, y in pairs]

    def missing(self, axis: str) -> bool:
        """Whether some point has no value on ``axis`` (cost on a training plan, tokens without a config line)."""
        return any(p.x(axis) is None for p in (*self.train, *self.validation))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "launches": self.launches,
            "train": [_flat(p) for p in self.train],
            "validation": [_flat(p) for p in self.validation],
        }


def _flat(point: Point) -> dict[str, Any]:
    data = asdict(point)
    return {**{k: v for k, v in data.items() if k != "values"}, **data["values"]}


def _setting(config: dict[str, str], job: Job, name: str) -> int | None:
    raw = config.get(name) or job.hyperparameters.get(name) or HYPERPARAMETERS_BY_NAME[name].default
    try:
        return int(str(raw))
    except ValueError:
        return None


def _tokens_per_step(config: dict[str, str], job: Job) -> int | None:
    """Tokens one optimizer step trains on every GPU together."""
    world = _setting(config, job, "world_size") if "world_size" in config else None
    if world is None:
        gpus = GPU_INSTANCE_TYPES.get(job.instance_type or "")
        world = gpus.gpus * job.instance_count if gpus else None
    batch, seq = _setting(config, job, "batch_size"), _setting(config, job, "seq_length")
    return batch * seq * world if batch and seq and world else None


def curve_of(name: str, launches: Sequence[tuple[Job, Iterable[LogEvent]]]) -> RunCurve:
    """The curve of run ``name`` from its launches in order: each job and its log events."""
    curve = RunCurve(name, launches=len(launches))
    hours_before = 0.0
    cost_before: float | None = 0.0
    for launch, (job, events) in enumerate(launches, start=1):
        config: dict[str, str] = {}
        train: list[Point] = []
        validation: list[Point] = []
        per_hour = None if job.capacity == "training plan" else estimate_cost_usd(
            job.instance_type or "", job.instance_count, 3600
        )  # fmt: skip
        first_ms = last_ms = None
        for event in events:
            parsed_config = parse_config_line(event.message)
            step_line = parse_step_line(event.message)
            validation_line = parse_validation_line(event.message)
            if parsed_config is not None:
                config = parsed_config
            if parsed_config is None and step_line is None and validation_line is None:
                continue
            first_ms = event.timestamp if first_ms is None else first_ms
            last_ms = event.timestamp
            hours = hours_before + (event.timestamp - first_ms) / 3_600_000
            cost = (
                None
                if per_hour is None or cost_before is None
                else cost_before + per_hour * (hours - hours_before)
            )
            per_step = _tokens_per_step(config, job)
            for found, into in ((step_line, train), (validation_line, validation)):
                if found is not None:
                    step, values = found
                    into.append(
                        Point(step, launch, per_step * step if per_step else None, hours, cost, values)
                    )
        if train or validation:
            first_step = min(p.step for p in (*train, *validation))
            curve.train = [p for p in curve.train if p.step < first_step] + train
            curve.validation = [p for p in curve.validation if p.step < first_step] + validation
        launch_hours = (
            (last_ms - first_ms) / 3_600_000 if first_ms is not None and last_ms is not None else 0.0
        )
        hours_before += launch_hours
        cost_before = (
            None if per_hour is None or cost_before is None else cost_before + per_hour * launch_hours
        )
    return curve
