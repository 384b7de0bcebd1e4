"""What a Hugging Face model folder's ``config.json`` means in the contract's terms: the architecture an ``init_from``
model gives the trainer (shape, grouped-query attention, tying, RoPE), or why it cannot be loaded.

Pure Python (standard library and ``training.contract`` only): the request check's Lambda reads the folder's
``config.json`` from S3 and the trainer from its weights channel, and both turn it into settings here, so the plan
before launch and the model in the job are the same. Supported: ``LlamaForCausalLM`` (``model_type`` llama) with
the trainer's block (SiLU/SwiGLU MLP, no biases, head_dim = hidden / heads, all of head_dim rotated), its RMSNorm
epsilon (``rms_norm_eps``, transformers' default when absent) and RoPE ``default`` or ``llama3``, spelled the transformers 4 way
(``rope_theta`` and ``rope_scaling``, whose type is ``rope_type`` or the older ``type``) or the transformers 5 way
(``rope_parameters`` holding ``rope_theta`` too).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.contract import settings_parse, settings_table, shapes

CONFIG_FILE = "config.json"
ARCHITECTURE = "LlamaForCausalLM"
MODEL_TYPE = "llama"
ROPE_TYPES: tuple[str, ...] = ("default", "llama3")
DEFAULT_ROPE_THETA = 10000.0
"""transformers' ``LlamaConfig`` default when a config.json names no ``rope_theta``."""
DEFAULT_RMS_NORM_EPS = 1e-6
"""transformers' ``LlamaConfig`` default when a config.json names no ``rms_norm_eps``
(``models/llama/configuration_llama.py``: ``rms_norm_eps=1e-6`` in 4.x's ``__init__``, ``rms_norm_eps: float = 1e-6``
in 5.x), so such a folder loads here as it does in ``from_pretrained``. Llama 3.x's own config.json say 1e-05."""

_LLAMA3_KEYS: Mapping[str, str] = {
    "rope_scaling_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_original_max_position_embeddings": "original_max_position_embeddings",
}
"""The contract's llama3 settings and their names in Hugging Face's ``rope_scaling`` / ``rope_parameters``."""


def refuse(where: str, message: str) -> settings_table.ContractError:
    """The refusal of an ``init_from`` folder (``where``: its path or S3 URI)."""
    return settings_table.ContractError("init_from", f"{where}: {message}")


def read_local(folder: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a local model folder; refuses a missing folder or file, or text that is not a JSON
    object."""
    path = Path(folder)
    if not path.is_dir():
        raise refuse(
            str(folder), "is not a folder (it must hold a Hugging Face model: config.json and safetensors)"
        )
    try:
        text = (path / CONFIG_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise refuse(str(folder), f"holds no {CONFIG_FILE} (a Hugging Face model folder has one)") from None
    except OSError as err:
        raise refuse(str(folder), f"cannot read {CONFIG_FILE}: {err.strerror or err}") from None
    return parse(text, str(folder))


def parse(text: str | bytes, where: str) -> dict[str, Any]:
    """``config.json``'s text as a JSON object, or the refusal naming ``where``."""
    try:
        config = json.loads(text)
    except ValueError as err:
        raise refuse(where, f"{CONFIG_FILE} is not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise refuse(where, f"{CONFIG_FILE} is not a JSON object")
    return config


def architecture(config: Mapping[str, Any], where: str = "init_from") -> dict[str, Any]:
    """The contract settings of the model ``config`` describes (``settings_table.ARCHITECTURE_NAMES``, the position
    encoding and RoPE's), or a ``ContractError`` on ``init_from`` naming what the trainer cannot load."""
    _check_supported(config, where)
    try:
        heads = _int(config, "num_attention_heads")
        hidden = _int(config, "hidden_size")
        settings: dict[str, Any] = {
            "num_layers": _int(config, "num_hidden_layers"),
            "hidden_size": hidden,
            "num_heads": heads,
            "num_kv_heads": _int(config, "num_key_value_heads", heads),
            "ffn_hidden_size": _int(config, "intermediate_size"),
            "vocab_size": _int(config, "vocab_size"),
            "tie_embeddings": _bool(config, "tie_word_embeddings", False),
            "position_encoding": "rope",
        }
    except (KeyError, TypeError, ValueError) as err:
        raise refuse(where, f"{CONFIG_FILE}: {err.args[0]}") from None
    head_dim = config.get("head_dim")
    if head_dim is not None and (heads <= 0 or head_dim * heads != hidden):
        raise refuse(
            where,
            f"head_dim {head_dim} x num_attention_heads {heads} is not hidden_size {hidden}; the trainer's "
            "attention needs head_dim = hidden_size / num_attention_heads",
        )
    settings["rms_norm_eps"] = _norm_eps(config, where)
    settings.update(_rope(config, where))
    return settings


def _norm_eps(config: Mapping[str, Any], where: str) -> float:
    """``rms_norm_eps``, or transformers' default without one; within the contract's range."""
    eps = config.get("rms_norm_eps")
    eps = DEFAULT_RMS_NORM_EPS if eps is None else eps
    low, high = shapes.NORM_EPS_RANGE
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not low <= eps <= high:
        raise refuse(
            where, f"{CONFIG_FILE}: rms_norm_eps must be a number from {low:g} to {high:g}; got {eps!r}"
        )
    return float(eps)


def _check_supported(config: Mapping[str, Any], where: str) -> None:
    """Refuse what the trainer's block is not: another architecture, biases, another activation, a quantized
    checkpoint."""
    model_type = config.get("model_type")
    architectures = config.get("architectures")
    if model_type is None and architectures is None:
        raise refuse(
            where, f"{CONFIG_FILE} names neither model_type nor architectures; supported: {MODEL_TYPE}"
        )
    if model_type is not None and model_type != MODEL_TYPE:
        raise refuse(
            where,
            f"model_type {model_type!r} is not supported; supported: {MODEL_TYPE} ({ARCHITECTURE}, e.g. Llama 3.x)",
        )
    if architectures is not None and ARCHITECTURE not in (architectures or []):
        raise refuse(where, f"architectures {architectures} is not supported; supported: {ARCHITECTURE}")
    unsupported = {
        "attention_bias": config.get("attention_bias", False) is not False,
        "mlp_bias": config.get("mlp_bias", False) is not False,
        "hidden_act": config.get("hidden_act", "silu") != "silu",
        "pretraining_tp": config.get("pretraining_tp", 1) not in (1, None),
        "quantization_config": config.get("quantization_config") is not None,
    }
    for key, bad in unsupported.items():
        if bad:
            raise refuse(
                where, f"{key}={config[key]!r} is not supported (the trainer's block: no biases, SiLU)"
            )


def _rope(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``rope_theta``, ``rope_scaling`` and its four parameters from either spelling."""
    parameters = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise refuse(where, f"rope_parameters must be an object; got {parameters!r}")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise refuse(where, f"rope_scaling must be an object or null; got {scaling!r}")
    merged: dict[str, Any] = {**(scaling or {}), **(parameters or {})}
    theta = next(
        (t for t in (merged.get("rope_theta"), config.get("rope_theta")) if t is not None), DEFAULT_ROPE_THETA
    )
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise refuse(where, f"RoPE type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    if merged.get("partial_rotary_factor", 1.0) != 1.0:
        raise refuse(
            where, f"partial_rotary_factor={merged['partial_rotary_factor']!r} is not supported (1.0 only)"
        )
    settings: dict[str, Any] = {"rope_theta": float(theta), "rope_scaling": "none"}
    settings |= dict.fromkeys(_LLAMA3_KEYS)
    if rope_type == "llama3":
        missing = [key for key in _LLAMA3_KEYS.values() if merged.get(key) is None]
        if missing:
            raise refuse(where, f"RoPE type llama3 needs {', '.join(missing)}")
        settings["rope_scaling"] = "llama3"
        for name, key in _LLAMA3_KEYS.items():
            settings[name] = (
                float(merged[key]) if name != "rope_original_max_position_embeddings" else int(merged[key])
            )
    return settings


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key)
    value = default if value is None else value  # null is transformers' "the default" (num_key_value_heads)
    if value is None:
        raise KeyError(f"{key} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer; got {value!r}")
    return value


def _bool(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false; got {value!r}")
    return value


def to_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture part of a ``LlamaForCausalLM`` config.json for contract settings (the inverse of
    :func:`architecture`): both RoPE spellings, so that readers of transformers 4 and 5 agree."""
    shape = settings_parse.model_shape(settings)
    theta = float(settings["rope_theta"])
    rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    rope_scaling = None
    if settings.get("rope_scaling", "none") == "llama3":
        rope_scaling = {"rope_type": "llama3"}
        for name, key in _LLAMA3_KEYS.items():
            rope_scaling[key] = settings[name]
        rope_parameters = {**rope_scaling, "rope_theta": theta}
    eps = float(settings.get("rms_norm_eps", shapes.NORM_EPS))  # a model.pt from before the setting: 1e-5
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.ffn_hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": shape.tie_embeddings,
    }
