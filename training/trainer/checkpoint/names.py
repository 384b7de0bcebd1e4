"""The names inside a run's checkpoint place, the same for both storage backends (a folder, an S3 prefix).

``step_00000100`` is the checkpoint of step 100, ``step_00000100-2`` a later save of that step whose name was
taken; inside it ``STARTED`` (written first), ``rank_00000.pt`` ... (each rank's trainer state), DCP's ``.metadata``
and ``__<rank>_<n>.distcp`` shards, and ``COMPLETE`` (written last). ``step_00000100.unusable`` beside it sets it
aside; ``step_00000100.tmp`` is the folder backend's name while a save is written (S3 has no rename: a checkpoint is
sealed where it is written); ``rank_00000.receipt`` is the S3 backend's record of what one rank uploaded.
"""

from __future__ import annotations

from training.contract import container

MARKER = "COMPLETE"
STARTED = "STARTED"
"""Written into a save's folder before anything else: what its ``COMPLETE`` will record (step, world size, model
shape, job), so that a save written whole but never sealed can be sealed later with the writer's facts."""
TMP = ".tmp"
ASIDE = container.SET_ASIDE_SUFFIX
RECEIPT = ".receipt"
"""``rank_00000.receipt`` (S3): what one rank uploaded into a checkpoint, ``{name: [size, sha256]}`` (JSON), created
when its upload completed, so that a save every rank finished can be sealed later even when the run ended before
its marker was written."""
METADATA = ".metadata"
"""DCP's index of a checkpoint, written by rank 0 once every rank's shards are written."""

INCOMPLETE = "incomplete: {why}an interrupted write; left as it is"
"""The reason given for an unsealed checkpoint (``{why}``: what is missing)."""
NO_MARKER = f"no {MARKER} marker, "
"""``INCOMPLETE``'s ``why`` for a checkpoint under its final name without a marker."""


def step_dir_name(step: int, generation: int = 1) -> str:
    """``step_00000100``, or ``step_00000100-2`` for the second folder of that step."""
    return f"step_{step:08d}" + (f"-{generation}" if generation > 1 else "")


def order(name: str) -> tuple[int, int] | None:
    """(step, generation) of a checkpoint name, or None for any other name."""
    match = container.CHECKPOINT_DIR_NAME.match(name)
    return (int(match.group(1)), int(match.group(2) or 1)) if match else None


def state_name(rank: int) -> str:
    """The trainer state of ``rank``: ``rank_00000.pt``."""
    return f"rank_{rank:05d}.pt"


def receipt_name(rank: int) -> str:
    """What ``rank`` uploaded (S3): ``rank_00000.receipt``."""
    return f"rank_{rank:05d}{RECEIPT}"


def set_aside_name(name: str) -> str:
    """The record that sets the checkpoint ``name`` aside: ``step_00000100.unusable``."""
    return name + ASIDE
