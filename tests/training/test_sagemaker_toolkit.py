"""The real sagemaker-training toolkit (``train`` console script) drives train.sh in a container-shaped layout."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from training import contract

from .runner import ROOT, TINY, VENV_BIN, env, fields

pytestmark = pytest.mark.slow


def container_code_dir(code: Path) -> None:
    """Lay out /opt/ml/code like the image: train.sh next to a copy of the training/ package."""
    code.mkdir(parents=True)
    shutil.copy2(ROOT / "training" / "train.sh", code / contract.ENTRY_POINT)
    shutil.copytree(
        ROOT / "training",
        code / "training",
        ignore=shutil.ignore_patterns("__pycache__", "Dockerfile", "train.sh"),
    )


def test_toolkit_runs_train_sh_with_the_step_functions_hyperparameters(tmp_path):
    base = tmp_path / "opt_ml"
    config_dir = base / "input" / "config"
    config_dir.mkdir(parents=True)
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
    (config_dir / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config_dir / "resourceconfig.json").write_text(
        json.dumps({"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"})
    )
    (config_dir / "inputdataconfig.json").write_text("{}")
    container_code_dir(base / "code")

    child_env = env()
    child_env.pop("PYTHONPATH")  # train.sh must find its package by itself
    child_env.update(
        SAGEMAKER_BASE_DIR=str(base),
        SAGEMAKER_PROGRAM=contract.ENTRY_POINT,
        SAGEMAKER_SUBMIT_DIRECTORY=str(base / "code"),
        SM_STUDIO_LOCAL_MODE="true",  # skips the toolkit's DNS wait for algo-1
        NPROC_PER_NODE="2",
    )
    proc = subprocess.run(
        [str(VENV_BIN / "train")], env=child_env, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    config = fields(next(line for line in output.splitlines() if line.startswith("config ")))
    for key, value in hyperparameters.items():
        assert config[key] == value, key
    assert config["world_size"] == "2"
    assert (tmp_path / "checkpoints" / "step_00000004" / "COMPLETE").is_file()
    assert (tmp_path / "model" / "model.pt").is_file()
    assert "summary steps=4 " in output
