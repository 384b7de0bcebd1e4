"""Several documents in one window, as attention sees them: which document each token belongs to, its position inside
that document, and what it may attend to.

A packed window (``training.trainer.data.packing``) holds whole examples one after another, then padding. Each row of a
batch carries a document id per token (``0`` for padding, ``1, 2, ...`` for the examples in order); from those ids:

* **positions** restart at 0 at every document's first token, so RoPE rotates each example exactly as it would
  alone (``positions``);
* on the **torch path**, a block-causal boolean mask ``[batch, 1, seq, seq]`` (``block_causal_mask``): query ``q``
  sees key ``k`` when both belong to the same document and ``k <= q``. It goes to
  ``F.scaled_dot_product_attention(attn_mask=...)``, an API unchanged from torch 2.0 to 2.13, on CPU and GPU alike;
  SDPA's own chooser then picks a kernel that takes an arbitrary mask (on a GPU memory-efficient attention, the
  ``attention_backend`` probe logs which one; Flash takes no mask). Memory: one byte per (query, key) pair of a row
  for the boolean mask, which SDPA widens to the compute dtype: 128 MiB a row at 8,192 tokens in bf16;
* on the **Transformer Engine path**, TE's packed-sequence format (``thd``) needs no mask: the tokens of the batch
  flattened into one stream, and ``cu_seqlens``, the int32 cumulative lengths of the documents (padding runs count
  as documents of their own, so there is no padding *between* sequences and ``cu_seqlens_padded`` is not needed),
  with ``max_seqlen``, the longest one (``te_arguments``; TE v2.11 ``DotProductAttention.forward``: 3-D q/k/v,
  ``attn_mask_type`` ``padding_causal``, ``cu_seqlens_q``/``_kv`` int32 ``[n + 1]``; ``MultiheadAttention`` applies
  RoPE per sequence from ``cu_seqlens`` when ``qkv_format`` is ``thd``). They are computed on the host from the
  ids before the copy to the GPU, so nothing waits on the device for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Documents:
    """One micro-batch's document layout: ``ids`` ``[batch, seq]`` (on the model's device), and for Transformer
    Engine ``cu_seqlens`` (int32, on the device) and ``max_seqlen`` (a Python int)."""

    ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int

    @classmethod
    def from_ids(cls, ids: torch.Tensor, device: torch.device | None = None) -> Documents:
        """The layout of host ``ids`` (``[batch, seq]`` integers), moved to ``device`` (default: where ids are)."""
        cu_seqlens, max_seqlen = te_arguments(ids.cpu().numpy())
        device = ids.device if device is None else device
        non_blocking = device.type == "cuda"
        return cls(
            ids.to(device, non_blocking=non_blocking),
            torch.from_numpy(cu_seqlens).to(device, non_blocking=non_blocking),
            max_seqlen,
        )


def starts(ids: torch.Tensor) -> torch.Tensor:
    """``[batch, seq]`` bool: True where a document (or a padding run) begins: the first token of each row and every
    token whose id differs from the one before it."""
    first = torch.ones_like(ids[:, :1], dtype=torch.bool)
    return torch.cat((first, ids[:, 1:] != ids[:, :-1]), dim=1)


def positions(ids: torch.Tensor) -> torch.Tensor:
    """Each token's position inside its document (``[batch, seq]`` int64), 0 at every document's first token."""
    index = torch.arange(ids.size(1), device=ids.device).expand_as(ids)
    begin = torch.where(starts(ids), index, torch.zeros_like(index))
    return index - begin.cummax(dim=1).values


def block_causal_mask(ids: torch.Tensor) -> torch.Tensor:
    """``[batch, 1, seq, seq]`` bool, True where query ``q`` may attend to key ``k``: same document and ``k <= q``.
    Every query sees at least itself, so no row of the softmax is empty."""
    seq = ids.size(1)
    same = ids.unsqueeze(2) == ids.unsqueeze(1)
    causal = torch.ones(seq, seq, dtype=torch.bool, device=ids.device).tril()
    return (same & causal).unsqueeze(1)


def te_arguments(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """``(cu_seqlens, max_seqlen)`` of a ``[batch, seq]`` array of ids with every row flattened into one stream
    (Transformer Engine's ``thd``): int32 cumulative document lengths from 0 to ``batch * seq``, and the longest
    document."""
    ids = np.asarray(ids)
    begins = np.ones(ids.shape, dtype=bool)
    begins[:, 1:] = ids[:, 1:] != ids[:, :-1]
    bounds = np.append(np.flatnonzero(begins.reshape(-1)), ids.size).astype(np.int32)
    return bounds, int(np.diff(bounds).max())
