"""tests/run_folder.py: this run's caches and temporary files in a folder of its own, taken over by its xdist workers
and by every process a test starts; older runs' folders removed, never a running one's."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import run_folder
from tests.conftest import ROOT, RUN_FOLDER


def test_every_cache_and_temporary_folder_of_this_process_is_the_runs(tmp_path):
    assert os.environ[run_folder.MARK].endswith(f":{RUN_FOLDER}")
    for name, sub in run_folder.FOLDERS.items():
        assert os.environ[name] == str(RUN_FOLDER / sub), name
    assert not set(run_folder.UNSET) & set(os.environ)
    assert tempfile.gettempdir() == str(RUN_FOLDER / "tmp") and tmp_path.is_relative_to(RUN_FOLDER)
    from constructs_lib.workflow import request_function

    assert request_function.build_asset().is_relative_to(RUN_FOLDER)  # the request validator's asset folder


def entered(environment: dict[str, str]) -> Path:
    """The run folder ``run_folder.enter`` gives a child process of this one with ``environment``."""
    script = "from tests import run_folder; print(run_folder.enter())"
    done = subprocess.run([sys.executable, "-c", script], env=environment, cwd=ROOT, capture_output=True,
                          text=True, check=True, timeout=60)  # fmt: skip
    return Path(done.stdout.strip())


def test_an_xdist_worker_takes_its_controllers_folder_and_any_other_process_makes_one(tmp_path):
    shell = {k: v for k, v in os.environ.items() if k != run_folder.MARK and not k.startswith("PYTEST_")}
    shell.update(TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    controller = tmp_path / "controller"
    controller.mkdir()
    worker = {**shell, "PYTEST_XDIST_WORKER": "gw0", run_folder.MARK: f"{os.getpid()}:{controller}"}
    assert entered(worker) == controller  # this process is the child's parent: its controller
    made = entered({**worker, run_folder.MARK: f"{os.getppid()}:{controller}"})  # another process's folder
    assert made.parent == tmp_path / f"blackwell-tests-{os.getuid()}" and made.name.startswith("run-")
    again = entered(shell)  # a pytest of its own (no worker), after the first one finished
    assert again != made and again.parent == made.parent
    assert sorted(made.parent.iterdir()) == sorted([made, again])  # nothing else left there


def test_finished_runs_folders_are_removed_but_the_newest_and_a_running_one_never(tmp_path):
    folders = []
    for age, name in enumerate(("run-newest", "run-older", "run-running", "run-oldest")):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".lock").touch()
        os.utime(tmp_path / name / ".lock", (1e9 - age * 100, 1e9 - age * 100))
        folders.append(tmp_path / name)
    (tmp_path / "run-no-lock").mkdir()  # not made by enter: left alone
    running = os.open(tmp_path / "run-running" / ".lock", os.O_RDWR)
    fcntl.flock(running, fcntl.LOCK_EX)
    try:
        assert run_folder.prune(tmp_path, keep=1) == [tmp_path / "run-older", tmp_path / "run-oldest"]
    finally:
        os.close(running)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-newest", "run-no-lock", "run-running"]
