"""Activation checkpointing of the model's blocks: which blocks (every k-th) and how (``full`` or ``selective``).

Applied by ``loop.build`` to the meta-device model before sharding, in the spirit of torchtitan's
``distributed/activation_checkpoint.py`` (read, not copied). A block's ``forward`` is replaced on the instance, so
parameter names, the FSDP2 units, checkpoints and the Hugging Face export are unchanged.

* ``full``: the block saves only its input and is recomputed in backward (``torch.utils.checkpoint``,
  non-reentrant). On the Transformer Engine path ``te.distributed.checkpoint``, which keeps the FP8 scaling state
  of the forward and the recompute consistent.
* ``selective`` (torch path only): op-level, torchtitan's policy. The outputs of compute-intensive ops (matmuls
  and attention, ``torch._functorch.partitioners.get_default_op_list().compute_intensive_ops`` plus the SDPA
  variants) are saved, except every second matmul of a block, which is recomputed; everything else (RMSNorm,
  RoPE, SiLU, the products and residual adds) is recomputed. In ``TorchBlock`` that saves the QKV projection,
  attention's output and log-sum-exp and the gate/up projection; the output and down projections are recomputed.
  Refused with Transformer Engine (``settings_checks.check_levers``): TE's GEMMs are its own extension calls, not
  ATen ops, so an op-level policy cannot see them (it would recompute them all, i.e. full AC with extra
  bookkeeping), and only ``te.distributed.checkpoint`` keeps TE's FP8 scaling state right across a recompute.
* every k-th block: ``interval`` k checkpoints blocks 0, k, 2k, ... and leaves the others' activations saved.
"""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

_SDPA_OPS = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_attention_math",
)
_MATMUL_OPS = ("mm", "addmm", "bmm", "linear")


def checkpointed_blocks(num_layers: int, mode: str, interval: int) -> list[int]:
    """The indices of the blocks ``mode`` (none, full, selective) checkpoints with ``interval`` k."""
    if mode == "none":
        return []
    return list(range(0, num_layers, interval))


def variants(num_layers: int, mode: str, interval: int) -> list[str]:
    """The distinct ways the model's blocks run under ``mode`` and ``interval``: ``mode`` for the checkpointed
    ones, ``none`` for the others (what ``compile.warm_up`` compiles)."""
    chosen = checkpointed_blocks(num_layers, mode, interval)
    return ([mode] if chosen else []) + (["none"] if len(chosen) < num_layers else [])


def apply(layers: nn.ModuleList, mode: str, interval: int = 1, *, use_te: bool = False) -> list[int]:
    """Checkpoint every ``interval``-th block of ``layers`` with ``mode``; returns their indices."""
    if mode not in ("none", "full", "selective"):
        raise ValueError(f"activation_checkpointing: must be one of none, full, selective; got {mode!r}")
    if mode == "selective" and use_te:
        raise ValueError("activation_checkpointing: selective is refused with Transformer Engine; use full")
    chosen = checkpointed_blocks(len(layers), mode, interval)
    for index in chosen:
        block = layers[index]
        if use_te:
            block.forward = functools.partial(_te_checkpoint, block.forward)
        else:
            # A method of the block (not a partial holding its bound forward): torch.compile then guards on the
            # block's type, so one compiled graph serves every checkpointed block (torch 2.9 guards a partial's
            # arguments by identity: a recompile per block, and eager blocks past its recompile limit of 8).
            block.forward = types.MethodType(_full_block if mode == "full" else _selective_block, block)
    return chosen


def _own_forward(block: nn.Module) -> Callable:
    """The block's own ``forward`` (its class's), under the checkpointing method ``apply`` put on the instance."""
    return functools.partial(type(block).forward, block)


def _full_block(block: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    return _full(_own_forward(block), *args, **kwargs)


def _selective_block(block: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    return _selective(_own_forward(block), *args, **kwargs)


def _full(forward: Callable, *args: Any, **kwargs: Any) -> torch.Tensor:
    if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _te_checkpoint(forward: Callable, *args: Any, **kwargs: Any) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    # Other keyword arguments (rotary_pos_emb) reach the layer (transformer_engine/pytorch/distributed.py, v2.11).
    te = importlib.import_module("transformer_engine.pytorch")
    return te.distributed.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _selective(forward: Callable, *args: Any, **kwargs: Any) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=_selective_contexts, **kwargs)


@functools.cache
def save_ops() -> frozenset:
    """The ops whose outputs ``selective`` saves (those this torch build has)."""
    from torch._functorch.partitioners import get_default_op_list

    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    ops.update(getattr(torch.ops.aten, name).default for name in _SDPA_OPS if hasattr(torch.ops.aten, name))
    return frozenset(ops)


@functools.cache
def _matmul_ops() -> frozenset:
    return frozenset(getattr(torch.ops.aten, name).default for name in _MATMUL_OPS)


def _selective_contexts():
    """A fresh policy per checkpointed call: counts the block's matmuls, in forward and in the recompute alike."""
    counts = {False: 0, True: 0}
    saved, matmuls = save_ops(), _matmul_ops()

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in matmuls:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:  # every second matmul is recomputed
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
