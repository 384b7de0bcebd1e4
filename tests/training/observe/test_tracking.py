"""TensorBoard and MLflow from real CPU trainer runs, read back: event files through TensorBoard's own reader,
MLflow through a file-based tracking store; plus where the event files go and an unreachable MLflow server."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.training.runner import ROOT, TINY, env, fields, run_single, step_lines, torchrun_cmd
from training.contract import container
from training.trainer.observe import tensorboard
from training.trainer.observe.mlflow_log import MlflowLog


def _mlflow_env(store: Path, run_name: str) -> dict[str, str]:
    return {
        container.MLFLOW_TRACKING_URI_ENV: store.as_uri(),
        container.MLFLOW_EXPERIMENT_ENV: "my-workflow",
        container.MLFLOW_RUN_NAME_ENV: run_name,
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 keeps the file store for tests like this one behind a flag
    }


def _run(settings: dict[str, str], extra_env: dict[str, str], nproc: int = 2) -> str:
    child = {**env(), **extra_env}
    proc = subprocess.run(
        torchrun_cmd(settings, nproc), env=child, cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output


def _scalars(directory: Path, tag: str) -> dict[int, float]:
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {event.step: event.value for event in acc.Scalars(tag)}


def _printed(output: str, field: str) -> dict[int, float]:
    return {
        step: float(fields(line)[field]) for step, line in step_lines(output).items() if field in fields(line)
    }


@pytest.mark.slow
def test_a_two_process_run_and_its_resume_write_one_tensorboard_log_and_one_mlflow_run(tmp_path, monkeypatch):
    board, store = tmp_path / "tb", tmp_path / "mlruns"
    settings = {
        **TINY,
        "log_interval": "2",
        "max_steps": "6",
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "model_dir": str(tmp_path / "model"),
        "tensorboard_dir": str(board),
    }
    first = _run(settings, _mlflow_env(store, "exec-1"))
    second = _run(
        {**settings, "max_steps": "10", "model_dir": str(tmp_path / "model2")}, _mlflow_env(store, "exec-1")
    )
    assert "MLflow: continuing run exec-1" in second

    # TensorBoard: rank 0 only (one event file per launch), every printed step, values as printed
    assert len(list(board.glob("events.out.tfevents.*"))) == 2
    printed = {**_printed(first, "loss"), **_printed(second, "loss")}
    assert sorted(printed) == [2, 4, 6, 8, 10]
    written = _scalars(board, "train/loss")
    assert sorted(written) == sorted(printed)
    for step, value in printed.items():
        assert math.isclose(written[step], value, rel_tol=1e-5), step
    assert sorted(_scalars(board, "train/lr")) == [2, 4, 6, 8, 10]
    assert sorted(_scalars(board, "train/peak_mem_gb")) == [2, 4, 6, 8, 10]
    assert 10 in _scalars(board, "final/tokens_per_sec")

    # MLflow: one experiment named after the workflow, one run named after the execution, continued by the resume
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.get_experiment_by_name("my-workflow")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_name for run in runs] == ["exec-1"]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["precision"] == "fp32"
    assert run.data.params["max_steps"] == "6"  # a parameter keeps its first value in an MLflow run
    assert run.data.params["world_size"] == "2"
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
    assert history.keys() == printed.keys()
    for step, value in printed.items():
        assert math.isclose(history[step], value, rel_tol=1e-5), step
    assert {m.step for m in client.get_metric_history(run.info.run_id, "final/final_loss")} == {6, 10}


def test_an_unreachable_mlflow_server_prints_one_warning_and_training_finishes(tmp_path, monkeypatch):
    settings = {
        **TINY,
        "max_steps": "3",
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "model_dir": str(tmp_path / "model"),
    }
    monkeypatch.setenv(
        container.MLFLOW_TRACKING_URI_ENV, "http://127.0.0.1:9"
    )  # discard port: refused at once
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    code, output = run_single(settings)
    assert code == 0, output
    warnings = [line for line in output.splitlines() if "MLflow" in line]
    assert len(warnings) == 1, output
    assert warnings[0].startswith(
        "warning: MLflow logging turned off for this run (start failed on http://127.0.0.1:9"
    )
    assert "training continues" in warnings[0]
    assert (tmp_path / "model" / "model.pt").is_file()
    assert sorted(step_lines(output)) == [1, 2, 3]


def test_event_files_go_where_asked_else_to_the_jobs_tensorboard_local_path(tmp_path):
    missing = tmp_path / "no-such-config.json"
    assert tensorboard.log_dir(None, str(missing)) is None
    assert tensorboard.log_dir(str(tmp_path / "mine"), str(missing)) == str(tmp_path / "mine")
    config = tmp_path / "tensorboardoutputconfig.json"
    config.write_text(json.dumps({"LocalPath": "/opt/ml/output/tb", "S3OutputPath": "s3://b/p"}))
    assert tensorboard.log_dir(None, str(config)) == "/opt/ml/output/tb"
    config.write_text(json.dumps({"S3OutputPath": "s3://b/p"}))
    assert tensorboard.log_dir(None, str(config)) == container.TENSORBOARD_LOCAL_PATH
    assert tensorboard.log_dir(str(tmp_path / "mine"), str(config)) == str(tmp_path / "mine")


def test_mlflow_is_off_without_a_tracking_uri_and_names_experiment_and_run_from_the_environment():
    said: list[str] = []
    assert MlflowLog.from_environment(said.append, {}) is None
    log = MlflowLog.from_environment(
        said.append,
        {container.MLFLOW_TRACKING_URI_ENV: "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/t",
         container.MLFLOW_EXPERIMENT_ENV: "wf", container.MLFLOW_RUN_NAME_ENV: "exec-9"},
    )  # fmt: skip
    assert log is not None
    assert (log.experiment, log.run_name, log.active) == ("wf", "exec-9", False)
    log.metrics(1, {"train/loss": 1.0})  # not started: nothing sent, nothing said
    assert said == []


def test_a_sagemaker_mlflow_arn_goes_through_the_plugin_and_without_credentials_only_warns(tmp_path):
    """The ARN as tracking URI reaches the sagemaker-mlflow plugin (which signs for the process-wide URI) and
    its endpoint; here, with no AWS credentials, that first request fails and MLflow is turned off in one line."""
    code = (
        "from training.trainer.observe.mlflow_log import MlflowLog\n"
        "log = MlflowLog('arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/team', 'wf', 'e-1', print)\n"
        "log.start({'precision': 'bf16'}); log.metrics(1, {'train/loss': 1.0}); log.close()\n"
        "print('active', log.active)\n"
    )
    child = {k: v for k, v in env().items() if not k.startswith("AWS_") and not k.startswith("MLFLOW_")}
    child.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_DEFAULT_REGION="us-west-2",
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=child, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "active False"
    (warning,) = lines[:-1]
    assert warning.startswith(
        "warning: MLflow logging turned off for this run (start failed on arn:aws:sagemaker:"
    )
    assert "https://us-west-2.experiments.sagemaker.aws/api/2.0/mlflow/" in warning  # the plugin's endpoint
