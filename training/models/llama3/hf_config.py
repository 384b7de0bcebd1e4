"""Llama's ``config.json`` (``LlamaForCausalLM``, ``model_type`` llama) <-> ``ModelConfig``.

The defaults are transformers' ``LlamaConfig`` ones (``models/llama/configuration_llama.py``, 5.x): a key absent
or null means ``rms_norm_eps`` 1e-6, ``rope_theta`` 10000, untied, 2048 positions, ``head_dim`` hidden / heads,
``num_key_value_heads`` = ``num_attention_heads``. Refused: another activation than SiLU, ``mlp_bias``,
``pretraining_tp`` other than 1, RoPE types other than default, linear and llama3.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.models import hf
from training.models.config import AttentionBias, ModelConfig

ARCHITECTURE = "LlamaForCausalLM"
MODEL_TYPE = "llama"
DEFAULTS: Mapping[str, Any] = {
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "pretraining_tp": 1,
}


def read(config: Mapping[str, Any]) -> ModelConfig:
    """The ``ModelConfig`` of a ``LlamaForCausalLM`` config.json."""
    reader = hf.Reader(config, {**DEFAULTS, "num_key_value_heads": config.get("num_attention_heads")})
    reader.choice("hidden_act", ("silu",), "the Llama block's MLP is SwiGLU")
    reader.choice("mlp_bias", (False,), "the MLP's projections have no bias")
    reader.choice("pretraining_tp", (1,), "tensor-parallel slicing of the pretraining is not implemented")
    sizes = reader.sizes()
    bias = reader.bool("attention_bias")
    head_dim = reader.optional_int("head_dim") or sizes["hidden_size"] // sizes["num_heads"]
    return ModelConfig(
        family="llama3",
        head_dim=head_dim,
        attention_bias=AttentionBias(bias, bias, bias, bias),
        rope=hf.read_rope(config, 10000.0),
        **sizes,
    )


def write(model: ModelConfig) -> dict[str, Any]:
    """The architecture part of the ``LlamaForCausalLM`` config.json of ``model`` (both RoPE spellings)."""
    hf.require_plain(model, "Llama", attention_bias=(AttentionBias(), AttentionBias(True, True, True, True)))
    bias = model.attention_bias.any
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        **hf.shape_keys(model),
        "hidden_act": "silu",
        "rms_norm_eps": model.norm_eps,
        **hf.rope_keys(model.rope),
        "attention_bias": bias,
        "mlp_bias": False,
        "tie_word_embeddings": model.tie_embeddings,
    }
    if model.max_position_embeddings is not None:
        out["max_position_embeddings"] = model.max_position_embeddings
    return out
