"""Decoder-only language model: embedding, N blocks, final RMSNorm, LM head, next-token cross-entropy (the head
and the loss in chunks of tokens, ``loss.linear_cross_entropy``).

Two interchangeable blocks with the same parameter count (``shapes.ModelShape.parameter_count``):

* ``TorchBlock``: pre-norm RMSNorm, fused QKV, SDPA causal attention with grouped-query attention
  (``num_kv_heads`` key/value heads shared by ``num_heads / num_kv_heads`` query heads each, as Llama's
  ``repeat_kv``), SwiGLU MLP, no biases (fp32/fp16/bf16).
* ``te_block``: ``transformer_engine.pytorch.TransformerLayer`` with the same structure (fp8/mxfp8/nvfp4),
  imported lazily. kwargs checked against TE tag v2.11 ``transformer_engine/pytorch/transformer.py``.

``tie_embeddings``: the LM head is the embedding's matrix (Llama 3.2 1B/3B); the model then has no ``head``
module and no ``head.weight`` in its state dict.

Position encoding (``position_encoding``): ``rope`` (default) rotates query and key as Llama does
(``training.trainer.model.rotary``, with Llama 3.1's frequency scaling when ``rope_scaling=llama3``; no parameters, so
the count is unchanged), and the model maps onto Hugging Face's ``LlamaForCausalLM``
(``training.trainer.checkpoint.export_hf``); ``none`` is NoPE (causal attention alone lets a decoder infer positions), the
behaviour of models trained before RoPE existed here.

Every parameter's value comes from ``training.trainer.checkpoint.weights`` (an imported model, or a generator seeded by the
seed and the parameter's name), after FSDP2 has sharded the meta-device model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.contract.shapes import NORM_EPS, POSITION_ENCODINGS, ModelShape
from training.trainer.loss import linear_cross_entropy, token_statistics
from training.trainer.model import doc_mask
from training.trainer.model.rotary import Llama3Scaling, Rope, apply_rotary

__all__ = [
    "NORM_EPS",
    "TorchBlock",
    "Transformer",
    "attention_inputs",
    "build_model",
    "causal_attention",
    "te_block",
]


class TorchBlock(nn.Module):
    """Pre-norm transformer block in plain PyTorch. The fused ``qkv`` weight is ``[q; k; v]``: ``num_heads *
    head_dim`` query rows, then ``num_kv_heads * head_dim`` rows each for key and value."""

    def __init__(self, shape: ModelShape, norm_eps: float = NORM_EPS):
        """``norm_eps``: the RMSNorms' epsilon (the ``rms_norm_eps`` setting)."""
        super().__init__()
        h, f = shape.hidden_size, shape.ffn_hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = shape.num_heads, shape.kv_heads, shape.head_dim
        self.attention_norm = nn.RMSNorm(h, eps=norm_eps)
        self.qkv = nn.Linear(h, h + 2 * self.num_kv_heads * self.head_dim, bias=False)
        self.out_proj = nn.Linear(h, h, bias=False)
        self.ffn_norm = nn.RMSNorm(h, eps=norm_eps)
        self.gate_up = nn.Linear(h, 2 * f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rotary_pos_emb: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``rotary_pos_emb``: the ``rotary.Rope`` frequencies (``[seq, 1, 1, head_dim]``, or per token ``[batch,
        seq, 1, head_dim]`` for packed documents), or None for NoPE; ``attention_mask``: a packed batch's
        block-causal mask (``doc_mask.block_causal_mask``), None for plain causal attention."""
        b, s, h = x.shape
        q, k, v = attention_inputs(
            self.qkv(self.attention_norm(x)), self.num_heads, self.num_kv_heads, self.head_dim, rotary_pos_emb
        )
        attn = causal_attention(q, k, v, mask=attention_mask)
        x = x + self.out_proj(attn.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def attention_inputs(
    qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, rotary_pos_emb: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SDPA's query, key and value (``[batch, heads, seq, head_dim]``: ``num_heads``, ``num_kv_heads`` and
    ``num_kv_heads`` heads) from the fused QKV projection's output ``qkv`` (``[batch, seq, (num_heads + 2 *
    num_kv_heads) * head_dim]``), query and key rotated: the shapes, dtypes and memory layout (strides) the kernel
    gets, which ``attention.AttentionPlan.in_effect`` probes with."""
    b, s, _ = qkv.shape
    kv_width = num_kv_heads * head_dim
    q, k, v = qkv.split((num_heads * head_dim, kv_width, kv_width), dim=-1)
    q = q.view(b, s, num_heads, head_dim)
    k, v = k.view(b, s, num_kv_heads, head_dim), v.view(b, s, num_kv_heads, head_dim)
    if rotary_pos_emb is not None:
        q, k = apply_rotary(q, rotary_pos_emb), apply_rotary(k, rotary_pos_emb)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sdpa: Callable[..., Any] | None = None,
    mask: torch.Tensor | None = None,
) -> Any:
    """The block's attention call: causal SDPA, with grouped-query attention (``enable_gqa``) when key and value
    have fewer heads than the query. ``sdpa``: what is called with these arguments instead of
    ``F.scaled_dot_product_attention`` (``attention.AttentionPlan`` passes ``torch._fused_sdp_choice``, which
    returns the backend SDPA would run for them). ``mask``: a packed batch's block-causal mask (``[batch, 1, seq,
    seq]`` bool, ``doc_mask``), given as ``attn_mask`` instead of ``is_causal``; key and value heads are then
    repeated to the query's (as Llama's ``repeat_kv``) rather than left to ``enable_gqa``, which torch 2.9's
    kernels that take a mask do not all accept (torch checks it per backend)."""
    call = F.scaled_dot_product_attention if sdpa is None else sdpa
    if mask is None:
        return call(q, k, v, is_causal=True, enable_gqa=k.size(1) != q.size(1))
    if k.size(1) != q.size(1):
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    return call(q, k, v, attn_mask=mask)


def te_block(
    shape: ModelShape,
    layer_number: int,
    params_dtype: torch.dtype,
    norm_eps: float = NORM_EPS,
    packed: bool = False,
) -> nn.Module:
    """The same block as ``TorchBlock`` from Transformer Engine (batch-first input, causal mask, RMSNorm, SwiGLU,
    ``num_gqa_groups`` = the key/value heads: TE's ``MultiheadAttention`` then makes its fused QKV weight
    ``hidden + 2 * groups * head_dim`` rows, interleaved per group, ``attention/multi_head_attention.py``).

    RoPE: ``forward(x, rotary_pos_emb=freqs)`` with ``rotary_pos_interleaved`` left at its default False
    (rotate-half, Llama's convention; transformer_engine/pytorch/transformer.py and
    attention/multi_head_attention.py at v2.11 apply it to query and key after the fused QKV projection).
    No ``init_method``: values never come from TE (``training.trainer.checkpoint.weights`` sets each one).

    ``packed``: several documents per window, in TE's packed-sequence format: ``attn_input_format="thd"`` (the
    batch's tokens as one stream ``[tokens, hidden]``) and ``padding_causal`` attention within each sequence that
    ``forward(..., cu_seqlens_q=, max_seqlen_q=)`` delimits (``doc_mask.te_arguments``; TE v2.11
    ``TransformerLayer.forward`` passes them to self-attention as both the query's and the key/value's, and
    ``MultiheadAttention`` rotates each sequence from position 0)."""
    te = importlib.import_module("transformer_engine.pytorch")
    return te.TransformerLayer(
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_heads,
        num_gqa_groups=shape.kv_heads,
        layernorm_epsilon=norm_eps,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        layer_number=layer_number,
        self_attn_mask_type="padding_causal" if packed else "causal",
        params_dtype=params_dtype,
        fuse_qkv_params=True,
        bias=False,
        activation="swiglu",
        normalization="RMSNorm",
        attn_input_format="thd" if packed else "bshd",
        # Built on meta like the rest of the model; after fully_shard, weights.initialize has TE's
        # reset_parameters() materialize (and, under quantized_model_init, quantize) each rank's shard with the
        # values weights.py gives it (transformer_engine/pytorch/module/base.py reset_parameters at v2.11).
        device="meta",
    )


class Transformer(nn.Module):
    """The LM. ``forward(tokens, targets)`` returns the mean next-token cross-entropy (fp32), the LM head and the
    loss computed ``loss_chunk_tokens`` tokens at a time (0: all at once)."""

    def __init__(
        self,
        shape: ModelShape,
        blocks: list[nn.Module],
        rope: Rope | None = None,
        loss_chunk_tokens: int = 0,
        norm_eps: float = NORM_EPS,
    ):
        """``rope``: the rotary frequencies every block gets (None: no position encoding); ``norm_eps``: the final
        RMSNorm's epsilon (the blocks have theirs)."""
        super().__init__()
        self.loss_chunk_tokens = loss_chunk_tokens
        self.shape = shape
        self.rope = rope
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(blocks)
        self.norm = nn.RMSNorm(shape.hidden_size, eps=norm_eps)
        self.head = (
            None if shape.tie_embeddings else nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        )

    te_packed: bool = False
    """Transformer Engine blocks built for packed documents (``te_block(packed=True)``: ``thd`` input)."""

    def hidden_states(
        self, tokens: torch.Tensor, documents: doc_mask.Documents | None = None
    ) -> torch.Tensor:
        """The last block's output (before the final norm) for ``tokens`` (``[batch, seq]``); ``documents``: the
        layout of a packed batch (each example attends only to itself, its positions restart at 0)."""
        x = self.embed(tokens)
        kwargs = self._block_arguments(tokens, documents)
        if self.te_packed:
            x = x.view(-1, x.size(-1))  # thd: the batch's tokens as one stream
        for layer in self.layers:  # activation checkpointing and compile wrap a block's forward in place
            x = layer(x, **kwargs)
        return x.view(*tokens.shape, -1) if self.te_packed else x

    def _block_arguments(self, tokens: torch.Tensor, documents: doc_mask.Documents | None) -> dict[str, Any]:
        """What every block gets besides the hidden states: RoPE frequencies and, for packed documents, the mask
        (torch) or the sequence boundaries (Transformer Engine)."""
        freqs = None if self.rope is None else self.rope(tokens.size(1), tokens.device)
        if documents is None:
            if self.te_packed:
                raise ValueError(
                    "these Transformer Engine blocks were built for packed documents: pass documents"
                )
            return {} if freqs is None else {"rotary_pos_emb": freqs}
        if self.te_packed:  # TE restarts RoPE per sequence itself from cu_seqlens
            kwargs: dict[str, Any] = {
                "cu_seqlens_q": documents.cu_seqlens,
                "max_seqlen_q": documents.max_seqlen,
            }
            return kwargs if freqs is None else {**kwargs, "rotary_pos_emb": freqs}
        kwargs = {"attention_mask": doc_mask.block_causal_mask(documents.ids)}
        if freqs is not None:  # per token: [batch, seq, 1, head_dim] at each token's position in its document
            table = freqs.view(freqs.size(0), -1)
            kwargs["rotary_pos_emb"] = table[doc_mask.positions(documents.ids)].unsqueeze(2)
        return kwargs

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's matrix: the embedding's when tied."""
        return self.embed.weight if self.head is None else self.head.weight

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor,
        documents: doc_mask.Documents | None = None,
        *,
        statistics: bool = False,
    ) -> torch.Tensor:
        """The mean next-token cross-entropy over the targets that count; ``documents``: a packed batch's layout.
        ``statistics`` (validation, no gradient): ``[loss sum, correct, counted]`` instead (``loss.token_statistics``:
        sums that add up over batches and ranks, and the token accuracy). A keyword of ``forward`` rather than a
        method of its own, so that FSDP2's hooks gather the root's parameters for it as for training."""
        x = self.norm(self.hidden_states(tokens, documents))
        # The head's weight, not a call of the head: FSDP2 has gathered it with the root's parameters.
        if statistics:
            return token_statistics(x, self.head_weight, targets, self.loss_chunk_tokens)
        return linear_cross_entropy(x, self.head_weight, targets, self.loss_chunk_tokens)

    def logits(self, tokens: torch.Tensor, documents: doc_mask.Documents | None = None) -> torch.Tensor:
        """The next-token logits of every position (``[batch, seq, vocab]``, unchunked; for checks and
        comparisons with Hugging Face, not for training). Under FSDP2, ``unshard()`` the root first."""
        return self.norm(self.hidden_states(tokens, documents)) @ self.head_weight.T


def build_model(
    shape: ModelShape,
    *,
    use_te: bool,
    te_params_dtype: torch.dtype,
    position_encoding: str = "rope",
    rope_theta: float = 10000.0,
    loss_chunk_tokens: int = 0,
    rope_scaling: Llama3Scaling | None = None,
    norm_eps: float = NORM_EPS,
    packed: bool = False,
) -> Transformer:
    """Build the model on the meta device (no memory until FSDP2 has sharded it; then
    ``parallel.shard_model`` materializes each rank's shard and ``weights.initialize`` fills it).
    ``loss_chunk_tokens``: the contract's setting (0: the LM head and loss unchunked). Activation checkpointing
    and ``torch.compile`` are applied to the blocks afterwards (``activation_checkpoint``, ``compile``).
    ``position_encoding`` is ``rope`` (rotary embeddings with base ``rope_theta`` and ``rope_scaling``) or
    ``none``; ``norm_eps``: every RMSNorm's epsilon (``rms_norm_eps``); ``packed``: the batches hold several
    documents per window (Transformer Engine blocks are then built for its packed format; torch blocks take the
    mask at run time).
    """
    if position_encoding not in POSITION_ENCODINGS:
        raise ValueError(f"position_encoding must be one of {POSITION_ENCODINGS}; got {position_encoding!r}")
    rope = Rope(shape.head_dim, rope_theta, rope_scaling) if position_encoding == "rope" else None
    blocks: list[nn.Module]
    if use_te:
        blocks = [te_block(shape, i + 1, te_params_dtype, norm_eps, packed) for i in range(shape.num_layers)]
    with torch.device("meta"):  # torch blocks too: nothing allocated (or initialized) before the shard
        if not use_te:
            blocks = [TorchBlock(shape, norm_eps) for _ in range(shape.num_layers)]
        model = Transformer(shape, blocks, rope=rope, loss_chunk_tokens=loss_chunk_tokens, norm_eps=norm_eps)
    model.te_packed = use_te and packed
    return model
