"""The exit-status contract's parts: who prints a refusal, what a refusing worker records for the launcher and for
torchrun, how ``training.trainer.distributed.launch`` tells a refusal from a failure, the reason of a failure during training,
and a refusal under a bare ``torchrun`` (whose own exit status is 1 for any failed worker)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from tests.training.runner import PYTHON, TINY, cli_args, env, torchrun_cmd
from training.trainer import refusal
from training.trainer.__main__ import main
from training.trainer.distributed import launch


@pytest.fixture
def marker(monkeypatch, tmp_path) -> Path:
    path = tmp_path / "refused"
    monkeypatch.setenv(refusal.MARKER_ENV, str(path))
    return path


def test_the_first_worker_speaks_a_silent_one_waits_for_it_and_speaks_if_still_running(
    monkeypatch, marker, capsys
):
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert refusal.refuse("batch_size: no") == 2
    assert capsys.readouterr().err == "error: batch_size: no\n"
    assert refusal.refused() == "batch_size: no"
    marker.unlink()
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(refusal, "QUIET_WAIT_SECONDS", 0.01)  # torchrun would have stopped it by now
    assert refusal.refuse("batch_size: no") == 2
    assert capsys.readouterr().err == "error: batch_size: no\n"
    assert marker.read_text() == "batch_size: no\n"


def test_torchrun_reports_the_reason_a_worker_records_in_its_error_file(monkeypatch, tmp_path):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    refusal.record("invalid setting dataset: x.bin has 3 bytes")
    failure = ProcessFailure(local_rank=0, pid=123, exitcode=2, error_file=str(error_file))  # torch's reader
    report = ChildFailedError("training.trainer", {0: failure}).format_msg()
    assert "traceback : invalid setting dataset: x.bin has 3 bytes" in report


class _StoppedByTorchrun(BaseException):
    """Stands for the SIGTERM torchrun sends a worker still running once another has failed."""


def test_torchruns_root_cause_is_the_speaking_worker_even_when_a_silent_one_reached_the_refusal_first(
    monkeypatch, tmp_path
):
    """torchrun's root cause is the failure with the earliest timestamp (ProcessFailure reads it from the worker's
    error file, whole seconds; a worker without one gets the time torchrun saw it end). A silent worker that
    reached the refusal a second before the speaking one, and was stopped by torchrun in its wait (exit -15), must
    not become the root cause, whichever worker is faster."""
    errors = {rank: tmp_path / f"error-{rank}.json" for rank in (0, 1)}
    monkeypatch.delenv(refusal.MARKER_ENV, raising=False)

    def stopped(_seconds: float) -> None:
        raise _StoppedByTorchrun

    monkeypatch.setattr(refusal.time, "sleep", stopped)
    for rank, now in ((1, 1000.0), (0, 1001.0)):  # the silent worker first, in an earlier second
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(errors[rank]))
        monkeypatch.setattr(refusal.time, "time", lambda now=now: now)
        try:
            refusal.refuse("vocab_size: no")
        except _StoppedByTorchrun:
            assert rank == 1
    monkeypatch.undo()
    failures = {
        0: ProcessFailure(local_rank=0, pid=100, exitcode=2, error_file=str(errors[0])),
        1: ProcessFailure(local_rank=1, pid=101, exitcode=-15, error_file=str(errors[1])),
    }
    rank, root = ChildFailedError("training.trainer", failures).get_first_failure()
    assert (rank, root.exitcode) == (0, 2) and root.message["message"] == "vocab_size: no"


def failed(*codes: int) -> ChildFailedError:
    failures = {rank: ProcessFailure(rank, 100 + rank, code, "<N/A>") for rank, code in enumerate(codes)}
    return ChildFailedError("training.trainer", failures)


@pytest.mark.parametrize(
    ("codes", "recorded", "refused"),
    [
        ((2, -15), True, True),  # one refused, torchrun stopped the other
        ((-9, 2), True, True),
        ((2, 2), True, True),
        ((2, -15), False, False),  # exit 2 without a recorded refusal (e.g. argparse in another program)
        ((1, -15), True, False),  # a crash
        ((2, 1), True, False),
        ((-15, -15), True, False),
    ],
)
def test_the_launcher_calls_a_failed_run_a_refusal_only_when_recorded_and_every_status_agrees(
    marker, codes, recorded, refused
):
    if recorded:
        marker.write_text("reason\n")
    assert launch.is_refusal(failed(*codes)) is refused


def test_a_failure_during_training_is_raised_with_its_reason_as_the_jobs(monkeypatch, tmp_path):
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path / "model"))
    monkeypatch.setenv("SM_OUTPUT_DIR", str(tmp_path / "output"))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(
        "training.trainer.distributed.parallel.init_distributed",
        lambda replicate=1: SimpleNamespace(rank=1, local_rank=1, is_main=False),
    )

    def crash(cfg, env):
        raise RuntimeError("gloo: connection closed by peer\nmore detail")

    monkeypatch.setattr("training.trainer.loop.run", crash)
    args = cli_args({**TINY, "checkpoint_dir": str(tmp_path / "c"), "model_dir": str(tmp_path / "m")})
    with pytest.raises(RuntimeError):  # Python prints its traceback and exits 1
        main(args)
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure == "training failed on rank 1: RuntimeError: gloo: connection closed by peer\n"


@pytest.mark.slow
def test_the_launcher_keeps_torchruns_report_and_exit_1_for_a_failure(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import os, sys\nsys.exit(1 if os.environ['RANK'] == '1' else 0)\n")
    proc = subprocess.run(
        [PYTHON, "-m", "training.trainer.distributed.launch", "--standalone", "--nproc-per-node=2", str(script)],
        env=env(), cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "crash.py FAILED" in proc.stderr and "exitcode  : 1" in proc.stderr
    assert "Traceback" not in proc.stderr  # the block, not the traceback through torchrun's own code


@pytest.mark.slow
def test_a_refusal_under_a_bare_torchrun_is_one_line_and_torchruns_report_names_it(tmp_path):
    """torchrun exits 1 for any failed worker (its ChildFailedError; docs/exit-status.md): the workers' part of the
    contract is one line, exit 2, nothing created, and the reason in torchrun's own report."""
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "train.bin"
    tokens = np.arange(5000, dtype=np.uint16) % 250
    tokens[4000] = 300
    tokens.tofile(path)
    settings = {**TINY, "dataset": "channel", "data_dir": str(tmp_path / "data"),
                "checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model")}  # fmt: skip
    proc = subprocess.run(
        torchrun_cmd(settings, 2), env=env(), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    output = proc.stdout + proc.stderr
    reason = (
        f"invalid setting vocab_size: must be above every token id in the data; {path} holds id 300 (token 4000), "
        "got 256"
    )
    assert sorted(os.listdir(tmp_path)) == ["data"]  # nothing created
    assert path.read_bytes() == tokens.tobytes()  # nothing lost
    assert proc.returncode == 1  # torchrun's own status (torch/distributed/run.py: ChildFailedError)
    root_cause = output.split("Root Cause (first observed failure):")[1]
    assert "exitcode  : 2 " in root_cause and f"traceback : {reason}" in root_cause
    assert output.count("Traceback (most recent call last)") == 1  # torchrun's own; no worker's
    errors = [line for line in output.splitlines() if "error:" in line]
    assert errors == [f"error: {reason}"]  # not one per rank
    # the silent worker ended by torchrun's SIGTERM, not by its SIGKILL after the close timeout
    assert launch.KILLED_RECORD not in output
