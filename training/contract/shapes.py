"""The model's shape: ``ModelShape`` (a Llama-style decoder), the named presets and their RoPE settings, and
the parameter and FLOP counts the trainer's MFU and the plan read (``flops_per_token``, the LoRA adapters' count).

The named presets come from ``training.models`` (each family's sizes); ``ModelShape`` and its counts stay here for
the plan's formulas until the plan reads ``training.models.config.ModelConfig`` (its drop-in: the same names).
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training.models import hf, registry
from training.models import settings as model_settings
from training.models.config import ModelConfig


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder's shape. ``num_kv_heads``: key/value heads of grouped-query attention (None: one per
    query head, multi-head attention); ``tie_embeddings``: the LM head is the input embedding's matrix."""

    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int = 32_000
    num_kv_heads: int | None = None
    tie_embeddings: bool = False

    @property
    def kv_heads(self) -> int:
        """Key/value heads in effect (``num_heads`` when ``num_kv_heads`` is None)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def parameter_count(self) -> int:
        """Parameters of the decoder-only LM (embedding, head unless tied, RMSNorm, SwiGLU MLP, no biases)."""
        return self.num_layers * self.block_parameter_count() + self.root_parameter_count()

    def block_parameter_count(self) -> int:
        """Parameters of one block: attention's query and output projections (h x h each), key and value
        projections (h x kv_heads * head_dim each), the SwiGLU MLP's three, two RMSNorm weights."""
        h = self.hidden_size
        kv_width = self.kv_heads * self.head_dim
        return 2 * h * h + 2 * h * kv_width + 3 * h * self.ffn_hidden_size + 2 * h

    def root_parameter_count(self) -> int:
        """Parameters outside the blocks: the embedding, the LM head (none of its own when tied) and the final
        RMSNorm."""
        matrices = 1 if self.tie_embeddings else 2
        return matrices * self.vocab_size * self.hidden_size + self.hidden_size


NORM_EPS = model_settings.FLAT_NORM_EPS
"""The default epsilon of every RMSNorm of the model (the ``rms_norm_eps`` setting): Llama 3.x's published value
(``rms_norm_eps`` 1e-05 in each Llama 3.x model's config.json), which every Llama preset keeps. An ``init_from``
model's, or another family's named size's, comes from its config.json (``hf_config.architecture``)."""
NORM_EPS_RANGE: tuple[float, float] = hf.NORM_EPS_RANGE
"""The ``rms_norm_eps`` values allowed (a setting, or an ``init_from`` model's config.json)."""

ROPE_SCALINGS: tuple[str, ...] = ("none", "llama3", "linear")
"""``rope_scaling`` values: none, Llama 3.1's frequency-dependent scaling (Hugging Face ``rope_type`` llama3), or
linear (every frequency divided by ``rope_scaling_factor``: Gemma 3's global layers)."""
LLAMA3_ROPE_SETTINGS: tuple[str, ...] = (
    "rope_scaling_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_position_embeddings",
)
"""The four parameters of ``rope_scaling=llama3`` (Hugging Face's ``factor``, ``low_freq_factor``,
``high_freq_factor``, ``original_max_position_embeddings``); ``linear`` takes the first."""
_DEFAULTS: Mapping[str, Any] = {
    "position_encoding": "rope",
    "rms_norm_eps": NORM_EPS,
    "rope_theta": 10000.0,
    "rope_scaling": "none",
    **dict.fromkeys(LLAMA3_ROPE_SETTINGS),
}
"""The contract's defaults of the settings a named size may set besides its shape."""
_SHAPE_NAMES = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "num_kv_heads",
                "tie_embeddings")  # fmt: skip


def _shape_of(size: ModelConfig) -> ModelShape:
    """A named size's dimensions (``num_kv_heads`` None for multi-head attention, as the Llama presets say it)."""
    kv = None if size.num_kv_heads == size.num_heads else size.num_kv_heads
    return ModelShape(size.num_layers, size.hidden_size, size.num_heads, size.ffn_hidden_size, size.vocab_size,
                      num_kv_heads=kv, tie_embeddings=size.tie_embeddings)  # fmt: skip


MODEL_PRESETS: Mapping[str, ModelShape | ModelConfig] = {
    name: size if model_settings.needs_model_config(size) else _shape_of(size)
    for name, size in registry.SIZES.items()
}
"""Every named size of ``training.models`` (``registry.SIZES``: the seed article's Llama-style range, Meta's Llama
3.x, Qwen 2.5 and 3, Mistral 7B v0.3, Gemma 3 12B and 27B, each family's folder citing its published config.json):
a Llama preset by its dimensions (a ``ModelShape``), another family's as its ``ModelConfig`` (the same attribute
names, with its own ``head_dim``, query width, norms and windows)."""
MODEL_PRESET_NAMES: tuple[str, ...] = (*MODEL_PRESETS, "custom")

PRESET_SETTINGS: Mapping[str, Mapping[str, Any]] = {
    name: settings
    for name, size in registry.SIZES.items()
    if (
        settings := {
            key: value
            for key, value in model_settings.to_settings(size).items()
            if key not in _SHAPE_NAMES and value != _DEFAULTS.get(key)
        }
    )
}
"""Settings other than the shape that a preset gives when the request leaves them out: the Llama 3.x presets' RoPE
(``rope_theta`` 500000 and ``rope_scaling`` llama3 with factor 32 for 3.2, 8 for 3.1, as their config.json); the
other families' RMSNorm epsilon, RoPE and ``model_config`` (what the flat settings cannot say of them)."""

POSITION_ENCODINGS: tuple[str, ...] = ("rope", "none")
"""``position_encoding`` values: rotary embeddings (Llama's), or none (NoPE)."""


def flops_per_token(shape: ModelShape | ModelConfig, seq_length: int, lora_parameters: int = 0) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), the PaLM/Megatron convention:
    ``6 * N + 12 * L * H * S`` with N the parameters taking part in matmuls (all but the input embedding, a
    lookup; the LM head counts, also when it is the embedding's matrix). The second term is attention's QK^T and
    AV matmuls, counted in full although the causal mask skips about half (grouped-query attention changes
    neither: every query head attends over the whole head_dim). Used by the trainer's MFU and by
    ``training.plan``'s time estimate.

    LoRA (``lora_parameters`` > 0, the adapters' count, ``lora_parameters``): the frozen weights run their forward
    and input-gradient GEMMs but no weight-gradient GEMM, ``4 * N``, and the adapters all three, ``6 * Na``; the
    attention term is unchanged. About 2/3 of full fine-tuning's, as Megatron-Bridge counts a LoRA run's TFLOP/s
    (NVIDIA-NeMo/Megatron-Bridge issue 2409) and NeMo AutoModel its MFU ((1 + 1 + Na / N) / 3)."""
    if isinstance(shape, ModelConfig):  # any family: the query's width, sliding windows at their window
        return shape.flops_per_token(seq_length, lora_parameters)
    lm_head = shape.vocab_size * shape.hidden_size  # a matmul whether or not it shares the embedding's matrix
    matmul_params = shape.num_layers * shape.block_parameter_count() + shape.hidden_size + lm_head
    attention = 12.0 * shape.num_layers * shape.hidden_size * seq_length
    if lora_parameters:
        return 4.0 * matmul_params + 6.0 * lora_parameters + attention
    return 6.0 * matmul_params + attention


def lora_block_parameter_count(shape: ModelShape | ModelConfig, rank: int, targets: Sequence[str]) -> int:
    """One block's LoRA adapter parameters (``training/trainer/model/lora.py``): rank x (in + out) for each targeted
    projection (``q_proj``, ..., ``down_proj``)."""
    if isinstance(shape, ModelConfig):  # any family: the projections' own shapes
        return shape.lora_block_parameter_count(rank, tuple(targets))
    h, f, kv = shape.hidden_size, shape.ffn_hidden_size, shape.kv_heads * shape.head_dim
    dims = {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h), "gate_proj": (f, h),
            "up_proj": (f, h), "down_proj": (h, f)}  # fmt: skip
    return sum(rank * (dims[t][0] + dims[t][1]) for t in targets)
