"""What a Hugging Face model folder's ``config.json`` means in the contract's terms: the architecture an ``init_from``
model gives the trainer (its family, shape, grouped-query attention, tying, RoPE and the rest of its
``ModelConfig``), or why it cannot be loaded.

Pure Python (standard library, ``training.contract`` and ``training.models`` only): the request check's Lambda reads
the folder's ``config.json`` from S3 and the trainer from its weights channel, and both turn it into settings here,
so the plan before launch and the model in the job are the same. What is supported, and how each family's keys and
transformers' defaults are read (both RoPE spellings), is each family's folder in ``training.models``: Llama 3,
Qwen 2 / 2.5, Qwen 3, Mistral and Gemma 3 text; mixtures of experts, vision-language models, RoPE types other
than default, linear and llama3, and Gemma 2's soft-capping are refused naming the key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.contract import settings_table
from training.models import registry
from training.models import settings as model_settings
from training.models.config import ModelConfig, ModelConfigError

CONFIG_FILE = "config.json"


class Architecture(dict[str, Any]):
    """:func:`architecture`'s settings (a plain mapping of contract settings, which is all the settings take from
    it), and what else the config.json says that a check notes: ``max_position_embeddings``, the context the model
    was built for (None when it names none)."""

    max_position_embeddings: int | None = None


def max_positions(architecture: Mapping[str, Any] | None) -> int | None:
    """The ``max_position_embeddings`` of the model whose settings ``architecture`` are (None: not known)."""
    return getattr(architecture, "max_position_embeddings", None)


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
    except RecursionError:
        raise refuse(where, f"{CONFIG_FILE} nests its arrays or objects too deeply to be read") from None
    if not isinstance(config, dict):
        raise refuse(where, f"{CONFIG_FILE} is not a JSON object")
    return config


def architecture(config: Mapping[str, Any], where: str = "init_from") -> Architecture:
    """The contract settings of the model ``config`` describes (``settings_table.ARCHITECTURE_NAMES``, the position
    encoding, RoPE, the RMSNorm epsilon, and ``model_config`` when those do not describe it whole:
    ``training.models.settings.to_settings``), with its ``max_position_embeddings`` beside them, or a
    ``ContractError`` on ``init_from`` naming the key of the config.json the trainer cannot load and what is
    supported (``training.models.registry``)."""
    try:
        model = registry.read_hf_config(config)
    except ModelConfigError as err:
        raise refuse(where, f"{CONFIG_FILE}: {err}") from None
    out = Architecture(model_settings.to_settings(model))
    positions = config.get("max_position_embeddings")  # as config.json says it (not a family's default)
    if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0:
        out.max_position_embeddings = positions
    return out


def model_of(config: Mapping[str, Any], where: str = "init_from") -> ModelConfig:
    """The ``ModelConfig`` of an ``init_from`` folder's config.json, refused as ``architecture`` refuses."""
    try:
        return registry.read_hf_config(config)
    except ModelConfigError as err:
        raise refuse(where, f"{CONFIG_FILE}: {err}") from None


def to_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture part of the config.json of the model of a run's ``settings`` (its family's class; both
    RoPE spellings, so that readers of transformers 4 and 5 agree): the inverse of :func:`architecture`. A Llama
    run saved before ``rms_norm_eps`` was recorded used 1e-5."""
    return registry.write_hf_config(model_settings.model_config(settings))
