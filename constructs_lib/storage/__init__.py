"""Storage: the checkpoint bucket (``checkpoint_bucket``: checkpoints, job output and training data, each under
its own prefix and granted separately). Names are re-exported lazily."""

from __future__ import annotations

from typing import Any

from constructs_lib._shared.lazy import lazy_attribute

_EXPORTS = {"CheckpointBucket": ".checkpoint_bucket"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
