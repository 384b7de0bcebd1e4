"""``torch.compile`` of each block's forward (and of the chunked loss's per-chunk body), with a fallback to eager.

Per-block compilation as torchtitan's ``distributed/compile.py`` does it (read, not copied): the blocks repeat, so
one compiled graph serves them all, and the FSDP2 hooks stay outside the compiled region because the block's
``forward`` (already wrapped by ``activation_checkpoint`` when that is on) is what is compiled, not the module's
call. ``loop.build`` applies it to the meta-device model before sharding.

Compilation happens at the first call. If it fails there (no C++ compiler, an unsupported op, an old torch), the
trainer prints one warning line and every block runs eagerly from then on. Not caught: a failure that shows only
when AOTAutograd lowers the backward graph, which it does lazily at the first backward pass (the graph itself is
traced in the forward pass, so tracing problems are caught).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from training.trainer import loss as loss_module


def resolve(setting: str, device: torch.device, use_te: bool) -> bool:
    """Whether to compile: ``auto`` compiles on a GPU on the torch path (Transformer Engine runs eagerly)."""
    if setting == "auto":
        return device.type == "cuda" and not use_te
    return setting == "true"


class _State:
    """Process-wide: a failure anywhere switches every compiled function back to eager, with one warning."""

    failed: str | None = None


def _warn(err: BaseException) -> None:
    if _State.failed is None:
        _State.failed = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
        print(
            f"warning: torch.compile failed ({_State.failed}); running eagerly", file=sys.stderr, flush=True
        )


def guarded(compiled: Callable, eager: Callable) -> Callable:
    """``compiled``, or ``eager`` once any compilation has failed (the failing call is rerun eagerly)."""

    @functools.wraps(eager)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _State.failed is None:
            try:
                return compiled(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - any compile failure falls back to eager
                _warn(err)
        return eager(*args, **kwargs)

    return call


def apply(layers: nn.ModuleList, *, loss_chunks: bool = True) -> None:
    """Compile each block's forward (``fullgraph``: a graph break is a failure, hence eager) and, with
    ``loss_chunks``, the chunked loss's per-chunk body."""
    for block in layers:
        eager = block.forward
        block.forward = guarded(torch.compile(eager, fullgraph=True), eager)
    if loss_chunks:
        loss_module.set_chunk_functions(
            guarded(torch.compile(loss_module.chunk_forward, fullgraph=True), loss_module.chunk_forward),
            guarded(torch.compile(loss_module.chunk_gradient, fullgraph=True), loss_module.chunk_gradient),
        )


def reset() -> None:
    """Eager loss chunks and no recorded failure (tests, and the benchmark between cells)."""
    _State.failed = None
    loss_module.set_chunk_functions(loss_module.chunk_forward, loss_module.chunk_gradient)


def failure() -> str | None:
    """Why compilation failed in this process, or None."""
    return _State.failed
