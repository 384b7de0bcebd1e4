"""Raw settings (strings from SageMaker, or JSON values, either spelling of a name) -> parsed,
checked settings with every default filled (``parse_hyperparameters``, ``override_settings``); the model shape and the
LoRA adapters' size of parsed settings; parsed settings rendered back as SageMaker ``HyperParameters``.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.contract import batch
from training.contract.settings_checks import check_consistency, lora_target_modules
from training.contract.settings_table import (
    ARCHITECTURE_NAMES,
    HYPERPARAMETERS,
    HYPERPARAMETERS_BY_NAME,
    LORA_ALL_LINEAR,
    MODEL_DIM_NAMES,
    ContractError,
)
from training.contract.shapes import (
    LLAMA3_ROPE_SETTINGS,
    MODEL_PRESETS,
    NORM_EPS,
    PRESET_SETTINGS,
    ModelShape,
    lora_block_parameter_count,
)
from training.models.config import ModelConfig


def lora_parameters(values: Mapping[str, Any]) -> int:
    """The LoRA adapters' parameters of parsed settings (or a saved run's config): every block's; 0 without LoRA."""
    rank = int(values.get("lora_rank") or 0)
    if not rank:
        return 0
    targets = lora_target_modules(values.get("lora_targets") or LORA_ALL_LINEAR)
    shape = model_shape(values)
    return shape.num_layers * lora_block_parameter_count(shape, rank, targets)


def normalize_name(name: str) -> str:
    """``num-layers`` / ``--num-layers`` / ``NUM_LAYERS`` -> ``num_layers``."""
    return name.lstrip("-").replace("-", "_").lower()


def parse_hyperparameters(
    raw: Mapping[str, Any],
    architecture: Mapping[str, Any] | None = None,
    *,
    sm: tuple[int, int] | None = None,
    world_size: int | None = None,
) -> dict[str, Any]:
    """Parse and cross-check raw settings (names in either spelling); return every setting with defaults filled.

    Raises ContractError naming the first bad field. Model dims come from ``model_preset`` unless set explicitly;
    with ``model_preset=custom`` all five dims must be given. ``architecture``: the settings an ``init_from``
    model's config.json gives (``training.request.hf_config.architecture``); they replace the preset's, and an
    explicit setting (or preset) that contradicts them is refused, naming it and the folder's value. ``sm``: the
    compute capability of the GPU the run will have (the request check knows it from the instance type), for the
    rules that depend on it (``check_dims``). ``world_size``: the run's GPUs (every one a data-parallel rank), which
    turn a ``batch_tokens`` into the ``batch_size`` it means (``batch.resolve``; needed only with ``batch_tokens``,
    which must not come with ``batch_size``).
    """
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = normalize_name(key)
        spec = HYPERPARAMETERS_BY_NAME.get(name)
        if spec is None:
            raise ContractError(name, f"unknown setting; allowed: {', '.join(HYPERPARAMETERS_BY_NAME)}")
        values[name] = spec.parse(value)
    batch.check_exclusive(values)
    if architecture is not None:
        _take_architecture(values, architecture)
    preset = values.get("model_preset") or HYPERPARAMETERS_BY_NAME["model_preset"].default
    _fill_preset_settings(values, preset)
    for spec in HYPERPARAMETERS:
        if values.get(spec.name) is None:
            values[spec.name] = spec.default
    for dim in MODEL_DIM_NAMES:
        if values[dim] is None:
            if preset == "custom":
                raise ContractError(dim, "must be set when model_preset=custom")
            values[dim] = getattr(MODEL_PRESETS[preset], dim)
    shaped = MODEL_PRESETS.get(preset)
    if values["num_kv_heads"] is None:
        values["num_kv_heads"] = (shaped and shaped.num_kv_heads) or values["num_heads"]
    if values["tie_embeddings"] is None:
        values["tie_embeddings"] = bool(shaped and shaped.tie_embeddings)
    if values["lora_alpha"] is None and values["lora_rank"]:
        values["lora_alpha"] = 2.0 * values["lora_rank"]  # the documented default: 2 x rank
    batch.resolve(values, world_size)
    check_consistency(values, sm)
    return values


def override_settings(
    values: Mapping[str, Any], overrides: Mapping[str, Any], *, sm: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Parsed settings ``values`` (``parse_hyperparameters``' result) with ``overrides`` set (each parsed by its own
    setting) and the cross-setting rules checked again: what ``parse_hyperparameters`` gives for the same raw
    settings with the overrides, when none of them is a model-shape setting (a tuning candidate). Raises
    ContractError naming the first bad field."""
    out = dict(values)
    for key, value in overrides.items():
        name = normalize_name(key)
        spec = HYPERPARAMETERS_BY_NAME.get(name)
        if spec is None:
            raise ContractError(name, f"unknown setting; allowed: {', '.join(HYPERPARAMETERS_BY_NAME)}")
        out[name] = spec.parse(value)
    check_consistency(out, sm)
    return out


def model_shape(values: Mapping[str, Any]) -> ModelShape | ModelConfig:
    """The ``ModelShape`` of parsed settings (``parse_hyperparameters``' result, or a saved run's config; a config
    saved before grouped-query attention and tying existed has neither). A run whose model the flat settings do
    not describe whole (``model_config``: another family, from ``init_from`` or a named size) gets its
    ``training.models`` ``ModelConfig`` instead, which has every name and count of ``ModelShape`` (and the
    family's own: ``head_dim`` explicit, biases, windows)."""
    if values.get("model_config"):
        return ModelConfig.from_summary(values["model_config"])
    shape = {name: values[name] for name in MODEL_DIM_NAMES}
    return ModelShape(
        **{name: int(value) for name, value in shape.items()},
        num_kv_heads=int(values.get("num_kv_heads") or values["num_heads"]),
        tie_embeddings=bool(values.get("tie_embeddings") or False),
    )


def _fill_preset_settings(values: dict[str, Any], preset: str) -> None:
    """The preset's other settings (``PRESET_SETTINGS``) where the request leaves them out; its llama3 RoPE
    parameters only while ``rope_scaling`` is the preset's."""
    settings = PRESET_SETTINGS.get(preset, {})
    own_scaling = values.get("rope_scaling") in (None, settings.get("rope_scaling"))
    for name, value in settings.items():
        if values.get(name) is None and (own_scaling or name not in LLAMA3_ROPE_SETTINGS):
            values[name] = value


def _take_architecture(values: dict[str, Any], architecture: Mapping[str, Any]) -> None:
    """Set ``architecture``'s settings into ``values``, refusing an explicit setting or preset that differs."""
    for name, value in architecture.items():
        given = values.get(name)
        if given is not None and given != value:
            wanted = "left out" if value is None else f"{_fmt_value(value)} or left out"
            raise ContractError(
                name,
                f"must be {wanted}: the init_from model's config.json has {name}={_fmt_value(value)}; got "
                f"{_fmt_value(given)}",
            )
    preset = values.get("model_preset")
    matching = [name for name in MODEL_PRESETS if _preset_settings(name) == _preset_view(architecture, name)]
    if preset not in (None, "custom") and preset not in matching:
        shape = ", ".join(f"{n}={_fmt_value(architecture[n])}" for n in ARCHITECTURE_NAMES)
        raise ContractError(
            "model_preset",
            f"{preset} is not the init_from model (its config.json: {shape}); leave model_preset out or use "
            f"{matching[0] if matching else 'custom'}",
        )
    values.update(architecture)
    values["model_preset"] = preset or (matching[0] if matching else "custom")


def _preset_settings(preset: str) -> dict[str, Any]:
    """A preset's architecture and RoPE settings, as an ``init_from`` architecture would give them."""
    shape = MODEL_PRESETS[preset]
    settings: dict[str, Any] = {name: getattr(shape, name) for name in ARCHITECTURE_NAMES}
    settings["num_kv_heads"] = shape.kv_heads
    rope = {"rope_theta": HYPERPARAMETERS_BY_NAME["rope_theta"].default, "rope_scaling": "none"}
    own = {"rms_norm_eps": NORM_EPS, "model_config": None, **PRESET_SETTINGS.get(preset, {})}
    return {**settings, **rope, **own}


def _preset_view(architecture: Mapping[str, Any], preset: str) -> dict[str, Any]:
    return {name: architecture.get(name) for name in _preset_settings(preset)}


def _fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def to_sagemaker_hyperparameters(values: Mapping[str, Any]) -> dict[str, str]:
    """Render settings as SageMaker ``HyperParameters`` (string to string), with the contract's names."""
    out: dict[str, str] = {}
    for key, value in values.items():
        name = normalize_name(key)
        if name not in HYPERPARAMETERS_BY_NAME:
            raise ContractError(name, f"unknown setting; allowed: {', '.join(HYPERPARAMETERS_BY_NAME)}")
        out[name] = format_setting(value)
    return out


def format_setting(value: Any) -> str:
    """A setting's value as a hyperparameter or command-line value (``true``/``false`` for booleans)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
