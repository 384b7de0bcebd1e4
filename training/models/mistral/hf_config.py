"""Mistral's ``config.json`` (``MistralForCausalLM``, ``model_type`` mistral) <-> ``ModelConfig``.

Defaults: transformers' ``MistralConfig`` (``models/mistral/configuration_mistral.py``, 5.x): ``sliding_window``
4096 when absent (null: none; a window applies to every layer, ``modeling_mistral.py``), ``head_dim`` hidden /
heads when absent or null, ``rms_norm_eps`` 1e-6, ``rope_theta`` 10000, untied, 131072 positions,
``num_key_value_heads`` 8 when absent (the heads when null). The class has no bias and ignores ``layer_types``.
Refused: another activation than SiLU; the mixture-of-experts Mixtral is another model_type (refused by the
registry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.models import hf
from training.models.config import ModelConfig, ModelConfigError

ARCHITECTURE = "MistralForCausalLM"
MODEL_TYPE = "mistral"
DEFAULTS: Mapping[str, Any] = {
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "hidden_act": "silu",
    "num_key_value_heads": 8,
}
DEFAULT_WINDOW = 4096
"""``MistralConfig.sliding_window`` when config.json has no such key (Mistral 7B v0.1's; v0.2 on: null)."""


def read(config: Mapping[str, Any]) -> ModelConfig:
    """The ``ModelConfig`` of a ``MistralForCausalLM`` config.json."""
    present = "num_key_value_heads" in config
    reader = hf.Reader(
        config,
        {**DEFAULTS, **({"num_key_value_heads": config.get("num_attention_heads")} if present else {})},
    )
    reader.choice("hidden_act", ("silu",), "the Mistral block's MLP is SwiGLU")
    sizes = reader.sizes()
    window = reader.optional_int("sliding_window") if "sliding_window" in config else DEFAULT_WINDOW
    head_dim = reader.optional_int("head_dim") or sizes["hidden_size"] // sizes["num_heads"]
    return ModelConfig(
        family="mistral",
        head_dim=head_dim,
        layer_types=("full" if window is None else "sliding",) * sizes["num_layers"],
        sliding_window=window,
        rope=hf.read_rope(config, 10000.0),
        **sizes,
    )


def write(model: ModelConfig) -> dict[str, Any]:
    """The architecture part of the ``MistralForCausalLM`` config.json of ``model`` (``sliding_window`` null, or
    the window of every layer)."""
    hf.require_plain(model, "Mistral", windowed=True)
    if len(set(model.layer_types)) > 1:
        raise ModelConfigError(
            "layer_types",
            "mixes full and sliding-window layers, which Mistral's class cannot express (one window for all)",
        )
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        **hf.shape_keys(model),
        "hidden_act": "silu",
        "rms_norm_eps": model.norm_eps,
        **hf.rope_keys(model.rope),
        "sliding_window": model.window(0),
        "tie_word_embeddings": model.tie_embeddings,
    }
    if model.max_position_embeddings is not None:
        out["max_position_embeddings"] = model.max_position_embeddings
    return out
