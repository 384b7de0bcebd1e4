"""The sweep, decided by the plan before anything runs: every micro-batch x activation checkpointing x compile x
attention backend, each planned (``training.plan``: the per-GPU peak, and the step time it estimates
from the source article's measured points), those predicted not to fit left out, and the rest put in the order
they are run:

1. the base: the trainer's defaults for the levers (no activation checkpointing, compile on, the first attention
   backend: cuDNN) at the largest micro-batch the plan fits with a margin (``BASE_MARGIN`` of the limit: the base
   is what everything else is compared with, so it must not be the edge, which the probe tests);
2. every other value of each lever, one at a time, the others at the base's (what each lever does, measured);
3. one probe just past the plan's memory edge (the nearest candidate it predicts not to fit), as the tuner does;
4. the rest of the grid, best predicted first.

Each candidate's time is its start-up (assumed, ``modes.StartUp``, until the run has measured its own) plus its
warm-up and timed steps at the plan's step time (scaled by what the trials so far measured against it, once they
have). The dry run takes candidates in that order while they fit the sweep's share; the real run decides again
before each trial with what it has measured. Pure Python (no torch).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training.contract import settings_parse
from training.measure.gpu_report.modes import PLAN_INSTANCE_TYPE, Gpu, Mode, StartUp
from training.plan import estimate, memory_terms

LEVERS = ("batch_size", "activation_checkpointing", "compile", "attention_backend")
BASE_MARGIN = 0.8


@dataclass(frozen=True)
class Candidate:
    """One trial: the settings it sets over the base, the plan's figures for it on this GPU, its role."""

    settings: dict[str, Any]
    peak_gib: float
    tensors_gib: float
    limit_gib: float
    step_seconds: float
    tokens_per_sec: float
    role: str = "grid"

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.limit_gib

    @property
    def compiled(self) -> bool:
        return self.settings.get("compile") == "true"

    def key(self) -> tuple[Any, ...]:
        return tuple(self.settings[name] for name in LEVERS)

    def describe(self) -> str:
        return " ".join(f"{k}={settings_parse.format_setting(v)}" for k, v in self.settings.items())


def request(
    mode: Mode, settings: Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The execution input that stands for one trial of ``mode`` (what the plan is asked about)."""
    hyperparameters = {**mode.base_settings, **mode.model, "seq_length": mode.seq_length, **(extra or {})}
    hyperparameters.update(settings)
    hyperparameters.setdefault("max_steps", mode.warmup_steps + mode.measured_steps)
    return {"instance_type": PLAN_INSTANCE_TYPE, "instance_count": 1, "hyperparameters": hyperparameters}


def planned(mode: Mode, gpu: Gpu, settings: Mapping[str, Any], role: str = "grid") -> Candidate:
    """The plan of one trial on ``gpu``: its peak against this GPU's memory (``memory_terms.HEADROOM`` of it)."""
    made = estimate.make_plan(request(mode, settings))
    limit = memory_terms.HEADROOM * gpu.memory_gb * 1e9 / memory_terms.GIB
    return Candidate(dict(settings), made.memory.peak_gib, made.memory.tensors_gib, limit,
                     made.timing.step_seconds, made.timing.tokens_per_sec_per_gpu, role)  # fmt: skip


def grid(mode: Mode, gpu: Gpu) -> list[Candidate]:
    """Every combination of the mode's lever values, planned."""
    return [
        planned(
            mode,
            gpu,
            {"batch_size": mb, "activation_checkpointing": ac, "compile": c, "attention_backend": a},
        )
        for mb in mode.micro_batches
        for ac in mode.ac_modes
        for c in mode.compile_values
        for a in mode.attention_values
    ]


def _with(base: Candidate, **changes: Any) -> dict[str, Any]:
    return {**base.settings, **changes}


def ordered(mode: Mode, gpu: Gpu) -> list[Candidate]:
    """The candidates in the order they are run (the module's doc): fitting ones, and the one probe."""
    everything = grid(mode, gpu)
    by_key = {c.key(): c for c in everything}
    fitting = [c for c in everything if c.fits]
    if not fitting:
        return []
    first = {"activation_checkpointing": mode.ac_modes[0], "compile": mode.compile_values[0],
             "attention_backend": mode.attention_values[0]}  # fmt: skip
    at_defaults = [c for c in fitting if all(c.settings[k] == v for k, v in first.items())] or fitting
    at_defaults = [c for c in at_defaults if c.peak_gib <= BASE_MARGIN * c.limit_gib] or at_defaults
    base = max(at_defaults, key=lambda c: (c.settings["batch_size"], c.tokens_per_sec))
    out = [_role(base, "base")]
    values = {"activation_checkpointing": mode.ac_modes, "compile": mode.compile_values,
              "attention_backend": mode.attention_values, "batch_size": mode.micro_batches}  # fmt: skip
    for lever in ("compile", "attention_backend", "activation_checkpointing", "batch_size"):
        for value in values[lever]:
            if value != base.settings[lever]:
                found = by_key.get(tuple(_with(base, **{lever: value})[n] for n in LEVERS))
                if found is not None and found.fits:
                    out.append(_role(found, f"lever {lever}"))
    edge = sorted(
        (c for c in everything if not c.fits and c.settings["compile"] == base.settings["compile"]
         and c.settings["attention_backend"] == base.settings["attention_backend"]),
        key=lambda c: c.peak_gib / c.limit_gib,
    )  # fmt: skip
    if edge:
        out.append(_role(edge[0], "probe (past the plan's memory edge)"))
    seen = {c.key() for c in out}
    rest = sorted((c for c in fitting if c.key() not in seen), key=lambda c: -c.tokens_per_sec)
    return out + rest


def _role(candidate: Candidate, role: str) -> Candidate:
    return Candidate(candidate.settings, candidate.peak_gib, candidate.tensors_gib, candidate.limit_gib,
                     candidate.step_seconds, candidate.tokens_per_sec, role)  # fmt: skip


@dataclass
class Calibration:
    """What the trials so far measured against the assumptions: start-up (first step of a trial without compile),
    compile's warm-up on top, and the measured step time over the plan's."""

    assumed: StartUp
    starts: list[float] = field(default_factory=list)
    compiles: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    def start(self, compiled: bool) -> float:
        base = statistics.median(self.starts) if self.starts else self.assumed.trial
        extra = statistics.median(self.compiles) if self.compiles else self.assumed.compile
        return base + (extra if compiled else 0.0)

    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 1.0

    def seconds(self, candidate: Candidate, steps: int) -> float:
        """Predicted seconds of one trial of ``steps`` steps."""
        return self.start(candidate.compiled) + steps * candidate.step_seconds * self.ratio()

    def learn(self, candidate: Candidate, first_step: float | None, step_median: float | None) -> None:
        """Take in one finished trial: its time to the first step, its median step time."""
        if step_median:
            self.ratios.append(step_median / candidate.step_seconds)
        if first_step is None:
            return
        if candidate.compiled:
            self.compiles.append(max(0.0, first_step - (statistics.median(self.starts) if self.starts
                                                        else self.assumed.trial)))  # fmt: skip
        else:
            self.starts.append(first_step)


def fill(candidates: Iterable[Candidate], seconds: float, predict, limit: int | None = None
         ) -> tuple[list[tuple[Candidate, float]], list[tuple[Candidate, float]]]:  # fmt: skip
    """Greedy: candidates in order while their predicted time fits ``seconds`` (a later, shorter one may still
    fit after a longer one did not); the chosen and the left out, each with its prediction."""
    chosen, left, used = [], [], 0.0
    for candidate in candidates:
        need = predict(candidate)
        if used + need <= seconds and (limit is None or len(chosen) < limit):
            chosen.append((candidate, need))
            used += need
        else:
            left.append((candidate, need))
    return chosen, left


def describe_all(items: Sequence[tuple[Candidate, float]]) -> list[str]:
    return [f"{c.describe()} [{c.role}] ~{need:.0f} s (plan: {c.peak_gib:.1f} GiB, {c.step_seconds:.2f} s/step)"
            for c, need in items]  # fmt: skip
