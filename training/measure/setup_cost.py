"""Measure what each set-up costs in a fresh clone: ``python -m training.measure.setup_cost --targets synth local
setup`` clones this checkout's committed ``HEAD`` into a new folder, runs ``make <target>`` for each target in
turn there (each set-up on top of the one before, as a reader would: a new ``.venv``, this machine's pip cache), and
prints, per target, its wall time, the CPU time its processes used, the load average before and after, and the
size on disk of ``.venv`` and ``node_modules`` after it (as ``du`` counts: allocated blocks, hard links once).

The table of docs/measurements.md ("Set-up time and size") is its output. Standard library only; it never touches
this checkout's own ``.venv``. ``--keep`` leaves the clone (its path is printed) for a ``make test`` there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MB = 10**6


def disk_usage(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (``du``'s count: blocks, each hard-linked file once, links not
    followed); 0 when it does not exist."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, dirs, files in os.walk(path):
        for name in [*files, *dirs]:
            stat = os.lstat(os.path.join(folder, name))
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_blocks * 512
    return total


def run_target(clone: Path, target: str) -> dict[str, float]:
    """``make <target>`` in ``clone``: wall and CPU seconds, load before and after, sizes after."""
    load_before = os.getloadavg()[0]
    cpu_before = os.times()
    started = time.monotonic()
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }  # the clone's own code
    done = subprocess.run(["make", target], cwd=clone, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    cpu_after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"error: make {target} failed in {clone}:\n{(done.stdout + done.stderr)[-4000:]}")
    return {
        "wall": wall,
        "cpu": (cpu_after.children_user - cpu_before.children_user)
        + (cpu_after.children_system - cpu_before.children_system),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "venv": disk_usage(clone / ".venv") / MB,
        "node_modules": disk_usage(clone / "node_modules") / MB,
    }


def table(rows: list[tuple[str, dict[str, float]]]) -> str:
    lines = [
        "| set-up (each on top of the one before) | wall time | CPU time | load average before, after | `.venv` (MB) "
        "| `node_modules` (MB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for target, r in rows:
        minutes, seconds = divmod(round(r["wall"]), 60)
        lines.append(
            f"| `make {target}` | {minutes} min {seconds:02d} s | {r['cpu']:.0f} s | {r['load_before']:.1f}, "
            f"{r['load_after']:.1f} | {r['venv']:,.0f} | {r['node_modules']:,.0f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.setup_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--targets", nargs="+", default=["synth"], help="make targets, in order (default: synth)"
    )
    parser.add_argument("--keep", action="store_true", help="leave the clone (its path is printed)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clone = Path(tempfile.mkdtemp(prefix="setup-cost-")) / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True
    )
    rows = []
    try:
        for target in args.targets:
            rows.append((target, run_target(clone, target)))
            print(f"make {target}: {rows[-1][1]['wall']:.0f} s", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(clone.parent, ignore_errors=True)
    print(f"fresh clone of {commit.stdout.strip()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(table(rows))
    if args.keep:
        print(f"the clone: {clone}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
