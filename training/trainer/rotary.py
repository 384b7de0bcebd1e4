"""Rotary position embeddings (RoPE) as Llama defines them: rotate-half on query and key, base ``rope_theta``.

One frequency tensor per forward, in Transformer Engine's layout: ``[seq, 1, 1, head_dim]`` fp32 holding the
angles ``position * theta ** (-2i / head_dim)`` with the two halves repeated (``cat(freqs, freqs)``). That is what
TE 2.11's ``TransformerLayer.forward(..., rotary_pos_emb=...)`` takes for ``rotary_pos_interleaved=False`` (the
default), built by ``transformer_engine.pytorch.attention.rope.RotaryPositionEmbedding(dim, rotary_base=...)``
(tag v2.11, ``transformer_engine/pytorch/attention/rope.py``: ``forward(max_seq_len)`` returns
``emb.reshape(seq, 1, 1, dim)`` with ``emb = cat((freqs, freqs), -1)``; ``_apply_rotary_pos_emb_base`` computes
``t * cos + _rotate_half(t) * sin`` with ``_rotate_half(x) = cat((-x2, x1))``). Hugging Face's Llama builds the
same angles (``LlamaRotaryEmbedding``: ``emb = cat((freqs, freqs))``, ``rotate_half``), so a model trained here
maps onto ``LlamaForCausalLM`` with no permutation of the query and key projections.

The torch block applies the same rotation itself (``apply_rotary``, cos/sin cast to the activations' dtype as
Hugging Face does). Frequencies are never parameters or buffers: nothing in the state dict, nothing for FSDP to
shard or for meta-device initialization to fill.
"""

from __future__ import annotations

import importlib

import torch


def inverse_frequencies(
    head_dim: int, theta: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """``theta ** (-2i / head_dim)`` for i in [0, head_dim / 2), fp32 (Llama's, and TE's, formula)."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings; got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta**exponents)


def frequencies(
    seq_len: int, head_dim: int, theta: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """The rotation angles of positions ``0 .. seq_len-1``: ``[seq_len, 1, 1, head_dim]`` fp32, halves repeated."""
    inv = inverse_frequencies(head_dim, theta, device)
    positions = torch.arange(seq_len, dtype=torch.float32, device=device)
    freqs = torch.outer(positions, inv)
    return torch.cat((freqs, freqs), dim=-1).view(seq_len, 1, 1, head_dim)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (Llama's ``rotate_half``)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate ``t`` (``[batch, seq, heads, head_dim]``) by ``freqs`` (``[seq, 1, 1, head_dim]``, from
    ``frequencies``); cos and sin are computed in fp32 and cast to ``t``'s dtype."""
    seq, dim = t.shape[1], t.shape[-1]
    emb = freqs[:seq].view(1, seq, 1, dim)
    cos, sin = emb.cos().to(t.dtype), emb.sin().to(t.dtype)
    return t * cos + rotate_half(t) * sin


class Rope:
    """The frequencies one forward passes to every block, cached by (sequence length, device).

    ``use_te``: built by Transformer Engine's own ``RotaryPositionEmbedding`` (the tensor its ``TransformerLayer``
    expects; TE builds it on the current CUDA device). Otherwise by ``frequencies``.
    """

    def __init__(self, head_dim: int, theta: float, use_te: bool = False):
        inverse_frequencies(head_dim, theta)  # refuses an odd head_dim now, not at the first forward
        self.head_dim, self.theta, self.use_te = head_dim, float(theta), use_te
        self._cache: dict[tuple[int, str], torch.Tensor] = {}

    def __call__(self, seq_len: int, device: torch.device) -> torch.Tensor:
        key = (seq_len, str(device))
        if key not in self._cache:
            if self.use_te:
                rope = importlib.import_module("transformer_engine.pytorch.attention.rope")
                module = rope.RotaryPositionEmbedding(self.head_dim, rotary_base=self.theta)
                self._cache[key] = module(seq_len).to(device=device, dtype=torch.float32)
            else:
                self._cache[key] = frequencies(seq_len, self.head_dim, self.theta, device)
        return self._cache[key]
