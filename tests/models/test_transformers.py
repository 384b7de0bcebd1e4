"""The model configs against transformers: every named size and a tiny model of each family (with its optional
features on and off) builds, from the config.json the family writes, the right transformers class with exactly the
parameter count, tensor names and shapes the config says (on the meta device: no memory); transformers' own
rewriting of that config.json (the transformers 5 spelling) reads back to the same config; the published
config.json of each named size (the transformers 4 spelling) reads to that size."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers

from training.models import registry
from training.models.config import ModelConfig

from .tiny import tiny_hf_config

PUBLISHED = Path(__file__).parent / "published"

VARIANTS = {
    "llama3": [
        {},
        {"attention_bias": True, "tie_word_embeddings": True},
        {"rope_scaling": None, "head_dim": 16},
    ],
    "qwen2": [{}, {"tie_word_embeddings": True}, {"head_dim": 16}],
    "qwen3": [{}, {"attention_bias": True}, {"tie_word_embeddings": True, "num_key_value_heads": 4}],
    "mistral": [{}, {"sliding_window": None}, {"head_dim": None, "tie_word_embeddings": True}],
    "gemma3": [
        {},
        {"attention_bias": True, "tie_word_embeddings": False},
        {"layer_types": None, "sliding_window_pattern": 2},
    ],
}
"""Tiny configs per family: the default and variants switching its optional features."""
TINY_CASES = [(family, changes) for family, variants in VARIANTS.items() for changes in variants]


def _transformers_model(config: dict) -> torch.nn.Module:
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf_config)


def _check_against_transformers(model_config: ModelConfig) -> None:
    family = registry.family(model_config.family)
    written = registry.write_hf_config(model_config)
    model = _transformers_model(written)
    assert type(model).__name__ == family.architecture
    assert sum(p.numel() for p in model.parameters()) == model_config.parameter_count()
    state = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if model_config.tie_embeddings:
        assert state.pop("lm_head.weight") == state["model.embed_tokens.weight"]
    assert state == family.names(model_config).tensors()
    assert registry.read_hf_config(model.config.to_dict()) == replace(
        model_config, max_position_embeddings=model.config.max_position_embeddings
    )


@pytest.mark.parametrize("size", list(registry.SIZES))
def test_every_named_size_is_its_transformers_model(size):
    _check_against_transformers(registry.named_size(size))


@pytest.mark.parametrize(("family", "changes"), TINY_CASES)
def test_a_tiny_model_of_each_family_is_its_transformers_model(family, changes):
    config = registry.read_hf_config(tiny_hf_config(family, **changes))
    _check_against_transformers(config)


@pytest.mark.parametrize(("family", "changes"), TINY_CASES)
def test_the_written_config_json_reads_back_to_the_same_config(family, changes):
    config = registry.read_hf_config(tiny_hf_config(family, **changes))
    assert registry.read_hf_config(registry.write_hf_config(config)) == config
    assert json.loads(json.dumps(registry.write_hf_config(config))) == registry.write_hf_config(config)


@pytest.mark.parametrize("size", [p.stem for p in sorted(PUBLISHED.glob("*.json"))])
def test_each_published_config_json_is_its_named_size(size):
    published = json.loads((PUBLISHED / f"{size}.json").read_text())
    assert registry.read_hf_config(published) == registry.named_size(size)


def test_transformers_reads_the_windows_and_ropes_the_config_says():
    """The keys that decide the forward, as transformers' classes hold them after reading the written file."""
    gemma = registry.read_hf_config(tiny_hf_config("gemma3"))
    hf = transformers.AutoConfig.for_model(**registry.write_hf_config(gemma))
    assert hf.layer_types == ["sliding_attention", "full_attention"] and hf.sliding_window == 5
    assert hf.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    assert hf.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert hf.query_pre_attn_scalar == 12 and hf.head_dim == 16
    mistral = registry.read_hf_config(tiny_hf_config("mistral"))
    hf = transformers.AutoConfig.for_model(**registry.write_hf_config(mistral))
    assert hf.sliding_window == 5 and hf.head_dim == 16
    qwen = registry.read_hf_config(tiny_hf_config("qwen2", head_dim=16))
    hf = transformers.AutoConfig.for_model(**registry.write_hf_config(qwen))
    assert hf.sliding_window is None and hf.head_dim == 16 and hf.layer_types == ["full_attention"] * 2


@pytest.mark.parametrize(("family", "changes"), TINY_CASES)
def test_the_name_map_goes_both_ways(family, changes):
    config = registry.read_hf_config(tiny_hf_config(family, **changes))
    names = registry.family(family).names(config)
    tensors = names.tensors()
    seen: dict[str, list[str]] = {}
    for ours, dims in names.parameters().items():
        parts = names.parts(ours)
        assert parts is not None
        assert sum(tensors[p][0] for p in parts) == dims[0]  # stacked along the rows
        assert all(tensors[p][1:] == dims[1:] for p in parts)
        for position, part in enumerate(parts):
            assert names.owner(part) == (ours, position)
            assert names.dims(part) == tensors[part]
        seen[ours] = list(parts)
    assert sorted(p for parts in seen.values() for p in parts) == sorted(tensors)
    assert (
        names.parts("layers.2.qkv.weight") is None
        and names.owner("model.layers.2.mlp.up_proj.weight") is None
    )
    assert (names.parts("head.weight") is None) == config.tie_embeddings
