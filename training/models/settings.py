"""A ``ModelConfig`` and the contract's flat model settings, both ways: what an ``init_from`` config.json or a
named size gives the settings (``to_settings``: the shape, the position encoding, RoPE, the RMSNorm epsilon and the
family), and the Llama model a run's settings describe when no config.json or named size of another family does
(``training.models.llama3.settings.from_flat_settings``: the custom shapes and the Llama presets, as the trainer
has always built them).

The setting names are the contract's (``num_layers``, ``hidden_size``, ``num_heads``, ``num_kv_heads``,
``ffn_hidden_size``, ``vocab_size``, ``tie_embeddings``, ``position_encoding``, ``rope_theta``, ``rope_scaling``
and its four ``rope_*`` parameters, ``rms_norm_eps``); this module reads and writes them as plain values and imports
nothing of the contract. What they cannot say (another family, an explicit ``head_dim``, biases, windows, ...) a
run's settings carry as ``model_config``, the model's ``ModelConfig.summary()``, derived from the ``init_from``
folder or the named size (``model_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from training.models.config import ModelConfig
from training.models.llama3.settings import DEFAULT_NORM_EPS, FAMILY_NAME, from_flat_settings

LLAMA3_ROPE_SETTINGS: Mapping[str, str] = {
    "rope_scaling_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_original_max_position_embeddings": "original_max_position_embeddings",
}
"""The contract's llama3 RoPE settings -> ``RopeConfig`` fields."""
FLAT_FAMILY = FAMILY_NAME
"""The family of a run's model when its settings carry no ``model_config`` (the model of its flat settings)."""
FLAT_NORM_EPS = DEFAULT_NORM_EPS
"""The flat settings' default RMSNorm epsilon (the ``rms_norm_eps`` setting's)."""


def to_settings(config: ModelConfig) -> dict[str, Any]:
    """The contract settings ``config`` gives (its shape, position encoding, RoPE of its global layers and RMSNorm
    epsilon, in the order and form ``init_from`` has always given them), and ``model_config`` (``config.summary()``)
    when those settings do not describe it whole (``needs_model_config``)."""
    settings = _flat_settings(config)
    if needs_model_config(config):
        settings["model_config"] = config.summary()
    return settings


def _flat_settings(config: ModelConfig) -> dict[str, Any]:
    rope = config.rope
    settings: dict[str, Any] = {
        "num_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "ffn_hidden_size": config.ffn_hidden_size,
        "vocab_size": config.vocab_size,
        "tie_embeddings": config.tie_embeddings,
        "position_encoding": config.position_encoding,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": rope.theta,
        "rope_scaling": rope.scaling,
    }
    for name, key in LLAMA3_ROPE_SETTINGS.items():
        settings[name] = getattr(rope, key) if rope.scaling == "llama3" or key == "factor" else None
    if rope.scaling == "none":
        settings["rope_scaling_factor"] = None
    return settings


def needs_model_config(config: ModelConfig) -> bool:
    """Whether the flat settings leave out part of ``config``: another family than Llama, or a Llama with what
    its settings cannot say (an explicit ``head_dim`` other than hidden / heads, an attention bias). Its maximum
    positions do not count (the trainer's model does not depend on them)."""
    plain = replace(config, max_position_embeddings=None)
    return plain != from_flat_settings(_flat_settings(config))


def model_config(values: Mapping[str, Any]) -> ModelConfig:
    """The model of a run's settings: its ``model_config`` when it has one (an ``init_from`` model or named size
    the flat settings do not describe whole), else the Llama model of its flat settings."""
    summary = values.get("model_config")
    if summary:
        return ModelConfig.from_summary(summary)
    return from_flat_settings(values)
