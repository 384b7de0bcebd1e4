"""Llama 3's named sizes: the seed article's Llama-style range (``1b`` ... ``64b``: 32,000-token vocabulary,
multi-head attention, RoPE base 10000) and Meta's Llama 3.1 / 3.2 exactly as their config.json give them.

Llama 3.x values (docs/open-weights.md says how each was checked against two sources): ``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``, ``vocab_size``
128256, ``rms_norm_eps`` 1e-5, ``rope_theta`` 500000 with ``rope_scaling`` llama3 (factor 8 for 3.1, 32 for 3.2;
low 1, high 4, original context 8192), ``max_position_embeddings`` 131072 and ``tie_word_embeddings`` (3.2: yes) of
https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json, .../Llama-3.1-70B, .../Llama-3.2-1B and
.../Llama-3.2-3B.
"""

from __future__ import annotations

from collections.abc import Mapping

from training.models.config import ModelConfig, RopeConfig

NORM_EPS = 1e-5
"""Llama 3.x's ``rms_norm_eps``, which every size here keeps."""


def _llama3_rope(factor: float) -> RopeConfig:
    return RopeConfig(500_000.0, "llama3", factor, 1.0, 4.0, 8192)


def _size(layers: int, hidden: int, heads: int, ffn: int, **rest) -> ModelConfig:
    """A size: ``head_dim`` = hidden / heads, and a Llama 3.x size's vocabulary and RoPE when ``rest`` gives them."""
    values = {"vocab_size": 32_000, "num_kv_heads": heads, "norm_eps": NORM_EPS} | rest
    return ModelConfig(
        family="llama3",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        ffn_hidden_size=ffn,
        head_dim=hidden // heads,
        **values,
    )


def _meta(layers: int, hidden: int, heads: int, ffn: int, factor: float, tied: bool) -> ModelConfig:
    return _size(
        layers,
        hidden,
        heads,
        ffn,
        vocab_size=128_256,
        num_kv_heads=8,
        tie_embeddings=tied,
        rope=_llama3_rope(factor),
        max_position_embeddings=131_072,
    )


SIZES: Mapping[str, ModelConfig] = {
    "1b": _size(16, 2048, 16, 5632),
    "8b": _size(32, 4096, 32, 14336),
    "14b": _size(40, 5120, 40, 17920),
    "32b": _size(64, 6144, 48, 20480),
    "64b": _size(80, 8192, 64, 22016),
    "llama3.2-1b": _meta(16, 2048, 32, 8192, 32.0, tied=True),
    "llama3.2-3b": _meta(28, 3072, 24, 8192, 32.0, tied=True),
    "llama3.1-8b": _meta(32, 4096, 32, 14336, 8.0, tied=False),
    "llama3.1-70b": _meta(80, 8192, 64, 28672, 8.0, tied=False),
}
