"""Identity: the IAM role SageMaker training jobs run as (``execution_role``: least privilege, inline policies
only). Names are re-exported lazily."""

from __future__ import annotations

from typing import Any

from constructs_lib._shared.lazy import lazy_attribute

_EXPORTS = {"SageMakerExecutionRole": ".execution_role"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
