"""The guard's parts in one process: the first non-finite step kept on the device and named when read, the gradient
norm ignored under a gradient scaler, the next batch read ahead and kept for the step that uses it, the line a stop
ends in. (Both stops through ``train.sh`` with 2 processes: tests/training/test_stops.py.)"""

from __future__ import annotations

import numpy as np
import torch

from training.trainer import guard
from training.trainer.data import token_files


class _NoData:
    def check_next(self) -> None:
        return None


def watch(check_grad_norm: bool = True, start: int = 0) -> guard.Guard:
    return guard.Guard(_NoData(), torch.device("cpu"), start, check_grad_norm=check_grad_norm, rank=1)


def step(g: guard.Guard, loss: float, norm: float = 1.0) -> None:
    g.step_done(torch.tensor(loss), torch.tensor(norm))


def test_the_first_non_finite_step_is_kept_and_named_when_read():
    g = watch(start=10)
    step(g, 2.5)
    assert g.problem(read_values=True, next_batch=True) is None
    step(g, float("nan"))  # step 12
    step(g, 2.0)
    step(g, float("inf"))
    found = g.problem(read_values=True, next_batch=False)
    assert found == guard.Problem(guard.VALUES, "non-finite training: step 12 gave loss nan (rank 1)")
    assert g.problem(read_values=False, next_batch=True) is None  # not read: nothing said (no device sync)


def test_a_non_finite_gradient_norm_counts_unless_a_gradient_scaler_skips_such_steps():
    g = watch()
    step(g, 2.0, float("inf"))
    assert g.problem(read_values=True, next_batch=False) == guard.Problem(
        guard.VALUES, "non-finite training: step 1 gave gradient norm inf (rank 1)"
    )
    scaled = watch(check_grad_norm=False)
    step(scaled, 2.0, float("inf"))
    assert scaled.problem(read_values=True, next_batch=False) is None


def test_the_next_batch_is_read_ahead_kept_for_its_step_and_a_bad_id_named_by_file_and_position(tmp_path):
    path = tmp_path / "tokens.bin"
    tokens = np.arange(33 * 8, dtype=np.uint16) % 200
    tokens.tofile(path)
    source = token_files.TokenFiles([path], "uint16", 256, 32, 2, 0, 0, 1)
    reference = token_files.TokenFiles([path], "uint16", 256, 32, 2, 0, 0, 1)
    assert source.check_next() is None
    assert source.position == 0
    for _ in range(2):
        assert all(
            torch.equal(a, b) for a, b in zip(source.next_batch(), reference.next_batch(), strict=True)
        )
    file, begin = source._where(2 * 2)  # the first window of the batch at position 2
    tokens[begin + 5] = 300
    tokens.tofile(path)
    bad = token_files.TokenFiles([path], "uint16", 256, 32, 2, 0, 0, 1)
    bad.load_state_dict(source.state_dict())
    g = guard.Guard(bad, torch.device("cpu"), 2, check_grad_norm=True, rank=0)
    problem = g.problem(read_values=True, next_batch=True)
    assert problem == guard.Problem(
        guard.DATA,
        f"vocab_size: must be above every token id in the data; {path} holds id 300 (token {begin + 5}), got 256",
    )
    assert guard.failure_message([problem], 2, tmp_path / "step_00000002") == (
        f"{problem.text}, in the batch of step 3: the check before training reads a sample of large data; stopped "
        f"after step 2: the newest checkpoint, {tmp_path / 'step_00000002'}, is kept; fix or remove that file, then "
        "run again to continue from there"
    )


def test_a_non_finite_state_wins_over_a_bad_next_batch_in_the_line():
    problems = [
        guard.Problem(guard.DATA, "vocab_size: x"),
        guard.Problem(guard.VALUES, "non-finite training: y"),
    ]
    assert guard.failure_message(problems, 7, None) == (
        "non-finite training: y; stopped before saving anything from that step on: no checkpoint had been written; "
        "lower learning_rate (or raise lr_warmup_steps), or train in another precision"
    )
