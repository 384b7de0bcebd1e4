"""How many threads torch computes with on the CPU, chosen once at start and said in one line.

torch's own default is one thread per physical core of the machine (``c10::TaskThreadPoolBase::defaultNumThreads``:
cpuinfo's cores), whatever CPUs the process may run on, whatever else runs, and however many processes share
them; ``torchrun`` sets ``OMP_NUM_THREADS=1`` for each of its workers when it starts more than one per node and the
variable is unset (``torch/distributed/run.py``), to keep the machine from being overloaded. One process alone gets
the default, and on a busy machine that is the slow case: an OpenMP parallel region waits for its slowest thread,
so a thread the kernel has put aside stalls every operator (on this project's shared 2-core machine at load average
about 10, the README's first run took 29 minutes with torch's two threads; docs/measurements.md).

So, when neither ``OMP_NUM_THREADS`` nor ``MKL_NUM_THREADS`` says otherwise (those are kept as given, as torch and
``torchrun`` keep them), a CPU run computes with the smallest of: torch's default; the CPUs this process may use
(its affinity, and a cgroup's CPU quota when it has one) divided among the node's processes (``LOCAL_WORLD_SIZE``);
and the CPUs left idle by the load average of the last minute (at least one). A GPU run is left alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""The variables that set torch's CPU threads (torch reads OMP_NUM_THREADS, then MKL_NUM_THREADS); kept as given."""
CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


@dataclass(frozen=True)
class Machine:
    """What the choice reads: torch's default threads, the CPUs this process may use, the processes of this node
    sharing them, the load average of the last minute (None where the system has none) and the environment."""

    torch_default: int
    usable_cpus: int
    local_processes: int
    load: float | None
    env: Mapping[str, str]


def choose(machine: Machine) -> tuple[int | None, str]:
    """The threads to compute with and why, in words; None: leave torch as the environment set it."""
    given = next((f"{name}={machine.env[name]}" for name in THREAD_ENV if machine.env.get(name)), None)
    if given:
        return None, f"as the environment sets it: {given}"
    processes = max(1, machine.local_processes)
    threads = min(machine.torch_default, max(1, machine.usable_cpus // processes))
    reasons = [
        f"torch's default {machine.torch_default} (physical cores)",
        f"{machine.usable_cpus} CPUs usable" + (f" by {processes} processes" if processes > 1 else ""),
    ]
    if machine.load is not None:
        idle = math.floor(machine.usable_cpus - machine.load + 0.5)
        reasons.append(f"load average {machine.load:.1f} leaves {max(idle, 0)} idle")
        threads = min(threads, max(1, idle))
    return threads, "the smallest of " + "; ".join(reasons) + ", at least 1; OMP_NUM_THREADS=N sets it"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity), fewer when a cgroup's CPU quota allows fewer."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota else max(1, cpus)


def _cgroup_quota() -> float | None:
    """CPUs a cgroup's CFS quota allows (v2 ``cpu.max``, else v1 ``cfs_quota_us / cfs_period_us``); None: no
    quota, or none readable."""
    try:
        quota, period = CGROUP_V2_CPU_MAX.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us, period_us = (int(path.read_text()) for path in CGROUP_V1_QUOTA)
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def this_machine() -> Machine:
    import torch

    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    return Machine(
        torch_default=torch.get_num_threads(),
        usable_cpus=usable_cpus(),
        local_processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        load=load,
        env=dict(os.environ),
    )


def configure(machine: Machine | None = None) -> str:
    """Set torch's CPU threads for a CPU run (``choose``) before its first operator; the line that says so."""
    import torch

    machine = machine or this_machine()
    threads, why = choose(machine)
    if threads is not None:
        torch.set_num_threads(threads)
    return f"cpu threads: {torch.get_num_threads()} ({why})"
