"""The trainer's progress read from lines made by the contract's own formatters."""

from __future__ import annotations

import pytest

from constructs_lib.cli.progress import Progress, format_duration
from training.contract.metric_lines import format_config_line, format_step_line, format_summary_line


def test_progress_follows_config_step_and_summary_lines():
    progress = Progress()
    assert progress.describe() == "waiting for the trainer's first step line"
    assert progress.feed("Invoking script with the following command: ./train.sh") is False
    assert progress.feed(format_config_line({"max_steps": 200, "precision": "mxfp8", "batch_size": 16}))
    assert progress.max_steps == 200
    line = format_step_line(
        50, {"loss": 2.5, "lr": 3e-4, "tokens_per_sec": 51234.5, "mfu": 0.412, "step_time": 0.5}
    )
    assert progress.feed(f"[rank0]: {line}")  # a launcher prefix does not hide it
    assert (progress.step, progress.fraction, progress.eta_seconds) == (50, 0.25, 75.0)
    assert progress.describe() == "step 50/200 loss 2.5 tokens/s 51,234 MFU 41.2% ETA 0:01:15"
    assert progress.feed(format_summary_line({"steps": 200, "final_loss": 1.75, "train_seconds": 100.0}))
    assert progress.step == 200 and progress.summary == {
        "steps": 200,
        "final_loss": 1.75,
        "train_seconds": 100,
    }
    assert progress.eta_seconds is None or progress.eta_seconds == 0.0


def test_a_low_precision_run_shows_its_bf16_equivalent_mfu_beside_its_own():
    progress = Progress()
    progress.feed(format_config_line({"max_steps": 100, "precision": "fp8"}))
    progress.feed(format_step_line(10, {"loss": 2.5, "mfu": 0.21, "mfu_bf16": 0.42}, max_steps=100))
    assert progress.describe() == "step 10/100 loss 2.5 MFU 21.0% (bf16-equivalent 42.0%)"


def test_max_steps_from_the_job_hyperparameters_until_the_trainer_says_it():
    progress = Progress()
    progress.expect({"precision": "bf16"})
    assert progress.max_steps == 1000  # the contract's default
    progress = Progress()
    progress.expect({"max_steps": "300", "checkpoint_dir": "/opt/ml/checkpoints"})
    assert progress.max_steps == 300
    progress.feed(format_config_line({"max_steps": 400}))
    progress.expect({"max_steps": "300"})
    assert progress.max_steps == 400


def test_unknown_hyperparameters_still_give_max_steps():
    progress = Progress()
    progress.expect({"max_steps": "70", "some_future_setting": "x"})
    assert progress.max_steps == 70


@pytest.mark.parametrize(
    "line",
    ["steps=5 loss=1", "configure max_steps=5", "summary", "stepping=3", "loss=2.0 step_time=1"],
)
def test_other_lines_are_not_progress(line):
    progress = Progress()
    assert progress.feed(line) is False
    assert progress.step is None and progress.max_steps is None


def test_format_duration():
    assert format_duration(None) == "-"
    assert format_duration(0) == "0:00:00"
    assert format_duration(3723.4) == "1:02:03"
    assert format_duration(90061) == "25:01:01"
