"""Qwen 2 / 2.5's ``config.json`` (``Qwen2ForCausalLM``, ``model_type`` qwen2) <-> ``ModelConfig``.

Defaults: transformers' ``Qwen2Config`` (``models/qwen2/configuration_qwen2.py``, 5.x): ``rms_norm_eps`` 1e-6,
``rope_theta`` 10000, untied, 32768 positions, ``head_dim`` hidden / heads unless given (the attention reads
``getattr(config, "head_dim", ...)``), ``num_key_value_heads`` 32 when absent (the heads when null). The query,
key and value projections always have a bias (``attention_bias`` is not read by this class). Refused:
``use_sliding_window`` true (and any ``sliding_attention`` layer), another activation than SiLU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.models import hf
from training.models.config import AttentionBias, ModelConfig, ModelConfigError

ARCHITECTURE = "Qwen2ForCausalLM"
MODEL_TYPE = "qwen2"
DEFAULTS: Mapping[str, Any] = {
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
    "use_sliding_window": False,
    "num_key_value_heads": 32,
}
BIAS = AttentionBias(q=True, k=True, v=True, o=False)


def read_plain_qwen(
    config: Mapping[str, Any], defaults: Mapping[str, Any]
) -> tuple[hf.Reader, dict[str, Any]]:
    """What Qwen 2 and Qwen 3 read alike: the sizes, SiLU, no sliding window (Qwen's ``use_sliding_window``
    layers are not implemented), RoPE with base 10000 by default."""
    kv_default = config.get("num_attention_heads") if "num_key_value_heads" in config else None
    reader = hf.Reader(config, {**defaults, **({"num_key_value_heads": kv_default} if kv_default else {})})
    reader.choice("hidden_act", ("silu",), "the Qwen block's MLP is SwiGLU")
    reader.choice("use_sliding_window", (False,), "Qwen's sliding-window layers are not implemented")
    layer_types = config.get("layer_types") or []
    if "sliding_attention" in layer_types:
        raise ModelConfigError(
            "layer_types",
            "has sliding_attention layers, which are not implemented; supported: full_attention",
        )
    values = reader.sizes() | {"rope": hf.read_rope(config, 10000.0)}
    return reader, values


def read(config: Mapping[str, Any]) -> ModelConfig:
    """The ``ModelConfig`` of a ``Qwen2ForCausalLM`` config.json."""
    reader, values = read_plain_qwen(config, DEFAULTS)
    head_dim = reader.optional_int("head_dim") or values["hidden_size"] // values["num_heads"]
    return ModelConfig(family="qwen2", head_dim=head_dim, attention_bias=BIAS, **values)


def write_plain_qwen(model: ModelConfig, architecture: str, model_type: str) -> dict[str, Any]:
    """The keys Qwen 2 and Qwen 3 write alike (no sliding window: ``use_sliding_window`` false)."""
    out: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        **hf.shape_keys(model),
        "hidden_act": "silu",
        "rms_norm_eps": model.norm_eps,
        **hf.rope_keys(model.rope),
        "tie_word_embeddings": model.tie_embeddings,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": model.num_layers,
    }
    if model.max_position_embeddings is not None:
        out["max_position_embeddings"] = model.max_position_embeddings
    return out


def write(model: ModelConfig) -> dict[str, Any]:
    """The architecture part of the ``Qwen2ForCausalLM`` config.json of ``model``."""
    hf.require_plain(model, "Qwen 2", attention_bias=BIAS)
    return write_plain_qwen(model, ARCHITECTURE, MODEL_TYPE)
