"""An external baseline for ``make bench``: a minimal FSDP2 training loop written from torchtitan's published
recipe (``docs/fsdp.md`` and ``torchtitan/models/llama3``: pre-norm RMSNorm, RoPE, SDPA causal attention, SwiGLU,
``fully_shard`` per block then at the root with a bf16/fp32 ``MixedPrecisionPolicy``, AdamW), sharing no code
with ``training.trainer`` (its own model, data and loop), so the benchmark can show the trainer's overhead
against something that is not itself. It logs nothing, saves nothing and computes the whole loss at once.

It has the run's architecture, so its parameters and FLOPs are the ones the benchmark counts for both loops
(``shapes.flops_per_token`` of the run's shape): grouped-query attention (``num_kv_heads`` key/value heads, SDPA's
``enable_gqa``, as torchtitan's ``n_kv_heads``), tied input and output embeddings (``tie_embeddings``: the output
projection is the embedding's matrix), ``rope_theta`` and ``rms_norm_eps``. Llama 3's RoPE frequency scaling is
left out: it changes the angles' values, not the work.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk, self.wv = (nn.Linear(dim, kv_heads * self.head_dim, bias=False) for _ in range(2))
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = (w(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2) for w in (self.wk, self.wv))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.wo(out.transpose(1, 2).reshape(b, s, d))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, eps: float):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim, eps=eps), nn.RMSNorm(dim, eps=eps)
        self.attention = _Attention(dim, heads, kv_heads)
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        normed = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(normed)) * self.w3(normed))


class Llama(nn.Module):
    """torchtitan's Llama 3 layout, written out here: embedding, blocks, norm, output head (``tie``: the
    embedding's matrix); ``kv_heads`` key/value heads (None: one per head)."""

    def __init__(
        self,
        vocab: int,
        dim: int,
        layers: int,
        heads: int,
        hidden: int,
        seq: int,
        theta: float = 1e4,
        *,
        kv_heads: int | None = None,
        tie: bool = False,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(_Block(dim, heads, kv_heads or heads, hidden, eps) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.output = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.output.weight = self.tok_embeddings.weight
        half = dim // heads // 2
        angles = torch.outer(torch.arange(seq).float(), theta ** (-torch.arange(half).float() / half))
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.norm(x))


def build(shape: Mapping[str, Any], seq: int) -> Llama:
    """The model of ``shape``: the run's settings ``num_layers``, ``hidden_size``, ``num_heads``,
    ``ffn_hidden_size``, ``vocab_size`` and, when given, ``num_kv_heads``, ``tie_embeddings``, ``rope_theta`` and
    ``rms_norm_eps``; built on the current default device."""
    return Llama(
        shape["vocab_size"], shape["hidden_size"], shape["num_layers"], shape["num_heads"],
        shape["ffn_hidden_size"], seq, float(shape.get("rope_theta") or 1e4),
        kv_heads=shape.get("num_kv_heads"), tie=bool(shape.get("tie_embeddings")),
        eps=float(shape.get("rms_norm_eps") or 1e-5),
    )  # fmt: skip


def parameter_count(net: nn.Module) -> int:
    """Parameters, a tied matrix once."""
    return sum(p.numel() for p in net.parameters())


def train(
    shape: Mapping[str, Any],
    seq: int,
    batch: int,
    steps: int,
    warmup: int,
    mesh: DeviceMesh,
    dtype: torch.dtype,
) -> float:
    """Tokens per second per rank over ``steps - warmup`` steps of the loop (random tokens) on the model of
    ``shape`` (``build``)."""
    device = torch.device(mesh.device_type)
    torch.manual_seed(0)
    with torch.device(device):
        net = build(shape, seq)
    policy = MixedPrecisionPolicy() if dtype == torch.float32 else MixedPrecisionPolicy(dtype, torch.float32)
    for block in net.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=policy)
    kernels = {"fused": True} if device.type == "cuda" else {"foreach": True}
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **kernels)
    data = torch.randint(
        0, shape["vocab_size"], (steps, batch, seq + 1), generator=torch.Generator().manual_seed(0)
    )
    if device.type == "cuda":  # pinned, as torchtitan's data loader's: the non_blocking copies do not block
        data = data.pin_memory()
    start = 0.0
    for step in range(steps):
        if step == warmup:
            _sync(device)
            start = time.perf_counter()
        tokens = data[step].to(device, non_blocking=True)
        logits = net(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    return (steps - warmup) * batch * seq / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
