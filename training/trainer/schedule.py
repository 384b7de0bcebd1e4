"""The learning-rate schedule: linear warm-up, then cosine decay to ``MIN_LR_RATIO`` of the peak, and what a
resume with a different ``max_steps`` does to it.

Continuation rule (documented in docs/trainer.md, "What resume does"): when a run resumes with a ``max_steps`` other than the one its
checkpoint was trained towards, the schedule continues from the learning rate already reached, without a jump:
from the resumed step it follows a new cosine from that rate down to the floor at the new ``max_steps``. A run
that had finished (at the floor) therefore continues at the floor; a run stopped mid-decay decays more slowly
to the new end. A resume inside the warm-up keeps the warm-up and decays to the new end (no jump either).
Raising ``max_steps`` again later repeats the rule from that point.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

MIN_LR_RATIO = 0.1


def lr_factor(step: int, warmup_steps: int, max_steps: int) -> float:
    """Multiplier of the peak LR at ``step`` (0-based): linear warm-up, then cosine decay to MIN_LR_RATIO."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return _cosine(progress, 1.0)


def _cosine(progress: float, start: float) -> float:
    return MIN_LR_RATIO + (start - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@dataclass(frozen=True)
class Schedule:
    """The schedule a run follows; saved in every checkpoint so that a resume knows what it was."""

    max_steps: int
    warmup_steps: int
    anchor_step: int | None = None
    """Set by a continuation: from this step the cosine starts at ``anchor_factor``."""
    anchor_factor: float = 1.0
    before: Schedule | None = None
    """The schedule the steps before ``anchor_step`` followed."""

    def factor(self, step: int) -> float:
        if self.anchor_step is None:
            return lr_factor(step, self.warmup_steps, self.max_steps)
        if step < self.anchor_step and self.before is not None:
            return self.before.factor(step)
        progress = (step - self.anchor_step) / max(1, self.max_steps - self.anchor_step)
        return _cosine(progress, self.anchor_factor)

    def continued_to(self, max_steps: int, step: int) -> Schedule:
        """This schedule, resumed at ``step`` (steps done) with a new ``max_steps`` (see the module doc)."""
        if max_steps == self.max_steps:
            return self
        if step < self.warmup_steps and self.anchor_step is None:
            return replace(self, max_steps=max_steps)
        return Schedule(max_steps, self.warmup_steps, step, self.factor(step), self)

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict) -> Schedule:
        before = state.get("before")
        return cls(**{**state, "before": cls.from_state_dict(before) if before else None})


def warmup_for(lr_warmup_steps: int, max_steps: int) -> tuple[int, str | None]:
    """The warm-up a new run uses, and a note when the configured one was shortened: a warm-up as long as the
    run would never reach the peak learning rate, so it becomes a tenth of the run."""
    if lr_warmup_steps < max_steps:
        return lr_warmup_steps, None
    shortened = max_steps // 10
    return shortened, (
        f"note: lr_warmup_steps={lr_warmup_steps} is not below max_steps={max_steps}; "
        f"warming up over {shortened} steps (a tenth of the run) instead"
    )
