"""The wheels the GPU report carries to a machine with no network (``make gpu-wheels``), and the proof, in a fresh
virtual environment with no index, that the list is complete.

    python -m training.measure.gpu_report.wheels download --dest .gpu-wheels   # from PyPI, for the device's Python
    python -m training.measure.gpu_report.wheels check --dest .gpu-wheels      # fresh venv, --no-index, imports

The device (the lent H100/H200 machine) has torch 2.11, triton, transformers, safetensors, tokenizers, numpy,
pandas, pyarrow, fsspec, huggingface-hub, tensorboard and more, but not what is listed here. ``check`` makes a
fresh venv, installs stand-ins for the device's own packages from the registry (torch 2.13 for its 2.11: the only
torch this machine installs without a GPU; triton 3.6.0, huggingface-hub 1.33.0, tokenizers 0.23.2, safetensors
0.8.0 as the device reported them; the rest at the registry's latest), then installs the carried list with
``--no-index --find-links`` and dependencies resolved (a missing wheel fails there), runs ``pip check``, and in
that venv imports torchtitan's trainer and our train spec, parses the report's torchtitan job config with
torchtitan's own parser, and builds torchtitan's model of our shape on the meta device to compare its parameter
count with ours.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DEVICE_PYTHON = "3.12"
"""The device's python3 (KINDS.md: Python 3.12.3)."""
LIMIT_BYTES = 60 * 2**20
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    why: str
    per_python: bool = False
    """Built per Python version (one file for the device's, one for this machine's, for the check)."""

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


WHEELS: tuple[Wheel, ...] = (
    Wheel(
        "torchtitan",
        "0.2.2",
        "the peer: torchtitan's own loop (released 2026-02-20 against torch 2.11 nightlies)",
    ),
    Wheel("tyro", "1.0.17", "torchtitan's config parser (config/manager.py imports it)"),
    Wheel(
        "tomli",
        "2.3.0",
        "declared by torchtitan 0.2.2 for every Python; imported only before 3.11 (tomllib after)",
        per_python=True,
    ),
    Wheel("typeguard", "4.6.1", "tyro's run-time type checks (tyro requires >= 4)"),
    Wheel("docstring-parser", "0.18.0", "tyro's help texts"),
    Wheel("torchdata", "0.11.0", "torchtitan's StatefulDataLoader (components/dataloader.py)"),
    Wheel(
        "datasets",
        "5.2.0",
        "imported by torchtitan's Llama 3 spec (hf_datasets/text_datasets.py), unused here",
    ),
    Wheel("dill", "0.4.1", "datasets' and multiprocess' pickler"),
    Wheel("multiprocess", "0.70.19", "datasets' process pool", per_python=True),
    Wheel("tensorboardX", "2.6.5", "our trainer's TensorBoard writer: each trial writes its event file"),
)
STAND_INS: tuple[str, ...] = (
    "torch==2.13.0", "triton==3.6.0", "numpy==2.4.6", "huggingface-hub==1.33.0", "tokenizers==0.23.2",
    "safetensors==0.8.0", "pyarrow", "pandas", "fsspec==2026.9.0", "requests", "einops", "pillow", "urllib3", "tqdm", "xxhash", "filelock",
    "pyyaml", "httpx", "aiohttp", "tensorboard", "protobuf", "packaging", "typing-extensions", "rich",
)  # fmt: skip
"""The device's own packages that the carried ones need (KINDS.md lists each), as near its versions as the registry
has them (numpy 2.5.2 has no wheel for this machine's Python 3.11; fsspec at datasets 5.2.0's highest allowed)."""


def pip(python: str, *args: str) -> None:
    print("$ pip " + " ".join(args), flush=True)
    subprocess.run([python, "-m", "pip", *args], check=True)


def download(dest: Path) -> int:
    """Every wheel, for the device's Python (and, per-Python ones, this machine's too), and the requirements file
    the report installs from; prints each file's size and refuses a total over 60 MiB."""
    dest.mkdir(parents=True, exist_ok=True)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    for wheel in WHEELS:
        for version in dict.fromkeys((DEVICE_PYTHON, here) if wheel.per_python else (DEVICE_PYTHON,)):
            platforms = [part for p in PLATFORMS for part in ("--platform", p)]
            pip(sys.executable, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", version,
                "--implementation", "cp", *platforms, "-d", str(dest), wheel.pin)  # fmt: skip
    (dest / "requirements.txt").write_text("".join(f"{w.pin}\n" for w in WHEELS))
    files = sorted(dest.glob("*.whl"))
    total = sum(f.stat().st_size for f in files)
    for f in files:
        print(f"{f.stat().st_size / 2**20:8.2f} MiB  {f.name}")
    print(f"{total / 2**20:8.2f} MiB  total, {len(files)} wheels (limit {LIMIT_BYTES / 2**20:.0f} MiB)")
    return 0 if total <= LIMIT_BYTES else 2


def check(dest: Path, venv: Path | None) -> int:
    """The fresh-venv proof (the module's doc)."""
    folder = venv or Path(tempfile.mkdtemp(prefix="gpu-wheels-check-"))
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = str(folder / "bin" / "python")
    pip(python, "install", "-q", *STAND_INS)
    pip(python, "install", "--no-index", "--find-links", str(dest), "-r", str(dest / "requirements.txt"))
    pip(python, "check")
    root = Path(__file__).resolve().parents[3]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([python, "-m", "training.measure.gpu_report.wheels", "probe"], env=env, check=False)
    print(f"fresh venv {folder}: " + ("complete" if done.returncode == 0 else "INCOMPLETE"))
    return done.returncode


def probe() -> int:
    """Inside the fresh venv: import what the report's torchtitan runs import, parse its job config with
    torchtitan's parser, build torchtitan's model of our shape on the meta device."""
    import json
    import os

    import torch

    from training.measure.gpu_report import titan
    from training.measure.gpu_report.modes import GPU_MODE

    os.environ["GPU_REPORT_TITAN_SHAPE"] = titan.shape_json(GPU_MODE)
    import tensorboardX  # noqa: F401  - our trials' writer
    import torchtitan.train  # noqa: F401
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    import training.measure.gpu_report.titan_spec as spec

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.toml"
        path.write_text(titan.toml(titan.config(GPU_MODE, {"batch_size": 2, "activation_checkpointing": "none"},
                                                True, Path(folder))))  # fmt: skip
        parsed = ConfigManager().parse_args(["--job.config_file", str(path)])
    registered = get_train_spec(spec.NAME)
    with torch.device("meta"):
        model = registered.model_cls(registered.model_args[spec.FLAVOR])
    theirs = sum(p.numel() for p in model.parameters())
    shape = GPU_MODE.shape()
    ours = shape.parameter_count()
    untied = ours + (shape.vocab_size * shape.hidden_size if shape.tie_embeddings else 0)
    print(json.dumps({"torch": torch.__version__, "torchtitan": __import__("torchtitan").__version__,
                      "config_parsed": {"model": parsed.model.name, "flavor": parsed.model.flavor,
                                        "compile": parsed.compile.enable, "seq_len": parsed.training.seq_len},
                      "torchtitan_parameters": theirs, "ours": ours, "ours_untied": untied}))  # fmt: skip
    return 0 if theirs == untied else 1


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.measure.gpu_report.wheels")
    parser.add_argument("action", choices=("download", "check", "probe"))
    parser.add_argument("--dest", default=".gpu-wheels", help="the wheels' folder")
    parser.add_argument("--venv", help="check: the fresh venv's folder (default: a new temporary one)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.action == "download":
        return download(Path(args.dest))
    if args.action == "check":
        return check(Path(args.dest), Path(args.venv) if args.venv else None)
    return probe()


if __name__ == "__main__":
    sys.exit(main())
