"""Gemma 3 text's ``config.json`` (``Gemma3ForCausalLM``, ``model_type`` gemma3_text) <-> ``ModelConfig``.

The block (transformers ``models/gemma3/modeling_gemma3.py``): the embedding times sqrt(hidden_size); four
``x * (1 + w)`` RMSNorms per block (computed in fp32) and the same form on query and key per head before RoPE;
GeGLU with the tanh GELU (``hidden_activation`` gelu_pytorch_tanh); scores scaled by ``query_pre_attn_scalar **
-0.5``; local layers (``sliding_attention``) within ``sliding_window`` tokens with their own RoPE base, global ones
(``full_attention``) with theirs and, in the larger models, linear RoPE scaling; tied embeddings.

Which layers are local: ``layer_types``, else ``sliding_window_pattern`` (every n-th layer global, default 6). RoPE:
transformers 5's ``rope_parameters`` ({"full_attention": {...}, "sliding_attention": {...}}), or transformers 4's
``rope_theta`` (global, default 1000000), ``rope_local_base_freq`` (local, default 10000) and ``rope_scaling`` (the
global layers'). Other defaults: ``Gemma3TextConfig`` 5.x (``head_dim`` 256, ``query_pre_attn_scalar`` 256,
``sliding_window`` 4096, ``rms_norm_eps`` 1e-6, tied, 131072 positions, ``num_key_value_heads`` 4 when absent).
Refused: Gemma 2's soft-capping (``attn_logit_softcapping`` / ``final_logit_softcapping`` set), bidirectional
attention (EmbeddingGemma), another activation; the multimodal ``Gemma3ForConditionalGeneration`` (model_type gemma3)
is refused by the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.models import hf
from training.models.config import AttentionBias, ModelConfig, ModelConfigError, RopeConfig

ARCHITECTURE = "Gemma3ForCausalLM"
MODEL_TYPE = "gemma3_text"
DEFAULTS: Mapping[str, Any] = {
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "hidden_activation": "gelu_pytorch_tanh",
    "num_key_value_heads": 4,
    "head_dim": 256,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "use_bidirectional_attention": False,
}
GLOBAL_THETA = 1_000_000.0
LOCAL_THETA = 10_000.0
HF_LAYER_TYPES: Mapping[str, str] = {"full_attention": "full", "sliding_attention": "sliding"}


def read(config: Mapping[str, Any]) -> ModelConfig:
    """The ``ModelConfig`` of a ``Gemma3ForCausalLM`` config.json."""
    present = "num_key_value_heads" in config
    heads = {"num_key_value_heads": config.get("num_attention_heads")} if present else {}
    reader = hf.Reader(config, {**DEFAULTS, **heads})
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is not None:
            raise ModelConfigError(
                key, f"{config[key]!r}: Gemma 2's soft-capping is not implemented; supported: null (Gemma 3)"
            )
    reader.choice("use_bidirectional_attention", (False,), "the trainer's decoder is causal")
    reader.choice("hidden_activation", ("gelu_pytorch_tanh",), "the Gemma 3 MLP is GeGLU with the tanh GELU")
    sizes = reader.sizes()
    bias = reader.bool("attention_bias")
    full, local = _ropes(config)
    return ModelConfig(
        family="gemma3",
        head_dim=reader.int("head_dim"),
        activation="gelu_tanh",
        norm="rmsnorm_unit_offset",
        norm_placement="sandwich",
        attention_bias=AttentionBias(bias, bias, bias, bias),
        qk_norm=True,
        query_pre_attn_scalar=reader.number("query_pre_attn_scalar"),
        layer_types=_layer_types(config, reader, sizes["num_layers"]),
        sliding_window=reader.int("sliding_window"),
        rope=full,
        local_rope=local,
        scale_embeddings=True,
        **sizes,
    )


def _layer_types(config: Mapping[str, Any], reader: hf.Reader, layers: int) -> tuple[str, ...]:
    given = config.get("layer_types")
    if given is None:
        pattern = reader.int("sliding_window_pattern")
        return tuple("sliding" if (i + 1) % pattern else "full" for i in range(layers))
    if not isinstance(given, list) or len(given) != layers or any(t not in HF_LAYER_TYPES for t in given):
        raise ModelConfigError(
            "layer_types",
            f"must list one of {', '.join(HF_LAYER_TYPES)} for each of the {layers} layers; got {given!r}",
        )
    return tuple(HF_LAYER_TYPES[t] for t in given)


def _ropes(config: Mapping[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """The global and the local layers' RoPE (transformers' ``Gemma3TextConfig.convert_rope_params_to_dict``:
    ``rope_parameters`` per layer type, ``rope_scaling`` on the global layers, ``rope_theta`` and
    ``rope_local_base_freq`` where those leave the base out)."""
    parameters = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    if not isinstance(parameters, Mapping) or not set(parameters) <= set(HF_LAYER_TYPES):
        raise ModelConfigError(
            "rope_parameters",
            f"must be an object with {' and '.join(HF_LAYER_TYPES)} entries; got {parameters!r}",
        )
    if not isinstance(scaling, Mapping):
        raise ModelConfigError("rope_scaling", f"must be an object or null; got {scaling!r}")
    full = dict(parameters.get("full_attention") or {})
    for key in set(full) & set(scaling) - {"type", "rope_type"}:
        if full[key] != scaling[key]:
            raise ModelConfigError(
                "rope_parameters",
                f"full_attention {key}={full[key]!r} disagrees with rope_scaling's {key}={scaling[key]!r}; give one",
            )
    full |= scaling
    local = dict(parameters.get("sliding_attention") or {})
    full_theta = full.get("rope_theta", config.get("rope_theta") or GLOBAL_THETA)
    local_theta = local.get("rope_theta", config.get("rope_local_base_freq") or LOCAL_THETA)
    return (
        hf.rope_config(full, full_theta, "rope_parameters" if parameters else "rope_scaling"),
        hf.rope_config(local, local_theta, "rope_parameters"),
    )


def write(model: ModelConfig) -> dict[str, Any]:
    """The architecture part of the ``Gemma3ForCausalLM`` config.json of ``model``: the RoPE and the layer pattern
    in both transformers 4's keys and 5's."""
    hf.require(
        model,
        "Gemma 3",
        activation="gelu_tanh",
        norm="rmsnorm_unit_offset",
        norm_placement="sandwich",
        qk_norm=True,
        scale_embeddings=True,
        position_encoding="rope",
        attention_bias=(AttentionBias(), AttentionBias(True, True, True, True)),
    )
    full, local = model.rope, model.local_rope or model.rope
    scaling = hf.rope_keys(full)["rope_scaling"]
    kinds = {kind: name for name, kind in HF_LAYER_TYPES.items()}
    scalar = model.query_pre_attn_scalar or model.head_dim
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        **hf.shape_keys(model),
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": model.norm_eps,
        "query_pre_attn_scalar": int(scalar) if float(scalar).is_integer() else scalar,
        "sliding_window": model.sliding_window,
        "layer_types": [kinds[kind] for kind in model.layer_types],
        "rope_theta": full.theta,
        "rope_local_base_freq": local.theta,
        "rope_scaling": scaling,
        "rope_parameters": {
            "full_attention": hf.rope_parameters(full),
            "sliding_attention": hf.rope_parameters(local),
        },
        "attention_bias": model.attention_bias.any,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "use_bidirectional_attention": False,
        "tie_word_embeddings": model.tie_embeddings,
    }
    pattern = _pattern(model.layer_types)
    if pattern is not None:
        out["sliding_window_pattern"] = pattern
    if model.max_position_embeddings is not None:
        out["max_position_embeddings"] = model.max_position_embeddings
    return out


def _pattern(kinds: tuple[str, ...]) -> int | None:
    """``sliding_window_pattern`` n when every n-th layer (and only those) is global, for transformers 4 readers
    that predate ``layer_types``; None for another pattern."""
    for n in range(1, len(kinds) + 1):
        if kinds == tuple("sliding" if (i + 1) % n else "full" for i in range(len(kinds))):
            return n
    return None
