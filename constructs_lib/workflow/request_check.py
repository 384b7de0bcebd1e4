"""The request check's Lambda entry point (``handler``); the decision itself is ``training.request.decision``."""

from __future__ import annotations

from training.request.decision import *  # noqa: F403 - moved there; re-exported while callers move
from training.request.decision import __all__, handler, init_from_architecture  # noqa: F401
