"""training.models.settings: the contract's flat model settings of a config, for Llama exactly what
``hf_config.architecture`` has always given; and the Llama model of a run's settings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.models.tiny import tiny_hf_config
from tests.request.test_hf_config import LLAMA_3_2_1B
from training.contract import settings_parse, shapes
from training.models import registry, settings
from training.models.config import ModelConfig, ModelConfigError
from training.models.llama3 import settings as llama3_settings
from training.request import hf_config


@pytest.mark.parametrize(
    "config",
    [
        LLAMA_3_2_1B,
        tiny_hf_config("llama3"),
        tiny_hf_config("llama3", rope_scaling=None),
        {k: v for k, v in LLAMA_3_2_1B.items() if k not in ("rms_norm_eps", "rope_theta")},
    ],
)
def test_a_llama_config_gives_the_settings_hf_config_gives(config):
    given = settings.to_settings(registry.read_hf_config(config))
    assert "model_config" not in given  # the flat settings say it all: nothing new in a Llama run's settings
    assert given == hf_config.architecture(config)
    assert list(given) == list(hf_config.architecture(config))


@pytest.mark.parametrize(
    "preset", [n for n in shapes.MODEL_PRESETS if registry.named_size(n).family == "llama3"]
)
def test_a_llama_presets_settings_give_its_named_size(preset):
    values = settings_parse.parse_hyperparameters({"model_preset": preset})
    size = registry.named_size(preset)
    assert llama3_settings.from_flat_settings(values) == replace(size, max_position_embeddings=None)


def test_a_run_saved_before_the_newer_settings_is_the_model_it_trained():
    old = {"num_layers": 2, "hidden_size": 32, "num_heads": 4, "ffn_hidden_size": 48, "vocab_size": 64,
           "rope_theta": 10000.0}  # fmt: skip
    config = llama3_settings.from_flat_settings(old)
    assert (config.num_kv_heads, config.tie_embeddings, config.norm_eps, config.position_encoding) == (
        4,
        False,
        1e-5,
        "rope",
    )


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral", "gemma3"])
def test_other_families_give_their_shape_and_the_whole_config(family):
    config = registry.read_hf_config(tiny_hf_config(family))
    given = settings.to_settings(config)
    assert given["num_kv_heads"] == 2 and given["rms_norm_eps"] == 1e-5
    assert given["model_config"] == config.summary() and settings.model_config(given) == config
    if family == "gemma3":
        assert (given["rope_theta"], given["rope_scaling"], given["rope_scaling_factor"]) == (
            1e6,
            "linear",
            2.0,
        )


def test_a_llama_the_flat_settings_cannot_say_carries_its_config():
    for changes in ({"head_dim": 16}, {"attention_bias": True}):
        config = registry.read_hf_config(tiny_hf_config("llama3", **changes))
        given = settings.to_settings(config)
        assert settings.needs_model_config(config) and settings.model_config(given) == config


def test_a_summary_reads_back_and_a_bad_one_is_refused():
    for size in registry.SIZES.values():
        assert ModelConfig.from_summary(size.summary()) == size
    with pytest.raises(ModelConfigError, match="model_config has unknown keys"):
        ModelConfig.from_summary({**size.summary(), "heads": 3})
