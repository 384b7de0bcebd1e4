"""What a checkpoint records about the model it holds, and the refusal of a run that cannot continue it, as the
trainer sees it: the rules and their words are the contract's (``training.contract.checkpoint_identity``, which the
request check also reads before launch); this adds what only the trainer can know, the frozen base a LoRA run's
adapters refer to (``lora.identity``: its seed, or its ``init_from`` files' sampled SHA-256)."""

from __future__ import annotations

from typing import Any

from training.contract import checkpoint_identity
from training.trainer.model import lora

REMEDY = checkpoint_identity.REMEDY
"""What the user can change when a checkpoint's model differs, by the setting that chose the checkpoint (the
contract's: the request check says the same of ``resume_from`` before launch)."""


def model_identity(cfg) -> dict[str, Any]:
    """What a checkpoint of ``cfg``'s model records and a resume must match (``checkpoint_identity.model_identity``
    of its settings), with LoRA's frozen base the adapters refer to (``lora.identity``)."""
    identity = checkpoint_identity.model_identity(cfg.as_dict())
    if getattr(cfg, "lora_rank", 0):
        identity["lora"] = lora.identity(cfg)  # the adapters' settings and the frozen base they refer to
    return identity


def mismatch(
    where: Any, stored: Any, shape: dict[str, Any] | None, remedy: str = REMEDY["checkpoint_dir"]
) -> str | None:
    """A one-line message when the checkpoint ``where`` (its folder or URI, as the message names it), whose marker
    records the identity ``stored``, holds a model this run (``shape``: :func:`model_identity`) cannot continue
    (``checkpoint_identity.mismatch``: another shape, position settings, family or LoRA adapters), in the words
    the request check uses before launch; None when they match, or when either is not known (an unreadable
    marker: verification reports it)."""
    return checkpoint_identity.mismatch(str(where), stored, shape, remedy)
