"""What one optimizer step holds, for the plan: its windows and tokens (with how ``batch_tokens`` became
``batch_size``: ``training.contract.batch``), and the examples and trained tokens (tokens with a loss: not masked,
not padding) in them: every token of a window on plain token data, and on prepared conversations the averages their
``metadata.json`` gives (its examples and trained tokens over the windows ``seq_length`` makes of them).

Why it is said: with packing a window holds several examples, so a step of ``batch_size`` windows holds several
times the examples of the same ``batch_size`` unpacked, and only the answers' tokens train; the trainer's first lines
give the same figures exactly for its run (``training.trainer.data.step_counts``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.contract import batch
from training.plan.memory import Setup


def step_plan(s: Setup, values: Mapping[str, Any]) -> dict[str, Any]:
    """The step's windows and tokens (of the setup ``s`` of parsed settings ``values``), and, as on plain token
    data, every token trained; the examples are not known without the data (:func:`with_examples` adds them)."""
    windows = s.world_size * s.batch_size * s.grad_accum_steps
    tokens = windows * s.seq_length
    said = batch.batch_text(values, s.world_size)
    return {
        "windows": windows,
        "tokens": tokens,
        "batch_size": s.batch_size,
        "batch_tokens": values.get(batch.TOKENS),
        "batch": said,
        "examples": None,
        "trained_tokens": tokens,
        "source": "plain token data: every token of a window has a target (prepared conversations: their "
        "metadata.json)",
        "summary": f"{said}; on plain token data every token trains",
    }


def with_examples(
    step: Mapping[str, Any],
    *,
    examples: int,
    windows: int,
    trained: int,
    packing: bool,
    exact: bool = True,
    what: str = "examples",
) -> dict[str, Any]:
    """``step`` (:func:`step_plan`) on prepared conversations whose train split holds ``examples`` and ``trained``
    trained tokens in ``windows`` windows (``packing``: best-fit decreasing; else one example each): the step's
    windows times the split's averages per window; ``exact``: ``windows`` is the count, not a lower bound (no
    recorded lengths: then the averages are upper bounds). ``what``: the data's word for an example (``pairs``)."""
    per_window = examples / windows if windows else 0.0
    trained_per_window = trained / windows if windows else 0.0
    held, trains = step["windows"] * per_window, step["windows"] * trained_per_window
    way = (
        f"packed: {per_window:.2f} {what} per window on average, where one per window the same batch_size would "
        f"hold {step['windows']:,}"
        if packing
        else "one per window"
    )
    source = (
        f"the train split's metadata.json: {examples:,} {what} and {trained:,} trained tokens in "
        f"{'' if exact else 'at least '}{windows:,} windows"
    )
    return {
        **step,
        "examples": round(held, 1),
        "trained_tokens": round(trains),
        "source": source,
        "summary": (
            f"{step['batch']}; holding {'about' if exact else 'at most'} {held:,.1f} {what} and {trains:,.0f} trained tokens ({way}; {source})"
        ),
    }
