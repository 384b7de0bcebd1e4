"""Llama's (``LlamaForCausalLM``) block tensors: each trainer parameter -> the tensors after
``model.layers.<i>.`` it holds, stacked along the rows in this order (transformers ``models/llama/modeling_llama.py``:
``self_attn.{q,k,v,o}_proj``, with a bias on all four when ``attention_bias``; ``mlp.{gate,up,down}_proj``;
``input_layernorm`` before attention and ``post_attention_layernorm`` before the MLP)."""

from __future__ import annotations

from collections.abc import Mapping

BLOCK: Mapping[str, tuple[str, ...]] = {
    "attention_norm.weight": ("input_layernorm.weight",),
    "qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "out_proj.weight": ("self_attn.o_proj.weight",),
    "out_proj.bias": ("self_attn.o_proj.bias",),
    "ffn_norm.weight": ("post_attention_layernorm.weight",),
    "gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down.weight": ("mlp.down_proj.weight",),
}
