"""What each test costs in CPU time, a figure the machine's load barely moves (its wall time follows the load): a
pytest plugin and its summary.

    pytest -p tests.cpu_seconds --cpu-seconds=cpu.jsonl -n 2 ...   # one JSON line per test
    python -m tests.cpu_seconds cpu.jsonl                           # per file and the longest tests

A test's CPU seconds are its pytest process's own plus those of every process it started and waited for
(torchrun, train.sh, the toolkit and their children: ``RUSAGE_CHILDREN``); a process left running past its test
counts for the test that reaps it. On an idle 2-core machine ``make test`` takes at least the sum over 2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-seconds", metavar="FILE", help="append each test's wall and CPU seconds to FILE")


def _cpu() -> float:
    """CPU seconds of this process, of its children it has waited for, and of every descendant still running with
    the children each of those has waited for: the fork servers of tests/zygote.py (the trainer processes they
    forked) and jsii's Node runtime (CDK's synths) live as long as the worker."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _descendants_cpu(os.getpid())


def _descendants_cpu(pid: int) -> float:
    """``/proc``'s CPU ticks of the running descendants of ``pid``, each with its waited-for children, in seconds."""
    ticks, pending = 0, _children(pid)
    while pending:
        child = pending.pop()
        try:
            fields = Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        ticks += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
        pending.extend(_children(child))
    return ticks / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def collected_id(nodeid: str) -> str:
    """``nodeid`` as collected, the key of tests/schedule.py's ``SECONDS``: without the ``@<group>`` pytest-xdist
    adds to a grouped test's id (its own rule: an ``@`` after the parameters' ``]``)."""
    return nodeid.rpartition("@")[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    path = item.config.getoption("cpu_seconds")
    wall, cpu, load = time.monotonic(), _cpu(), os.getloadavg()[0]
    yield
    if path:
        row = {"test": collected_id(item.nodeid), "wall": round(time.monotonic() - wall, 2), "cpu": round(_cpu() - cpu, 2),
               "load": round(load, 1), "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}  # fmt: skip
        with open(path, "a") as handle:  # one short line per write: workers' lines never interleave
            handle.write(json.dumps(row) + "\n")


def summary(rows: list[dict], longest: int = 30) -> str:
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        entry = by_file[row["test"].split("::", 1)[0]]
        entry[0], entry[1], entry[2] = entry[0] + row["wall"], entry[1] + row["cpu"], entry[2] + 1
    lines = [f"{'CPU s':>8} {'wall s':>8} {'tests':>5}  file"]
    for name, (wall, cpu, count) in sorted(by_file.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{cpu:8.1f} {wall:8.1f} {count:5d}  {name}")
    lines.append(
        f"{sum(r['cpu'] for r in rows):8.1f} {sum(r['wall'] for r in rows):8.1f} {len(rows):5d}  all"
    )
    lines.append(f"\n{'CPU s':>8} {'wall s':>8} {'load':>5}  the {longest} longest tests (CPU)")
    for row in sorted(rows, key=lambda r: -r["cpu"])[:longest]:
        lines.append(f"{row['cpu']:8.1f} {row['wall']:8.1f} {row['load']:5.1f}  {row['test']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.cpu_seconds", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", metavar="FILE", help="what --cpu-seconds wrote (several: summed)")
    parser.add_argument("--longest", type=int, default=30, help="how many of the longest tests to list")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    rows = [json.loads(line) for name in args.files for line in Path(name).read_text().splitlines()]
    print(summary(rows, args.longest))
