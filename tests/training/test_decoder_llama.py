"""training.trainer.decoder for Llama is training.trainer.model, bit for bit: the same parameter names, and with the
same weights the same logits, loss and gradients (plain, packed documents, llama3 RoPE scaling, NoPE), so that
replacing model.py by decoder.py leaves the trainer's Llama numbers unchanged."""

from __future__ import annotations

import pytest
import torch

from training.models.config import ModelConfig, RopeConfig
from training.request import contract
from training.trainer import decoder, doc_mask, model
from training.trainer.rotary import Llama3Scaling

CASES = {
    "mha-untied": dict(num_kv_heads=4, tied=False, rope=RopeConfig(10000.0), encoding="rope"),
    "gqa-tied-llama3": dict(num_kv_heads=2, tied=True, rope=RopeConfig(500000.0, "llama3", 8.0, 1.0, 4.0, 16),
                            encoding="rope"),
    "nope": dict(num_kv_heads=2, tied=False, rope=RopeConfig(10000.0), encoding="none"),
}  # fmt: skip


def _pair(case: dict) -> tuple[model.Transformer, decoder.Transformer]:
    shape = contract.ModelShape(
        2, 32, 4, 48, 64, num_kv_heads=case["num_kv_heads"], tie_embeddings=case["tied"]
    )
    rope: RopeConfig = case["rope"]
    scaling = None if rope.scaling == "none" else Llama3Scaling(rope.factor, rope.low_freq_factor,
                                                                  rope.high_freq_factor,
                                                                  rope.original_max_position_embeddings)  # fmt: skip
    old = model.build_model(shape, use_te=False, te_params_dtype=torch.float32,
                            position_encoding=case["encoding"], rope_theta=rope.theta, rope_scaling=scaling,
                            norm_eps=1e-5, loss_chunk_tokens=5)  # fmt: skip
    config = ModelConfig(family="llama3", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                         num_kv_heads=case["num_kv_heads"], head_dim=8, ffn_hidden_size=48, norm_eps=1e-5,
                         tie_embeddings=case["tied"], rope=rope, position_encoding=case["encoding"])  # fmt: skip
    new = decoder.build_model(config, use_te=False, te_params_dtype=torch.float32, loss_chunk_tokens=5)
    old.to_empty(device="cpu")
    new.to_empty(device="cpu")
    assert [n for n, _ in old.named_parameters()] == [n for n, _ in new.named_parameters()]
    torch.manual_seed(0)
    with torch.no_grad():
        for (_, a), (_, b) in zip(old.named_parameters(), new.named_parameters(), strict=True):
            a.normal_()
            b.copy_(a)
    return old, new


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("packed", [False, True])
def test_the_same_logits_loss_and_gradients_bit_for_bit(case, packed):
    old, new = _pair(CASES[case])
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (2, 12), generator=generator)
    targets = torch.randint(0, 64, (2, 12), generator=generator)
    documents = None
    if packed:
        ids = torch.tensor([[1] * 5 + [2] * 7, [1] * 3 + [2] * 2 + [3] * 6 + [0]])
        documents = doc_mask.Documents.from_ids(ids)
    with torch.no_grad():
        assert torch.equal(old.logits(tokens, documents), new.logits(tokens, documents))
    old_loss, new_loss = old(tokens, targets, documents), new(tokens, targets, documents)
    assert torch.equal(old_loss, new_loss)
    old_loss.backward()
    new_loss.backward()
    for (name, a), (_, b) in zip(old.named_parameters(), new.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name
