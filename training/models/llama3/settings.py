"""The Llama model of the contract's flat model settings (``num_layers``, ``hidden_size``, ``num_heads``,
``num_kv_heads``, ``ffn_hidden_size``, ``vocab_size``, ``tie_embeddings``, ``position_encoding``, ``rope_theta``,
``rope_scaling`` and its four ``rope_*`` parameters, ``rms_norm_eps``): every custom shape and Llama preset, as the
trainer has always built them. ``training.models.settings`` reads a run's model through it when the run carries no
``model_config`` of another family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.models.config import ModelConfig, RopeConfig
from training.models.llama3.sizes import NORM_EPS

FAMILY_NAME = "llama3"
"""The family of every model the flat settings describe (this folder's)."""
DEFAULT_NORM_EPS = NORM_EPS
"""The ``rms_norm_eps`` setting's default: Llama 3.x's published epsilon."""
LEGACY_NORM_EPS = 1e-5
"""The epsilon of a run saved before ``rms_norm_eps`` was a setting (every such run used Llama 3's 1e-5)."""


def from_flat_settings(values: Mapping[str, Any]) -> ModelConfig:
    """The Llama model of a run's settings (``parse_hyperparameters``' result, or a saved run's config; one saved
    before grouped-query attention, tying or ``rms_norm_eps`` existed has none of them): ``head_dim`` = hidden /
    heads, no bias, pre-norm RMSNorm, SwiGLU, RoPE with the settings' base and scaling (or none)."""
    heads = int(values["num_heads"])
    rope = RopeConfig(float(values.get("rope_theta") or 10000.0))
    if values.get("rope_scaling", "none") == "llama3":
        rope = RopeConfig(
            rope.theta,
            "llama3",
            float(values["rope_scaling_factor"]),
            float(values["rope_low_freq_factor"]),
            float(values["rope_high_freq_factor"]),
            int(values["rope_original_max_position_embeddings"]),
        )
    elif values.get("rope_scaling", "none") == "linear":
        rope = RopeConfig(rope.theta, "linear", float(values["rope_scaling_factor"]))
    eps = values.get("rms_norm_eps")
    return ModelConfig(
        family=FAMILY_NAME,
        vocab_size=int(values["vocab_size"]),
        hidden_size=int(values["hidden_size"]),
        num_layers=int(values["num_layers"]),
        num_heads=heads,
        num_kv_heads=int(values.get("num_kv_heads") or heads),
        head_dim=int(values["hidden_size"]) // heads,
        ffn_hidden_size=int(values["ffn_hidden_size"]),
        norm_eps=float(LEGACY_NORM_EPS if eps is None else eps),
        position_encoding=str(values.get("position_encoding") or "rope"),
        rope=rope,
        tie_embeddings=bool(values.get("tie_embeddings") or False),
    )
