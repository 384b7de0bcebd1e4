"""The tuning driver's process handling, with real processes: a trial's whole tree is killed at its timeout, even a
worker in a session of its own (as torchrun starts them), and nothing of it is left afterwards."""

from __future__ import annotations

import os
import sys
import time

from training.tune import runner

# A parent that starts a child in a new session (as torchrun does with its workers), prints both pids and hangs.
HANGING_TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(f"child {child.pid}", flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


GRACE_SECONDS = 120.0
"""The runner's wait for the output pipe's end after its kill, made generous so that no verdict here depends on the
machine's speed: a holder left alive (sleeping 600 s) keeps the pipe open past it, and the run says so in its notes;
a kill that works closes the pipe in well under a second."""


def test_a_hanging_tree_is_killed_at_its_timeout_including_a_worker_in_its_own_session(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "KILL_GRACE_SECONDS", GRACE_SECONDS)
    assert runner.become_subreaper()
    started = time.monotonic()
    finished = runner.run(
        [sys.executable, "-c", HANGING_TREE], env=dict(os.environ), log_path=tmp_path / "trial.log", timeout=3
    )
    assert finished.timed_out and finished.exit_code is None
    assert time.monotonic() - started >= 3  # not before its timeout
    assert finished.notes == []  # the pipe closed: every holder died
    child = int(finished.lines[0].split()[1])
    deadline = time.monotonic() + 60  # a guard: SIGKILLed and reaped by the run already
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
    assert child not in runner.descendants(os.getpid())  # reaped too (not left as a zombie below us)
    assert (tmp_path / "trial.log").read_text().startswith("child ")


def test_a_finished_trial_gives_its_exit_status_lines_and_first_step_time(tmp_path):
    script = "print('config world_size=2'); print('step=1/2 50.0% loss=2.5', flush=True); raise SystemExit(3)"
    finished = runner.run(
        [sys.executable, "-c", script], env=dict(os.environ), log_path=tmp_path / "t.log", timeout=30
    )
    assert (finished.exit_code, finished.timed_out) == (3, False)
    assert finished.lines == ["config world_size=2", "step=1/2 50.0% loss=2.5"]
    assert finished.first_step_seconds is not None and finished.first_step_seconds <= finished.seconds


def test_an_address_space_limit_makes_a_large_allocation_fail_in_the_trial(tmp_path):
    script = "x = bytearray(3 * 10**9)"
    finished = runner.run([sys.executable, "-c", script], env=dict(os.environ), log_path=tmp_path / "t.log",
                          timeout=30, memory_limit_gb=1.0)  # fmt: skip
    assert finished.exit_code == 1 and finished.lines[-1] == "MemoryError"


def test_cli_args_print_booleans_as_the_contract_does():
    assert runner.cli_args({"batch_size": 4, "activation_checkpointing": True}) == [
        "--batch_size", "4", "--activation_checkpointing", "true"
    ]  # fmt: skip


# A parent that leaves an orphan holding its output pipe (a worker whose torchrun already exited), then exits 0.
ORPHAN_HOLDS_THE_PIPE = """
import subprocess, sys, time
code = "import os, time; print(f'orphan {os.getpid()}', flush=True); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
time.sleep(1.0)
print("parent done", flush=True)
"""


def test_an_orphan_holding_the_pipe_is_swept_at_once_and_every_line_reaches_the_open_log(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(runner, "KILL_GRACE_SECONDS", GRACE_SECONDS)
    assert runner.become_subreaper()
    started = time.monotonic()
    finished = runner.run([sys.executable, "-c", ORPHAN_HOLDS_THE_PIPE], env=dict(os.environ),
                          log_path=tmp_path / "t.log", timeout=60)  # fmt: skip
    took = time.monotonic() - started
    assert finished.exit_code == 0 and finished.notes == []  # the reader saw the pipe's end
    assert took < GRACE_SECONDS, took  # not the grace period spent waiting on the orphan's pipe (~2 s here)
    orphan = int(next(line for line in finished.lines if line.startswith("orphan")).split()[1])
    assert not alive(orphan) and orphan not in runner.descendants(os.getpid())
    assert sorted((tmp_path / "t.log").read_text().splitlines()) == sorted(finished.lines)
