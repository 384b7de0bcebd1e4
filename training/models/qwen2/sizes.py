"""Qwen 2.5's named sizes, as their published config.json give them.

https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json and .../Qwen2.5-72B/blob/main/config.json (checked
against two copies each, since huggingface.co cannot be read from here: litgpt's ``litgpt/config.py``, whose
entries cite those URLs, and copies of the files in derived Hugging Face repositories that name the source model):
``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
``vocab_size`` 152064, ``rms_norm_eps`` (7B: 1e-6, 72B: 1e-5), ``rope_theta`` 1000000, ``max_position_embeddings``
131072, untied, ``use_sliding_window`` false. The Instruct models have the same architecture (their config.json
say 32768 positions; the weights are the same shape).
"""

from __future__ import annotations

from collections.abc import Mapping

from training.models.config import ModelConfig, RopeConfig
from training.models.qwen2.hf_config import BIAS


def _size(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, eps: float) -> ModelConfig:
    return ModelConfig(
        family="qwen2",
        vocab_size=152_064,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hidden // heads,
        ffn_hidden_size=ffn,
        norm_eps=eps,
        attention_bias=BIAS,
        rope=RopeConfig(theta=1_000_000.0),
        max_position_embeddings=131_072,
    )


SIZES: Mapping[str, ModelConfig] = {
    "qwen2.5-7b": _size(28, 3584, 28, 4, 18944, 1e-6),
    "qwen2.5-72b": _size(80, 8192, 64, 8, 29568, 1e-5),
}
