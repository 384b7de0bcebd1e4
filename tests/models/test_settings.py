"""training.models.settings: the contract's flat model settings of a config, for Llama exactly what
``hf_config.architecture`` has always given; and the Llama model of a run's settings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.models.tiny import tiny_hf_config
from training.models import registry, settings
from training.request import contract, hf_config

from ..training.test_hf_config import LLAMA_3_2_1B


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
    assert given.pop("model_family") == "llama3"
    assert given == hf_config.architecture(config)
    assert list(given) == list(hf_config.architecture(config))


@pytest.mark.parametrize("preset", list(contract.MODEL_PRESETS))
def test_a_llama_presets_settings_give_its_named_size(preset):
    values = contract.parse_hyperparameters({"model_preset": preset})
    size = registry.named_size(preset)
    assert settings.llama_from_settings(values) == replace(size, max_position_embeddings=None)


def test_a_run_saved_before_the_newer_settings_is_the_model_it_trained():
    old = {"num_layers": 2, "hidden_size": 32, "num_heads": 4, "ffn_hidden_size": 48, "vocab_size": 64,
           "rope_theta": 10000.0}  # fmt: skip
    config = settings.llama_from_settings(old)
    assert (config.num_kv_heads, config.tie_embeddings, config.norm_eps, config.position_encoding) == (
        4,
        False,
        1e-5,
        "rope",
    )


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral", "gemma3"])
def test_other_families_give_their_shape_and_family(family):
    config = registry.read_hf_config(tiny_hf_config(family))
    given = settings.to_settings(config)
    assert given["model_family"] == family and given["num_kv_heads"] == 2 and given["rms_norm_eps"] == 1e-5
    if family == "gemma3":
        assert (given["rope_theta"], given["rope_scaling"], given["rope_scaling_factor"]) == (
            1e6,
            "linear",
            2.0,
        )
