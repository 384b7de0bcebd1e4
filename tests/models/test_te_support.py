"""training.models.te_support: which families Transformer Engine 2.11's TransformerLayer can be the block of."""

from __future__ import annotations

from dataclasses import replace

import pytest

from training.models import registry
from training.models.config import AttentionBias
from training.models.te_support import te_refusal


@pytest.mark.parametrize(
    ("size", "fragment"),
    [
        ("llama3.1-8b", None),
        ("qwen3-32b", None),
        ("mistral-7b-v0.3", None),
        ("qwen2.5-7b", "q/k/v projections alone"),
        ("gemma3-12b", "norms after attention"),
    ],
)
def test_each_named_size(size, fragment):
    problem = te_refusal(registry.named_size(size))
    if fragment is None:
        assert problem is None
    else:
        assert fragment in problem and "\n" not in problem


def test_the_other_reasons():
    llama = registry.named_size("llama3.1-8b")
    assert "q/k/v/o" in te_refusal(replace(llama, attention_bias=AttentionBias(True, True, True, True)))
    gemma = replace(registry.named_size("gemma3-27b"), norm_placement="pre")
    assert "(1 + w)" in te_refusal(gemma)
    scaled = replace(llama, query_pre_attn_scalar=100.0)
    assert "query_pre_attn_scalar 100" in te_refusal(scaled)
    assert te_refusal(replace(llama, query_pre_attn_scalar=128.0)) is None
    windowed = replace(llama, layer_types=("sliding",) * 32, sliding_window=4096)
    assert te_refusal(windowed) is None
