"""Make docs/tuning-example/, docs/tuning.md's example report, from a real tuning run on this machine's CPU.

The tuning driver exactly as a job runs it (``train.sh --tune_trials ...``: each trial a fresh ``train.sh`` and
``torchrun`` of 2 gloo processes), on the tiny 2-layer model: micro-batch 2, 8 and 32 (each with the
accumulation that keeps the base's 32 sequences per optimizer step) with and without activation checkpointing, then a micro-batch of 4096 x 128 tokens that cannot allocate its activations under the per-trial
memory limit (a real OOM), and 4096 x 64 tokens with full activation checkpointing, which fits but outlasts its
trial's 90 s limit (a real timeout: some 13 s a step, and the driver stops no trial before its warm-up and window);
then the winner's convergence run in bf16 against fp32 (what this CPU runs). The report's table, charts and
winner are copied to ``OUT_DIR`` (default ``./tuning-example/``; a folder that already holds them is refused, so
nothing is written over; ``--replace`` writes over them, as regenerating docs/tuning-example/ does). About 4 minutes on
2 CPU cores::

    .venv/bin/python docs/tuning_example.py                                   # into ./tuning-example/
    .venv/bin/python docs/tuning_example.py docs/tuning-example --replace     # the page's own copy, regenerated
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.contract import hardware, tuning  # noqa: E402

MODEL = {"model_preset": "custom", "num_layers": "2", "hidden_size": "64", "num_heads": "4",
         "ffn_hidden_size": "128", "vocab_size": "256", "seq_length": "32", "precision": "fp32",
         "learning_rate": "0.003", "max_steps": "2000"}  # fmt: skip
MODEL["batch_size"] = "32"
"""The base: 32 x 32 tokens per optimizer step, which every trial but the last two keeps (its grad_accum_steps
makes up for its micro-batch)."""
TRIALS = [
    *(
        {"batch_size": b, "grad_accum_steps": 32 // b, "activation_checkpointing": ac}
        for b in (32, 8, 2)
        for ac in ("none", "full")
    ),  # fmt: skip
    # the documented exceptions (the report's notes name them): a step this large is what it takes to run out of
    # memory, and to outlast the trial's time limit, on this CPU
    {"batch_size": 4096, "seq_length": 128},
    {"batch_size": 4096, "seq_length": 64, "activation_checkpointing": "full"},
]
TUNE = {
    tuning.TUNE_TRIALS: tuning.format_trials(TRIALS),
    "tune_instance_type": hardware.DEFAULT_INSTANCE_TYPE,
    "tune_max_measured_steps": "12",
    "tune_window_steps": "6",
    "tune_cv_target": "0.05",
    "tune_trial_timeout_seconds": "90",
    "tune_trial_memory_limit_gb": "3",
    "tune_convergence_reference": "fp32",
    "tune_convergence_precisions": "bf16",
    "tune_convergence_steps": "60",
}
KEPT = ("table.md", "throughput_memory.png", "convergence.png", "winner.json")
"""The report's files the page shows (a CPU run draws no throughput-against-memory chart: its memory axis would be
a process's resident set)."""


def main(out: Path, replace: bool = False) -> int:
    taken = [name for name in KEPT if (out / name).exists()]
    if taken and not replace:
        print(
            f"error: {out} already holds {', '.join(taken)}: choose another folder, or --replace",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as work:
        settings = {**MODEL, **TUNE, "checkpoint_dir": f"{work}/checkpoints", "model_dir": f"{work}/model"}
        args = [part for key, value in settings.items() for part in (f"--{key}", value)]
        env = {**os.environ, "NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1", "PYTHON": sys.executable,
               "TUNE_SCRATCH_DIR": work}  # fmt: skip
        done = subprocess.run(["/bin/sh", str(ROOT / "training" / "train.sh"), *args], env=env, cwd=work)
        if done.returncode != 0:
            return done.returncode
        report = Path(work) / "checkpoints" / tuning.TUNE_REPORT_FOLDER
        out.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            shutil.copy2(report / name, out / name)
    print(f"wrote {', '.join(KEPT)} to {out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default="tuning-example", help="default: ./tuning-example/")
    parser.add_argument("--replace", action="store_true", help="write over the files a folder already holds")
    args = parser.parse_args()
    sys.exit(main(Path(args.out_dir), args.replace))
