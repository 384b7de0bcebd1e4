"""A tuning job on CPU, end to end: the hyperparameters the request check's tuning plan gives, sent as the workflow
sends them, run by the real sagemaker-training toolkit through ``train.sh`` (2 gloo processes per trial): a real
out-of-memory trial (an address-space limit per trial that the largest one exceeds) and a real timeout (a trial
that never produces a result: its processes are stopped, as a hung collective leaves them) are classified as such,
the trials after them still run, and the table, charts, winner, winning request, records and the convergence
comparison are written.

No verdict here depends on the machine's speed: the timeout trial cannot finish however fast the machine is (it is
stopped; its own ``timeout_seconds`` ends it sooner than the job's limit), and the trials that must end by
themselves (the OOM, which fails at its first activation, and the two small ones) took 30 to 41 s each on the
2-core development machine under a load average of 21 to 24 (the whole test: 5 min 18 s), far inside
``TIMEOUT_SECONDS``.

The trial list is given in the order a plan puts a larger model's candidates (largest micro-batch first): for this
tiny model the plan's estimate predicts the same MFU for every micro-batch (all below the seed's smallest point),
so the plan would rank them by memory, smallest first (``tests/request/test_tuning.py`` checks the ranking)."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.training.runner import TINY, toolkit_job
from training.contract import settings_parse, settings_table
from training.contract import tuning as contract_tuning
from training.plan import inputs, measured
from training.request import tuning, tuning_plan

pytestmark = pytest.mark.slow

INSTANCE = "ml.p6-b200.48xlarge"
MEMORY_LIMIT_GB = 3.0
"""Per trial process: the first activation of micro-batch 4096 of 2048 tokens (2.1 GB in fp32 for hidden size 64)
cannot be allocated under it, so that trial fails as soon as its first step starts."""
TIMEOUT_SECONDS = 120
"""The job's hard limit of each trial: several times what the trials that end by themselves take on a busy 2-core
machine."""
HUNG_TRIAL = 2
HUNG_TIMEOUT_SECONDS = 20
"""The hung trial's own limit (``timeout_seconds`` in its trial): it can never finish (its processes are stopped),
so a limit shorter than the job's costs the test only this long, whatever the machine's speed."""
TRIALS = [
    {"batch_size": 4096, "seq_length": 2048},
    {
        "batch_size": 4096,
        "seq_length": 64,
        "activation_checkpointing": "full",
        "grad_accum_steps": 8,
        "timeout_seconds": HUNG_TIMEOUT_SECONDS,
    },  # fmt: skip
    {"batch_size": 8, "seq_length": 32},
    {"batch_size": 2, "seq_length": 32},
]


class Hang:
    """Stops (SIGSTOP) every process of one trial as soon as it appears (found by the trial's scratch folder in its
    command line), so that it never gives a result, as a hung rank would not: the driver's timeout must kill it.
    The trial is also a long one (some 100 s a step here, and at least 6 steps): were it not found, it still could
    not end within its limit (and the test fails on ``stopped``)."""

    def __init__(self, scratch: Path, trial: int):
        self.marker = f"{scratch}/trial-{trial:02d}-".encode()
        self.stopped: set[int] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Hang:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(10)

    def _watch(self) -> None:
        while not self.done.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) in self.stopped:
                    continue
                with contextlib.suppress(OSError):
                    if self.marker in (entry / "cmdline").read_bytes():
                        os.kill(int(entry.name), signal.SIGSTOP)
                        self.stopped.add(int(entry.name))
            time.sleep(0.05)


def tune_hyperparameters(tmp_path) -> dict[str, str]:
    """What the workflow sends for a tuning run of the tiny model (the request check's plan), plus the two
    settings only a local run uses: the per-trial memory limit and a short trial timeout."""
    model = {
        k: TINY[k] for k in ("model_preset", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size")
    }
    request = {
        "instance_type": INSTANCE,
        "precision": "fp32",
        "num_layers": 2,
        "seq_length": 32,
        "batch_size": 2,
        "hyperparameters": {**model, "learning_rate": "0.003", "max_steps": "1000"},
    }
    settings, problems = tuning.parse_tune(
        {
            "search_space": {"batch_size": [2, 8, 4096], "seq_length": [32, 128]},
            "warmup_steps": 3,
            "max_measured_steps": 6,
            "window_steps": 3,
            "cv_target": 0.25,
            "convergence": {"precisions": ["bf16"], "reference": "fp32", "steps": 16},
        },
        INSTANCE,
    )
    assert not problems
    planned = tuning_plan.plan_tuning(*inputs.parse_request(request), settings, max_runtime_seconds=86_400)
    assert not planned.problems
    top_level = {
        k: settings_parse.format_setting(request[k])
        for k in settings_table.TOP_LEVEL_SETTINGS
        if k in request
    }
    return {
        **request["hyperparameters"],
        **top_level,
        "deterministic": "true",
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "model_dir": str(tmp_path / "model"),
        **tuning_plan.job_hyperparameters(
            planned, instance_type=INSTANCE, image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/t:abc123"
        ),
        contract_tuning.TUNE_TRIALS: contract_tuning.format_trials(TRIALS),
        "tune_trial_memory_limit_gb": str(MEMORY_LIMIT_GB),
        "tune_trial_timeout_seconds": str(TIMEOUT_SECONDS),
    }  # fmt: skip


def test_a_tuning_job_under_the_toolkit_ranks_its_trials_through_an_oom_and_a_timeout(tmp_path):
    command, child_env = toolkit_job(tmp_path, tune_hyperparameters(tmp_path))
    child_env["TUNE_SCRATCH_DIR"] = str(tmp_path / "scratch")
    with Hang(tmp_path / "scratch", HUNG_TRIAL) as hang:
        proc = subprocess.run(
            command, env=child_env, cwd=tmp_path, capture_output=True, text=True, timeout=900
        )
    output = proc.stdout + proc.stderr
    assert hang.stopped, "the hung trial's processes were never found"
    assert proc.returncode == 0, output[-6000:]
    folder = tmp_path / "checkpoints" / "tune"  # the job's checkpoint folder: SageMaker uploads it
    report = json.loads((folder / "report.json").read_text())
    by_trial = {row["trial"]: row for row in report["rows"]}
    assert by_trial[1]["status"] == "oom", by_trial[1]
    assert "can't allocate memory" in by_trial[1]["error"]
    assert by_trial[HUNG_TRIAL]["status"] == "timeout", by_trial[HUNG_TRIAL]
    waited = re.search(r"no result within (\d+) s", by_trial[HUNG_TRIAL]["error"])
    # killed at its own limit (or just after), not at the job's
    assert waited and HUNG_TIMEOUT_SECONDS <= int(waited.group(1)) < TIMEOUT_SECONDS, by_trial[HUNG_TRIAL]
    assert "timeout_seconds" not in by_trial[HUNG_TRIAL]["settings"]  # not a trainer setting
    assert f"(its own timeout: {HUNG_TIMEOUT_SECONDS} s)" in output
    by_batch = {row["settings"]["batch_size"]: row for row in report["rows"] if row["trial"] > 2}
    for batch in (8, 2):  # after the OOM and the timeout, in the same order as planned
        row = by_batch[batch]
        assert row["status"] == "ok", row
        assert row["measured_tokens_per_sec"] > 0 and row["step_seconds"]["steps"] >= 3
        assert (
            row["measured_allocated_gb"] > 0 and row["measured_reserved_gb"] is None
        )  # no caching allocator
        assert row["predicted_tokens_per_sec"] > 0 and row["basis"] == "estimate"
        assert row["usd_per_billion_tokens"] is None  # measured on CPU: no dollars projected
    assert [row["trial"] for row in report["rows"]][2:] == [1, 2]  # failures ranked last, in trial order
    assert sorted(row["trial"] for row in report["rows"][:2]) == [3, 4]
    winner = json.loads((folder / "winner.json").read_text())
    assert winner["settings"]["batch_size"] in (2, 8) and winner["trial"] == report["rows"][0]["trial"]
    request = json.loads((folder / "winning_request.json").read_text())
    assert request["batch_size"] == winner["settings"]["batch_size"] and request["instance_type"] == INSTANCE
    assert "checkpoint_dir" not in request["hyperparameters"]
    rows = list(csv.DictReader((folder / "table.csv").open()))
    assert [r["status"] for r in rows] == ["ok", "ok", "oom", "timeout"]
    table = (folder / "table.md").read_text()
    assert "| # | configuration | status | measured tok/s/process [p90-p10 step] |" in table  # no GPU column
    assert all(r["stable"] in ("True", "False") for r in rows[:2]) and rows[2]["stable"] == ""
    for chart in ("throughput_memory.png", "convergence.png"):
        assert (folder / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart
    assert not (folder / "throughput_vs_memory.png").exists()  # against a CPU process's resident set: nothing
    records = json.loads((folder / "measurements.json").read_text())["records"]
    assert {r["measured"]["status"] for r in records} == {"ok", "oom"}
    assert all(r["key"]["image_tag"] == "abc123" and r["where"]["device"] == "cpu" for r in records)
    # a CPU measurement never stands for a B200 request
    assert measured.find(records, settings_parse.parse_hyperparameters({"batch_size": 8}), instance_type=INSTANCE,
                         instance_count=1, image_tag="abc123") is None  # fmt: skip
    (comparison,) = report["convergence"]
    assert (
        comparison["precision"] == "bf16" and comparison["reference"] == "fp32" and comparison["points"] >= 3
    )
    assert sorted(p.name for p in (folder / "trials").iterdir()) == [
        "convergence-101.log", "convergence-102.log", *(f"trial-{i:02d}.log" for i in range(1, 5))
    ]  # fmt: skip
    assert not list((tmp_path / "scratch").iterdir())  # every trial's checkpoints removed
    assert "tune: winner: trial" in output
