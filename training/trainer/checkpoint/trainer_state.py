"""Each rank's trainer state in a checkpoint (``rank_00000.pt``: step, data position, LR schedule and scheduler,
grad scaler, RNG states), written and read here only, the same bytes format in both storage backends (a file in a
folder, an object under an S3 prefix): ``torch.save``'s archive, so a checkpoint copied from one to the other
loads alike."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from training.trainer.checkpoint import safe_load


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def write(state: dict[str, Any], path: Path) -> None:
    """``state`` into the file ``path``."""
    torch.save(state, path)


def encode(state: dict[str, Any]) -> bytes:
    """``state`` as the bytes ``write`` puts in a file (an object's body)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def read(source: Path | bytes, name: str | None = None) -> dict[str, Any]:
    """The trainer state in the file ``source``, or in the bytes of the object ``name``, read weights-only
    (``safe_load.UnsafeFileError`` naming it when it holds more)."""
    if isinstance(source, bytes):
        return safe_load.load(io.BytesIO(source), name=name or "a trainer state")
    return safe_load.load(source)
