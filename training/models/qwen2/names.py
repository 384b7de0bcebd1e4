"""Qwen 2's (``Qwen2ForCausalLM``) block tensors: each trainer parameter -> the tensors after ``model.layers.<i>.``
it holds, stacked along the rows in this order (transformers ``models/qwen2/modeling_qwen2.py``: ``q_proj``,
``k_proj`` and ``v_proj`` always with a bias, ``o_proj`` without; the MLP and the two norms as Llama's)."""

from __future__ import annotations

from collections.abc import Mapping

BLOCK: Mapping[str, tuple[str, ...]] = {
    "attention_norm.weight": ("input_layernorm.weight",),
    "qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "out_proj.weight": ("self_attn.o_proj.weight",),
    "ffn_norm.weight": ("post_attention_layernorm.weight",),
    "gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down.weight": ("mlp.down_proj.weight",),
}
