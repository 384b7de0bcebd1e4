"""training.trainer.layout: our parameters <-> Hugging Face tensors for every family, both blocks (torch's stacked
rows, Transformer Engine's per-group QKV interleaving); (for Llama the values llama_layout gave: ``test_weights``)."""

from __future__ import annotations

import pytest
import torch

from tests.models.tiny import tiny_hf_config
from training.models import registry
from training.trainer.model import layout

FAMILIES = list(registry.FAMILIES)


def _config(family: str):
    return registry.read_hf_config(tiny_hf_config(family, num_attention_heads=4, num_key_value_heads=2))


@pytest.mark.parametrize("family", FAMILIES)
def test_fuse_then_split_gives_back_every_tensor_in_both_blocks(family):
    config = _config(family)
    tensors = {n: torch.randn(d, generator=torch.Generator().manual_seed(i)) for i, (n, d) in
               enumerate(layout.hf_tensors(config).items())}  # fmt: skip
    names = layout.names_of(config)
    seen = set()
    for name, dims in names.parameters().items():
        for candidate in [name] + [f"{name.rsplit('.', 2)[0]}.{te}" for te, ours in layout.TE_BLOCK.items()
                                   if name.endswith("." + ours) and name.startswith("layers.")]:  # fmt: skip
            parts = layout.parts(candidate, config)
            value = layout.fuse(parts, [tensors[n] for n in parts.names], config)
            assert tuple(value.shape) == dims
            back = layout.split(parts, value, config)
            assert all(torch.equal(back[n], tensors[n]) for n in parts.names)
            seen |= set(parts.names)
    assert seen == set(tensors)


def test_te_interleaving_puts_each_groups_key_and_value_after_its_query_heads():
    config = _config("qwen3")  # explicit head_dim 16, 4 heads in 2 groups
    hd, hidden = config.head_dim, config.hidden_size
    q = torch.arange(4 * hd).repeat_interleave(hidden).view(4 * hd, hidden).float()
    k, v = -1 - torch.arange(2 * hd).float().unsqueeze(1).expand(2 * hd, hidden), torch.zeros(2 * hd, hidden)
    parts = layout.parts("layers.0.self_attention.layernorm_qkv.weight", config)
    fused = layout.fuse(parts, [q, k, v], config).view(2, 4, hd, hidden)  # groups, (2 q + k + v), head_dim
    assert torch.equal(fused[0, 0], q[:hd]) and torch.equal(fused[0, 1], q[hd : 2 * hd])
    assert torch.equal(fused[0, 2], k[:hd]) and torch.equal(fused[0, 3], v[:hd])
    assert torch.equal(fused[1, 0], q[2 * hd : 3 * hd]) and torch.equal(fused[1, 2], k[hd:])
