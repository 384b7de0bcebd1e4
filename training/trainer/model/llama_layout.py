"""The trainer's parameters in Llama's terms: which Hugging Face ``LlamaForCausalLM`` tensors make each of them, and
how they are fused (import, initialization) and split (export). One table for both directions and both blocks.

Torch blocks (``model.TorchBlock``): the fused ``qkv`` weight is ``[q; k; v]`` along the rows (``num_heads *
head_dim`` query rows, then ``num_kv_heads * head_dim`` rows each for key and value) and ``gate_up`` is ``[gate;
up]`` (``silu(gate) * up``).

Transformer Engine 2.11 blocks (``TransformerLayer`` with ``fuse_qkv_params=True``, ``qkv_weight_interleaved=True``,
RMSNorm, SwiGLU, no bias) name them ``self_attention.layernorm_qkv.{layer_norm_weight,weight}``,
``self_attention.proj.weight``, ``layernorm_mlp.{layer_norm_weight,fc1_weight,fc2_weight}``
(``module/layernorm_linear.py``: ``weight_names = ["weight"]`` without ``parameters_split``;
``module/layernorm_mlp.py``: ``fc1_weight`` is ``[2 * ffn, hidden]`` for swiglu, ``fc2_weight`` ``[hidden, ffn]``).
TE's fused QKV rows are interleaved per query group, ``[groups, heads/groups + 2, head_dim, hidden]``: each
group's query heads, then its key head, then its value head (``attention/multi_head_attention.py``:
``hidden_size_q + 2 * hidden_size_kv`` rows with ``hidden_size_kv = head_dim * num_gqa_groups``; forward: ``[sq, b,
ng * (np/ng + 2) * hn] --> [sq, b, ng, (np/ng + 2), hn]``, split ``(np/ng, 1, 1)`` along dim -2, the query then
reshaped to ``[sq, b, np, hn]``, so query head ``g * np/ng + i`` uses key/value head ``g``, as Llama's
``repeat_kv``). SwiGLU gates the FIRST half of ``fc1``'s output (``ops/basic/activation.py``, ``SwiGLU``), so ``fc1 =
[gate; up]``. RoPE is rotate-half in both blocks and in Llama (``training.trainer.model.rotary``), so the query and key
projections map over unpermuted.

A tied model (``tie_embeddings``) has no ``head.weight`` and no ``lm_head.weight``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from training.contract.shapes import ModelShape

ROOT = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "head.weight": "lm_head.weight",
}
"""Parameters outside the blocks: ours -> Llama's."""

TORCH_BLOCK = {
    "attention_norm.weight": ("input_layernorm.weight",),
    "qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "out_proj.weight": ("self_attn.o_proj.weight",),
    "ffn_norm.weight": ("post_attention_layernorm.weight",),
    "gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down.weight": ("mlp.down_proj.weight",),
}
TE_BLOCK = {
    "self_attention.layernorm_qkv.layer_norm_weight": ("input_layernorm.weight",),
    "self_attention.layernorm_qkv.weight": TORCH_BLOCK["qkv.weight"],
    "self_attention.proj.weight": ("self_attn.o_proj.weight",),
    "layernorm_mlp.layer_norm_weight": ("post_attention_layernorm.weight",),
    "layernorm_mlp.fc1_weight": TORCH_BLOCK["gate_up.weight"],
    "layernorm_mlp.fc2_weight": ("mlp.down_proj.weight",),
}
"""A block's parameters (after ``layers.<i>.``) -> the Llama tensors (after ``model.layers.<i>.``) they hold."""

TE_INTERLEAVED = "self_attention.layernorm_qkv.weight"
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_LAYER_TENSOR = re.compile(r"^model\.layers\.\d+\.")


@dataclass(frozen=True)
class Parts:
    """One of our parameters as Llama tensors: ``names`` stacked along the rows, or, ``interleaved``, in TE's
    per-group QKV order."""

    names: tuple[str, ...]
    interleaved: bool = False


def block_tensors(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """The tensors of one Llama decoder layer (names after ``model.layers.<i>.``) and their shapes."""
    h, f, kv = shape.hidden_size, shape.ffn_hidden_size, shape.kv_heads * shape.head_dim
    return {
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (h, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, h),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (f, h),
        "mlp.up_proj.weight": (f, h),
        "mlp.down_proj.weight": (h, f),
    }


def llama_tensors(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """Every tensor of the ``LlamaForCausalLM`` of ``shape`` and its shape (a tied model has no ``lm_head``)."""
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, shape.hidden_size)}
    per_layer = block_tensors(shape)
    for index in range(shape.num_layers):
        out |= {f"model.layers.{index}.{name}": dims for name, dims in per_layer.items()}
    out["model.norm.weight"] = (shape.hidden_size,)
    if not shape.tie_embeddings:
        out["lm_head.weight"] = (shape.vocab_size, shape.hidden_size)
    return out


def dims_of(name: str, shape: ModelShape) -> tuple[int, ...]:
    """The shape of the Llama tensor ``name`` in the model of ``shape``."""
    if name == "model.norm.weight":
        return (shape.hidden_size,)
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (shape.vocab_size, shape.hidden_size)
    return block_tensors(shape)[_LAYER_TENSOR.sub("", name)]


def parts(name: str, shape: ModelShape) -> Parts | None:
    """The Llama tensors our parameter ``name`` (torch or TE naming) holds; None for a name Llama has no
    counterpart of."""
    if name in ROOT:
        return None if name == "head.weight" and shape.tie_embeddings else Parts((ROOT[name],))
    match = _LAYER.match(name)
    if match is None or int(match.group(1)) >= shape.num_layers:
        return None
    index, suffix = match.groups()
    names = TORCH_BLOCK.get(suffix) or TE_BLOCK.get(suffix)
    if names is None:
        return None
    return Parts(tuple(f"model.layers.{index}.{n}" for n in names), interleaved=suffix == TE_INTERLEAVED)


def fuse(layout: Parts, tensors: list[torch.Tensor], shape: ModelShape) -> torch.Tensor:
    """Our parameter from its Llama tensors (in ``layout.names`` order)."""
    if len(tensors) == 1:
        return tensors[0]
    if not layout.interleaved:
        return torch.cat(tensors, dim=0)
    q, k, v = tensors
    groups, hidden = shape.kv_heads, q.shape[-1]
    per_group = shape.num_heads // groups
    grouped = torch.cat(
        (
            q.reshape(groups, per_group, shape.head_dim, hidden),
            k.reshape(groups, 1, shape.head_dim, hidden),
            v.reshape(groups, 1, shape.head_dim, hidden),
        ),
        dim=1,
    )
    return grouped.reshape(-1, hidden)


def split(layout: Parts, tensor: torch.Tensor, shape: ModelShape) -> dict[str, torch.Tensor]:
    """Our parameter's value as its Llama tensors (the inverse of :func:`fuse`)."""
    if len(layout.names) == 1:
        return {layout.names[0]: tensor}
    if layout.interleaved:
        groups, hidden = shape.kv_heads, tensor.shape[-1]
        grouped = tensor.reshape(groups, shape.num_heads // groups + 2, shape.head_dim, hidden)
        pieces = grouped.split((shape.num_heads // groups, 1, 1), dim=1)
        return {n: p.reshape(-1, hidden) for n, p in zip(layout.names, pieces, strict=True)}
    rows = [dims_of(n, shape)[0] for n in layout.names]
    return dict(zip(layout.names, tensor.split(rows, dim=0), strict=True))
