"""Exit-status check: run many finished 2-process trainer runs under torchrun and count their exit codes.

    python -m training.measure.exit_status_check                 # 30 runs of a tiny CPU model (gloo), a few minutes
    python -m training.measure.exit_status_check --runs 60 --nproc 2

Each run trains a tiny model for a few steps with a checkpoint mid-run and at the end, saves the model, and
exits. A finished run must exit 0 every time; the script prints one line per run, then the count of each exit
code and of runs whose output holds an abort at teardown (``terminate called``), and exits 1 if any run did
not exit 0. It prints numbers and is not part of the test suite (too slow for it).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = {"model_preset": "custom", "num_layers": "2", "hidden_size": "64", "num_heads": "4",
        "ffn_hidden_size": "128", "vocab_size": "256", "seq_length": "32", "batch_size": "2",
        "precision": "fp32", "lr_warmup_steps": "1", "log_interval": "1", "throughput_warmup_steps": "1"}  # fmt: skip


def one_run(workdir: Path, steps: int, nproc: int, timeout: float) -> tuple[int, str, float]:
    """(exit code, output, seconds) of one finished run writing into ``workdir``."""
    settings = {
        **TINY,
        "max_steps": str(steps),
        "checkpoint_interval": str(max(1, steps // 2)),
        "checkpoint_dir": str(workdir / "checkpoints"),
        "model_dir": str(workdir / "model"),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "training.trainer", *(part for key, value in settings.items() for part in (f"--{key}", value))]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        code, output = -999, f"timed out after {timeout} s\n{err.stdout or ''}{err.stderr or ''}"
    return code, output, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="Finished runs to start (default 30).")
    parser.add_argument("--nproc", type=int, default=2, help="Processes per run (default 2).")
    parser.add_argument("--steps", type=int, default=4, help="Steps per run (default 4).")
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds before a run counts as hung.")
    parser.add_argument("--show-failures", action="store_true", help="Print the output of failed runs.")
    args = parser.parse_args(argv)

    codes: collections.Counter[int] = collections.Counter()
    aborts = 0
    with tempfile.TemporaryDirectory(prefix="exit-status-") as tmp:
        for index in range(1, args.runs + 1):
            code, output, seconds = one_run(
                Path(tmp) / f"run_{index:03d}", args.steps, args.nproc, args.timeout
            )
            codes[code] += 1
            aborted = "terminate called" in output
            aborts += aborted
            finished = "summary " in output
            print(f"run {index:3d}: exit {code} in {seconds:.1f} s, summary {'yes' if finished else 'no'}"
                  f"{', ABORT at teardown' if aborted else ''}", flush=True)  # fmt: skip
            if code != 0 and args.show_failures:
                print(output, flush=True)
    print("exit codes: " + ", ".join(f"{code}: {count}" for code, count in sorted(codes.items())))
    print(f"runs={args.runs} exit_0={codes[0]} nonzero={args.runs - codes[0]} teardown_aborts={aborts}")
    return 0 if codes[0] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
