"""The step's overheads, as the fastest trainers keep them down (torchtitan, read not copied): the CUDA caching
allocator's expandable segments, Python's garbage collector run on a schedule, and AdamW's kernels.

* ``expandable_segments``: ``torch.cuda.memory._set_allocator_settings("expandable_segments:True")`` before the
  first allocation of the run (the run's ``PYTORCH_ALLOC_CONF``, when set, wins and is left alone).
* ``gc_interval`` N: the collector is disabled and run (generation 1) every N steps, torchtitan's
  ``tools/utils.GarbageCollection``; 0 leaves Python's automatic collection on.
* ``adamw_impl``: ``torch.optim.AdamW(fused=True)`` on CUDA (one kernel for every parameter; no foreach
  temporaries), ``foreach`` elsewhere. With ``quantized_model_init`` the primary weights are FP8 or MXFP8, so the
  optimizer is ``master_weights.MasterWeightAdamW`` (the same kernels on fp32 master copies, written back into
  the quantized weights; TE 2.11's ``FusedAdam`` cannot shard its states with FSDP2, that module says why).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterable

import torch

from training.trainer.distributed.master_weights import MasterWeightAdamW

ALLOC_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def configure_allocator(enabled: bool, device: torch.device) -> str:
    """Turn on expandable segments for this process's CUDA allocator; what is in effect, for the log."""
    if device.type != "cuda":
        return "n/a (cpu)"
    given = next((f"{name}={os.environ[name]}" for name in ALLOC_ENV if os.environ.get(name)), None)
    if given:
        return f"from the environment ({given})"
    if not enabled:
        return "off"
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    return "expandable_segments:True"


class GarbageCollection:
    """Python's collector off, a generation-1 collection every ``interval`` steps (0: automatic, untouched)."""

    def __init__(self, interval: int):
        self.interval = interval
        self.seconds = 0.0
        if interval:
            gc.disable()
            self._collect()

    def _collect(self) -> None:
        started = time.perf_counter()
        gc.collect(1)
        self.seconds += time.perf_counter() - started

    def step(self, step: int) -> None:
        if self.interval and step > 1 and step % self.interval == 0:
            self._collect()

    def close(self) -> None:
        if self.interval:
            gc.enable()

    @staticmethod
    def describe_interval(interval: int) -> str:
        return f"every_{interval}_steps" if interval else "python_automatic"


def adamw_impl(setting: str, device: torch.device) -> str:
    """The AdamW kernels: ``fused`` on CUDA and ``foreach`` elsewhere (``auto``), or the named ones."""
    if setting == "auto":
        return "fused" if device.type == "cuda" else "foreach"
    return setting


def build_optimizer(
    params: Iterable[torch.nn.Parameter],
    impl: str,
    lr: float,
    weight_decay: float,
    *,
    master_weights: bool = False,
) -> torch.optim.Optimizer:
    """AdamW (betas 0.9/0.95) with the kernels ``impl`` names (``adamw_impl``'s result); ``master_weights``
    (``quantized_model_init``): on fp32 master copies of the parameters (``master_weights.MasterWeightAdamW``)."""
    kernels = {"fused": True} if impl == "fused" else {"foreach": True}
    adamw = MasterWeightAdamW if master_weights else torch.optim.AdamW
    return adamw(list(params), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay, **kernels)
