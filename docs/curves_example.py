"""Make docs/curves-example.png, the README's picture of ``blackwell-training curves``, from two real CPU runs.

Two runs of the tiny 2-layer model on real text (the source of four standard-library packages, tokenized by
``training.prepare``), learning rates 0.01 and 0.002, each line of the trainer time-stamped as it is printed
(as CloudWatch Logs does), then drawn by the same code as ``curves --out`` (``curves.curve_of`` and ``plots.png``).
About 2 minutes on 2 CPU cores: ``.venv/bin/python docs/curves_example.py [OUT.png]`` (default
``./curves-example.png``; an existing file is refused, so nothing is written over; ``--replace`` writes over it, as
regenerating the page's picture does: ``docs/curves_example.py docs/curves-example.png --replace``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from constructs_lib.cli import plots  # noqa: E402
from constructs_lib.cli.curves import curve_of  # noqa: E402
from constructs_lib.cli.records import Job, LogEvent  # noqa: E402
from training.prepare import corpus  # noqa: E402

SETTINGS = {
    "model_preset": "custom", "num_layers": "2", "hidden_size": "64", "num_heads": "4", "ffn_hidden_size": "128",
    "seq_length": "64", "batch_size": "8", "precision": "fp32", "max_steps": "400", "lr_warmup_steps": "20",
    "log_interval": "10", "validation_interval": "50", "checkpoint_interval": "0", "dataset": "channel",
}  # fmt: skip


def timed_lines(command: list[str]) -> list[LogEvent]:
    """Run ``command``; every line of its output with the time it was printed (ms)."""
    events = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            events.append(LogEvent("job/algo-1-1", int(time.time() * 1000), line.rstrip("\n")))
    if proc.returncode:
        raise SystemExit("\n".join(e.message for e in events[-20:]))
    return events


def main(out: Path, replace: bool = False) -> int:
    if out.exists() and not replace:
        print(f"error: {out} already exists: choose another file, or --replace", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        meta = corpus.prepare([str(stdlib / n) for n in ("json", "email", "html", "http")], f"{tmp}/data")
        curves = []
        for name, lr in (("lr-0.01", "0.01"), ("lr-0.002", "0.002")):
            settings = {**SETTINGS, "learning_rate": lr, "vocab_size": str(meta["vocab_size"]),
                        "data_dir": f"{tmp}/data", "checkpoint_dir": f"{tmp}/{name}/ckpt", "model_dir": f"{tmp}/{name}/model"}  # fmt: skip
            args = [part for key, value in settings.items() for part in (f"--{key}", value)]
            events = timed_lines([sys.executable, "-m", "training.trainer", *args])
            job = Job(name, instance_type="ml.p6-b200.48xlarge")  # tokens: the config line's world_size (1)
            curves.append(curve_of(name, [(job, events)]))
    plots.png(curves, "tokens", out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="curves-example.png", help="default: ./curves-example.png")
    parser.add_argument("--replace", action="store_true", help="write over an existing file")
    args = parser.parse_args()
    sys.exit(main(Path(args.out), args.replace))
