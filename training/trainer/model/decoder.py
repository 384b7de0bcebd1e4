"""Decoder-only language model of any family in ``training.models`` (one ``ModelConfig``): embedding (times
sqrt(hidden) for Gemma), N blocks, final norm, LM head, next-token cross-entropy (the head and the loss in chunks
of tokens, ``loss.linear_cross_entropy``).

Two interchangeable blocks with the same parameters (``ModelConfig.parameter_count``):

* ``TorchBlock``: the family's block in plain PyTorch (fp32/fp16/bf16): pre-norm (and Gemma's post-norms), fused
  QKV with its bias when the family has one, per-head query/key norm before RoPE, SDPA causal attention with
  grouped-query attention (``num_kv_heads`` key/value heads shared by ``num_heads / num_kv_heads`` query heads, as
  transformers' ``repeat_kv``), the scale ``ModelConfig.attention_scale``, a sliding window on the layers that
  have one (a mask), the gated MLP (SwiGLU or GeGLU).
* ``te_block``: ``transformer_engine.pytorch.TransformerLayer`` where Transformer Engine 2.11 can express the
  family (fp8/mxfp8/nvfp4), imported lazily; the families it cannot express are refused in one line
  (``training.models.te_support.te_refusal``). kwargs checked against TE tag v2.11 ``transformer_engine/pytorch/transformer.py`` and
  ``attention/multi_head_attention.py``.

Norms: ``nn.RMSNorm`` (``x / rms(x) * w``, Llama's), or ``UnitOffsetRMSNorm`` (Gemma's ``x / rms(x) * (1 + w)``,
in fp32, as transformers' ``Gemma3RMSNorm``). ``tie_embeddings``: the LM head is the embedding's matrix; the model
then has no ``head`` module and no ``head.weight`` in its state dict.

Position encoding: ``rope`` rotates query and key as the family does (``training.trainer.model.rotary``; each layer
with its own base and scaling: Gemma 3's local layers differ from its global ones; no parameters), ``none`` is
NoPE. Attention per layer: the layers of one kind (``ModelConfig.layer_types``: full or sliding) share their
RoPE table and mask, made once per forward (``Transformer.layer_arguments``).

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

from training.models.config import ModelConfig
from training.models.te_support import te_refusal
from training.trainer.loss import linear_cross_entropy, token_log_probs, token_statistics
from training.trainer.model import doc_mask
from training.trainer.model.rotary import Rope, apply_rotary

__all__ = [
    "TorchBlock",
    "Transformer",
    "UnitOffsetRMSNorm",
    "attention_inputs",
    "attention_mask",
    "build_model",
    "causal_attention",
    "te_block",
    "te_refusal",
]


class _UnitOffsetRMSNormFunction(torch.autograd.Function):
    """Gemma's RMSNorm with what a fused norm keeps for backward: the input (its own dtype) and one fp32 rstd per
    row. Autograd through the fp32 ops of the forward would keep two fp32 copies of the input's size (the upcast
    input and the normalized value: 8 bytes per feature, about 1.3 GiB per Gemma 3 12B block at 8,192 tokens with
    its six norms); the backward recomputes the normalized value from the input instead."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (h * rstd * (1.0 + weight.float())).type_as(x)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        grad = grad_out.float()
        grad_weight = (grad * normed).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        grad_normed = grad * (1.0 + weight.float())
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


class UnitOffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``x / sqrt(mean(x^2) + eps) * (1 + w)``, computed in fp32 and cast back (transformers'
    ``Gemma3RMSNorm``: "Llama does x.to(float16) * w whilst Gemma3 is (x * w).to(float16)"). ``w`` starts at 0.
    Keeps the input and the fp32 rstd for backward, as a fused RMSNorm does (``_UnitOffsetRMSNormFunction``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _UnitOffsetRMSNormFunction.apply(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def make_norm(config: ModelConfig, dim: int) -> nn.Module:
    """The family's norm over ``dim`` features."""
    if config.norm == "rmsnorm_unit_offset":
        return UnitOffsetRMSNorm(dim, config.norm_eps)
    return nn.RMSNorm(dim, eps=config.norm_eps)


class TorchBlock(nn.Module):
    """The family's transformer block in plain PyTorch. Parameters (``training.models.names``):
    ``attention_norm``, ``qkv`` (``[q; k; v]``: ``num_heads * head_dim`` query rows, then ``num_kv_heads *
    head_dim`` rows each for key and value; with a bias when the family's q/k/v have one), ``q_norm`` and
    ``k_norm`` (query/key norm), ``out_proj``, ``post_attention_norm`` (sandwich), ``ffn_norm``, ``gate_up``
    (``[gate; up]``), ``down``, ``post_ffn_norm`` (sandwich)."""

    def __init__(self, config: ModelConfig):
        """``config``: the model's (every block of a model is the same; a layer's window and RoPE come with its
        forward's arguments)."""
        super().__init__()
        h, f, hd = config.hidden_size, config.ffn_hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, hd
        self.scale = config.attention_scale if config.query_pre_attn_scalar is not None else None
        self.activation = config.activation
        sandwich = config.norm_placement == "sandwich"
        bias = config.attention_bias
        self.attention_norm = make_norm(config, h)
        self.qkv = nn.Linear(h, config.q_width + 2 * config.kv_width, bias=bias.qkv)
        self.q_norm = make_norm(config, hd) if config.qk_norm else None
        self.k_norm = make_norm(config, hd) if config.qk_norm else None
        self.out_proj = nn.Linear(config.q_width, h, bias=bias.o)
        self.post_attention_norm = make_norm(config, h) if sandwich else None
        self.ffn_norm = make_norm(config, h)
        self.gate_up = nn.Linear(h, 2 * f, bias=False)
        self.down = nn.Linear(f, h, bias=False)
        self.post_ffn_norm = make_norm(config, h) if sandwich else None

    def forward(
        self,
        x: torch.Tensor,
        rotary_pos_emb: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``rotary_pos_emb``: the ``rotary.Rope`` frequencies of this layer's kind (``[seq, 1, 1, head_dim]``, or
        per token ``[batch, seq, 1, head_dim]`` for packed documents), or None for NoPE; ``attention_mask``: what
        each query may see when that is not plain causal attention (a sliding window, packed documents:
        ``attention_mask``), else None."""
        b, s, _ = x.shape
        q, k, v = attention_inputs(
            self.qkv(self.attention_norm(x)),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            rotary_pos_emb,
            self.q_norm,
            self.k_norm,
        )
        attn = causal_attention(q, k, v, mask=attention_mask, scale=self.scale)
        out = self.out_proj(attn.transpose(1, 2).reshape(b, s, -1))
        x = x + (out if self.post_attention_norm is None else self.post_attention_norm(out))
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        act = F.silu(gate) if self.activation == "silu" else F.gelu(gate, approximate="tanh")
        mlp = self.down(act * up)
        return x + (mlp if self.post_ffn_norm is None else self.post_ffn_norm(mlp))


def attention_inputs(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    rotary_pos_emb: torch.Tensor | None,
    q_norm: nn.Module | None = None,
    k_norm: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SDPA's query, key and value (``[batch, heads, seq, head_dim]``: ``num_heads``, ``num_kv_heads`` and
    ``num_kv_heads`` heads) from the fused QKV projection's output ``qkv`` (``[batch, seq, (num_heads + 2 *
    num_kv_heads) * head_dim]``): query and key normalized per head (``q_norm``, ``k_norm``: Qwen 3, Gemma 3) and
    then rotated. The shapes, dtypes and memory layout (strides) the kernel gets, which
    ``attention.AttentionPlan.in_effect`` probes with."""
    b, s, _ = qkv.shape
    kv_width = num_kv_heads * head_dim
    q, k, v = qkv.split((num_heads * head_dim, kv_width, kv_width), dim=-1)
    q = q.view(b, s, num_heads, head_dim)
    k, v = k.view(b, s, num_kv_heads, head_dim), v.view(b, s, num_kv_heads, head_dim)
    if q_norm is not None and k_norm is not None:
        q, k = q_norm(q), k_norm(k)
    if rotary_pos_emb is not None:
        q, k = apply_rotary(q, rotary_pos_emb), apply_rotary(k, rotary_pos_emb)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def attention_mask(
    ids: torch.Tensor | None, seq: int, window: int | None, device: torch.device
) -> torch.Tensor:
    """``[batch or 1, 1, seq, seq]`` bool, True where query ``q`` may attend to key ``k``: ``k <= q``, within the
    same document when ``ids`` (a packed batch's document ids, ``doc_mask.block_causal_mask``), and within the
    sliding ``window`` when given (``q - k < window``, as transformers' ``sliding_window_overlay``: the window
    counts the query itself). Documents are contiguous, so the window inside a document is the same band."""
    if ids is not None:
        mask = doc_mask.block_causal_mask(ids)
        if window is None:
            return mask
    else:
        mask = torch.ones(seq, seq, dtype=torch.bool, device=device).tril().view(1, 1, seq, seq)
    if window is not None:
        mask = mask & torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1 - window).view(
            1, 1, seq, seq
        )
    return mask


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sdpa: Callable[..., Any] | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> Any:
    """The block's attention call: causal SDPA, with grouped-query attention (``enable_gqa``) when key and value
    have fewer heads than the query. ``sdpa``: what is called with these arguments instead of
    ``F.scaled_dot_product_attention`` (``attention.AttentionPlan`` passes ``torch._fused_sdp_choice``, which
    returns the backend SDPA would run for them). ``mask``: a boolean ``[batch or 1, 1, seq, seq]`` of what each
    query may see (``attention_mask``: a sliding window, packed documents), given as ``attn_mask`` instead
    of ``is_causal``; key and value heads are then repeated to the query's (as transformers' ``repeat_kv``) rather
    than left to ``enable_gqa``, which torch 2.9's kernels that take a mask do not all accept (torch checks it per
    backend). ``scale``: the factor on query . key when it is not SDPA's ``head_dim ** -0.5`` (Gemma 3's
    ``query_pre_attn_scalar``)."""
    call = F.scaled_dot_product_attention if sdpa is None else sdpa
    extra = {} if scale is None else {"scale": scale}
    if mask is None:
        return call(q, k, v, is_causal=True, enable_gqa=k.size(1) != q.size(1), **extra)
    if k.size(1) != q.size(1):
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    return call(q, k, v, attn_mask=mask, **extra)


def te_block(
    config: ModelConfig,
    layer_number: int,
    params_dtype: torch.dtype,
    packed: bool = False,
) -> nn.Module:
    """The same block as ``TorchBlock`` from Transformer Engine (batch-first input, causal mask, RMSNorm, the gated
    MLP, ``num_gqa_groups`` = the key/value heads, ``kv_channels`` = ``head_dim``: TE's ``MultiheadAttention``
    then makes its fused QKV weight ``num_heads * head_dim + 2 * groups * head_dim`` rows, interleaved per group,
    ``attention/multi_head_attention.py``). ``layer_number`` counts from 1 (TE's convention).

    Family features: ``window_size=(window - 1, 0)`` on a sliding-window layer (TE v2.11: a query ``i`` sees keys
    ``[i - window_size[0], i + window_size[1]]``, so ``window`` tokens including itself, as Hugging Face's
    ``sliding_window``); ``qk_norm_type="RMSNorm"`` with ``qk_norm_before_rope=True`` and ``qk_norm_eps`` for a
    query/key norm (Qwen 3; ``MultiheadAttention._create_qk_norm_modules`` makes an RMSNorm over the head's
    ``hidden_size_per_attention_head``). What TE cannot express is refused (``te_refusal``).

    RoPE: ``forward(x, rotary_pos_emb=freqs)`` with ``rotary_pos_interleaved`` left at its default False
    (rotate-half, the families' convention). No ``init_method``: values never come from TE
    (``training.trainer.checkpoint.weights`` sets each one).

    ``packed``: several documents per window, in TE's packed-sequence format: ``attn_input_format="thd"`` and
    ``padding_causal`` attention within each sequence that ``forward(..., cu_seqlens_q=, max_seqlen_q=)``
    delimits (``doc_mask.te_arguments``; TE rotates each sequence from position 0)."""
    problem = te_refusal(config)
    if problem is not None:
        raise ValueError(problem)
    te = importlib.import_module("transformer_engine.pytorch")
    window = config.window(layer_number - 1)
    extra: dict[str, Any] = {}
    if window is not None:
        extra["window_size"] = (window - 1, 0)
    if config.qk_norm:
        extra |= {"qk_norm_type": "RMSNorm", "qk_norm_eps": config.norm_eps, "qk_norm_before_rope": True}
    return te.TransformerLayer(
        hidden_size=config.hidden_size,
        ffn_hidden_size=config.ffn_hidden_size,
        num_attention_heads=config.num_heads,
        num_gqa_groups=config.num_kv_heads,
        kv_channels=config.head_dim,
        layernorm_epsilon=config.norm_eps,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        layer_number=layer_number,
        self_attn_mask_type="padding_causal" if packed else "causal",
        params_dtype=params_dtype,
        fuse_qkv_params=True,
        bias=False,
        activation="swiglu" if config.activation == "silu" else "geglu",
        normalization="RMSNorm",
        attn_input_format="thd" if packed else "bshd",
        # Built on meta like the rest of the model; after fully_shard, weights.initialize has TE's
        # reset_parameters() materialize (and, under quantized_model_init, quantize) each rank's shard with the
        # values weights.py gives it (transformer_engine/pytorch/module/base.py reset_parameters at v2.11).
        device="meta",
        **extra,
    )


class Transformer(nn.Module):
    """The LM. ``forward(tokens, targets)`` returns the mean next-token cross-entropy (fp32), the LM head and the
    loss computed ``loss_chunk_tokens`` tokens at a time (0: all at once)."""

    def __init__(
        self,
        config: ModelConfig,
        blocks: list[nn.Module],
        rope: Rope | None | str = "config",
        loss_chunk_tokens: int = 0,
    ):
        """``config``: the model's. ``rope``: ``"config"`` (each kind of layer gets its own from the config), or
        the frequencies every block gets (None: none, NoPE)."""
        super().__init__()
        self.loss_chunk_tokens = loss_chunk_tokens
        self.shape = self.config = config
        self.layer_kinds = config.layer_types
        self.ropes = {
            kind: Rope.from_config(config.rope_of(config.layer_types.index(kind)), config.head_dim)
            if isinstance(rope, str)
            else rope
            for kind in dict.fromkeys(config.layer_types)
        }
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(blocks)
        self.norm = make_norm(config, config.hidden_size)
        self.head = (
            None if config.tie_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    te_packed: bool = False
    """Transformer Engine blocks built for packed documents (``te_block(packed=True)``: ``thd`` input)."""
    te_blocks: bool = False
    """The blocks are Transformer Engine's (their windows are built in; no mask is passed)."""

    @property
    def rope(self) -> Rope | None:
        """The rotary frequencies of the first kind of layer (the full-attention layers of every family here but
        Gemma 3): what a stand-in block is warmed up with (``compile.warm_up``). Set: every layer's (None: NoPE)."""
        return next(iter(self.ropes.values()))

    @rope.setter
    def rope(self, value: Rope | None) -> None:
        self.ropes = dict.fromkeys(self.ropes, value)

    def hidden_states(
        self, tokens: torch.Tensor, documents: doc_mask.Documents | None = None
    ) -> torch.Tensor:
        """The last block's output (before the final norm) for ``tokens`` (``[batch, seq]``); ``documents``: the
        layout of a packed batch (each example attends only to itself, its positions restart at 0)."""
        x = self.embed(tokens)
        if self.config.scale_embeddings:  # Gemma: sqrt(hidden) in the activations' dtype, as transformers
            x = x * torch.tensor(self.config.embedding_multiplier, dtype=x.dtype, device=x.device)
        arguments = self.layer_arguments(tokens, documents)
        if self.te_packed:
            x = x.view(-1, x.size(-1))  # thd: the batch's tokens as one stream
        for layer, kind in zip(self.layers, self.layer_kinds, strict=True):
            x = layer(x, **arguments[kind])  # activation checkpointing and compile wrap forward in place
        return x.view(*tokens.shape, -1) if self.te_packed else x

    def layer_arguments(
        self, tokens: torch.Tensor, documents: doc_mask.Documents | None
    ) -> dict[str, dict[str, Any]]:
        """What the blocks of each kind get besides the hidden states: RoPE frequencies and, for packed documents
        or a sliding window, the mask (torch) or the sequence boundaries (Transformer Engine)."""
        return {kind: self._kind_arguments(kind, tokens, documents) for kind in self.ropes}

    def _kind_arguments(
        self, kind: str, tokens: torch.Tensor, documents: doc_mask.Documents | None
    ) -> dict[str, Any]:
        rope = self.ropes[kind]
        freqs = None if rope is None else rope(tokens.size(1), tokens.device)
        window = self.config.sliding_window if kind == "sliding" else None
        kwargs: dict[str, Any] = {}
        if documents is None:
            if self.te_packed:
                raise ValueError(
                    "these Transformer Engine blocks were built for packed documents: pass documents"
                )
            if window is not None and not self.te_blocks and window < tokens.size(1):
                kwargs["attention_mask"] = attention_mask(None, tokens.size(1), window, tokens.device)
            return kwargs if freqs is None else {**kwargs, "rotary_pos_emb": freqs}
        if self.te_packed:  # TE restarts RoPE per sequence itself from cu_seqlens
            kwargs = {"cu_seqlens_q": documents.cu_seqlens, "max_seqlen_q": documents.max_seqlen}
            return kwargs if freqs is None else {**kwargs, "rotary_pos_emb": freqs}
        kwargs["attention_mask"] = attention_mask(documents.ids, tokens.size(1), window, tokens.device)
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
        log_probs: bool = False,
    ) -> torch.Tensor:
        """The mean next-token cross-entropy over the targets that count; ``documents``: a packed batch's layout.
        ``statistics`` (validation, no gradient): ``[loss sum, correct, counted]`` instead (``loss.token_statistics``:
        sums that add up over batches and ranks, and the token accuracy). ``log_probs``: each token's log-probability
        of its target instead (flattened, 0 where ignored; ``loss.token_log_probs``: preference tuning).
        Keywords of ``forward`` rather than methods of their own, so that FSDP2's hooks gather the root's
        parameters for them as for training."""
        x = self.norm(self.hidden_states(tokens, documents))
        # The head's weight, not a call of the head: FSDP2 has gathered it with the root's parameters.
        if statistics:
            return token_statistics(x, self.head_weight, targets, self.loss_chunk_tokens)
        if log_probs:
            return token_log_probs(x, self.head_weight, targets, self.loss_chunk_tokens)
        return linear_cross_entropy(x, self.head_weight, targets, self.loss_chunk_tokens)

    def logits(self, tokens: torch.Tensor, documents: doc_mask.Documents | None = None) -> torch.Tensor:
        """The next-token logits of every position (``[batch, seq, vocab]``, unchunked; for checks and
        comparisons with Hugging Face, not for training). Under FSDP2, ``unshard()`` the root first."""
        return self.norm(self.hidden_states(tokens, documents)) @ self.head_weight.T


def build_model(
    config: ModelConfig,
    *,
    use_te: bool,
    te_params_dtype: torch.dtype,
    loss_chunk_tokens: int = 0,
    packed: bool = False,
) -> Transformer:
    """Build the model on the meta device (no memory until FSDP2 has sharded it; then
    ``parallel.shard_model`` materializes each rank's shard and ``weights.initialize`` fills it).
    ``loss_chunk_tokens``: the contract's setting (0: the LM head and loss unchunked). Activation checkpointing
    and ``torch.compile`` are applied to the blocks afterwards (``activation_checkpoint``, ``compile``).
    ``packed``: the batches hold several documents per window (Transformer Engine blocks are then built for its
    packed format; torch blocks take the mask at run time). ``config``: the model's (its family, position
    encoding, RoPE and norm epsilon)."""
    blocks: list[nn.Module]
    if use_te:
        blocks = [te_block(config, i + 1, te_params_dtype, packed=packed) for i in range(config.num_layers)]
    with torch.device("meta"):  # torch blocks too: nothing allocated (or initialized) before the shard
        if not use_te:
            blocks = [TorchBlock(config) for _ in range(config.num_layers)]
        model = Transformer(config, blocks, loss_chunk_tokens=loss_chunk_tokens)
    model.te_packed = use_te and packed
    model.te_blocks = use_te
    return model
