"""What the memory estimate is held against and made of, besides the request: the share of the GPU's memory a
request may plan to use, the allowance for what no tensor tracker sees, the per-token terms fitted to
the traced reference, the bytes per value of the quantized formats, and ``Memory``, the estimate by
part (``memory.estimate_memory``; the model behind each term: ``memory``'s docstring).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GIB = 2**30
HEADROOM = 0.95
"""Share of the GPU's memory a request may plan to use; the rest is for what even the allowance misses."""
ALLOWANCE_FIXED_GIB = 2.0
"""CUDA context (about 0.5 GiB on H100/B200), cuBLAS workspace (32 MiB per stream on Hopper and newer), TE's
workspace (32 MiB), NCCL's buffers (a few MiB per channel and peer: a few hundred MiB at 8-16 ranks)."""
ALLOWANCE_FRACTION = 0.08
"""The caching allocator's fragmentation, as a share of the live tensors (PyTorch's reserved-over-allocated is
typically 1.05-1.15 in steady training)."""
AC_RECOMPUTE_BYTES_PER_H = 9
"""Fitted to the trace: gradients in flight right after a block's recompute, per token, in units of h."""
AC_TAIL_BYTES_PER_HF = 8
"""Fitted to the trace: per-token gradients in flight at the end of a block's backward, in units of (h + f)."""
LOSS_BYTES_PER_V = 12
"""Unchunked: fp32 log-softmax saved (4), and in its backward its fp32 gradient in and out (8), per token and
vocabulary entry."""
CHUNKED_LOSS_BYTES_PER_V = 6
"""Chunked: one chunk's fp32 logits (4) and their gradient in the compute dtype (2), per token and entry."""

QUANTIZED_BYTES: Mapping[str, float] = {"fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32, "nvfp4": 0.5 + 1.0 / 16}
"""Bytes per value of one quantized usage (data + block scales: E8M0 per 32 values for MXFP8, E4M3 per 16 for
NVFP4; fp8's per-tensor scale is negligible)."""


@dataclass(frozen=True)
class Memory:
    """The estimate: ``parts`` (GiB, at the peak moment) sum to ``tensors_gib``; ``peak_gib`` adds the allowance."""

    moment: str
    parts: dict[str, float]
    tensors_gib: float
    allowance_gib: float
    peak_gib: float
    gpu_gib: float
    limit_gib: float

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.limit_gib
