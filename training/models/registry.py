"""The model families and how a Hugging Face ``config.json`` picks one: by ``model_type`` (and ``architectures``,
which must name the family's class when given). Adding a family: its folder (``training/models/<name>/``, whose
``FAMILY`` says everything) and its line in ``FAMILIES``.

Refused in one line naming the key and what is supported: a model_type or architecture no family has, with the
reason when it is a known kind the trainer does not build (mixture of experts, vision-language, Gemma 2's
soft-capping); the family's own refusals come from its ``read``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.models import hf
from training.models.config import ModelConfig, ModelConfigError
from training.models.family import Family
from training.models.gemma3.family import FAMILY as GEMMA3
from training.models.llama3.family import FAMILY as LLAMA3
from training.models.mistral.family import FAMILY as MISTRAL
from training.models.qwen2.family import FAMILY as QWEN2
from training.models.qwen3.family import FAMILY as QWEN3

FAMILIES: Mapping[str, Family] = {family.name: family for family in (LLAMA3, QWEN2, QWEN3, MISTRAL, GEMMA3)}
"""Every family, by folder name."""

KNOWN_UNSUPPORTED: Mapping[str, str] = {
    "mixtral": "a mixture-of-experts model (Mixtral)",
    "qwen2_moe": "a mixture-of-experts model (Qwen MoE)",
    "qwen3_moe": "a mixture-of-experts model (Qwen 3 MoE)",
    "deepseek_v3": "a mixture-of-experts model (DeepSeek V3)",
    "llama4": "a mixture-of-experts, vision-language model (Llama 4)",
    "gemma3": "the vision-language Gemma3ForConditionalGeneration (its text decoder alone, a Gemma3ForCausalLM "
    "folder with model_type gemma3_text, is supported)",
    "gemma3n": "Gemma 3n (per-layer embeddings, AltUp), not implemented",
    "gemma2": "Gemma 2, whose attention and final-logit soft-capping (attn_logit_softcapping, "
    "final_logit_softcapping) are not implemented",
    "gemma": "Gemma 1 (GeGLU without Gemma 3's block), not implemented",
    "mllama": "a vision-language model (Llama 3.2 Vision)",
    "mistral3": "a vision-language model (Mistral Small 3.1)",
    "qwen2_vl": "a vision-language model (Qwen2-VL)",
    "qwen2_5_vl": "a vision-language model (Qwen2.5-VL)",
    "llava": "a vision-language model (LLaVA)",
}
"""model_types that people try, and why the trainer does not build them."""


def supported() -> str:
    """The supported classes, as the refusals name them."""
    return ", ".join(family.supported for family in FAMILIES.values())


def family_of(config: Mapping[str, Any]) -> Family:
    """The family of a config.json, from its ``model_type`` and ``architectures``."""
    model_type = config.get("model_type")
    architectures = config.get("architectures")
    if model_type is None and architectures is None:
        raise ModelConfigError("model_type", f"and architectures are both missing; supported: {supported()}")
    if isinstance(model_type, str) and model_type in KNOWN_UNSUPPORTED:
        raise ModelConfigError(
            "model_type", f"{model_type!r} is {KNOWN_UNSUPPORTED[model_type]}; supported: {supported()}"
        )
    if architectures is not None and (
        not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures)
    ):
        raise ModelConfigError("architectures", f"must be a list of class names; got {architectures!r}")
    by_type = [f for f in FAMILIES.values() if f.model_type == model_type]
    by_class = [f for f in FAMILIES.values() if f.architecture in (architectures or [])]
    if model_type is not None and not by_type:
        raise ModelConfigError("model_type", f"{model_type!r} is not supported; supported: {supported()}")
    if architectures is not None and not by_class:
        raise ModelConfigError("architectures", f"{architectures} is not supported; supported: {supported()}")
    if by_type and by_class and by_type[0] is not by_class[0]:
        raise ModelConfigError(
            "architectures",
            f"{architectures} is not model_type {model_type!r}'s class {by_type[0].architecture}",
        )
    return (by_type or by_class)[0]


def read_hf_config(config: Mapping[str, Any]) -> ModelConfig:
    """The ``ModelConfig`` of a Hugging Face config.json (its family's reading, after the refusals every family
    makes: quantized, mixture of experts, multimodal)."""
    family = family_of(config)
    hf.refuse_unsupported_kinds(config, supported())
    return family.read(config)


def write_hf_config(model: ModelConfig) -> dict[str, Any]:
    """The architecture part of the config.json of ``model``'s Hugging Face class."""
    return family(model.family).write(model)


def family(name: str) -> Family:
    """The family named ``name`` (its folder)."""
    if name not in FAMILIES:
        raise ModelConfigError("family", f"{name!r} is not a model family; supported: {', '.join(FAMILIES)}")
    return FAMILIES[name]


SIZES: Mapping[str, ModelConfig] = {name: size for f in FAMILIES.values() for name, size in f.sizes.items()}
"""Every named size, by its name (unique across families)."""


def named_size(name: str) -> ModelConfig:
    """The config of the named size ``name``."""
    if name not in SIZES:
        raise ModelConfigError("model_preset", f"{name!r} is not a named size; supported: {', '.join(SIZES)}")
    return SIZES[name]
