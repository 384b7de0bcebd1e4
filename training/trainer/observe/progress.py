"""Progress a person can read: the loss as the mean over each logging interval (all ranks), elapsed time and an
ETA for ``step N/M`` lines."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


class Progress:
    """Accumulates each step's loss on the device (no host sync per step) and times the run of this process."""

    def __init__(
        self,
        start_step: int,
        max_steps: int,
        world_size: int,
        all_reduce: Callable[[torch.Tensor], Any] = dist.all_reduce,
    ):
        """``all_reduce`` sums a tensor over the ranks in place (the default process group's)."""
        self.start_step, self.max_steps, self.world_size = start_step, max_steps, world_size
        self.all_reduce = all_reduce
        self.started = time.perf_counter()
        self._sum: torch.Tensor | None = None
        self._count = 0
        self.last_mean: float | None = None

    def add(self, loss: torch.Tensor) -> None:
        value = loss.detach().float()
        self._sum = value if self._sum is None else self._sum + value
        self._count += 1

    @property
    def pending(self) -> int:
        """Steps added since the last ``mean_loss``."""
        return self._count

    def mean_loss(self) -> float:
        """Mean loss over every step and rank since the last call (a collective: every rank calls it)."""
        if self._sum is None:
            raise RuntimeError("mean_loss needs at least one step")
        total = self._sum.clone().reshape(1)
        self.all_reduce(total)  # SUM: gloo has no AVG
        self.last_mean = float(total.item()) / (self._count * self.world_size)
        self._sum, self._count = None, 0
        return self.last_mean

    def timing(self, step: int) -> tuple[float, float]:
        """(elapsed seconds of this process's training, estimated seconds left to ``max_steps``)."""
        elapsed = time.perf_counter() - self.started
        done = step - self.start_step
        eta = elapsed / done * (self.max_steps - step) if done > 0 else 0.0
        return elapsed, eta
