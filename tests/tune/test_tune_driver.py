"""The tuning driver's settings (what the workflow sends, parsed back), each trial's settings and environment, and
the in-trial rule that stops a trial once its step time is stable (SIGTERM to itself, the trainer's stop path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.runner import ROOT, env
from training.contract import container, settings_parse, settings_table
from training.tune import driver, stability

ARGS = ["--tune_trials", "batch_size=4,activation_checkpointing=true;batch_size=8,probe=true,timeout_seconds=60", "--precision", "bf16",
        "--max_steps", "500", "--tune_cv_target", "0.05", "--tune-window-steps", "6", "--deterministic", "true"]  # fmt: skip


def test_the_arguments_split_into_tune_options_base_settings_and_trials():
    job = driver.parse_args(ARGS)
    assert job.trials == [
        {"batch_size": 4, "activation_checkpointing": "full"},  # the trainer's name for true
        {"batch_size": 8, "probe": True, "timeout_seconds": 60},  # its own limit, in place of the job's
    ]
    assert job.options["tune_cv_target"] == 0.05 and job.options["tune_window_steps"] == 6
    assert job.options["tune_trial_timeout_seconds"] == 900  # the contract's default
    assert job.base["precision"] == "bf16" and job.base["deterministic"] == "true"
    assert "tune_trials" not in job.base and job.base["checkpoint_dir"].endswith(
        "checkpoints"
    )  # local default


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--tune_trials", "learning_rate=1"], "tune_trials"),
        (["--tune_trials", "batch_size=2", "--tune_cv_target", "2"], "tune_cv_target"),
        (["--tune_trials", "batch_size=2", "--precision", "fp64"], "precision"),
        (["--tune_trials", "batch_size=2", "stray"], "stray"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(args, field):
    with pytest.raises(settings_table.ContractError) as refused:
        driver.parse_args(args)
    assert refused.value.field == field


def test_a_trial_runs_the_base_with_its_own_settings_and_the_trials_mechanics(tmp_path, monkeypatch):
    job = driver.parse_args(ARGS)
    settings = driver.trial_settings(job, job.trials[1], tmp_path, steps=33, warmup=3, save=True)
    assert settings["batch_size"] == "8" and settings["precision"] == "bf16"
    assert "probe" not in settings and "timeout_seconds" not in settings
    assert (settings["max_steps"], settings["throughput_warmup_steps"], settings["log_interval"]) == (
        "33",
        "3",
        "1",
    )
    assert settings["checkpoint_interval"] == "33"  # its one save, unless it stops early (and saves then)
    assert settings["checkpoint_dir"] == str(tmp_path / "checkpoints")
    assert (
        driver.trial_settings(job, {}, tmp_path, steps=10, warmup=3, save=False)["checkpoint_interval"] == "0"
    )
    monkeypatch.setenv(
        container.MLFLOW_TRACKING_URI_ENV, "arn:aws:sagemaker:us-west-2:1:mlflow-tracking-server/x"
    )
    monkeypatch.setenv("MASTER_PORT", "29500")
    trial_env = driver.trial_environment(job, 3, tmp_path, 0.05)
    assert container.MLFLOW_TRACKING_URI_ENV not in trial_env  # a trial is not a tracked run
    # a trial's failure reason and refusal are its own, not the tuning job's
    assert trial_env["SM_OUTPUT_DIR"] == str(tmp_path / "output")
    assert trial_env["TRAINER_REFUSAL_FILE"] == str(tmp_path / "refusal")
    assert (trial_env["TRAINER_MODULE"], trial_env["MASTER_PORT"]) == ("training.tune.trial", "29504")
    assert (trial_env[stability.CV_ENV], trial_env[stability.WINDOW_ENV]) == ("0.05", "6")
    assert driver.train_sh() == ROOT / "training" / "train.sh"


def test_a_trial_past_its_deadline_is_not_started(tmp_path):
    job = driver.parse_args([*ARGS, "--tune_deadline_seconds", "1"])
    job.started -= 100
    result = driver.run_trial(job, 1, job.trials[0], tmp_path)
    assert result.status == "not-run" and result.error.startswith("not started:")


STOPPER = """
import signal, sys
from training.contract import metric_lines
from training.tune.stability import Stability
from training.tune.trial import StopWhenStable
received = []
signal.signal(signal.SIGTERM, lambda *_: received.append(True))
lines = []
watch = StopWhenStable(Stability(window=3, cv_target=0.02), lines.append)
for step, seconds in enumerate([2.0, 1.0, 1.3, 1.0, 1.001, 1.002, 1.0], start=1):
    watch(metric_lines.format_step_line(step, {"loss": 1.0, "step_time": seconds}, 50))
    if received:
        break
print(step, len(received), lines[-1])
"""


def test_a_trial_asks_itself_to_stop_once_its_step_time_is_stable():
    proc = subprocess.run([sys.executable, "-c", STOPPER], env=env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    step, signals, last = proc.stdout.split(" ", 2)
    assert (step, signals) == ("6", "1")  # steps 4-6 vary by 0.1%; steps 2-4 and 3-5 by more than 2%
    assert last.startswith("tune: step time stable at step 6 (cv 0.10% over the last 3 timed steps")


def test_the_trial_entry_point_exists_where_train_sh_starts_it():
    text = (ROOT / "training" / "train.sh").read_text()
    assert "training.tune.trial" in text and 'exec "$python" -m training.tune' in text
    assert Path(driver.__file__).with_name("trial.py").is_file()


@pytest.mark.slow
def test_the_overhead_benchmark_prints_each_phase(capsys):
    from training.measure import tune_overhead

    assert tune_overhead.main(["--repeats", "1", "--nproc", "1"]) == 0
    out = capsys.readouterr().out
    for phase in (
        "settings checked",
        "workers up",
        "first step",
        "after the last step",
        "start to first step",
    ):
        line = next(line for line in out.splitlines() if line.startswith(phase))
        assert float(line[len(phase) :].split()[0]) > 0


def test_a_base_that_starts_from_a_model_folder_takes_its_shape_for_the_trials_plans(tmp_path):
    from tests.training.hf_models import tiny_config
    from training.request import hf_config
    from training.tune import report
    from training.tune.outcome import TrialResult

    tiny_config(tied=True).save_pretrained(tmp_path)  # config.json only: the shape is all the driver reads
    job = driver.parse_args(
        ["--tune_trials", "batch_size=2", "--init_from", str(tmp_path), "--seq_length", "32"]
    )
    assert job.architecture == hf_config.architecture(hf_config.read_local(tmp_path), str(tmp_path))
    where = report.Where("ml.p6-b200.48xlarge", 1, "cpu", None, 2, "local", None, None, None, "now", "h")
    row = report.make_row(TrialResult(1, {"batch_size": 2}, status="oom"), job.base, where, job.architecture)
    planned = settings_parse.model_shape(settings_parse.parse_hyperparameters({}, job.architecture))
    assert (planned.num_layers, planned.hidden_size, planned.num_kv_heads, planned.tie_embeddings) == (
        2,
        64,
        2,
        True,
    )
    assert row.predicted_tensors_gb < 0.1  # the tiny model's plan, not the 1b preset's
