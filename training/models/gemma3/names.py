"""Gemma 3's (``Gemma3ForCausalLM``) block tensors: each trainer parameter -> the tensors after
``model.layers.<i>.`` it holds, stacked along the rows in this order (transformers
``models/gemma3/modeling_gemma3.py``: four norms per block, ``input_layernorm`` before attention,
``post_attention_layernorm`` on its output, ``pre_feedforward_layernorm`` before the MLP and
``post_feedforward_layernorm`` on its output; ``self_attn.q_norm`` / ``k_norm`` per head; a bias on the four
attention projections when ``attention_bias``). Note that Llama's ``post_attention_layernorm`` is the norm BEFORE its
MLP, Gemma's the one AFTER attention: the tables differ on that name."""

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
    "post_attention_norm.weight": ("post_attention_layernorm.weight",),
    "ffn_norm.weight": ("pre_feedforward_layernorm.weight",),
    "gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down.weight": ("mlp.down_proj.weight",),
    "post_ffn_norm.weight": ("post_feedforward_layernorm.weight",),
}
