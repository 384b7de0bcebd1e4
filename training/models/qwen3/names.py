"""Qwen 3's (``Qwen3ForCausalLM``) block tensors: each trainer parameter -> the tensors after ``model.layers.<i>.``
it holds, stacked along the rows in this order (transformers ``models/qwen3/modeling_qwen3.py``: Llama's tensors,
a bias on all four attention projections when ``attention_bias``, and ``self_attn.q_norm`` / ``k_norm``, RMSNorm
over each head's ``head_dim`` before RoPE)."""

from __future__ import annotations

from collections.abc import Mapping

BLOCK: Mapping[str, tuple[str, ...]] = {
    "attention_norm.weight": ("input_layernorm.weight",),
    "qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "q_norm.weight": ("self_attn.q_norm.weight",),
    "k_norm.weight": ("self_attn.k_norm.weight",),
    "out_proj.weight": ("self_attn.o_proj.weight",),
    "out_proj.bias": ("self_attn.o_proj.bias",),
    "ffn_norm.weight": ("post_attention_layernorm.weight",),
    "gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down.weight": ("mlp.down_proj.weight",),
}
