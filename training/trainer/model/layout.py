"""The trainer's parameters as Hugging Face tensors, for any family: which tensors make each parameter
(``training.models.names``: the family's table, both directions), and how they are fused (import,
initialization) and split (export). One place for both directions and both blocks.

Torch blocks (``decoder.TorchBlock``): the fused ``qkv`` weight (and bias) is ``[q; k; v]`` along the rows
(``num_heads * head_dim`` query rows, then ``num_kv_heads * head_dim`` rows each for key and value) and ``gate_up``
is ``[gate; up]`` (``act(gate) * up``).

Transformer Engine 2.11 blocks (``TransformerLayer`` with ``fuse_qkv_params=True``, ``qkv_weight_interleaved=True``,
RMSNorm, a gated MLP, no bias) name them ``self_attention.layernorm_qkv.{layer_norm_weight,weight}``,
``self_attention.proj.weight``, ``self_attention.{q,k}_norm.weight`` (``qk_norm_type="RMSNorm"``),
``layernorm_mlp.{layer_norm_weight,fc1_weight,fc2_weight}`` (``module/layernorm_linear.py``: ``weight_names =
["weight"]`` without ``parameters_split``; ``module/layernorm_mlp.py``: ``fc1_weight`` is ``[2 * ffn, hidden]`` for
a gated activation, ``fc2_weight`` ``[hidden, ffn]``). TE's fused QKV rows are interleaved per query group,
``[groups, heads/groups + 2, head_dim, hidden]``: each group's query heads, then its key head, then its value head
(``attention/multi_head_attention.py``: ``hidden_size_q + 2 * hidden_size_kv`` rows with ``hidden_size_kv =
kv_channels * num_gqa_groups``; forward: ``[sq, b, ng * (np/ng + 2) * hn] --> [sq, b, ng, (np/ng + 2), hn]``, split
``(np/ng, 1, 1)`` along dim -2, so query head ``g * np/ng + i`` uses key/value head ``g``, as transformers'
``repeat_kv``). SwiGLU and GeGLU gate the FIRST half of ``fc1``'s output (``ops/basic/activation.py``), so ``fc1 =
[gate; up]``. RoPE is rotate-half in both blocks and in every family here (``training.trainer.model.rotary``), so the
query and key projections map over unpermuted.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch

from training.models import registry
from training.models.config import ModelConfig
from training.models.names import NameMap

TE_BLOCK = {
    "self_attention.layernorm_qkv.layer_norm_weight": "attention_norm.weight",
    "self_attention.layernorm_qkv.weight": "qkv.weight",
    "self_attention.q_norm.weight": "q_norm.weight",
    "self_attention.k_norm.weight": "k_norm.weight",
    "self_attention.proj.weight": "out_proj.weight",
    "layernorm_mlp.layer_norm_weight": "ffn_norm.weight",
    "layernorm_mlp.fc1_weight": "gate_up.weight",
    "layernorm_mlp.fc2_weight": "down.weight",
}
"""A Transformer Engine block's parameters (after ``layers.<i>.``) -> the torch block's of the same value."""
TE_INTERLEAVED = "self_attention.layernorm_qkv.weight"
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Parts:
    """One of our parameters as Hugging Face tensors: ``names`` stacked along the rows, or, ``interleaved``, in
    TE's per-group QKV order."""

    names: tuple[str, ...]
    interleaved: bool = False


def torch_name(name: str) -> tuple[str, bool]:
    """The torch block's name of our parameter ``name`` (a TE block's is mapped), and whether its rows are TE's
    interleaved QKV."""
    match = _LAYER.match(name)
    if match is None:
        return name, False
    index, suffix = match.groups()
    if suffix in TE_BLOCK:
        return f"layers.{index}.{TE_BLOCK[suffix]}", suffix == TE_INTERLEAVED
    return name, False


def names_of(config: ModelConfig) -> NameMap:
    """The family's name map of ``config``'s model."""
    return _names(config)


@functools.lru_cache(maxsize=16)
def _names(config: ModelConfig) -> NameMap:
    return registry.family(config.family).names(config)


def parts(name: str, config: ModelConfig) -> Parts | None:
    """The Hugging Face tensors our parameter ``name`` (torch or TE naming) holds; None for a name the model has
    no counterpart of."""
    ours, interleaved = torch_name(name)
    names = names_of(config).parts(ours)
    return None if names is None else Parts(names, interleaved)


def hf_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model's Hugging Face class (what its safetensors hold; a tied model has no
    ``lm_head``) and its shape."""
    return names_of(config).tensors()


def dims_of(name: str, config: ModelConfig) -> tuple[int, ...]:
    """The shape of the Hugging Face tensor ``name`` in the model of ``config``."""
    return names_of(config).dims(name)


def fuse(layout: Parts, tensors: list[torch.Tensor], config: ModelConfig) -> torch.Tensor:
    """Our parameter from its Hugging Face tensors (in ``layout.names`` order)."""
    if len(tensors) == 1:
        return tensors[0]
    if not layout.interleaved:
        return torch.cat(tensors, dim=0)
    q, k, v = tensors
    groups, hidden, hd = config.num_kv_heads, q.shape[-1], config.head_dim
    per_group = config.num_heads // groups
    grouped = torch.cat(
        (
            q.reshape(groups, per_group, hd, hidden),
            k.reshape(groups, 1, hd, hidden),
            v.reshape(groups, 1, hd, hidden),
        ),
        dim=1,
    )
    return grouped.reshape(-1, hidden)


def split(layout: Parts, tensor: torch.Tensor, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our parameter's value as its Hugging Face tensors (the inverse of :func:`fuse`)."""
    if len(layout.names) == 1:
        return {layout.names[0]: tensor}
    if layout.interleaved:
        groups, hidden = config.num_kv_heads, tensor.shape[-1]
        per_group = config.num_heads // groups
        grouped = tensor.reshape(groups, per_group + 2, config.head_dim, hidden)
        pieces = grouped.split((per_group, 1, 1), dim=1)
        return {n: p.reshape(-1, hidden) for n, p in zip(layout.names, pieces, strict=True)}
    rows = [dims_of(n, config)[0] for n in layout.names]
    return dict(zip(layout.names, tensor.split(rows, dim=0), strict=True))
