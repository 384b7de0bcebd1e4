"""Reading and writing the parts of a Hugging Face ``config.json`` that the families share: the decoder's sizes,
the RMSNorm epsilon, tying, the maximum positions and RoPE (the transformers 4 spelling, ``rope_theta`` and
``rope_scaling`` whose type is ``rope_type`` or the older ``type``, and the transformers 5 one, ``rope_parameters``
holding ``rope_theta`` too), and the refusals every family makes (a quantized checkpoint, a mixture of experts, a
vision-language wrapper). Each family's folder reads its own keys with these.

A key given as ``null`` means the class's default, as in transformers (e.g. ``num_key_value_heads: null``).
Every refusal is a ``ModelConfigError`` naming the key and what is supported.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from typing import Any

from training.models.config import ModelConfig, ModelConfigError, RopeConfig

NORM_EPS_RANGE: tuple[float, float] = (1e-12, 1e-2)
"""The RMSNorm epsilons accepted (a setting, or a config.json's ``rms_norm_eps``)."""
REQUIRED = object()
"""A key with no default: its absence is refused."""
ROPE_TYPES: Mapping[str, str] = {"default": "none", "linear": "linear", "llama3": "llama3"}
"""Hugging Face's RoPE types the trainer implements, and their ``RopeConfig.scaling``."""
_LLAMA3_KEYS: tuple[str, ...] = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)
EXPERT_KEYS: tuple[str, ...] = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_intermediate_size",
)
"""Keys that make a config.json a mixture of experts (Mixtral, Qwen MoE, DeepSeek)."""
WRAPPER_KEYS: tuple[str, ...] = ("text_config", "vision_config", "audio_config")
"""Keys of a multimodal wrapper (a vision-language model's config.json nests its decoder in ``text_config``)."""


class Reader:
    """One family's view of a config.json: each key read with the family's transformers default (``defaults``)
    when absent or null, checked, and refused by name."""

    def __init__(self, config: Mapping[str, Any], defaults: Mapping[str, Any]):
        self.config = config
        self.defaults = defaults

    def raw(self, key: str) -> Any:
        """The value as given, or the family's default when absent or null (``REQUIRED``: none)."""
        value = self.config.get(key)
        return self.defaults.get(key, REQUIRED) if value is None else value

    def int(self, key: str) -> int:
        value = self.raw(key)
        if value is REQUIRED:
            raise ModelConfigError(key, "is missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelConfigError(key, f"must be a positive integer; got {value!r}")
        return value

    def optional_int(self, key: str) -> builtins.int | None:
        """A positive integer, or None when absent or null with no default (a window, a maximum)."""
        value = self.raw(key)
        return None if value is REQUIRED or value is None else self.int(key)

    def bool(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise ModelConfigError(key, f"must be true or false; got {value!r}")
        return value

    def number(self, key: str) -> builtins.float:
        value = self.raw(key)
        if value is REQUIRED:
            raise ModelConfigError(key, "is missing")
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ModelConfigError(key, f"must be a positive number; got {value!r}")
        return float(value)

    def norm_eps(self) -> builtins.float:
        """``rms_norm_eps`` within ``NORM_EPS_RANGE``."""
        eps = self.raw("rms_norm_eps")
        low, high = NORM_EPS_RANGE
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not low <= eps <= high:
            raise ModelConfigError("rms_norm_eps", f"must be a number from {low:g} to {high:g}; got {eps!r}")
        return float(eps)

    def choice(self, key: str, allowed: tuple[Any, ...], why: str) -> Any:
        """The value, refused unless one of ``allowed`` (``why``: what the trainer's block is instead)."""
        value = self.raw(key)
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            shown = ", ".join(json.dumps(a) for a in allowed)
            raise ModelConfigError(key, f"{json.dumps(value)} is not supported ({why}); supported: {shown}")
        return value

    def sizes(self) -> dict[str, Any]:
        """The decoder's sizes every family names the same way, in ``ModelConfig``'s terms (``head_dim`` is the
        family's to read: its default differs)."""
        return {
            "num_layers": self.int("num_hidden_layers"),
            "hidden_size": self.int("hidden_size"),
            "num_heads": self.int("num_attention_heads"),
            "num_kv_heads": self.int("num_key_value_heads"),
            "ffn_hidden_size": self.int("intermediate_size"),
            "vocab_size": self.int("vocab_size"),
            "norm_eps": self.norm_eps(),
            "tie_embeddings": self.bool("tie_word_embeddings"),
            "max_position_embeddings": self.optional_int("max_position_embeddings"),
        }


def require(model: ModelConfig, title: str, **expected: Any) -> None:
    """Refuse to write ``model`` as a config.json of a class that cannot express it: each keyword names a
    ``ModelConfig`` field and the value (or tuple of values) the class has."""
    for name, allowed in expected.items():
        value = getattr(model, name)
        if value not in (allowed if isinstance(allowed, tuple) else (allowed,)):
            raise ModelConfigError(
                name, f"{value!r} cannot be written as {title}'s config.json (its class has {allowed!r})"
            )


def require_plain(model: ModelConfig, title: str, *, windowed: bool = False, **expected: Any) -> None:
    """``require`` with the plain pre-norm decoder (Llama, Qwen, Mistral) as the default: RMSNorm before attention
    and before the MLP, SwiGLU, no query/key norm, RoPE with one base, no embedding scale, no scaled scores, full
    attention on every layer (``windowed``: or the sliding window on some); ``expected`` overrides or adds fields."""
    plain: dict[str, Any] = {
        "norm": "rmsnorm",
        "norm_placement": "pre",
        "activation": "silu",
        "qk_norm": False,
        "position_encoding": "rope",
        "local_rope": None,
        "scale_embeddings": False,
        "query_pre_attn_scalar": None,
    }
    require(model, title, **(plain | expected))
    if "sliding" in model.layer_types and not windowed:
        raise ModelConfigError(
            "layer_types", f"has sliding-window layers, which {title}'s class cannot express"
        )


def refuse_unsupported_kinds(config: Mapping[str, Any], supported: str) -> None:
    """Refuse what no family here is: a quantized checkpoint, a mixture of experts, a multimodal wrapper, RoPE
    on part of each head."""
    if config.get("quantization_config") is not None:
        method = (config["quantization_config"] or {}).get("quant_method", "?")
        raise ModelConfigError(
            "quantization_config",
            f"(quant_method {method!r}) is not supported: a quantized checkpoint cannot be trained here; supported: "
            "the unquantized safetensors (bf16, fp16 or fp32)",
        )
    factor = config.get("partial_rotary_factor")
    if factor not in (None, 1, 1.0):
        raise ModelConfigError(
            "partial_rotary_factor", f"{factor!r} is not supported (1.0 only: all of head_dim)"
        )
    for key in EXPERT_KEYS:
        if config.get(key):
            raise ModelConfigError(
                key, f"{config[key]!r}: mixture-of-experts models are not supported; supported: {supported}"
            )
    for key in WRAPPER_KEYS:
        if config.get(key) is not None:
            raise ModelConfigError(
                key,
                f"is present: multimodal (vision-language) models are not supported; supported: {supported} "
                "(text-only decoders)",
            )


def read_rope(config: Mapping[str, Any], default_theta: float, where: str = "") -> RopeConfig:
    """The RoPE of a flat config.json (``rope_theta`` + ``rope_scaling``, or ``rope_parameters``). Both given:
    they must agree (transformers would take ``rope_scaling``'s and silently drop the other's)."""
    parameters = _object(config, "rope_parameters")
    scaling = _object(config, "rope_scaling")
    for key in set(parameters) & set(scaling) - {"type", "rope_type"}:
        if parameters[key] != scaling[key]:
            raise ModelConfigError(
                "rope_parameters",
                f"{key}={parameters[key]!r} disagrees with rope_scaling's {key}={scaling[key]!r}; give one",
            )
    merged = {**scaling, **parameters}
    theta = next(
        (t for t in (merged.get("rope_theta"), config.get("rope_theta")) if t is not None), default_theta
    )
    return rope_config(merged, theta, where or ("rope_parameters" if parameters else "rope_scaling"))


def rope_config(parameters: Mapping[str, Any], theta: Any, where: str) -> RopeConfig:
    """A ``RopeConfig`` from one set of Hugging Face RoPE parameters (``rope_type`` or ``type`` and its keys)."""
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ModelConfigError(
            where, f"has RoPE type {rope_type!r}, which is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    factor = parameters.get("partial_rotary_factor", 1.0)
    if factor != 1.0:
        raise ModelConfigError(
            "partial_rotary_factor", f"{factor!r} is not supported (1.0 only: all of head_dim)"
        )
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise ModelConfigError("rope_theta", f"must be a positive number; got {theta!r}")
    scaling = ROPE_TYPES[rope_type]
    wanted = {"none": (), "linear": ("factor",), "llama3": _LLAMA3_KEYS}[scaling]
    missing = [key for key in wanted if parameters.get(key) is None]
    if missing:
        raise ModelConfigError(where, f"has RoPE type {rope_type}, which needs {', '.join(missing)}")
    values: dict[str, Any] = {}
    for key in wanted:
        value = parameters[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ModelConfigError(where, f"has {key} {value!r}; it must be a positive number")
        values[key] = int(value) if key == "original_max_position_embeddings" else float(value)
    return RopeConfig(theta=float(theta), scaling=scaling, **values)


def _object(config: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise ModelConfigError(key, f"must be an object or null; got {value!r}")
    return dict(value or {})


def rope_parameters(rope: RopeConfig) -> dict[str, Any]:
    """``rope`` as Hugging Face's parameters (``rope_type`` and its keys, ``rope_theta`` included)."""
    rope_type = next(name for name, scaling in ROPE_TYPES.items() if scaling == rope.scaling)
    out: dict[str, Any] = {"rope_type": rope_type}
    for key in {"none": (), "linear": ("factor",), "llama3": _LLAMA3_KEYS}[rope.scaling]:
        out[key] = getattr(rope, key)
    return out | {"rope_theta": rope.theta}


def rope_keys(rope: RopeConfig) -> dict[str, Any]:
    """A flat config.json's RoPE keys in both spellings (``rope_theta`` + ``rope_scaling``, and
    ``rope_parameters``), so that readers of transformers 4 and 5 agree."""
    parameters = rope_parameters(rope)
    scaling = None if rope.scaling == "none" else {k: v for k, v in parameters.items() if k != "rope_theta"}
    return {"rope_theta": rope.theta, "rope_scaling": scaling, "rope_parameters": parameters}


def shape_keys(model: ModelConfig) -> dict[str, Any]:
    """The shape keys every family's ``config.json`` spells alike (sizes, heads, key/value heads, ``head_dim``)."""
    return {
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
    }
