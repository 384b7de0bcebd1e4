"""Precision -> Transformer Engine recipe, dtypes, autocast/init contexts, and the hardware check.

TE names checked against NVIDIA/TransformerEngine tag v2.11 (VERSION 2.11.0):

* ``transformer_engine/common/recipe/__init__.py``: ``Format`` (E4M3, HYBRID, E2M1), ``DelayedScaling(fp8_format,
  amax_history_len=1024, amax_compute_algo="max")``, ``Float8CurrentScaling(fp8_format)``,
  ``MXFP8BlockScaling(fp8_format=Format.E4M3)``, ``NVFP4BlockScaling()`` (defaults: E2M1 data, E4M3 scales).
* ``transformer_engine/pytorch/quantization.py`` (re-exported by ``transformer_engine.pytorch``): the context
  managers are ``autocast(enabled, calibrating, recipe, amax_reduction_group)`` and
  ``quantized_model_init(enabled, recipe, preserve_high_precision_init_val)``; ``fp8_autocast`` and
  ``fp8_model_init`` still exist but emit deprecation warnings. ``is_fp8_available``/``is_mxfp8_available``/
  ``is_nvfp4_available(return_reason=False)`` return a bool, or ``(bool, reason)`` with ``return_reason=True``.

Transformer Engine is imported lazily, only by the functions that need it, so everything else runs without it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from training.contract import hardware, settings_checks, settings_table

TE_RECIPE_MODULE = "transformer_engine.common.recipe"
TE_TORCH_MODULE = "transformer_engine.pytorch"


class PrecisionError(settings_table.ContractError):
    """The precision cannot run here (no GPU, no TE, or the wrong GPU generation)."""

    def __init__(self, message: str):
        super().__init__("precision", message)


@dataclass(frozen=True)
class RecipeSpec:
    """A TE recipe as data: the class in ``transformer_engine.common.recipe`` and its keyword arguments.

    Values in ``formats`` name members of that module's ``Format`` enum (resolved when the recipe is built).
    """

    class_name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)


def recipe_spec(
    precision: str, fp8_recipe: str = "auto", sm: tuple[int, int] | None = None
) -> RecipeSpec | None:
    """The TE recipe for ``precision`` (None for fp32/fp16/bf16, which run without TE); for fp8, ``fp8_recipe``
    on a GPU of compute capability ``sm`` (``auto``: current scaling, MXFP8 on SM 10.x;
    ``hardware.fp8_recipe_for``)."""
    if precision == "fp8":
        fp8_recipe = hardware.fp8_recipe_for(fp8_recipe, sm)
        if fp8_recipe == "mxfp8":
            return RecipeSpec("MXFP8BlockScaling", {}, {"fp8_format": "E4M3"})
        if fp8_recipe == "delayed":
            return RecipeSpec(
                "DelayedScaling",
                {"amax_history_len": 1024, "amax_compute_algo": "max"},
                {"fp8_format": "HYBRID"},
            )
        if fp8_recipe == "current":
            return RecipeSpec("Float8CurrentScaling", {}, {"fp8_format": "HYBRID"})
        raise settings_table.ContractError("fp8_recipe", f"must be one of {', '.join(hardware.FP8_RECIPES)}")
    if precision == "mxfp8":
        return RecipeSpec("MXFP8BlockScaling", {}, {"fp8_format": "E4M3"})
    if precision == "nvfp4":
        return RecipeSpec("NVFP4BlockScaling")
    if precision in hardware.PRECISIONS:
        return None
    raise settings_table.ContractError("precision", f"must be one of {', '.join(hardware.PRECISIONS)}")


def build_recipe(spec: RecipeSpec, recipe_module: ModuleType | None = None) -> Any:
    """Construct the TE recipe object (plain Python: works without a GPU wherever TE imports)."""
    module = recipe_module or importlib.import_module(TE_RECIPE_MODULE)
    kwargs = dict(spec.kwargs)
    kwargs.update({key: getattr(module.Format, name) for key, name in spec.formats.items()})
    return getattr(module, spec.class_name)(**kwargs)


def compute_dtype(precision: str) -> torch.dtype:
    """dtype of parameters and activations in forward/backward (TE precisions compute outside GEMMs in bf16)."""
    return {"fp32": torch.float32, "fp16": torch.float16}.get(precision, torch.bfloat16)


def uses_te(precision: str) -> bool:
    return precision in hardware.TE_PRECISIONS


def te_available() -> bool:
    try:
        importlib.import_module(TE_TORCH_MODULE)
    except ImportError:
        return False
    return True


def check_hardware(
    precision: str, *, has_te: bool, cuda_available: bool, capability: tuple[int, int] | None
) -> None:
    """Raise PrecisionError with a clear message if ``precision`` cannot run on this machine.

    ``capability`` is the GPU's (major, minor) compute capability, or None without a GPU. bf16 runs on CPU too;
    fp16 on CPU is allowed (slow, for tests). TE precisions need TE and a GPU that ``precision_supported_on``.
    """
    if uses_te(precision):
        if not has_te:
            raise PrecisionError(
                f"{precision} needs NVIDIA Transformer Engine (import {TE_TORCH_MODULE} failed); "
                "use fp32, fp16 or bf16, or run in the training container"
            )
        if not cuda_available or capability is None:
            raise PrecisionError(
                f"{precision} needs an NVIDIA GPU; none is visible (torch.cuda.is_available() is False)"
            )
    if (
        cuda_available
        and capability is not None
        and not hardware.precision_supported_on(precision, capability)
    ):
        needs = (
            "a data-centre Blackwell GPU (SM 10.x)" if precision in hardware.BLACKWELL_ONLY_PRECISIONS else ""
        )
        needs = needs or (
            "SM 8.9+ (Ada, Hopper, Blackwell)" if precision == "fp8" else "SM 8.0+ (Ampere or newer)"
        )
        supported = ", ".join(hardware.instance_types_supporting(precision))
        raise PrecisionError(
            f"{precision} needs {needs}; this GPU is SM {capability[0]}.{capability[1]}. "
            f"Instance types that support it: {supported}"
        )


def check_this_machine(precision: str) -> None:
    """``check_hardware`` with what this process sees (TE import, CUDA, device 0's capability)."""
    cuda = torch.cuda.is_available()
    capability = torch.cuda.get_device_capability() if cuda else None
    check_hardware(
        precision,
        has_te=te_available() if uses_te(precision) else False,
        cuda_available=cuda,
        capability=capability,
    )


@dataclass(frozen=True)
class PrecisionPlan:
    """What the model and loop need from a precision: dtypes, the TE recipe, and the two contexts."""

    precision: str
    dtype: torch.dtype
    recipe: Any
    quantized_init: bool
    amax_reduction_group: Any = None
    """The data-parallel group over which TE reduces amaxes (DelayedScaling's at the end of each autocast region;
    ``quantization.py`` ``reduce_and_update_fp8_tensors`` at v2.11): the FSDP mesh's group, named explicitly so a
    second mesh dimension never widens or narrows it by accident (None would mean the whole world)."""

    def autocast(self, enabled: bool = True) -> contextlib.AbstractContextManager:
        """Forward-pass context: ``te.autocast(recipe=..., amax_reduction_group=...)`` for TE precisions, nothing
        otherwise (``enabled=False``: a region of a TE run in bf16).

        fp16/bf16 need no torch autocast: FSDP2's MixedPrecisionPolicy casts the parameters.
        """
        if self.recipe is None:
            return contextlib.nullcontext()
        te = importlib.import_module(TE_TORCH_MODULE)
        return te.autocast(
            enabled=enabled, recipe=self.recipe, amax_reduction_group=self.amax_reduction_group
        )

    def keep_edge_blocks_high_precision(self, layers: Sequence[torch.nn.Module], count: int) -> list[int]:
        """Run the first and last ``count`` blocks outside quantization (``te.autocast(enabled=False)`` nested in
        the step's region: TE restores the outer state on exit), as Megatron keeps NVFP4's first and last layers
        in bf16. Returns their indices."""
        edges = sorted({*range(count), *range(len(layers) - count, len(layers))}) if count else []
        for index in edges:
            block = layers[index]
            block.forward = functools.partial(self._unquantized, block.forward)
        return edges

    def _unquantized(self, forward: Any, *args: Any, **kwargs: Any) -> Any:
        with self.autocast(enabled=False):
            return forward(*args, **kwargs)

    def init_context(self) -> contextlib.AbstractContextManager:
        """Model-construction context: ``te.quantized_model_init`` keeps primary weights quantized."""
        if not self.quantized_init:
            return contextlib.nullcontext()
        te = importlib.import_module(TE_TORCH_MODULE)
        return te.quantized_model_init(enabled=True, recipe=self.recipe)

    def grad_scaler(self) -> Any:
        """A loss scaler for fp16 (None otherwise): fp16 gradients underflow without one."""
        if self.precision != "fp16":
            return None
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        # ShardedGradScaler all-reduces found_inf so every rank skips (or takes) the same steps.
        return ShardedGradScaler(device="cuda" if torch.cuda.is_available() else "cpu")


def plan(
    precision: str,
    fp8_recipe: str,
    quantized_model_init: bool,
    *,
    sm: tuple[int, int] | None = None,
    amax_reduction_group: Any = None,
) -> PrecisionPlan:
    """Build the precision plan (constructs the TE recipe, importing TE, only for TE precisions) for a GPU of
    compute capability ``sm`` (None: this process's GPU 0, if any)."""
    if sm is None and torch.cuda.is_available():
        sm = torch.cuda.get_device_capability()
    spec = recipe_spec(precision, fp8_recipe, sm)
    recipe = build_recipe(spec) if spec is not None else None
    return PrecisionPlan(
        precision, compute_dtype(precision), recipe, quantized_model_init, amax_reduction_group
    )


def nondeterministic_op(cfg: Any, capability: tuple[int, int] | None) -> str | None:
    """The op of ``cfg``'s run that has no deterministic kernel on a CUDA GPU of ``capability``, or None (always
    None on CPU). From torch 2.9's ``use_deterministic_algorithms`` documentation and its SDPA selection, and TE
    v2.11's ``attention/dot_product_attention/utils.py`` (determinism filter)."""
    if capability is None:
        return None
    if cfg.loss_chunk_tokens == 0:
        return (
            "loss_chunk_tokens=0: F.cross_entropy's aten::nll_loss forward on CUDA (torch documents it as raising "
            "under deterministic algorithms); use the chunked loss (loss_chunk_tokens > 0)"
        )
    if not uses_te(cfg.precision) and cfg.attention_backend == "cudnn":
        return (
            "attention_backend=cudnn: aten::_scaled_dot_product_cudnn_attention's backward (torch: 'cuDNN SDPA is "
            "not deterministic'); use attention_backend auto or flash"
        )
    if uses_te(cfg.precision) and capability[0] >= 10:
        return (
            f"precision={cfg.precision} on SM {capability[0]}.{capability[1]}: Transformer Engine's FusedAttention "
            "(cuDNN) backward, which TE 2.11 disables for determinism on Blackwell (falling back to an unfused "
            "attention that holds seq_length^2 scores per head)"
        )
    return None


def check_run(cfg: Any) -> None:
    """Everything about ``cfg`` this machine can refuse before any process starts: the precision's hardware
    (``check_this_machine``), the model's dims for the recipe this GPU runs (``settings_checks.check_dims``: fp8 runs
    MXFP8 on SM 10.x, which needs multiples of 32) and ``deterministic=true`` with an op that has no deterministic
    kernel here."""
    check_this_machine(cfg.precision)
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    settings_checks.check_dims(cfg.as_dict(), capability)
    if cfg.deterministic:
        op = nondeterministic_op(cfg, capability)
        if op is not None:
            raise settings_table.ContractError("deterministic", f"true cannot be honoured on this GPU: {op}")
