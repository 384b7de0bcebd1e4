"""Mistral's named size: Mistral 7B v0.3, as its published config.json gives it.

https://huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json (checked against litgpt's
``litgpt/config.py``, whose entry cites that URL, and copies of the file in derived Hugging Face repositories that
name it as their source, e.g. unsloth/mistral-7b-v0.3): ``hidden_size`` 4096, ``num_hidden_layers`` 32,
``num_attention_heads`` 32, ``num_key_value_heads`` 8, ``intermediate_size`` 14336, ``vocab_size`` 32768,
``rms_norm_eps`` 1e-5, ``rope_theta`` 1000000, ``sliding_window`` null, ``max_position_embeddings`` 32768, untied.
The Instruct v0.3 model has the same architecture.
"""

from __future__ import annotations

from collections.abc import Mapping

from training.models.config import ModelConfig, RopeConfig

SIZES: Mapping[str, ModelConfig] = {
    "mistral-7b-v0.3": ModelConfig(
        family="mistral",
        vocab_size=32_768,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        ffn_hidden_size=14336,
        norm_eps=1e-5,
        rope=RopeConfig(theta=1_000_000.0),
        max_position_embeddings=32_768,
    ),
}
