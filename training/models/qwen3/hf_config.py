"""Qwen 3 dense's ``config.json`` (``Qwen3ForCausalLM``, ``model_type`` qwen3) <-> ``ModelConfig``.

Defaults: transformers' ``Qwen3Config`` (``models/qwen3/configuration_qwen3.py``, 5.x): ``head_dim`` 128 (explicit:
Qwen3-32B's 64 heads x 128 are not its hidden 5120), ``rms_norm_eps`` 1e-6, ``rope_theta`` 10000, untied, 32768
positions, ``attention_bias`` false (true: a bias on all four projections), ``num_key_value_heads`` 32 when absent
(the heads when null). Every layer has the query/key RMSNorm. Refused: ``use_sliding_window`` true, another
activation than SiLU; the mixture-of-experts ``qwen3_moe`` is another model_type (refused by the registry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.models import hf
from training.models.config import AttentionBias, ModelConfig
from training.models.qwen2.hf_config import read_plain_qwen, write_plain_qwen

ARCHITECTURE = "Qwen3ForCausalLM"
MODEL_TYPE = "qwen3"
DEFAULTS: Mapping[str, Any] = {
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
    "use_sliding_window": False,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "attention_bias": False,
}


def read(config: Mapping[str, Any]) -> ModelConfig:
    """The ``ModelConfig`` of a ``Qwen3ForCausalLM`` config.json."""
    reader, values = read_plain_qwen(config, DEFAULTS)
    bias = reader.bool("attention_bias")
    return ModelConfig(
        family="qwen3",
        head_dim=reader.int("head_dim"),
        attention_bias=AttentionBias(bias, bias, bias, bias),
        qk_norm=True,
        **values,
    )


def write(model: ModelConfig) -> dict[str, Any]:
    """The architecture part of the ``Qwen3ForCausalLM`` config.json of ``model``."""
    hf.require_plain(
        model,
        "Qwen 3",
        qk_norm=True,
        attention_bias=(AttentionBias(), AttentionBias(True, True, True, True)),
    )
    return write_plain_qwen(model, ARCHITECTURE, MODEL_TYPE) | {"attention_bias": model.attention_bias.any}
