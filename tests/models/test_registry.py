"""training.models.registry: every family folder is registered, a config.json picks its family by model_type and
architectures, and what the trainer does not build is refused in one line naming the key and what is supported.
The package is pure Python (the request check's Lambda runs it)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from training.models import registry
from training.models.config import ModelConfigError

from .tiny import tiny_hf_config

PACKAGE = Path(registry.__file__).parent


def test_the_registry_covers_every_family_folder():
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(registry.FAMILIES)
    for name, family in registry.FAMILIES.items():
        assert family.name == name
        assert family.read.__module__ == f"training.models.{name}.hf_config"
        assert all(size.family == name for size in family.sizes.values())


def test_a_family_folder_is_reached_only_through_the_registry():
    """Outside its own folder, nothing imports a family's modules but the registry (and ``settings``, which reads
    the flat settings as the Llama they describe): adding a family touches its folder and one registry line, and
    nothing family-specific lives in the trainer, the planner or the request code."""
    training = PACKAGE.parent
    allowed = {PACKAGE / "registry.py", PACKAGE / "settings.py"}
    for path in [*training.rglob("*.py"), *(training.parent / "constructs_lib").rglob("*.py")]:
        if path in allowed or path.parent.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for module in modules:
                parts = module.split(".")
                family = parts[2] if parts[:2] == ["training", "models"] and len(parts) > 2 else None
                assert family not in registry.FAMILIES, f"{path} imports {module}"


def test_the_trainer_builds_only_from_a_model_config():
    """The trainer's code never sees the contract's Llama ``ModelShape`` (``training.contract.shapes``): a run's
    settings become a ``ModelConfig`` once (``TrainConfig.shape``, through the flat settings' family folder), and
    the model, its layout, LoRA, the exports and the meters take that config only."""
    trainer = PACKAGE.parent / "trainer"
    for path in trainer.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                modules = []
            assert "training.contract.shapes" not in modules, f"{path} imports training.contract.shapes"
            name = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else None
            )
            assert name != "ModelShape", f"{path}:{node.lineno} uses ModelShape"


def test_named_sizes_are_unique_across_families():
    names = [name for family in registry.FAMILIES.values() for name in family.sizes]
    assert len(names) == len(set(names)) == len(registry.SIZES)
    assert {
        "qwen2.5-7b",
        "qwen2.5-72b",
        "qwen3-8b",
        "qwen3-32b",
        "mistral-7b-v0.3",
        "gemma3-12b",
        "gemma3-27b",
    } <= set(names)


def test_the_package_imports_only_the_standard_library():
    """No torch (nor anything else outside the standard library): the Lambda and the image both import it."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert (
                    top in sys.stdlib_module_names
                    or name.startswith("training.models")
                    or top == "__future__"
                ), f"{path.relative_to(PACKAGE)} imports {name}"


@pytest.mark.parametrize("family", list(registry.FAMILIES))
def test_each_family_is_picked_by_model_type_or_architectures(family):
    config = tiny_hf_config(family)
    assert registry.family_of(config).name == family
    assert registry.family_of({k: v for k, v in config.items() if k != "architectures"}).name == family
    assert registry.family_of({k: v for k, v in config.items() if k != "model_type"}).name == family
    assert registry.read_hf_config(config).family == family


def _refusal(config) -> ModelConfigError:
    with pytest.raises(ModelConfigError) as caught:
        registry.read_hf_config(config)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(caught.value.field)
    return caught.value


@pytest.mark.parametrize(
    ("config", "field", "fragment"),
    [
        (
            {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]},
            "model_type",
            "mixture-of-experts",
        ),
        ({"model_type": "mixtral"}, "model_type", "mixture-of-experts"),
        (tiny_hf_config("qwen2", num_experts=8), "num_experts", "mixture-of-experts"),
        (
            {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]},
            "model_type",
            "vision-language",
        ),
        (tiny_hf_config("llama3", vision_config={}), "vision_config", "vision-language"),
        ({"model_type": "gemma2"}, "model_type", "attn_logit_softcapping"),
        (
            {"model_type": "phi3"},
            "model_type",
            "'phi3' is not supported; supported: llama (LlamaForCausalLM)",
        ),
        ({"architectures": ["Phi3ForCausalLM"]}, "architectures", "is not supported"),
        ({}, "model_type", "and architectures are both missing"),
        (
            tiny_hf_config("qwen2", architectures=["LlamaForCausalLM"]),
            "architectures",
            "is not model_type 'qwen2'",
        ),
        (
            tiny_hf_config("mistral", quantization_config={"quant_method": "gptq"}),
            "quantization_config",
            "gptq",
        ),
        (tiny_hf_config("qwen2", use_sliding_window=True), "use_sliding_window", "true is not supported"),
        (tiny_hf_config("qwen3", use_sliding_window=True), "use_sliding_window", "not implemented"),
        (tiny_hf_config("gemma3", attn_logit_softcapping=50.0), "attn_logit_softcapping", "soft-capping"),
        (tiny_hf_config("gemma3", final_logit_softcapping=30.0), "final_logit_softcapping", "soft-capping"),
        (tiny_hf_config("gemma3", use_bidirectional_attention=True), "use_bidirectional_attention", "causal"),
        (tiny_hf_config("gemma3", hidden_activation="gelu"), "hidden_activation", "tanh GELU"),
        (tiny_hf_config("llama3", hidden_act="gelu"), "hidden_act", '"gelu" is not supported'),
        (tiny_hf_config("llama3", mlp_bias=True), "mlp_bias", "no bias"),
        (
            tiny_hf_config("qwen2", rope_scaling={"rope_type": "yarn", "factor": 4.0}),
            "rope_scaling",
            "'yarn'",
        ),
        (
            tiny_hf_config("llama3", rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
            "rope_scaling",
            "dynamic",
        ),
        (tiny_hf_config("qwen3", partial_rotary_factor=0.5), "partial_rotary_factor", "1.0 only"),
        (
            tiny_hf_config("llama3", rope_scaling={"rope_type": "llama3", "factor": 8.0}),
            "rope_scaling",
            "needs",
        ),
        (tiny_hf_config("mistral", rms_norm_eps=0.5), "rms_norm_eps", "from 1e-12 to 0.01"),
        (tiny_hf_config("qwen2", num_hidden_layers=0), "num_hidden_layers", "positive integer"),
        (
            {k: v for k, v in tiny_hf_config("qwen2").items() if k != "hidden_size"},
            "hidden_size",
            "is missing",
        ),
        (tiny_hf_config("gemma3", layer_types=["sliding_attention"]), "layer_types", "each of the 2 layers"),
        (tiny_hf_config("qwen2", layer_types=["sliding_attention"] * 2), "layer_types", "full_attention"),
    ],
)
def test_what_the_trainer_does_not_build_is_refused_in_one_line(config, field, fragment):
    error = _refusal(config)
    assert error.field == field
    assert fragment in str(error)


def test_rope_scaling_and_rope_parameters_must_agree():
    config = tiny_hf_config("llama3")
    both = {**config, "rope_parameters": {**config["rope_scaling"], "rope_theta": 500000.0}}
    assert registry.read_hf_config(both) == registry.read_hf_config(config)
    other = {**both, "rope_parameters": {**both["rope_parameters"], "factor": 4.0}}
    assert "disagrees" in str(_refusal(other))


def test_a_name_that_is_not_a_size_or_a_family_is_refused():
    with pytest.raises(ModelConfigError, match="'qwen2.5-9b' is not a named size; supported: 1b"):
        registry.named_size("qwen2.5-9b")
    with pytest.raises(ModelConfigError, match="'phi' is not a model family"):
        registry.family("phi")
