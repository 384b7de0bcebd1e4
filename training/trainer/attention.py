"""The attention kernel: which scaled-dot-product-attention backend the torch path pins, and the one in effect.

``attention_backend`` ``auto`` pins, in this order of priority, cuDNN then Flash then memory-efficient then math
on Hopper and Blackwell (SM 9.0+: cuDNN's SDPA is the fastest there, torchtitan PR #1209 for B200), Flash first
on Ampere, and leaves the CPU to torch's own choice. A named backend is the only one enabled besides math, the
fallback that takes every input (on a CPU, where torch ignores the priority order and picks Flash whenever it is
enabled, that is what makes ``math`` mean math). ``torch.nn.attention.sdpa_kernel(..., set_priority=True)``
(torch 2.9 has it) enables the backends and sets their order around the forward pass; the backward pass runs the
kernel the forward chose.

The kernel actually selected is probed at start with ``torch._fused_sdp_choice`` on the run's query shape and
logged. Transformer Engine chooses its own kernel (FlashAttention, cuDNN FusedAttention, or unfused); the trainer
logs TE's choice after the first step (``te_backend``).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS: dict[str, SDPBackend] = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
_NAMES = {backend.value: name for name, backend in BACKENDS.items()}


def priority(
    setting: str, capability: tuple[int, int] | None, deterministic: bool = False
) -> list[str] | None:
    """The enabled backends in priority order for ``setting`` on a GPU of ``capability`` (None: CPU, torch
    decides)."""
    if setting != "auto":
        return list(dict.fromkeys((setting, "math")))
    if capability is None:
        return None
    order = (
        ["cudnn", "flash", "efficient", "math"] if capability >= (9, 0) else ["flash", "efficient", "math"]
    )
    if deterministic:  # cuDNN's SDPA backward has no deterministic kernel; torch skips it anyway
        order = [name for name in order if name != "cudnn"]
    return order


@dataclass(frozen=True)
class AttentionPlan:
    """The pinned order (None: torch's default) and how to apply it."""

    order: list[str] | None

    def context(self) -> contextlib.AbstractContextManager:
        if self.order is None:
            return contextlib.nullcontext()
        return sdpa_kernel([BACKENDS[name] for name in self.order], set_priority=True)

    def in_effect(
        self, batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> str:
        """The backend torch selects for a causal query of this shape under this plan (meta-free probe on tiny
        real tensors of the run's dtype; ``_fused_sdp_choice`` only inspects shapes, dtypes and devices)."""
        query = torch.empty((batch, heads, seq, head_dim), dtype=dtype, device=device)
        with self.context():
            choice = torch._fused_sdp_choice(query, query, query, None, 0.0, True)
        return _NAMES.get(int(choice), f"backend {int(choice)}")


def plan(setting: str, device: torch.device, deterministic: bool = False) -> AttentionPlan:
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return AttentionPlan(priority(setting, capability, deterministic))


def te_backend() -> str:
    """Transformer Engine's attention choice after a forward pass (its module-level record at v2.11,
    ``attention/dot_product_attention/dot_product_attention.py`` ``_attention_backends``)."""
    try:
        module = importlib.import_module(
            "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
        )
    except ImportError:
        return "unknown (Transformer Engine not importable)"
    chosen = getattr(module, "_attention_backends", {})
    if chosen.get("use_flash_attention"):
        return f"FlashAttention ({chosen.get('flash_attention_backend')})"
    if chosen.get("use_fused_attention"):
        return f"FusedAttention (cuDNN, {chosen.get('fused_attention_backend')})"
    if chosen.get("use_unfused_attention"):
        return "UnfusedDotProductAttention"
    return "not selected yet"
