"""The real sagemaker-training toolkit (``train`` console script) drives train.sh in a container-shaped layout;
refusals go through the container's entry point (entrypoint.sh), whose exit status is the contract's."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.training.runner import TINY, container_command, fields, toolkit_job
from training.contract import container
from training.trainer.checkpoint import names

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
    assert config["world_size"] == "2" and config["settings"] == str(tmp_path / "model" / "settings.json")
    settings = json.loads((tmp_path / "model" / "settings.json").read_text())  # every setting, the line a few
    for key, value in hyperparameters.items():  # the mode "true" spells (full)
        assert str(settings[key]).lower() == ("full" if key == "activation_checkpointing" else value), key
        if key in config:
            assert config[key] == str(settings[key]).lower(), key
    assert (tmp_path / "checkpoints" / "step_00000004" / "COMPLETE").is_file()
    assert (tmp_path / "model" / "model.pt").is_file()
    # the model artifact holds the Hugging Face folder (training.trainer.checkpoint.export_hf)
    assert {p.name for p in (tmp_path / "model" / "hf").iterdir()} == {
        "README.md", "config.json", "generation_config.json", "model.safetensors"
    }  # fmt: skip
    assert "summary steps=4 " in output


def test_a_start_up_refusal_becomes_the_jobs_failure_reason(reference, tmp_path):
    """The issue's case: resume_from an earlier run of another model shape. train.sh's check refuses it before
    torchrun; the trainer's line, not the toolkit's bare exit code, is what SageMaker reads as FailureReason."""
    channel = tmp_path / "opt_ml" / "input" / "data" / container.RESUME_CHANNEL
    shutil.copytree(reference[0] / "ckpt_ref" / names.step_dir_name(12), channel)
    hyperparameters = {**TINY, "num_layers": "3", "max_steps": "20", "checkpoint_dir": str(tmp_path / "ckpt"),
                       "model_dir": str(tmp_path / "model")}  # fmt: skip
    command, child_env = toolkit_job(tmp_path, hyperparameters)
    (tmp_path / "opt_ml" / "input" / "config" / "inputdataconfig.json").write_text(
        json.dumps({container.RESUME_CHANNEL: {"TrainingInputMode": "File"}})
    )
    proc = subprocess.run(
        container_command(command), env=child_env, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output  # the toolkit itself exits 1 ("Encountered exit_code 1")
    assert "ExitCode 2" in output  # train.sh's status, as the toolkit reports it
    reason = (
        f"invalid setting resume_from: {channel} holds a model of shape (num_layers=2, hidden_size=64, num_heads=4, "
        "ffn_hidden_size=128, vocab_size=256), but this run's shape is (num_layers=3, hidden_size=64, num_heads=4, "
        "ffn_hidden_size=128, vocab_size=256); continue a run of this model shape, or give this run the earlier "
        "run's model settings"
    )
    assert (tmp_path / "opt_ml" / "output" / "failure").read_text() == reason + "\n"
    assert [line for line in output.splitlines() if "error:" in line] == [f"error: {reason}"]
    assert "Failure file exists. Skipping creation" in output  # the toolkit kept the trainer's reason
    assert "train.sh: torchrun" not in output  # refused before any process group


def test_on_unusable_checkpoints_fail_exits_before_step_1_with_the_line_as_the_failure_reason(
    reference, tmp_path
):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0] / "ckpt_ref", ckpt)
    (ckpt / "step_00000012" / "__0_0.distcp").unlink()
    marker = ckpt / "step_00000006" / names.MARKER
    marker.write_text(marker.read_text()[:-10])
    with pytest.raises(json.JSONDecodeError) as unreadable:
        json.loads(marker.read_text())
    # a sound checkpoint an earlier launch set aside: skipped without a new check, named since nothing loads
    shutil.copytree(ckpt / "step_00000012", ckpt / "step_00000003")
    (ckpt / "step_00000003.unusable").write_text(json.dumps({"reason": "load failed on rank 1: OSError: x"}))
    before = {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    hyperparameters = {**TINY, "max_steps": "20", "on_unusable_checkpoints": "fail", "checkpoint_dir": str(ckpt),
                       "model_dir": str(tmp_path / "model")}  # fmt: skip
    command, child_env = toolkit_job(tmp_path, hyperparameters)
    proc = subprocess.run(
        container_command(command), env=child_env, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "ExitCode 2" in output and "ChildFailedError" not in output
    reason = (tmp_path / "opt_ml" / "output" / "failure").read_text()
    assert reason == (
        f"on_unusable_checkpoints=fail: no usable checkpoint in {ckpt}, 3 skipped, not training: step_00000012 "
        "(__0_0.distcp is missing; set aside, left as it is: step_00000012.unusable says why); step_00000006 "
        f"(unreadable COMPLETE marker (JSONDecodeError: {unreadable.value}); set aside, left as it is: "
        "step_00000006.unusable says why); step_00000003 (set aside earlier: load failed on rank 1: OSError: x)\n"
    )
    assert len(reason.splitlines()) == 1
    assert [line for line in output.splitlines() if "error:" in line] == [f"error: {reason.strip()}"]
    assert "train.sh: torchrun" in output and "step=1/" not in output  # refused in the trainer, before step 1
    after = {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    assert {key: after.get(key) for key in before} == before  # nothing moved, changed or deleted
    assert sorted(str(key) for key in set(after) - set(before)) == [
        "step_00000006.unusable",
        "step_00000012.unusable",
    ]  # the records of the two set aside now
    assert not (tmp_path / "model").exists() or not any((tmp_path / "model").iterdir())
