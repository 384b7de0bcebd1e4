"""Decoder-only language model: embedding, N blocks, final RMSNorm, LM head, next-token cross-entropy (the head
and the loss in chunks of tokens, ``loss.linear_cross_entropy``).

Two interchangeable blocks with the same parameter count (``contract.ModelShape.parameter_count``):

* ``TorchBlock``: pre-norm RMSNorm, fused QKV, SDPA causal attention, SwiGLU MLP, no biases (fp32/fp16/bf16).
* ``te_block``: ``transformer_engine.pytorch.TransformerLayer`` with the same structure (fp8/mxfp8/nvfp4),
  imported lazily. kwargs checked against TE tag v2.11 ``transformer_engine/pytorch/transformer.py``.

Position encoding (``position_encoding``): ``rope`` (default) rotates query and key as Llama does
(``training.trainer.rotary``; no parameters, so the count is unchanged), and the model maps onto Hugging Face's
``LlamaForCausalLM`` (``training.trainer.export_hf``); ``none`` is NoPE (causal attention alone lets a decoder
infer positions), the behaviour of models trained before RoPE existed here.
"""

from __future__ import annotations

import importlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from training.request.contract import POSITION_ENCODINGS, ModelShape
from training.trainer.loss import linear_cross_entropy
from training.trainer.rotary import Rope, apply_rotary

INIT_STD = 0.02
NORM_EPS = 1e-5


class TorchBlock(nn.Module):
    """Pre-norm transformer block in plain PyTorch."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        h, f = shape.hidden_size, shape.ffn_hidden_size
        self.num_heads = shape.num_heads
        self.attention_norm = nn.RMSNorm(h, eps=NORM_EPS)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.out_proj = nn.Linear(h, h, bias=False)
        self.ffn_norm = nn.RMSNorm(h, eps=NORM_EPS)
        self.gate_up = nn.Linear(h, 2 * f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor, rotary_pos_emb: torch.Tensor | None = None) -> torch.Tensor:
        """``rotary_pos_emb``: the ``rotary.Rope`` frequencies (``[seq, 1, 1, head_dim]``), or None for NoPE."""
        b, s, h = x.shape
        q, k, v = (
            self.qkv(self.attention_norm(x)).view(b, s, 3, self.num_heads, h // self.num_heads).unbind(2)
        )
        if rotary_pos_emb is not None:
            q, k = apply_rotary(q, rotary_pos_emb), apply_rotary(k, rotary_pos_emb)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out_proj(attn.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def te_block(shape: ModelShape, layer_number: int, params_dtype: torch.dtype) -> nn.Module:
    """The same block as ``TorchBlock`` from Transformer Engine (batch-first input, causal mask, RMSNorm, SwiGLU).

    RoPE: ``forward(x, rotary_pos_emb=freqs)`` with ``rotary_pos_interleaved`` left at its default False
    (rotate-half, Llama's convention; transformer_engine/pytorch/transformer.py and
    attention/multi_head_attention.py at v2.11 apply it to query and key after the fused QKV projection)."""
    te = importlib.import_module("transformer_engine.pytorch")
    return te.TransformerLayer(
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_heads,
        layernorm_epsilon=NORM_EPS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method=lambda w: nn.init.normal_(w, std=INIT_STD),
        output_layer_init_method=lambda w: nn.init.normal_(w, std=INIT_STD / math.sqrt(2 * shape.num_layers)),
        layer_number=layer_number,
        self_attn_mask_type="causal",
        params_dtype=params_dtype,
        fuse_qkv_params=True,
        bias=False,
        activation="swiglu",
        normalization="RMSNorm",
        attn_input_format="bshd",
        # Built on meta like the rest of the model; after fully_shard, TE's reset_parameters() materializes
        # and initializes each rank's shard (DTensor-aware, quantizing when quantized_model_init is on).
        # Checked: transformer_engine/pytorch/module/base.py reset_parameters and
        # tests/pytorch/distributed/run_fsdp2_model.py at tag v2.11.
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
    ):
        """``rope``: the rotary frequencies every block gets (None: no position encoding)."""
        super().__init__()
        self.loss_chunk_tokens = loss_chunk_tokens
        self.shape = shape
        self.rope = rope
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(blocks)
        self.norm = nn.RMSNorm(shape.hidden_size, eps=NORM_EPS)
        self.head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """The last block's output (before the final norm) for ``tokens`` (``[batch, seq]``)."""
        x = self.embed(tokens)
        kwargs = {} if self.rope is None else {"rotary_pos_emb": self.rope(tokens.size(1), tokens.device)}
        for layer in self.layers:  # activation checkpointing and compile wrap a block's forward in place
            x = layer(x, **kwargs)
        return x

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.hidden_states(tokens)
        # The head's weight, not a call of the head: FSDP2 has gathered it with the root's parameters.
        return linear_cross_entropy(self.norm(x), self.head.weight, targets, self.loss_chunk_tokens)


def build_model(
    shape: ModelShape,
    *,
    use_te: bool,
    te_params_dtype: torch.dtype,
    position_encoding: str = "rope",
    rope_theta: float = 10000.0,
    loss_chunk_tokens: int = 0,
) -> Transformer:
    """Build the model on the meta device (no memory until FSDP2 has sharded it; then
    ``parallel.shard_model`` materializes each rank's shard and ``init_weights`` fills it).
    ``loss_chunk_tokens``: the contract's setting (0: the LM head and loss unchunked). Activation checkpointing
    and ``torch.compile`` are applied to the blocks afterwards (``activation_checkpoint``, ``compile``).

    TE blocks are initialized by TE itself during materialization; the rest by ``init_weights``.
    ``position_encoding`` is ``rope`` (rotary embeddings with base ``rope_theta``) or ``none``.
    """
    if position_encoding not in POSITION_ENCODINGS:
        raise ValueError(f"position_encoding must be one of {POSITION_ENCODINGS}; got {position_encoding!r}")
    head_dim = shape.hidden_size // shape.num_heads
    rope = Rope(head_dim, rope_theta, use_te=use_te) if position_encoding == "rope" else None
    blocks: list[nn.Module]
    if use_te:
        blocks = [te_block(shape, i + 1, te_params_dtype) for i in range(shape.num_layers)]
    else:
        blocks = [TorchBlock(shape) for _ in range(shape.num_layers)]
    with torch.device("meta"):
        model = Transformer(shape, blocks, rope=rope, loss_chunk_tokens=loss_chunk_tokens)
    return model


def _init_value(name: str, param: torch.Tensor, num_layers: int, generator: torch.Generator) -> torch.Tensor:
    """The full initial value of one parameter: ones for norms, N(0, 0.02) for weights, output projections of
    each block scaled by 1/sqrt(2 * num_layers) (GPT-2 style)."""
    if name.endswith("norm.weight"):
        return torch.ones(param.shape, device=param.device, dtype=param.dtype)
    std = (
        INIT_STD / math.sqrt(2 * num_layers)
        if name.endswith(("out_proj.weight", "down.weight"))
        else INIT_STD
    )
    full = torch.empty(param.shape, device=param.device, dtype=torch.float32)
    return full.normal_(0.0, std, generator=generator).to(param.dtype)


@torch.no_grad()
def init_weights(model: Transformer, seed: int) -> None:
    """Initialize the (materialized, possibly sharded) parameters: each parameter's FULL value is
    drawn from a generator seeded by (seed, parameter index), then this rank keeps its shard. The result does
    not depend on the world size. TE layers (already initialized by TE) are skipped."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for index, (name, param) in enumerate(model.named_parameters()):
        if name.startswith("layers.") and not isinstance(_owner(model, name), TorchBlock):
            continue
        generator = torch.Generator(device=param.device).manual_seed(seed * 1_000_003 + index)
        if isinstance(param, DTensor):
            full = _init_value(
                name, param.to_local().new_empty(param.shape), model.shape.num_layers, generator
            )
            param.copy_(distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None))
        else:
            param.copy_(_init_value(name, param, model.shape.num_layers, generator))


def _owner(model: Transformer, param_name: str) -> nn.Module:
    return model.layers[int(param_name.split(".")[1])]
