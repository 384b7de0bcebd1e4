"""Qwen 3's named sizes (dense), as their published config.json give them.

https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json and .../Qwen3-32B/blob/main/config.json (checked against
two copies each, since huggingface.co cannot be read from here: litgpt's ``litgpt/config.py``, whose entries cite
those URLs, and copies of the files in Hugging Face repositories, e.g. the commit "Copy config.json from
Qwen/Qwen3-8B" of thejaminator/qwen-hook-layer-9):
``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` 8, ``head_dim`` 128,
``intermediate_size``, ``vocab_size`` 151936, ``rms_norm_eps`` 1e-6, ``rope_theta`` 1000000,
``max_position_embeddings`` 40960, untied, no attention bias.
"""

from __future__ import annotations

from collections.abc import Mapping

from training.models.config import ModelConfig, RopeConfig


def _size(layers: int, hidden: int, heads: int, ffn: int) -> ModelConfig:
    return ModelConfig(
        family="qwen3",
        vocab_size=151_936,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=8,
        head_dim=128,
        ffn_hidden_size=ffn,
        norm_eps=1e-6,
        qk_norm=True,
        rope=RopeConfig(theta=1_000_000.0),
        max_position_embeddings=40_960,
    )


SIZES: Mapping[str, ModelConfig] = {
    "qwen3-8b": _size(36, 4096, 32, 12288),
    "qwen3-32b": _size(64, 5120, 64, 25600),
}
