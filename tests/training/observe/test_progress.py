"""Progress: the logged loss is the mean over the interval and the ranks; elapsed time and ETA."""

from __future__ import annotations

import pytest
import torch

from training.trainer.observe import progress


def test_loss_is_the_interval_mean_over_steps_and_ranks_and_eta_follows_the_pace(monkeypatch):
    clock = iter([100.0, 110.0])  # created, then asked at step 15
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    # two ranks: the peer's losses are 10 higher, so the all-reduce adds 10 per step to the sum
    meter = progress.Progress(10, 30, 2, all_reduce=lambda t: t.mul_(2).add_(10 * 3))
    for value in (1.0, 2.0, 3.0):
        meter.add(torch.tensor(value, requires_grad=True))
    assert meter.pending == 3
    assert meter.mean_loss() == pytest.approx((1 + 2 + 3 + 11 + 12 + 13) / 6)
    assert meter.pending == 0 and meter.last_mean == pytest.approx(7.0)
    assert meter.timing(15) == (10.0, 30.0)  # 5 steps in 10 s, 15 to go
    with pytest.raises(RuntimeError):
        meter.mean_loss()
