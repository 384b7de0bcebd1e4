"""What the plan reads from a request: the trainer's settings of an execution input (the top-level ones
over its ``hyperparameters``), parsed (``training.contract.settings_parse``), and the ``memory.Setup`` they
make on the request's instances; ``data_parallel_replicate`` checked against their GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.contract import hardware, settings_checks, settings_parse, settings_table
from training.models import registry
from training.models import settings as model_settings
from training.plan import network
from training.plan.memory import Setup


def trainer_settings(request: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer's settings of an execution input: its ``hyperparameters`` with the top-level ones set over them."""
    settings = dict(request.get("hyperparameters") or {})
    settings.update({k: request[k] for k in settings_table.TOP_LEVEL_SETTINGS if request.get(k) is not None})
    return settings


def setup_from_request(request: Mapping[str, Any], architecture: Mapping[str, Any] | None = None) -> Setup:
    """A :class:`Setup` from an execution input (the workflow's fields; absent ones take the trainer's and the
    workflow's defaults). ``architecture``: the settings of the ``init_from`` model's config.json
    (``training.request.hf_config.architecture``), which give the shape. Raises ``settings_table.ContractError`` naming
    a bad setting."""
    return parse_request(request, architecture)[1]


def parse_request(
    request: Mapping[str, Any], architecture: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], Setup]:
    """The parsed settings (``settings_parse.parse_hyperparameters``) and the :class:`Setup` of a plain execution input,
    for a plan outside the request's decision (``python -m training.plan``, the tuning report, the
    measurements, a stored record's configuration); the decision passes its own parsed settings to
    :func:`setup_from_values`. Raises ``settings_table.ContractError`` naming a bad setting."""
    instance_type = request.get("instance_type") or hardware.DEFAULT_INSTANCE_TYPE
    if instance_type not in hardware.GPU_INSTANCE_TYPES:
        raise settings_table.ContractError(
            "instance_type", f"must be one of {', '.join(hardware.GPU_INSTANCE_TYPES)}; got {instance_type!r}"
        )
    gpu = hardware.GPU_INSTANCE_TYPES[instance_type]
    count = request.get("instance_count") or 1
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise settings_table.ContractError("instance_count", f"must be an integer >= 1; got {count!r}")
    values = settings_parse.parse_hyperparameters(
        trainer_settings(request), architecture, sm=gpu.sm, world_size=count * gpu.gpus
    )
    replicate_setting(values, count, instance_type)
    setup = setup_from_values(
        values,
        instance_type=instance_type,
        instance_count=count,
        max_runtime_seconds=request.get("max_runtime_seconds"),
    )
    return values, setup


def setup_from_values(
    values: Mapping[str, Any],
    *,
    instance_type: str,
    instance_count: int = 1,
    max_runtime_seconds: int | None = None,
    conversations: bool = False,
) -> Setup:
    """A :class:`Setup` from parsed settings (``settings_parse.parse_hyperparameters``' result, their
    ``data_parallel_replicate`` checked against the GPUs by :func:`replicate_setting`: nothing is parsed or checked
    here) on ``instance_count`` x ``instance_type``, with the run's time limit; ``conversations``: the data is
    prepared conversations (packed into windows when the settings' ``packing`` is on)."""
    shape = settings_parse.model_shape(values)
    return Setup(
        shape=shape,
        precision=values["precision"],
        quantized_model_init=bool(values["quantized_model_init"]),
        batch_size=values["batch_size"],
        seq_length=values["seq_length"],
        activation_checkpointing=values["activation_checkpointing"],
        instance_type=instance_type,
        instance_count=instance_count,
        max_steps=values["max_steps"],
        loss_chunk_tokens=int(values.get("loss_chunk_tokens") or 0),
        max_runtime_seconds=max_runtime_seconds,
        position_encoding=values["position_encoding"],
        activation_checkpointing_interval=values["activation_checkpointing_interval"],
        grad_accum_steps=values["grad_accum_steps"],
        adamw_impl=values["adamw_impl"],
        nvfp4_bf16_blocks=values["nvfp4_bf16_blocks"],
        lora_rank=values["lora_rank"],
        lora_targets=settings_checks.lora_target_modules(values["lora_targets"])
        if values["lora_rank"]
        else (),
        lora_dropout=values["lora_dropout"],
        data_parallel_replicate=values.get("data_parallel_replicate", "auto"),
        attention_backend=values["attention_backend"],
        packed_documents=conversations and bool(values.get("packing", True)),
    )


def replicate_setting(values: Mapping[str, Any], count: int, instance_type: str) -> int | str:
    """``data_parallel_replicate`` of parsed settings, refused by name when it does not divide the GPUs of ``count``
    x ``instance_type``: where the settings are read (``value.read_settings`` for a request, :func:`parse_request`
    for a plain input) and for each tuning candidate that sets it."""
    replicate = values.get("data_parallel_replicate", "auto")
    world = count * hardware.GPU_INSTANCE_TYPES[instance_type].gpus
    problem = None if replicate == "auto" else network.layout_problem(int(replicate), world)
    if problem:
        raise settings_table.ContractError(
            "data_parallel_replicate", f"{problem} ({count} x {instance_type}); or leave it auto"
        )
    return replicate


def trimmed_architecture(
    name: str, num_layers: int | None = None, vocab_size: int | None = None
) -> dict[str, Any] | None:
    """The settings an ``init_from`` folder of the named size ``name`` with ``num_layers`` blocks (its pattern of
    layer kinds kept, ``ModelConfig.trimmed``) and ``vocab_size`` would give (``setup_from_request``'s
    ``architecture``): how the measurements plan and trace a fraction of a family's model, whose flat settings
    cannot be changed against its named size. None for a model of the flat settings (a Llama preset), whose
    ``num_layers`` and ``vocab_size`` are plain settings, or a name that is no named size (``custom``)."""
    size = registry.SIZES.get(name)
    if size is None or not model_settings.needs_model_config(size):
        return None
    return model_settings.to_settings(size.trimmed(num_layers or size.num_layers, vocab_size))
