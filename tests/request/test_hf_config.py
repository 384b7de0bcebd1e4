"""training.request.hf_config: a Hugging Face config.json in the contract's terms (both RoPE spellings), the
refusals of what the trainer cannot load, and the config.json the export writes back."""

from __future__ import annotations

import json

import pytest
from transformers import LlamaConfig

from tests.training.hf_models import tiny_config
from training.contract import settings_parse, settings_table, shapes
from training.models import registry
from training.request import hf_config

LLAMA_3_2_1B = {  # meta-llama/Llama-3.2-1B config.json, as transformers 4.45 wrote it
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}


def test_the_transformers_4_spelling_of_llama_3_2_1b_is_the_preset():
    settings = hf_config.architecture(LLAMA_3_2_1B)
    values = settings_parse.parse_hyperparameters({}, settings)
    assert values["model_preset"] == "llama3.2-1b"
    assert settings_parse.model_shape(values) == shapes.MODEL_PRESETS["llama3.2-1b"]
    assert (values["rope_theta"], values["rope_scaling"], values["rope_scaling_factor"]) == (
        500000.0,
        "llama3",
        32.0,
    )


def test_the_transformers_5_spelling_and_the_old_type_key_give_the_same_settings():
    v5 = tiny_config(tied=True).to_dict()
    assert "rope_parameters" in v5
    v4 = {k: v for k, v in v5.items() if k != "rope_parameters"}
    rope = dict(v5["rope_parameters"])
    v4["rope_theta"] = rope.pop("rope_theta")
    v4["rope_scaling"] = {**rope, "type": rope.pop("rope_type")}
    assert hf_config.architecture(v5) == hf_config.architecture(v4)
    assert hf_config.architecture(v5)["rope_original_max_position_embeddings"] == 16
    plain = {**v4, "rope_scaling": None}
    assert hf_config.architecture(plain)["rope_scaling"] == "none"
    without_theta = {k: v for k, v in plain.items() if k != "rope_theta"}
    assert hf_config.architecture(without_theta)["rope_theta"] == 10000.0  # LlamaConfig's default
    nulls = {**plain, "rope_theta": None, "num_key_value_heads": None}  # transformers' "the default"
    assert hf_config.architecture(nulls)["num_kv_heads"] == plain["num_attention_heads"]


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (
            {"model_type": "phi3"},
            "model_type 'phi3' is not supported; supported: llama (LlamaForCausalLM), qwen2",
        ),
        ({"model_type": "mistral"}, "architectures ['LlamaForCausalLM'] is not model_type 'mistral''s class"),
        (
            {"architectures": ["LlamaForSequenceClassification"]},
            "is not supported; supported: llama (LlamaForCausalLM)",
        ),
        ({"model_type": "qwen3_moe"}, "model_type 'qwen3_moe' is a mixture-of-experts model"),
        ({"mlp_bias": True}, "mlp_bias true is not supported"),
        ({"hidden_act": "gelu"}, 'hidden_act "gelu" is not supported'),
        ({"rms_norm_eps": 0.5}, "config.json: rms_norm_eps must be a number from 1e-12 to 0.01; got 0.5"),
        ({"rms_norm_eps": "1e-5"}, "rms_norm_eps must be a number from 1e-12 to 0.01; got '1e-5'"),
        (
            {"quantization_config": {"quant_method": "fbgemm_fp8"}},
            "quantization_config (quant_method 'fbgemm_fp8')",
        ),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE type 'yarn', which is not supported"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            "RoPE type llama3, which needs low_freq_factor",
        ),
        ({"num_hidden_layers": None}, "num_hidden_layers is missing"),
        ({"vocab_size": "128256"}, "vocab_size must be a positive integer; got '128256'"),
    ],
)
def test_what_the_trainer_cannot_load_is_refused_on_init_from(change, fragment):
    config = {**LLAMA_3_2_1B, **change}
    with pytest.raises(settings_table.ContractError) as info:
        hf_config.architecture(config, "s3://bucket/data/llama/")
    assert info.value.field == "init_from"
    assert str(info.value).startswith("init_from: s3://bucket/data/llama/: ") and fragment in str(info.value)


def test_rms_norm_eps_is_the_folders_or_transformers_default_and_the_presets_keep_llama_3s():
    """A config.json without rms_norm_eps is read as transformers' LlamaConfig reads it (1e-6), not as the
    presets' 1e-5; an explicit setting that contradicts the folder is refused, naming it."""
    without = {k: v for k, v in LLAMA_3_2_1B.items() if k != "rms_norm_eps"}
    assert (
        hf_config.architecture(without)["rms_norm_eps"] == LlamaConfig.from_dict(without).rms_norm_eps == 1e-6
    )
    values = settings_parse.parse_hyperparameters({}, hf_config.architecture(without))
    assert values["rms_norm_eps"] == 1e-6
    assert values["model_preset"] == "custom"  # not exactly Llama 3.2 1B any more
    with pytest.raises(settings_table.ContractError) as info:
        settings_parse.parse_hyperparameters({"rms_norm_eps": "1e-5"}, hf_config.architecture(without))
    assert info.value.field == "rms_norm_eps" and "config.json has rms_norm_eps=1e-06; got 1e-05" in str(
        info.value
    )
    llama2 = settings_parse.parse_hyperparameters(
        {}, hf_config.architecture({**LLAMA_3_2_1B, "rms_norm_eps": 1e-6})
    )
    assert llama2["rms_norm_eps"] == 1e-6
    assert hf_config.architecture(LLAMA_3_2_1B)["rms_norm_eps"] == 1e-5  # the published value
    for (
        preset
    ) in shapes.MODEL_PRESETS:  # the Llama ones keep Llama 3's; the other families' their published one
        expected = registry.named_size(preset).norm_eps
        assert expected == 1e-5 or registry.named_size(preset).family != "llama3", preset
        assert settings_parse.parse_hyperparameters({"model_preset": preset})["rms_norm_eps"] == expected, (
            preset
        )
    assert hf_config.to_config(llama2)["rms_norm_eps"] == 1e-6  # and the export writes it back


def test_the_written_config_reads_back_the_same_in_this_module_and_in_transformers():
    values = settings_parse.parse_hyperparameters({"model_preset": "llama3.1-8b"})
    written = hf_config.to_config(values)
    assert hf_config.architecture(written) == {k: values[k] for k in hf_config.architecture(written)}
    loaded = LlamaConfig(**json.loads(json.dumps(written)))
    assert loaded.num_key_value_heads == 8 and loaded.tie_word_embeddings is False
    assert loaded.rope_parameters["rope_type"] == "llama3" and loaded.rope_parameters["factor"] == 8.0
    assert loaded.rope_parameters["rope_theta"] == 500000.0


def test_a_folder_that_is_missing_or_unreadable_is_refused(tmp_path):
    with pytest.raises(settings_table.ContractError, match="is not a folder"):
        hf_config.read_local(tmp_path / "nothing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(settings_table.ContractError, match="config.json is not valid JSON"):
        hf_config.read_local(tmp_path)
