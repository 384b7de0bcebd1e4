"""The tuning driver's own overhead per trial on this machine: from starting a trial's process to its first step.

    python -m training.measure.tune_overhead                 # 5 trials of the tiny model, 2 CPU processes each
    python -m training.measure.tune_overhead --repeats 10 --nproc 1

Each trial is what the driver runs (``training.tune.driver.run_trial``: a fresh ``train.sh`` with its settings
check, ``torchrun``, the workers importing torch, the process group, building and sharding the model), timed line by
line: when ``train.sh``'s settings check answered, when the trainer's config line came (workers up, process group
formed), when the first step line came, and when the whole process tree had gone after the last step (the
checkpoint save, the summary, the kill and the sweep). It prints each phase's median and range over the repeats
and asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from training.contract import metric_lines
from training.tune import driver, runner
from training.tune.stability import percentile

TINY = ["--model_preset", "custom", "--num_layers", "2", "--hidden_size", "64", "--num_heads", "4",
        "--ffn_hidden_size", "128", "--vocab_size", "256", "--seq_length", "32", "--precision", "fp32"]  # fmt: skip
PHASES = (
    ("settings checked", "train.sh's --check-only (one Python start, torch imported)"),
    ("workers up", "torchrun, the workers' imports, the process group, the config line"),
    ("first step", "model built and sharded, data, first step done"),
    ("after the last step", "checkpoint save, summary, exit, tree killed and reaped"),
)


def one_trial(job: driver.Job, index: int, scratch: Path) -> dict[str, float]:
    """Run one trial as the driver does, with a timestamp for each line; the phases' seconds."""
    stamps: dict[str, float] = {}
    started = time.monotonic()

    def seen(line: str) -> None:
        now = time.monotonic() - started
        if line.startswith("settings ok:"):
            stamps.setdefault("settings checked", now)
        elif metric_lines.parse_config_line(line) is not None:
            stamps.setdefault("workers up", now)
        elif metric_lines.parse_step_line(line) is not None:
            stamps.setdefault("first step", now)
            stamps["last step"] = now

    folder = Path(tempfile.mkdtemp(prefix=f"trial-{index:02d}-", dir=scratch))
    settings = driver.trial_settings(job, {}, folder, steps=job.options["tune_warmup_steps"] + 3,
                                     warmup=job.options["tune_warmup_steps"], save=True)  # fmt: skip
    finished = runner.run(
        ["/bin/sh", str(driver.train_sh()), *runner.cli_args(settings)],
        env=driver.trial_environment(job, index, folder, 0.0),
        log_path=folder / "trial.log",
        timeout=600,
        echo=seen,
    )
    if finished.exit_code != 0 or "first step" not in stamps:
        raise SystemExit(f"trial {index} failed:\n" + "\n".join(finished.lines[-20:]))
    return {
        "settings checked": stamps["settings checked"],
        "workers up": stamps["workers up"] - stamps["settings checked"],
        "first step": stamps["first step"] - stamps["workers up"],
        "after the last step": finished.seconds - stamps["last step"],
        "start to first step": stamps["first step"],
        "trial": finished.seconds,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2, help="CPU processes per trial (NPROC_PER_NODE)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["NPROC_PER_NODE"] = str(args.nproc)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    runner.become_subreaper()
    job = driver.parse_args(["--tune_trials", "batch_size=2", "--batch_size", "2", *TINY])
    print(f"driver overhead per trial: tiny model, {args.nproc} CPU process(es), {args.repeats} trials, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        samples = [one_trial(job, i, Path(scratch)) for i in range(1, args.repeats + 1)]
    print(f"{'phase':<24} {'median s':>9} {'min s':>7} {'p90 s':>7}  what")
    what = dict(PHASES) | {
        "start to first step": "process start to first step (the overhead)",
        "trial": "whole trial",
    }
    for phase in [*(p for p, _ in PHASES), "start to first step", "trial"]:
        values = [s[phase] for s in samples]
        print(f"{phase:<24} {statistics.median(values):9.2f} {min(values):7.2f} {percentile(values, 90):7.2f}  "
              f"{what[phase]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
