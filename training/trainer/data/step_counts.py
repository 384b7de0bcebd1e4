"""What the run's optimizer steps hold, counted exactly before step 1 for its first lines: each step's windows and
tokens (how ``batch_tokens`` became ``batch_size``: ``training.contract.batch``) and, on prepared conversations or
preference pairs, the examples and the trained tokens (targets with a loss) of the very windows each step the run
has left will read, in the data's own order (``packing.Conversations``' and ``pairs.PreferencePairs``' seeded
permutation per epoch); on plain token data every token of a window is a target.

The plan says the same from the data's ``metadata.json`` on average (``training.plan.step_batch``); here they are
the run's own, with their spread over its steps. Packed, a window holds several examples, so a step of
``batch_size`` windows holds several times the examples of the same ``batch_size`` one example per window.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from training.contract import batch
from training.trainer.data.packing import Conversations
from training.trainer.data.pairs import PreferencePairs

MAX_WINDOWS = 1 << 22
"""The most windows counted (about 0.1 s and 100 MB): a longer run's first steps that hold that many."""
MAX_EPOCHS = 100
"""The most epochs counted (one permutation each): a long run on little data, its first steps over that many."""


def unit_counts(data: Conversations | PreferencePairs) -> tuple[np.ndarray, np.ndarray]:
    """Per window of ``data`` (``packing.Conversations`` or ``pairs.PreferencePairs``): its units (examples, or
    pairs) and its trained targets (a sequence's mask over its tokens after the first, as ``window`` reads it)."""
    starts = np.asarray(data.offsets[:-1], dtype=np.int64)
    mask = np.asarray(data.mask, dtype=np.uint8)
    trained = np.add.reduceat(mask, starts, dtype=np.int64) - mask[starts] if len(starts) else np.zeros(0)
    sides = len(starts) // max(
        1, sum(len(window) for window in data.windows)
    )  # 2 for pairs: chosen, rejected
    per_unit = trained.reshape(-1, sides).sum(axis=1)
    window_of = np.repeat(np.arange(len(data.windows)), [len(window) for window in data.windows])
    units = np.concatenate([np.asarray(window, dtype=np.int64) for window in data.windows])
    examples = np.bincount(window_of, minlength=len(data.windows))
    targets = np.bincount(window_of, weights=per_unit[units], minlength=len(data.windows)).astype(np.int64)
    return examples, targets


def window_order(data: Any, first: int, count: int) -> np.ndarray:
    """The windows global samples ``first`` .. ``first + count - 1`` read (``_window_index`` for many at once)."""
    total = len(data.windows)
    samples = np.arange(first, first + count, dtype=np.int64)
    epochs, at = np.divmod(samples, total)
    if not data.shuffle:
        return at
    out = np.empty(count, dtype=np.int64)
    for epoch in np.unique(epochs):
        chosen = epochs == epoch
        out[chosen] = np.random.default_rng((data.seed, int(epoch))).permutation(total)[at[chosen]]
    return out


def step_figures(data: Any, first: int, step_windows: int, steps: int) -> dict[str, Any]:
    """Each of ``steps`` steps of ``step_windows`` windows from global sample ``first``: the mean, least and most
    units and trained tokens (``counted``: the steps counted, at most :data:`MAX_WINDOWS` windows' and
    :data:`MAX_EPOCHS` epochs' worth)."""
    epochs = MAX_EPOCHS * len(data.windows) // step_windows
    counted = max(1, min(steps, MAX_WINDOWS // step_windows, epochs))
    examples, targets = unit_counts(data)
    order = window_order(data, first, counted * step_windows).reshape(counted, step_windows)
    per_step = {"examples": examples[order].sum(axis=1), "trained": targets[order].sum(axis=1)}
    figures: dict[str, Any] = {"counted": counted, "steps": steps}
    for name, values in per_step.items():
        figures[name] = (float(values.mean()), int(values.min()), int(values.max()))
    figures["per_window"] = float(examples.mean())
    return figures


def step_line(cfg: Any, data: Any, world_size: int, step: int) -> str:
    """``step: ...``: what each optimizer step of the run from ``step`` holds (``data``: its training batches, each
    rank's ``batch_size`` an optimizer step's windows)."""
    said = batch.batch_text(cfg.as_dict(), world_size)
    if not isinstance(data, (Conversations, PreferencePairs)):
        return f"step: {said}; every token of a window is a target (plain token data)"
    what = "pairs" if isinstance(data, PreferencePairs) else "examples"
    steps = max(0, cfg.max_steps - step)
    if not steps:
        return f"step: {said}"
    f = step_figures(data, data.consumed, world_size * data.batch_size, steps)
    over = (
        f"its {steps:,} steps" if f["counted"] == steps else f"its first {f['counted']:,} of {steps:,} steps"
    )
    held, trained = f["examples"], f["trained"]
    packed = (
        f"packed: {f['per_window']:.2f} {what} per window, where one per window the same batch_size would hold "
        f"{world_size * data.batch_size:,}"
        if data.packing
        else "one per window"
    )
    return (
        f"step: {said}; holding {held[0]:,.1f} {what} ({held[1]:,}-{held[2]:,}) and {trained[0]:,.1f} trained tokens "
        f"({trained[1]:,}-{trained[2]:,}), mean (least-most) over {over}, counted from the windows they read "
        f"({packed})"
    )
