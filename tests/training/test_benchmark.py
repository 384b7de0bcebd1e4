"""training/measure/benchmark.py runs its grid and prints a row per loop and cell, with the trainer's overhead
against the bare loop and the external one, then each lever's effect with the spread of its repeats.

Kept light for the suite (one batch size, 3 steps of 16 tokens, one repeat, the two kinds of lever measurement:
the trainer's own tokens/s and the wall clock of ``async_checkpoint``); ``make bench`` runs every lever."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from training.measure import benchmark

from .runner import ROOT, env

LEVERS = ("grad_accum_steps", "async_checkpoint")  # measured by the summary's tokens/s, and by the wall clock


def test_benchmark_prints_every_loop_of_each_cell_and_each_levers_effect():
    proc = subprocess.run(
        [sys.executable, "-m", "training.measure.benchmark", "--steps", "3", "--warmup", "1", "--repeats", "1",
         "--seq-length", "16", "--batch-sizes", "1", "--lever-repeats", "1", "--levers", ",".join(LEVERS)],
        env=env(), cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s*fp32\s", line)]
    assert {(r[1], r[2], r[3]) for r in rows} == {
        ("1", "off", "trainer"), ("1", "off", "bare"), ("1", "off", "external"),
        ("1", "on", "trainer"), ("1", "on", "bare"),
    }  # fmt: skip
    for r in rows:
        assert float(r[4]) > 0 and float(r[7]) > 0  # tokens/s and peak memory are measured
    overheads = {r[2]: r[8:] for r in rows if r[3] == "trainer"}
    # against the bare loop (same model), the external one (AC off only: it has no AC), the spread of the repeats
    assert re.fullmatch(r"[+-]\d+\.\d% [+-]\d+\.\d%ext \[\d+\.\.\d+\]", " ".join(overheads["off"]))
    assert re.fullmatch(r"[+-]\d+\.\d% \[\d+\.\.\d+\]", " ".join(overheads["on"]))
    for lever in LEVERS:
        printed = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] == [lever]]
        labels = [label for label, _ in dict(benchmark.LEVER_CASES)[lever]]
        assert len(printed) == len(labels), lever  # a row per value, the first the reference of the effect
        assert all(
            re.fullmatch(r"\d+\.\.\d+", row[-2]) and re.fullmatch(r"[+-]\d+\.\d%", row[-1]) for row in printed
        )
        assert printed[0][-1] == "+0.0%"
    assert "to be measured by issue #36" in proc.stdout


@pytest.mark.parametrize(
    ("lever", "values"), benchmark.LEVER_CASES, ids=[name for name, _ in benchmark.LEVER_CASES]
)
def test_every_lever_case_is_a_valid_trainer_configuration(lever, values):
    """What ``make bench`` measures but this suite does not run: each value's settings pass the contract."""
    args = benchmark.parse_args([])
    for _, overrides in values:
        cfg = benchmark.make_config(args, "fp32", 1, False, "/unused", **overrides)
        assert all(str(getattr(cfg, key)).lower() == value for key, value in overrides.items())
