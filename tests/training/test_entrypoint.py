"""training/entrypoint.sh, the container's PID 1: SageMaker's SIGTERM reaches the trainer through the real toolkit.

The chain is the container's: entrypoint.sh -> sagemaker-training ``train`` -> ``/bin/sh -c ./train.sh`` -> torchrun
-> 2 workers. Only the entry point is signalled, as SageMaker signals only PID 1; the toolkit and torchrun would
not pass it on.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.training.runner import ROOT, TINY, step_lines, toolkit_job
from training.trainer.checkpoint.folder import complete_checkpoints

pytestmark = pytest.mark.slow


def test_sigterm_to_the_entrypoint_checkpoints_and_stops_the_job(tmp_path):
    hyperparameters = {
        **TINY,
        "max_steps": "100000",
        "checkpoint_interval": "0",
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "model_dir": str(tmp_path / "model"),
    }
    command, child_env = toolkit_job(tmp_path, hyperparameters)
    child_env["TRAINER_PID_DIR"] = str(tmp_path / "pids")
    proc = subprocess.Popen(
        [str(ROOT / "training" / "entrypoint.sh"), *command],
        env=child_env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if len(step_lines("".join(seen))) >= 2:
                assert len(os.listdir(tmp_path / "pids")) == 2  # both workers registered
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    output = "".join(seen) + rest
    assert proc.returncode == 0, output
    assert "entrypoint: SIGTERM received" in output
    assert "stopping at step" in output, output
    stopped_at = max(step_lines(output))
    assert [step for step, _ in complete_checkpoints(tmp_path / "checkpoints")] == [stopped_at]
    assert not Path(tmp_path / "model" / "model.pt").exists()
    assert os.listdir(tmp_path / "pids") == []  # workers removed their PID files on exit


def test_entrypoint_passes_the_child_exit_status_through_except_for_a_refusal(tmp_path):
    script = ROOT / "training" / "entrypoint.sh"
    refused = tmp_path / "refused"
    env = {**os.environ, "TRAINER_PID_DIR": str(tmp_path / "pids"), "TRAINER_REFUSAL_FILE": str(refused)}
    assert subprocess.run([str(script), "sh", "-c", "exit 7"], env=env).returncode == 7
    assert subprocess.run([str(script), "true"], env=env).returncode == 0
    # the toolkit exits 1 for any failed train.sh; a refusal the trainer recorded makes the container's status 2
    refuse = 'echo reason > "$TRAINER_REFUSAL_FILE"; exit 1'
    assert subprocess.run([str(script), "sh", "-c", refuse], env=env).returncode == 2
    refused.write_text("an earlier container's\n")  # removed at start: only this run's refusal counts
    assert subprocess.run([str(script), "sh", "-c", "exit 1"], env=env).returncode == 1
