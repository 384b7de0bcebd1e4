"""The memory plan's attention terms per block, for every model family: the query, key and value widths
(``ModelConfig.q_width`` and ``kv_width``: an explicit ``head_dim`` makes the query wider than the hidden size,
Qwen 3 32B's and Gemma 3's), the norms a family adds to the block (Gemma 3's norms after attention and the MLP,
the per-head query/key norms of Qwen 3 and Gemma 3), RoPE's tables and saved cos/sin (one table per kind of layer
with its own RoPE), the masks of packed documents and sliding windows (Mistral's, Gemma 3's local layers) and
PyTorch's math kernel. ``memory`` adds them to the block's saved activations and the step's moments."""

from __future__ import annotations

from typing import Any

from training.plan.memory_terms import QUANTIZED_BYTES

Setup = Any
"""``training.plan.memory.Setup`` (not imported: ``memory`` imports this module)."""


def q_width(s: Setup) -> int:
    """The query's (and attention output's) width: ``num_heads x head_dim`` (the hidden size for Llama)."""
    return int(getattr(s.shape, "q_width", s.shape.hidden_size))


def kv_width(s: Setup) -> int:
    """The key's (and value's) width: ``kv_heads x head_dim``."""
    return s.shape.kv_heads * s.shape.head_dim


def family_saved_bytes(s: Setup) -> float:
    """Bytes per token a block saves for the norms its family adds to Llama's (both keep the input and one fp32
    rstd per row, as a fused RMSNorm: ``nn.RMSNorm`` on CUDA, ``decoder.UnitOffsetRMSNorm`` for Gemma): the norms
    after attention and after the MLP (``norm_placement`` sandwich: their inputs, the output and down projections'
    outputs, h wide each, which nothing else keeps) and the per-head query/key norms (``qk_norm``: their inputs
    are views of the QKV output, already kept: one rstd per head)."""
    extra = 0.0
    if getattr(s.shape, "norm_placement", "pre") == "sandwich":
        extra += 2.0 * s.compute_bytes * s.shape.hidden_size + 8.0
    if getattr(s.shape, "qk_norm", False):
        extra += 4.0 * (s.shape.num_heads + s.shape.kv_heads)
    return extra


def window_in_effect(s: Setup, layer: int) -> bool:
    """Whether block ``layer`` attends within a sliding window shorter than the sequence (Mistral's
    ``sliding_window``, Gemma 3's local layers): the torch block then takes a mask (``decoder.attention_mask``)."""
    window = s.shape.window(layer) if hasattr(s.shape, "window") else None
    return window is not None and window < s.seq_length


def masked(s: Setup, layer: int) -> bool:
    """Whether the torch block ``layer`` attends through a mask (packed documents, or its sliding window)."""
    if s.precision in QUANTIZED_BYTES:
        return False
    return s.packed_documents or window_in_effect(s, layer)


def window_mask_bytes(s: Setup) -> float:
    """The sliding-window mask of an unpacked micro-batch (``decoder.attention_mask``: ``[1, 1, seq, seq]`` bool),
    made once per forward for the windowed layers and given to each of them; counted through the whole step as
    ``document_mask_bytes`` (with packed documents the windowed layers' mask is a second ``[batch, 1, seq, seq]``
    one). 0 without a window shorter than the sequence and on Transformer Engine's path."""
    if s.precision in QUANTIZED_BYTES or not any(window_in_effect(s, i) for i in range(s.shape.num_layers)):
        return 0.0
    return float((s.batch_size if s.packed_documents else 1) * s.seq_length * s.seq_length)


def rope_kinds(s: Setup) -> int:
    """The RoPE tables a forward builds: one per kind of layer (Gemma 3's local and global layers have their own
    base and scaling)."""
    return len(set(getattr(s.shape, "layer_types", ("full",))))


def math_attention_bytes(s: Setup) -> float:
    """Bytes per token one block's attention keeps beyond Flash's with ``attention_backend`` math (torch path only:
    Transformer Engine precisions choose their own kernel). PyTorch's math kernel
    (``_scaled_dot_product_attention_math``, ATen ``native/transformers/attention.cpp``) computes in fp32 for 16-bit
    inputs (``allow_fp16_bf16_reduction_math_sdp`` is off by default) and keeps for its backward the softmax of the
    whole score matrix (``num_heads x seq_length`` fp32 values per token, causal or not), the scaled query, and the
    key and value repeated to every query head (fp32: 4 x ``q_width`` each; in fp32 runs the value only with grouped-query
    attention, else it is the projection's own), and no log-sum-exp (Flash's 4 bytes per head, counted by the
    caller, less). The traced rows of ``training.measure.plan_agreement`` run it."""
    if s.attention_backend != "math" or s.precision in QUANTIZED_BYTES:
        return 0.0
    qw, nh = q_width(s), s.shape.num_heads
    value = 4.0 * qw if s.compute_bytes < 4 or s.shape.kv_heads != nh else 0.0
    return 4.0 * nh * s.seq_length + 8.0 * qw + value - 4.0 * nh


def math_attention_moments(s: Setup, moments: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """With ``attention_backend`` math, the moment inside a block's attention backward: the first block's backward
    (``last block backward``, or the top checkpointed block's right after its recompute) once its MLP is done (its
    saved tensors freed, ``mlp_saved_bytes``), with the score matrix's gradient and the softmax's input gradient in
    flight (fp32, ``num_heads x seq_length`` values per token each). Selective activation checkpointing keeps no
    score matrix (its policy saves the kernels' outputs, and math is matmuls and a softmax): it appears in the
    recompute only. Traced: ``training.measure.plan_agreement``'s math rows."""
    if s.attention_backend != "math" or s.precision in QUANTIZED_BYTES:
        return moments
    in_flight = 2 * 4.0 * s.shape.num_heads * s.seq_length * s.tokens
    mlp = mlp_saved_bytes(s) * s.tokens
    out = dict(moments)
    for name, held in (("last block backward", "saved activations"),
                       ("block backward, after its recompute", "recomputed block")):  # fmt: skip
        if name in moments:
            parts = moments[name]
            out[f"{name}, in its attention (math)"] = {
                **parts,
                held: parts[held] - mlp,
                "gradients in flight": in_flight,
            }
    return out


def mlp_saved_bytes(s: Setup) -> float:
    """Bytes per token a block keeps for its MLP's backward (torch path): the normed input, gate/up, SiLU and their
    product, and the norm's fp32 rstd."""
    return s.compute_bytes * (s.shape.hidden_size + 4 * s.shape.ffn_hidden_size) + 4.0


def rope_layer_bytes(s: Setup) -> float:
    """Per block, independent of the micro-batch: the torch block's RoPE saves cos and sin (in the compute
    dtype, ``[seq, head_dim]``) once for the query and once for the key (``rotary.apply_rotary``). TE's fused RoPE
    saves only the shared fp32 frequencies (``rope_table_bytes``)."""
    if s.position_encoding != "rope" or s.precision in QUANTIZED_BYTES:
        return 0.0
    return 4.0 * s.compute_bytes * s.seq_length * s.shape.head_dim


def document_mask_bytes(s: Setup) -> float:
    """The torch path's block-causal mask of a packed micro-batch (``training/trainer/model/doc_mask.block_causal_mask``:
    ``[batch, 1, seq, seq]`` bool, one byte per pair of tokens), made once per micro-batch and given to every block;
    counted through the whole step (checkpointed blocks keep it for their recompute; without activation
    checkpointing it is freed after the forward pass, so this over-counts the backward by batch x seq^2 bytes).
    0 on Transformer Engine's path (``cu_seqlens``, no mask) and without packed documents."""
    if not s.packed_documents or s.precision in QUANTIZED_BYTES:
        return 0.0
    return float(s.batch_size * s.seq_length * s.seq_length)


def document_mask_layer_bytes(s: Setup) -> float:
    """What a packed micro-batch adds on the torch path to each block that keeps its activations (and to a block
    being recomputed), beyond ``layer_activation_bytes``. Read in torch's SDPA (``aten/src/ATen/native/
    transformers``; the same at 2.9 and 2.13):

    * the additive bias: ``scaled_dot_product_attention`` turns the boolean mask into ``where(mask, 0, -inf)`` in
      the compute dtype (``convert_boolean_attn_mask``: a new ``[batch, 1, seq, seq]`` tensor per block; padded to
      a multiple of 8 keys when seq_length is not one, ``preprocess_mask``), expands it over the heads as a view,
      and the kernel that takes a mask (memory-efficient attention on a GPU; cuDNN's takes one as well) saves it
      for its backward (their derivatives take ``attn_bias``): c x batch x seq x seq bytes, about 3x the bool
      mask's in bf16 per block;
    * grouped-query attention: with a mask the key and value are repeated to every query head
      (``model.causal_attention``), and SDPA saves the repeated ones; the fused QKV output is then no longer kept
      alive by the value (a view of it), so per token c x (h - 3kv) with RoPE (the query, key and value h wide
      each, instead of QKV h + 2kv plus the rotated query and key h + kv), c x 2h without it (the query still a
      view of QKV); nothing without grouped-query attention;
    * RoPE per document: cos and sin per token (``[batch, seq, 1, head_dim]``) instead of per position, for the
      query and the key: 4 c (batch - 1) seq head_dim more than ``rope_layer_bytes``.

    With ``attention_backend`` math only the last: its kernel (``_scaled_dot_product_attention_math``) adds the
    bias to the fp32 scores in place and saves the softmax, the scaled query and fp32 copies of the key and value
    repeated to every query head, exactly what it saves for ``enable_gqa`` without a mask (``math_attention_bytes``
    counts them): neither the bias nor the 16-bit repeated key and value outlive the call (traced in
    tests/request/test_fine_tuning_request.py)."""
    return mask_layer_bytes(s, None) if s.packed_documents else 0.0


def mask_layer_bytes(s: Setup, layer: int | None) -> float:
    """What a mask adds to block ``layer`` (None: any block of a packed micro-batch) on the torch path,
    beyond ``layer_activation_bytes``: ``document_mask_layer_bytes``' terms, for packed documents (a
    ``[batch, 1, seq, seq]`` mask, RoPE per document) or a sliding window alone (``window_in_effect``: one
    ``[1, 1, seq, seq]`` mask, so a bias of ``c x seq x seq`` bytes per block whatever the micro-batch), the query
    ``q_width`` wide."""
    if s.precision in QUANTIZED_BYTES or not (s.packed_documents or (layer is not None and masked(s, layer))):
        return 0.0
    c, b, seq = s.compute_bytes, s.batch_size, s.seq_length
    qw, kv = q_width(s), kv_width(s)
    rope = s.position_encoding == "rope"
    per_token_rope = 4 * c * (b - 1) * seq * s.shape.head_dim if rope and s.packed_documents else 0
    if s.attention_backend == "math":
        return float(per_token_rope)
    bias = c * (b if s.packed_documents else 1) * seq * (-(-seq // 8) * 8)
    if kv == qw:
        repeated = 0
    elif getattr(s.shape, "qk_norm", False):
        repeated = 2 * qw - kv  # the q/k norms keep QKV alive: the repeated key and value on top
    else:
        repeated = qw - 3 * kv if rope else 2 * qw
    return float(bias + c * repeated * s.tokens + per_token_rope)


def rope_table_bytes(s: Setup) -> float:
    """The rotary frequencies every block gets (``rotary.Rope``: ``[seq, 1, 1, head_dim]`` fp32, cached; one per
    kind of layer, ``rope_kinds``)."""
    if s.position_encoding != "rope":
        return 0.0
    return 4.0 * s.seq_length * s.shape.head_dim * rope_kinds(s)


def recompute_gradient_bytes(s: Setup, layer: int) -> float:
    """Bytes per token of gradients in flight in block ``layer``'s backward beyond Llama's fitted term
    (``memory_terms.AC_RECOMPUTE_BYTES_PER_H``): through a mask with grouped-query attention the key and value
    were repeated to every query head, so their gradients come out ``q_width`` wide before they are summed back
    (``2 c (q_width - kv)``); the norms after attention and the MLP (sandwich) add one hidden-size gradient."""
    c, extra = s.compute_bytes, 0.0
    if masked(s, layer) and s.attention_backend != "math" and kv_width(s) != q_width(s):
        extra += 2.0 * c * (q_width(s) - kv_width(s))
    if getattr(s.shape, "norm_placement", "pre") == "sandwich":
        extra += c * s.shape.hidden_size
    return extra
