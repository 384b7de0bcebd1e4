"""Precision -> TE recipe mapping, the hardware check, and the TE contexts (with a fake TE module tree)."""

from __future__ import annotations

import enum
import importlib.machinery
import sys
import types
from dataclasses import dataclass, field

import pytest
import torch

from training.contract import hardware
from training.trainer import selfcheck
from training.trainer.distributed import precision


class Format(enum.Enum):
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    HYBRID = "hybrid"
    E2M1 = "e2m1"


@dataclass
class FakeRecipe:
    kwargs: dict = field(default_factory=dict)


def fake_recipe_module() -> types.ModuleType:
    module = types.ModuleType("transformer_engine.common.recipe")
    module.Format = Format
    for name in ("DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "NVFP4BlockScaling"):
        setattr(
            module,
            name,
            type(name, (FakeRecipe,), {"__init__": lambda self, **kw: FakeRecipe.__init__(self, kw)}),
        )
    return module


@pytest.fixture
def fake_te(monkeypatch):
    """A fake ``transformer_engine`` package: recipes record their kwargs, contexts record their calls."""
    calls = []

    class Context:
        def __init__(self, name, kwargs):
            calls.append((name, kwargs))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    te = types.ModuleType("transformer_engine")
    te.__version__ = "2.11.0"
    common = types.ModuleType("transformer_engine.common")
    te_torch = types.ModuleType("transformer_engine.pytorch")
    te_torch.autocast = lambda **kw: Context("autocast", kw)
    te_torch.quantized_model_init = lambda **kw: Context("quantized_model_init", kw)
    modules = {
        "transformer_engine": te,
        "transformer_engine.common": common,
        "transformer_engine.common.recipe": fake_recipe_module(),
        "transformer_engine.pytorch": te_torch,
    }
    for name, module in modules.items():
        # a spec, as an imported package has: importlib.util.find_spec (peft's check for TE) reads it
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        monkeypatch.setitem(sys.modules, name, module)
    return calls


@pytest.mark.parametrize(
    ("prec", "fp8_recipe", "class_name", "kwargs"),
    [
        ("fp8", "delayed", "DelayedScaling",
         {"fp8_format": Format.HYBRID, "amax_history_len": 1024, "amax_compute_algo": "max"}),
        ("fp8", "current", "Float8CurrentScaling", {"fp8_format": Format.HYBRID}),
        ("fp8", "mxfp8", "MXFP8BlockScaling", {"fp8_format": Format.E4M3}),
        ("mxfp8", "delayed", "MXFP8BlockScaling", {"fp8_format": Format.E4M3}),
        ("nvfp4", "delayed", "NVFP4BlockScaling", {}),
    ],
)  # fmt: skip
def test_te_precisions_map_to_their_recipe(fake_te, prec, fp8_recipe, class_name, kwargs):
    recipe = precision.plan(prec, fp8_recipe, False).recipe
    assert type(recipe).__name__ == class_name
    assert recipe.kwargs == kwargs


@pytest.mark.parametrize(
    ("prec", "dtype"), [("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)]
)
def test_torch_precisions_need_no_te(prec, dtype):
    plan = precision.plan(prec, "delayed", False)
    assert (plan.recipe, plan.dtype) == (None, dtype)
    assert (plan.grad_scaler() is not None) == (prec == "fp16")
    with plan.autocast(), plan.init_context():
        pass


def test_fp8_auto_is_current_scaling_on_hopper_and_mxfp8_on_blackwell(fake_te):
    assert type(precision.plan("fp8", "auto", False, sm=(9, 0)).recipe).__name__ == "Float8CurrentScaling"
    assert type(precision.plan("fp8", "auto", False, sm=(10, 0)).recipe).__name__ == "MXFP8BlockScaling"


def test_te_autocast_and_quantized_init_contexts(fake_te):
    group = object()  # the FSDP mesh's group, passed explicitly as TE's amax reduction group
    plan = precision.plan("mxfp8", "delayed", True, amax_reduction_group=group)
    with plan.init_context(), plan.autocast():
        pass
    assert fake_te == [
        ("quantized_model_init", {"enabled": True, "recipe": plan.recipe}),
        ("autocast", {"enabled": True, "recipe": plan.recipe, "amax_reduction_group": group}),
    ]


def test_nvfp4_keeps_the_first_and_last_blocks_out_of_quantization(fake_te):
    plan = precision.plan("nvfp4", "auto", False, sm=(10, 0))
    layers = [torch.nn.Identity() for _ in range(6)]
    assert plan.keep_edge_blocks_high_precision(layers, 1) == [0, 5]
    layers[0](torch.ones(1))
    layers[2](torch.ones(1))
    assert [call for call in fake_te if call[0] == "autocast"] == [
        ("autocast", {"enabled": False, "recipe": plan.recipe, "amax_reduction_group": None})
    ]


@pytest.mark.parametrize(
    ("prec", "capability", "message"),
    [
        ("mxfp8", (9, 0), "mxfp8 needs a data-centre Blackwell GPU (SM 10.x); this GPU is SM 9.0"),
        ("nvfp4", (12, 0), "nvfp4 needs a data-centre Blackwell GPU (SM 10.x); this GPU is SM 12.0"),
        ("fp8", (8, 0), "fp8 needs SM 8.9+"),
        ("bf16", (7, 0), "bf16 needs SM 8.0+"),
    ],
)
def test_hardware_check_rejects_wrong_gpu(prec, capability, message):
    with pytest.raises(
        precision.PrecisionError, match=message.replace("(", r"\(").replace(")", r"\)")
    ) as err:
        precision.check_hardware(prec, has_te=True, cuda_available=True, capability=capability)
    assert err.value.field == "precision"
    assert "ml.p6-b200.48xlarge" in str(err.value) or prec == "bf16"


@pytest.mark.parametrize(
    ("prec", "has_te", "cuda", "capability"),
    [("mxfp8", True, True, (10, 0)), ("fp8", True, True, (9, 0)), ("fp32", False, False, None),
     ("bf16", False, False, None), ("nvfp4", True, True, (10, 3))],
)  # fmt: skip
def test_hardware_check_accepts_supported(prec, has_te, cuda, capability):
    precision.check_hardware(prec, has_te=has_te, cuda_available=cuda, capability=capability)


def test_hardware_check_needs_te_and_a_gpu():
    with pytest.raises(precision.PrecisionError, match="needs NVIDIA Transformer Engine"):
        precision.check_hardware("fp8", has_te=False, cuda_available=True, capability=(10, 0))
    with pytest.raises(precision.PrecisionError, match="needs an NVIDIA GPU"):
        precision.check_hardware("nvfp4", has_te=True, cuda_available=False, capability=None)


def test_every_te_precision_has_a_recipe_and_others_none():
    for prec in hardware.PRECISIONS:
        assert (precision.recipe_spec(prec) is not None) == (prec in hardware.TE_PRECISIONS)


def test_selfcheck_passes_with_te_and_names_the_recipes(fake_te, capsys):
    assert selfcheck.main([]) == 0
    out = capsys.readouterr().out
    for name in ("DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "NVFP4BlockScaling"):
        assert f"recipe {name}" in out


def test_selfcheck_fails_on_wrong_te_version(fake_te, capsys):
    assert selfcheck.main(["--expected-te-version", "2.12.0"]) == 1
    assert "FAILED: transformer_engine is 2.11.0; expected 2.12.0" in capsys.readouterr().out


def test_selfcheck_reports_missing_te_clearly(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # makes the import raise ImportError
    assert selfcheck.main([]) == 1
    out = capsys.readouterr().out
    assert "FAILED: import transformer_engine: ModuleNotFoundError" in out
    assert "ok: import training.trainer.loop" in out
