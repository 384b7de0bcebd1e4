"""training/measure/benchmark.py runs its grid and prints a row per loop and cell, with the trainer's overhead
against the bare loop and the external one, then each lever's effect with the spread of its repeats."""

from __future__ import annotations

import re
import subprocess
import sys

from training.measure import benchmark

from .runner import ROOT, env

LEVERS = [lever for lever, _ in benchmark.LEVER_CASES if lever != "compile"]  # compile's effect: make bench


def test_benchmark_prints_trainer_and_bare_rows_for_every_cell():
    proc = subprocess.run(
        [sys.executable, "-m", "training.measure.benchmark", "--steps", "4", "--warmup", "1", "--repeats", "1",
         "--batch-sizes", "1,2", "--lever-repeats", "1",
         "--levers", ",".join(LEVERS)],
        env=env(), cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s*fp32\s", line)]
    cells = {(r[1], r[2], r[3]) for r in rows}
    assert cells == {
        (b, ac, loop) for b in ("1", "2") for ac in ("off", "on") for loop in ("trainer", "bare")
    } | {(b, "off", "external") for b in ("1", "2")}
    for r in rows:
        assert float(r[4]) > 0 and float(r[7]) > 0  # tokens/s and peak memory are measured
        if r[3] == "trainer":
            assert re.fullmatch(r"[+-]\d+\.\d%", r[8])  # overhead against the bare loop of the same cell
            assert re.fullmatch(r"\[\d+\.\.\d+\]", r[-1])  # the spread of the repeats
    for lever in LEVERS:
        printed = [line for line in proc.stdout.splitlines() if line.split()[:1] == [lever]]
        assert printed and all(re.search(r"\d+\.\.\d+ +[+-]\d+\.\d%$", line) for line in printed), lever
