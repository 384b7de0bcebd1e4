"""training.trainer.model.rotary and RoPE in the model: Llama's rotate-half, checked against Hugging Face's own code."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama

from tests.training.llama import llama
from training.trainer.checkpoint import weights
from training.trainer.distributed import activation_checkpoint, parallel
from training.trainer.model import decoder, rotary

HEAD_DIM, THETA, SEQ = 16, 500000.0, 64


def test_frequencies_give_hugging_face_llamas_cos_and_sin():
    config = LlamaConfig(hidden_size=4 * HEAD_DIM, num_attention_heads=4, rope_theta=THETA)
    reference = modeling_llama.LlamaRotaryEmbedding(config)
    x = torch.zeros(1, SEQ, 4 * HEAD_DIM)
    cos, sin = reference(x, torch.arange(SEQ)[None])
    freqs = rotary.frequencies(SEQ, HEAD_DIM, THETA)
    assert freqs.shape == (SEQ, 1, 1, HEAD_DIM) and freqs.dtype == torch.float32  # TE's layout
    torch.testing.assert_close(freqs[:, 0, 0].cos(), cos[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(freqs[:, 0, 0].sin(), sin[0], rtol=0, atol=1e-6)


def test_apply_rotary_is_hugging_faces_apply_rotary_pos_emb():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, SEQ, 3, HEAD_DIM, generator=generator)  # [batch, seq, heads, head_dim] (bshd)
    k = torch.randn(2, SEQ, 3, HEAD_DIM, generator=generator)
    freqs = rotary.frequencies(SEQ, HEAD_DIM, THETA)
    emb = freqs[:, 0, 0][None]
    # Hugging Face rotates [batch, heads, seq, head_dim] with cos/sin of [batch, seq, head_dim]
    hf_q, hf_k = modeling_llama.apply_rotary_pos_emb(
        q.transpose(1, 2), k.transpose(1, 2), emb.cos(), emb.sin()
    )
    torch.testing.assert_close(rotary.apply_rotary(q, freqs), hf_q.transpose(1, 2), rtol=0, atol=1e-6)
    torch.testing.assert_close(rotary.apply_rotary(k, freqs), hf_k.transpose(1, 2), rtol=0, atol=1e-6)


def test_attention_scores_depend_only_on_the_distance_between_positions():
    vector_q, vector_k = torch.randn(HEAD_DIM), torch.randn(HEAD_DIM)
    freqs = rotary.frequencies(SEQ, HEAD_DIM, 10000.0)
    q = rotary.apply_rotary(vector_q.expand(1, SEQ, 1, HEAD_DIM), freqs)[0, :, 0]
    k = rotary.apply_rotary(vector_k.expand(1, SEQ, 1, HEAD_DIM), freqs)[0, :, 0]
    scores = q @ k.T
    for shift in (0, 3, 17):
        diagonal = torch.diagonal(scores, offset=-shift)  # q at m + shift, k at m
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=0, atol=1e-4)
    assert not torch.allclose(torch.diagonal(scores, -3)[0], torch.diagonal(scores, -17)[0], atol=1e-3)
    torch.testing.assert_close(q.norm(dim=-1), vector_q.norm().expand(SEQ))  # a rotation


def test_a_rope_block_sees_the_order_of_earlier_tokens_and_a_nope_block_does_not():
    torch.manual_seed(0)
    shape = llama(num_layers=1, hidden_size=32, num_heads=2, ffn_hidden_size=64, vocab_size=16)
    block = decoder.TorchBlock(shape)
    rope = rotary.Rope(16, 10000.0).__call__(4, torch.device("cpu"))
    a, b, c, last = torch.randn(4, 32)
    first, swapped = torch.stack([a, b, c, last])[None], torch.stack([b, a, c, last])[None]
    # Without positions, causal attention sees the earlier tokens as a set: the last output is the same.
    torch.testing.assert_close(block(first)[0, 3], block(swapped)[0, 3])
    assert not torch.allclose(
        block(first, rotary_pos_emb=rope)[0, 3], block(swapped, rotary_pos_emb=rope)[0, 3], atol=1e-4
    )
    torch.testing.assert_close(block(first, rotary_pos_emb=rope)[0, 0], block(first)[0, 0])  # position 0


def test_bad_settings_are_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="position_encoding must be one of rope, none; got 'alibi'"):
        llama(1, 32, 2, 64, 16, position_encoding="alibi")
    with pytest.raises(ValueError, match="head_dim must be even"):
        rotary.Rope(15, 10000.0)


def test_blocks_get_fp32_frequencies_under_a_bf16_fsdp_policy(monkeypatch):
    """FSDP2 casts floating-point forward arguments to param_dtype unless told not to: bf16 angles of a long
    sequence are off by whole radians, so the blocks must receive the frequencies in fp32."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(parallel._free_port()))
    env = parallel.init_distributed()
    try:
        shape = llama(num_layers=2, hidden_size=32, num_heads=2, ffn_hidden_size=64, vocab_size=16)
        net = decoder.build_model(shape, use_te=False, te_params_dtype=torch.float32)
        activation_checkpoint.apply(net.layers, "full")
        parallel.shard_model(net, env.mesh, parallel.mixed_precision(torch.bfloat16), env.device)
        weights.initialize(net, seed=1)
        seen = []
        for layer in net.layers:
            layer.register_forward_pre_hook(
                lambda _m, args, kwargs: seen.append((args[0].dtype, kwargs["rotary_pos_emb"].dtype)),
                with_kwargs=True,
            )
        tokens = torch.randint(0, 16, (2, 16))
        net(tokens, tokens).backward()  # with activation checkpointing: forward and recompute
        assert seen and set(seen) == {(torch.bfloat16, torch.float32)}
        bf16_angles = rotary.frequencies(8192, 16, 10000.0).to(torch.bfloat16).float()
        assert (bf16_angles - rotary.frequencies(8192, 16, 10000.0)).abs().max() > 1.0  # why it matters
    finally:
        dist.destroy_process_group()
