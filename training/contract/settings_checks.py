"""The rules no single setting can express: widths and ``seq_length`` against the precision's
kernels, the FP8 recipe against the GPU, RoPE scaling's parameters, the speed levers' combinations and LoRA's; each
refusal a ``ContractError`` naming the setting and what is allowed. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.contract.hardware import (
    QUANTIZED_INIT_PRECISIONS,
    TE_PRECISIONS,
    fp8_recipe_for,
    precision_supported_on,
)
from training.contract.settings_table import (
    DPO_SETTINGS,
    HYPERPARAMETERS_BY_NAME,
    LORA_ALL_LINEAR,
    LORA_SETTINGS,
    LORA_TARGETS,
    ContractError,
)
from training.contract.shapes import LLAMA3_ROPE_SETTINGS
from training.models import settings as model_settings
from training.models.config import ModelConfig, ModelConfigError
from training.models.te_support import te_refusal


def lora_target_modules(text: str) -> tuple[str, ...]:
    """The Llama projections (``q_proj``, ..., ``down_proj``, in block order) that ``lora_targets`` names; raises
    ContractError for a name a decoder block (every family here) has no projection of, or an empty or repeated list."""
    if text.strip().lower() == LORA_ALL_LINEAR:
        return tuple(module.rsplit(".", 1)[1] for module in LORA_TARGETS.values())
    names = [part.strip().lower() for part in text.split(",")]
    allowed = f"{LORA_ALL_LINEAR}, or a comma-separated list of {', '.join(LORA_TARGETS)}"
    chosen: list[str] = []
    for name in names:
        short = name.removesuffix("_proj")
        if short not in LORA_TARGETS:
            what = (
                "an empty entry"
                if not name
                else f"{name!r}, which a decoder block (every family here) has no projection of"
            )
            raise ContractError("lora_targets", f"must be {allowed}; got {text!r} with {what}")
        if short in chosen:
            raise ContractError("lora_targets", f"names {short} twice; got {text!r}")
        chosen.append(short)
    return tuple(LORA_TARGETS[s].rsplit(".", 1)[1] for s in LORA_TARGETS if s in chosen)


SEQ_LENGTH_MULTIPLE: Mapping[str, int] = {
    "fp32": 8,
    "fp16": 8,
    "bf16": 8,
    "fp8": 16,
    "mxfp8": 32,
    "nvfp4": 32,
}
"""``seq_length`` and model dims must be multiples of this for the precision's kernels (FP8 GEMMs need
16-aligned dims; MXFP8 and NVFP4 scale blocks of 32 and 16 values, so 32 covers both). ``precision=fp8`` runs
MXFP8 where its recipe resolves to it (``fp8_recipe`` mxfp8, or auto on SM 10.x): ``dims_multiple``."""


def dims_multiple(precision: str, fp8_recipe: str = "auto", sm: tuple[int, int] | None = None) -> int:
    """The multiple ``seq_length`` and the model's widths need for the recipe that will run: ``precision``'s,
    or MXFP8's 32 when ``precision=fp8`` resolves to MXFP8 on a GPU of compute capability ``sm``
    (``fp8_recipe_for``; TE 2.11 ``MXFP8Quantizer.is_quantizable``: both dims multiples of 32). ``sm`` None (the
    GPU not known yet): what the recipe alone decides; the request check and the trainer know the GPU."""
    if precision == "fp8" and fp8_recipe_for(fp8_recipe, sm) == "mxfp8":
        return SEQ_LENGTH_MULTIPLE["mxfp8"]
    return SEQ_LENGTH_MULTIPLE[precision]


def check_dims(values: Mapping[str, Any], sm: tuple[int, int] | None = None) -> None:
    """``seq_length``, ``hidden_size``, ``ffn_hidden_size`` (and, for block-scaled formats, the fused QKV
    projection's rows, hidden + 2 x key/value width) are multiples of ``dims_multiple`` on a GPU of ``sm``."""
    precision = values["precision"]
    multiple = dims_multiple(precision, values.get("fp8_recipe", "auto"), sm)
    why = f"precision={precision}"
    if precision == "fp8" and multiple != SEQ_LENGTH_MULTIPLE["fp8"]:
        on = f" on SM {sm[0]}.{sm[1]}" if sm is not None and values.get("fp8_recipe") == "auto" else ""
        why += f" with fp8_recipe={values.get('fp8_recipe')} (MXFP8BlockScaling{on}: blocks of 32 values)"
    for field in ("seq_length", "hidden_size", "ffn_hidden_size"):
        if values[field] % multiple:
            raise ContractError(field, f"must be a multiple of {multiple} for {why}; got {values[field]}")
    if values.get("model_config"):
        model = model_of(values)
        qkv_rows = model.q_width + 2 * model.kv_width
    else:  # a Llama of its flat settings: head_dim = hidden_size / num_heads
        head_dim = values["hidden_size"] // values["num_heads"]
        qkv_rows = values["hidden_size"] + 2 * values["num_kv_heads"] * head_dim
    if multiple >= SEQ_LENGTH_MULTIPLE["mxfp8"] and qkv_rows % multiple:
        raise ContractError(
            "num_kv_heads",
            f"{'num_heads x head_dim' if values.get('model_config') else 'hidden_size'} + 2 x num_kv_heads x head_dim "
            f"(the fused QKV projection's rows) must be a multiple of "
            f"{multiple} for {why}; got {qkv_rows} with num_kv_heads={values['num_kv_heads']}",
        )


def check_consistency(values: Mapping[str, Any], sm: tuple[int, int] | None = None) -> None:
    """Cross-field rules that no single field can express (``sm``: the run's GPU, when known)."""
    precision = values["precision"]
    if not values.get("model_config"):  # a Llama from its flat settings: head_dim = hidden_size / num_heads
        if values["hidden_size"] % values["num_heads"]:
            raise ContractError(
                "num_heads", f"must divide hidden_size ({values['hidden_size']}); got {values['num_heads']}"
            )
        head_dim = values["hidden_size"] // values["num_heads"]
        if head_dim % 8:
            raise ContractError(
                "num_heads", f"hidden_size / num_heads must be a multiple of 8; got {head_dim}"
            )
    else:
        check_model_config(values)
    if values["num_heads"] % values["num_kv_heads"]:
        raise ContractError(
            "num_kv_heads", f"must divide num_heads ({values['num_heads']}); got {values['num_kv_heads']}"
        )
    check_dims(values, sm)
    check_fp8_recipe(values, sm)
    if values["quantized_model_init"] and precision not in QUANTIZED_INIT_PRECISIONS:
        raise ContractError(
            "quantized_model_init",
            f"works only with precision {' or '.join(sorted(QUANTIZED_INIT_PRECISIONS))}; got precision={precision}",
        )
    _check_rope_scaling(values)
    check_levers(values)
    check_lora(values)
    check_te_block(values)
    check_objective(values)
    if values.get("init_from_source") is not None and values.get("init_from") is None:
        raise ContractError(
            "init_from_source",
            f"only with init_from (it names that model); got {values['init_from_source']!r} without init_from",
        )


def model_of(values: Mapping[str, Any]) -> ModelConfig:
    """The model of parsed settings (``training.models.settings.model_config``), a bad ``model_config`` refused
    by name."""
    try:
        return model_settings.model_config(values)
    except ModelConfigError as err:
        raise ContractError("model_config", f"{err}") from None


def check_model_config(values: Mapping[str, Any]) -> None:
    """A run whose model the flat settings do not describe whole (another family, from ``init_from`` or a named
    size) carries it as ``model_config``: every flat setting of the model must say what it says (a setting
    given against a named size's model is refused by name: another shape of that family is an ``init_from``
    folder)."""
    model = model_of(values)
    for name, value in model_settings.to_settings(model).items():
        if name != "model_config" and values.get(name) != value:
            preset = values.get("model_preset")
            source = f"model_preset {preset}" if preset not in (None, "custom") else "the init_from model"
            raise ContractError(
                name,
                f"must be {value} or left out: {source} is a {model.family} model with {name}={value}; got "
                f"{values.get(name)}",
            )


def check_te_block(values: Mapping[str, Any]) -> None:
    """The precisions that run on Transformer Engine's ``TransformerLayer`` (fp8, mxfp8, nvfp4) are refused for a
    model that layer cannot express (``training.models.te_support``), before anything is launched."""
    if values["precision"] not in TE_PRECISIONS:
        return
    problem = te_refusal(model_of(values))
    if problem is not None:
        raise ContractError(
            "precision",
            f"{values['precision']} runs the model on Transformer Engine's TransformerLayer, which cannot be this "
            f"model's block ({problem}); use bf16, fp16 or fp32 (the torch block)",
        )


def check_fp8_recipe(values: Mapping[str, Any], sm: tuple[int, int] | None) -> None:
    """``precision=fp8`` with ``fp8_recipe=mxfp8`` runs TE's ``MXFP8BlockScaling``, which needs a data-centre
    Blackwell GPU (SM 10.x), as ``precision=mxfp8`` does (``precision_supported_on``); refused on a GPU of another
    ``sm`` (None: the GPU is not known, nothing to check)."""
    if sm is None or values["precision"] != "fp8" or values["fp8_recipe"] != "mxfp8":
        return
    if not precision_supported_on("mxfp8", sm):
        raise ContractError(
            "fp8_recipe",
            f"mxfp8 (TE MXFP8BlockScaling) needs a data-centre Blackwell GPU (SM 10.x), and this run's GPUs are SM "
            f"{sm[0]}.{sm[1]}: use auto (current scaling there), current or delayed; got mxfp8 with precision=fp8",
        )


def _check_rope_scaling(values: Mapping[str, Any]) -> None:
    """``rope_scaling=llama3`` needs RoPE and its four parameters (high above low), ``linear`` RoPE and
    ``rope_scaling_factor`` alone; ``none`` takes none of them."""
    scaling = values["rope_scaling"]
    if scaling in ("none", "linear"):
        for name in LLAMA3_ROPE_SETTINGS[1:] if scaling == "linear" else LLAMA3_ROPE_SETTINGS:
            if values.get(name) is not None:
                raise ContractError(
                    name, f"only with rope_scaling=llama3; got {values[name]!r} with rope_scaling={scaling}"
                )
        if scaling == "none":
            return
    if values["position_encoding"] != "rope":
        raise ContractError(
            "rope_scaling",
            f"{values['rope_scaling']} needs position_encoding=rope; got {values['position_encoding']}",
        )
    if scaling == "linear":
        if values.get("rope_scaling_factor") is None:
            raise ContractError("rope_scaling_factor", "must be set when rope_scaling=linear")
        return
    if values["position_encoding"] != "rope":
        raise ContractError(
            "rope_scaling",
            f"{values['rope_scaling']} needs position_encoding=rope; got {values['position_encoding']}",
        )
    for name in LLAMA3_ROPE_SETTINGS:
        if values.get(name) is None:
            raise ContractError(name, f"must be set when rope_scaling={values['rope_scaling']}")
    if values["rope_high_freq_factor"] <= values["rope_low_freq_factor"]:
        raise ContractError(
            "rope_high_freq_factor",
            f"must be above rope_low_freq_factor ({values['rope_low_freq_factor']:g}); got "
            f"{values['rope_high_freq_factor']:g}",
        )


def check_levers(values: Mapping[str, Any]) -> None:
    """The speed levers' cross-field rules (``LEVERS``): combinations that cannot run are refused by name."""
    precision = values["precision"]
    if values["quantized_model_init"] and not values["master_weights"]:
        raise ContractError(
            "master_weights",
            "must be true with quantized_model_init: FP8 primary weights without fp32 master weights round "
            "small updates away (the trainer's AdamW keeps fp32 masters); set master_weights true or "
            "quantized_model_init false",
        )
    if precision in TE_PRECISIONS and values["compile"] == "true":
        raise ContractError(
            "compile",
            f"true cannot compile precision={precision}: Transformer Engine 2.11's layers run eagerly "
            "(torch.compile breaks its graph at every TE module); use compile auto or false",
        )
    if precision in TE_PRECISIONS and values["activation_checkpointing"] == "selective":
        raise ContractError(
            "activation_checkpointing",
            f"selective cannot run with precision={precision}: Transformer Engine's GEMMs are not ATen ops an "
            "op-level policy can save, and only te.distributed.checkpoint keeps its FP8 scaling state across a "
            "recompute; use full (optionally with activation_checkpointing_interval)",
        )
    if precision in TE_PRECISIONS and values["attention_backend"] != "auto":
        raise ContractError(
            "attention_backend",
            f"must be auto with precision={precision}: Transformer Engine chooses its own attention kernel "
            f"(logged at start); got {values['attention_backend']}",
        )
    if precision == "nvfp4" and 2 * values["nvfp4_bf16_blocks"] >= values["num_layers"]:
        raise ContractError(
            "nvfp4_bf16_blocks",
            f"must leave a block in nvfp4: 2 x {values['nvfp4_bf16_blocks']} first and last blocks is not "
            f"below num_layers {values['num_layers']}",
        )
    if values["activation_checkpointing_interval"] > values["num_layers"]:
        raise ContractError(
            "activation_checkpointing_interval",
            f"must be at most num_layers ({values['num_layers']}); got {values['activation_checkpointing_interval']}",
        )


def check_lora(values: Mapping[str, Any]) -> None:
    """LoRA's cross-field rules: adapters wrap the torch path's linear layers (``training/trainer/model/lora.py``), so
    no Transformer Engine precision and no quantized primary weights; ``lora_targets`` names Llama projections;
    the other LoRA settings only with ``lora_rank`` > 0."""
    if not values.get("lora_rank"):
        for name in LORA_SETTINGS:
            default = HYPERPARAMETERS_BY_NAME[name].default
            if values.get(name) is not None and values[name] != default:
                raise ContractError(
                    name, f"only with lora_rank > 0 (LoRA); got {values[name]!r} with lora_rank=0"
                )
        return
    lora_target_modules(values["lora_targets"])
    if values["quantized_model_init"]:
        raise ContractError(
            "quantized_model_init",
            f"must be false with LoRA (lora_rank={values['lora_rank']}): the adapters wrap the torch path's "
            "linear layers, whose frozen base weights are not quantized",
        )
    precision = values["precision"]
    if precision in TE_PRECISIONS:
        raise ContractError(
            "precision",
            f"{precision} cannot train LoRA adapters (lora_rank={values['lora_rank']}): the adapters wrap the "
            "torch path's linear layers, not Transformer Engine's; use precision bf16 (or fp16, fp32)",
        )


def check_objective(values: Mapping[str, Any]) -> None:
    """Preference tuning's rules: its settings only where DPO may run (``objective`` dpo or auto: auto decides
    from the data, ``training/trainer/preference``), and the reference with the adapters switched off only with
    adapters (LoRA)."""
    if values.get("objective", "auto") == "next_token":
        for name in DPO_SETTINGS:
            default = HYPERPARAMETERS_BY_NAME[name].default
            if values.get(name) is not None and values[name] != default:
                raise ContractError(
                    name, f"only with objective dpo (or auto on preference data); got {values[name]!r} with "
                    "objective=next_token",
                )  # fmt: skip
    if values.get("dpo_reference") == "adapter_off" and not values.get("lora_rank"):
        raise ContractError(
            "dpo_reference",
            "adapter_off needs LoRA adapters to switch off (lora_rank > 0); without them the reference is "
            "precomputed (dpo_reference precomputed or auto); got adapter_off with lora_rank=0",
        )
