"""The trainer chooses its CPU threads by itself (``training.trainer.distributed.cpu_threads``): as the environment
sets them when it does, else no more than the CPUs it may use, shared by the node's processes and left idle by the
load; and a CPU run says so in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.training.runner import ROOT, TINY, cli_args, env
from training.trainer.distributed import cpu_threads
from training.trainer.distributed.cpu_threads import Machine


def test_a_busy_machine_gets_one_thread_an_idle_one_torchs_default():
    busy = Machine(torch_default=2, usable_cpus=2, local_processes=1, load=11.3, env={})
    threads, why = cpu_threads.choose(busy)
    assert threads == 1
    assert why == (
        "the smallest of torch's default 2 (physical cores); 2 CPUs usable; load average 11.3 leaves 0 idle, at "
        "least 1; OMP_NUM_THREADS=N sets it"
    )
    assert cpu_threads.choose(Machine(2, 2, 1, 0.2, {}))[0] == 2
    assert cpu_threads.choose(Machine(16, 16, 1, 4.6, {}))[0] == 11  # 16 - 4.6, rounded
    assert cpu_threads.choose(Machine(16, 16, 1, None, {}))[0] == 16  # no load average: torch's default


def test_the_cpus_are_shared_by_the_nodes_processes_and_never_exceed_torchs_default():
    threads, why = cpu_threads.choose(
        Machine(torch_default=32, usable_cpus=64, local_processes=8, load=3.0, env={})
    )
    assert threads == 8 and "64 CPUs usable by 8 processes" in why
    assert cpu_threads.choose(Machine(4, 64, 1, 0.0, {}))[0] == 4  # torch's default bounds it
    assert cpu_threads.choose(Machine(8, 2, 4, 0.0, {}))[0] == 1  # fewer CPUs than processes: one each


@pytest.mark.parametrize("name", cpu_threads.THREAD_ENV)
def test_the_environments_setting_is_kept(name):
    threads, why = cpu_threads.choose(Machine(2, 2, 1, 30.0, {name: "2"}))
    assert threads is None and why == f"as the environment sets it: {name}=2"
    assert cpu_threads.choose(Machine(2, 2, 1, 30.0, {name: ""}))[0] == 1  # empty: unset


def test_a_cgroup_cpu_quota_bounds_the_usable_cpus(tmp_path, monkeypatch):
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(cpu_threads, "CGROUP_V2_CPU_MAX", cpu_max)
    monkeypatch.setattr(cpu_threads, "CGROUP_V1_QUOTA", (tmp_path / "quota", tmp_path / "period"))
    affinity = len(os.sched_getaffinity(0))
    assert cpu_threads.usable_cpus() == affinity  # no cgroup file: the affinity
    cpu_max.write_text("max 100000\n")
    assert cpu_threads.usable_cpus() == affinity
    cpu_max.write_text("50000 100000\n")  # half a CPU: one
    assert cpu_threads.usable_cpus() == 1
    cpu_max.unlink()
    (tmp_path / "quota").write_text("150000\n")
    (tmp_path / "period").write_text("100000\n")
    assert cpu_threads.usable_cpus() == min(affinity, 2)


def test_configure_sets_torchs_threads_and_says_so():
    before = torch.get_num_threads()
    try:
        line = cpu_threads.configure(
            Machine(torch_default=before, usable_cpus=2, local_processes=1, load=40.0, env={})
        )
        assert torch.get_num_threads() == 1
        assert line.startswith("cpu threads: 1 (the smallest of torch's default ")
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_a_cpu_run_without_thread_variables_chooses_and_says_it_in_one_line(tmp_path):
    """The trainer as a reader runs it (no OMP_NUM_THREADS, no MKL_NUM_THREADS): its first line says the threads
    it computes with, no more than the CPUs it may use, and why."""
    reader = {k: v for k, v in env().items() if k not in cpu_threads.THREAD_ENV}
    settings = {**TINY, "max_steps": "1", "checkpoint_interval": "0", "checkpoint_dir": str(tmp_path / "c"),
                "model_dir": str(tmp_path / "m")}  # fmt: skip
    command = [sys.executable, "-m", "training.trainer", *cli_args(settings)]
    done = subprocess.run(command, env=reader, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("cpu threads: ")]
    threads = int(line.split()[2])
    assert 1 <= threads <= cpu_threads.usable_cpus(), line
    assert "(the smallest of torch's default " in line and " CPUs usable; load average " in line
    assert done.stdout.splitlines()[0] == line  # before the config line
