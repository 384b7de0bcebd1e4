"""training.models.config: the typed model config's checks, its per-layer views, its counts and FLOPs (equal to the
contract's Llama formulas where the model is Llama's, each sliding-window layer's attention counted at its
window)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from training.contract import shapes
from training.models import registry
from training.models.config import AttentionBias, ModelConfig, ModelConfigError, RopeConfig


def _tiny(**changes) -> ModelConfig:
    values = dict(
        family="llama3",
        vocab_size=64,
        hidden_size=32,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        ffn_hidden_size=48,
    )
    return ModelConfig(**(values | changes))


@pytest.mark.parametrize(
    "preset", [n for n in shapes.MODEL_PRESETS if registry.named_size(n).family == "llama3"]
)
def test_a_llama_size_counts_and_flops_as_the_contract_does(preset):
    """The Llama sizes here and the contract's presets agree on the shape, and every count and FLOPs figure is
    the contract's, to the last bit."""
    shape = shapes.MODEL_PRESETS[preset]
    config = registry.named_size(preset)
    assert (config.num_layers, config.hidden_size, config.num_heads, config.ffn_hidden_size) == (
        shape.num_layers,
        shape.hidden_size,
        shape.num_heads,
        shape.ffn_hidden_size,
    )
    assert (config.vocab_size, config.kv_heads, config.head_dim, config.tie_embeddings) == (
        shape.vocab_size,
        shape.kv_heads,
        shape.head_dim,
        shape.tie_embeddings,
    )
    assert config.block_parameter_count() == shape.block_parameter_count()
    assert config.root_parameter_count() == shape.root_parameter_count()
    assert config.parameter_count() == shape.parameter_count()
    for seq in (1, 2048, 131072):
        assert config.flops_per_token(seq) == shapes.flops_per_token(shape, seq)
        assert config.flops_per_token(seq, 12345) == shapes.flops_per_token(shape, seq, 12345)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert config.lora_block_parameter_count(16, targets) == shapes.lora_block_parameter_count(
        shape, 16, targets
    )


def test_a_sliding_window_layer_counts_its_attention_at_its_window():
    full = _tiny()
    windowed = _tiny(layer_types=("sliding", "full", "sliding"), sliding_window=100)
    seq = 1000
    width = 4 * 8
    assert full.flops_per_token(seq) - windowed.flops_per_token(seq) == 12.0 * width * 2 * (seq - 100)
    # A window longer than the sequence changes nothing.
    assert windowed.flops_per_token(50) == full.flops_per_token(50)
    assert [windowed.attention_span(i, seq) for i in range(3)] == [100, seq, 100]
    assert [windowed.window(i) for i in range(3)] == [100, None, 100]


def test_the_attention_width_is_the_query_heads_not_the_hidden_size():
    """Qwen 3 32B: 64 query heads of 128 are 8192 wide, its hidden size 5120."""
    config = registry.named_size("qwen3-32b")
    assert (config.q_width, config.kv_width, config.hidden_size) == (8192, 1024, 5120)
    assert config.projection_shapes()["q_proj"] == (8192, 5120)
    assert config.projection_shapes()["o_proj"] == (5120, 8192)
    seq = 4096
    matmul_parameters = config.parameter_count() - config.vocab_size * 5120  # all but the embedding lookup
    attention = config.flops_per_token(seq) - 6.0 * matmul_parameters
    assert attention == 12.0 * 64 * 8192 * seq


def test_per_layer_rope_and_scale():
    gemma = registry.named_size("gemma3-27b")
    assert gemma.rope_of(0) == RopeConfig(10000.0)
    assert gemma.rope_of(5) == RopeConfig(1_000_000.0, "linear", 8.0)
    assert gemma.attention_scale == 168**-0.5
    assert gemma.embedding_multiplier == 5376**0.5
    llama = registry.named_size("llama3.1-8b")
    assert llama.attention_scale == 128**-0.5 and llama.embedding_multiplier == 1.0
    assert replace(llama, position_encoding="none").rope_of(0) is None


def test_bias_norms_and_qk_norm_count():
    base = _tiny()
    assert _tiny(attention_bias=AttentionBias(True, True, True, False)).block_parameter_count() == (
        base.block_parameter_count() + 32 + 2 * 16
    )
    assert _tiny(attention_bias=AttentionBias(True, True, True, True)).block_parameter_count() == (
        base.block_parameter_count() + 32 + 2 * 16 + 32
    )
    assert _tiny(qk_norm=True).block_parameter_count() == base.block_parameter_count() + 2 * 8
    assert _tiny(norm_placement="sandwich").block_parameter_count() == base.block_parameter_count() + 2 * 32


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"num_kv_heads": 3}, "num_kv_heads", "must divide num_heads 4"),
        ({"activation": "relu"}, "activation", "must be one of silu, gelu_tanh"),
        ({"layer_types": ("full",)}, "layer_types", "has 1 entries for num_layers 3"),
        ({"layer_types": ("full", "sliding", "full")}, "sliding_window", "must be a positive integer"),
        (
            {"layer_types": ("full", "local", "full"), "sliding_window": 4},
            "layer_types",
            "must be one of full",
        ),
        ({"attention_bias": AttentionBias(q=True)}, "attention_bias", "all of the query, key and value"),
        ({"num_heads": 0}, "num_heads", "must be a positive integer"),
        ({"query_pre_attn_scalar": -1.0}, "query_pre_attn_scalar", "must be positive"),
    ],
)
def test_a_config_the_trainer_cannot_build_is_refused_naming_the_field(changes, field, fragment):
    with pytest.raises(ModelConfigError) as caught:
        _tiny(**changes)
    assert caught.value.field == field
    assert fragment in str(caught.value) and str(caught.value).startswith(field)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("rope", "field"),
    [
        (dict(theta=0.0), "rope_theta"),
        (dict(scaling="yarn"), "rope_scaling"),
        (dict(scaling="linear"), "factor"),
        (dict(scaling="linear", factor=2.0, low_freq_factor=1.0), "low_freq_factor"),
        (dict(scaling="llama3", factor=8.0), "low_freq_factor"),
    ],
)
def test_rope_settings_are_checked(rope, field):
    with pytest.raises(ModelConfigError) as caught:
        RopeConfig(**rope)
    assert caught.value.field == field


def test_summary_is_plain_values():
    summary = registry.named_size("gemma3-12b").summary()
    assert summary["rope"] == {
        "theta": 1_000_000.0,
        "scaling": "linear",
        "factor": 8.0,
        "low_freq_factor": None,
        "high_freq_factor": None,
        "original_max_position_embeddings": None,
    }
    assert summary["layer_types"][:6] == ["sliding"] * 5 + ["full"]
    assert summary["attention_bias"] == {"q": False, "k": False, "v": False, "o": False}


def test_a_trimmed_model_keeps_each_kind_of_layer():
    """What the memory traces measure in place of a whole named size: its first blocks, its last layer's kind kept
    (Gemma 3's global layer beside a local one), the vocabulary replaced when asked."""
    gemma = registry.named_size("gemma3-12b")
    two = gemma.trimmed(2, 32_000)
    assert (two.num_layers, two.layer_types, two.vocab_size) == (2, ("sliding", "full"), 32_000)
    assert gemma.trimmed(6).layer_types == gemma.layer_types[:6]
    assert gemma.trimmed(1).layer_types == ("sliding",)
    assert two.block_parameter_count() == gemma.block_parameter_count()
    qwen = registry.named_size("qwen2.5-7b").trimmed(3)
    assert (qwen.num_layers, qwen.layer_types, qwen.vocab_size) == (3, ("full",) * 3, 152_064)
