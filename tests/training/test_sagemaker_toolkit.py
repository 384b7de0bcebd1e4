"""The real sagemaker-training toolkit (``train`` console script) drives train.sh in a container-shaped layout."""

from __future__ import annotations

import subprocess

import pytest

from .runner import TINY, fields, toolkit_job

pytestmark = pytest.mark.slow


def test_toolkit_runs_train_sh_with_the_step_functions_hyperparameters(tmp_path):
    # Values as JSON strings, exactly as the Step Functions task sends HyperParameters.
    hyperparameters = {
        **TINY,
        "batch_size": "2",
        "num_layers": "3",
        "activation_checkpointing": "true",
        "max_steps": "4",
        "log_interval": "2",
        "checkpoint_interval": "2",
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "model_dir": str(tmp_path / "model"),
    }
    command, child_env = toolkit_job(tmp_path, hyperparameters)
    proc = subprocess.run(command, env=child_env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    config = fields(next(line for line in output.splitlines() if line.startswith("config ")))
    for key, value in hyperparameters.items():
        assert config[key] == value, key
    assert config["world_size"] == "2"
    assert (tmp_path / "checkpoints" / "step_00000004" / "COMPLETE").is_file()
    assert (tmp_path / "model" / "model.pt").is_file()
    # the model artifact holds the Hugging Face folder (training.trainer.export_hf)
    assert {p.name for p in (tmp_path / "model" / "hf").iterdir()} == {
        "README.md", "config.json", "generation_config.json", "model.safetensors"
    }  # fmt: skip
    assert "summary steps=4 " in output
