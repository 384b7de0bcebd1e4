"""The attention kernel: which scaled-dot-product-attention backend the torch path pins, and the one in effect.

``attention_backend`` ``auto`` pins, in this order of priority, cuDNN then Flash then memory-efficient then math
on Hopper and Blackwell (SM 9.0+: cuDNN's SDPA is the fastest there, torchtitan PR #1209 for B200), Flash first
on Ampere, and leaves the CPU to torch's own choice. A named backend is the only one enabled besides math, the
fallback that takes every input (on a CPU, where torch ignores the priority order and picks Flash whenever it is
enabled, that is what makes ``math`` mean math). ``torch.nn.attention.sdpa_kernel(..., set_priority=True)``
(torch 2.9 has it) enables the backends and sets their order around the forward pass; the backward pass runs the
kernel the forward chose.

The kernel actually selected is probed at start (``resolve``) with ``torch._fused_sdp_choice``, SDPA's own
chooser, called exactly as the block calls SDPA (``model.causal_attention``) on inputs made as the block makes them
(``model.attention_inputs``): the micro-batch, sequence length and compute dtype of the run, the query's heads and
the key/value heads of grouped-query attention with ``enable_gqa``, the strides of the fused QKV projection's
output, requiring grad as in training. Each backend has its own rules for these (grouped-query attention, head_dim,
dtype, memory layout, determinism), and torch skips a backend that cannot take them for the next in the order, so
the probe finds the kernel that really runs. That one is logged; a NAMED ``attention_backend`` that torch cannot run
for the model (it would fall back to math, whose memory grows with seq_length^2) is refused before the model is
built, on every rank together. Transformer Engine chooses its own kernel (FlashAttention, cuDNN FusedAttention, or
unfused); the trainer logs TE's choice after the first step (``te_backend``).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel

from training.models.config import ModelConfig
from training.trainer import refusal
from training.trainer.model import decoder
from training.trainer.model.rotary import Rope

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
        self,
        shape: ModelConfig,
        batch: int,
        seq: int,
        dtype: torch.dtype,
        device: torch.device,
        rope: Rope | None = None,
        packed: bool = False,
    ) -> str:
        """The backend SDPA runs under this plan for a block of ``shape`` on a ``[batch, seq]`` micro-batch in
        ``dtype`` on ``device`` (``rope``: the run's rotary frequencies, None for NoPE). The inputs are made by the
        block's own code from an uninitialized fused QKV output (``_fused_sdp_choice`` reads shapes, strides,
        dtypes, the device and whether grad is required, never values) and freed on return. ``packed``: with a mask
        (packed documents' block-causal mask, or a sliding window: ``decoder.causal_attention``'s ``mask``), which
        rules out the kernels that take no mask."""
        width = (shape.num_heads + 2 * shape.kv_heads) * shape.head_dim  # the fused QKV projection's output
        with torch.enable_grad():
            qkv = torch.empty((batch, seq, width), dtype=dtype, device=device, requires_grad=True)
            freqs = None if rope is None else rope(seq, device)
            q, k, v = decoder.attention_inputs(qkv, shape.num_heads, shape.kv_heads, shape.head_dim, freqs)
            mask = (
                torch.ones((batch, 1, seq, seq), dtype=torch.bool, device=device).tril() if packed else None
            )
            with self.context():
                choice = int(decoder.causal_attention(q, k, v, sdpa=torch._fused_sdp_choice, mask=mask))
        return _NAMES.get(choice, f"backend {choice}")


def plan(setting: str, device: torch.device, deterministic: bool = False) -> AttentionPlan:
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return AttentionPlan(priority(setting, capability, deterministic))


class BackendUnavailable(refusal.Refusal):
    """``attention_backend`` names a kernel torch cannot run for the model's attention on this machine."""


def unavailable(
    setting: str, chosen: str, shape: ModelConfig, seq: int, dtype: torch.dtype, device: torch.device
) -> str | None:
    """Why a named ``setting`` cannot serve when SDPA would run ``chosen`` instead (None: it can, or ``auto``)."""
    if setting == "auto" or chosen == setting:
        return None
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    gqa = " (grouped-query attention)" if shape.kv_heads != shape.num_heads else ""
    return (
        f"attention_backend: {setting} cannot run this model's attention on {where} with torch {torch.__version__} "
        f"({shape.num_heads} query heads, {shape.kv_heads} key/value heads{gqa}, head_dim {shape.head_dim}, "
        f"seq_length {seq}, {str(dtype).removeprefix('torch.')}): SDPA would run {chosen} instead; use "
        "attention_backend auto (the fastest kernel torch can run for it, logged at start)"
    )


def resolve(
    cfg, device: torch.device, dtype: torch.dtype, group: dist.ProcessGroup, packed: bool = False
) -> tuple[AttentionPlan, str]:
    """The torch path's attention plan for the run ``cfg`` and the kernel in effect (``AttentionPlan.in_effect``
    on the run's shapes); a named backend torch cannot run is refused (``BackendUnavailable``) on every rank
    together: the ranks agree through one all-reduce on ``group`` (the host-side gloo group)."""
    chosen_plan = plan(cfg.attention_backend, device, cfg.deterministic)
    model = cfg.shape
    rope = Rope.from_config(model.rope_of(0), model.head_dim)
    windowed = any(model.attention_span(i, cfg.seq_length) < cfg.seq_length for i in range(model.num_layers))
    masked = packed or windowed  # a sliding window is a mask too (the block's attention_mask)
    chosen = chosen_plan.in_effect(model, cfg.batch_size, cfg.seq_length, dtype, device, rope, masked)
    problem = unavailable(cfg.attention_backend, chosen, cfg.shape, cfg.seq_length, dtype, device)
    flag = torch.tensor([0 if problem is None else 1], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if flag.item():
        raise BackendUnavailable(
            problem or f"attention_backend: {cfg.attention_backend} cannot run on another rank"
        )
    return chosen_plan, chosen


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
