"""Helpers for the trainer tests: tiny-model settings, running the trainer under torchrun, parsing its lines."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import zygote
from training.contract import container, hardware

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

TINY = {
    "model_preset": "custom",
    "num_layers": "2",
    "hidden_size": "64",
    "num_heads": "4",
    "ffn_hidden_size": "128",
    "vocab_size": "256",
    "seq_length": "32",
    "batch_size": "4",
    "precision": "fp32",
    "learning_rate": "0.003",
    "lr_warmup_steps": "3",
    "log_interval": "1",
    "throughput_warmup_steps": "1",
    "deterministic": "true",
}


def cli_args(settings: dict[str, str]) -> list[str]:
    return [part for key, value in settings.items() for part in (f"--{key}", str(value))]


FRESH_ENV = "TESTS_NO_ZYGOTE"
"""Set (to anything) for every trainer process a test starts to be a new interpreter (tests/zygote.py not used)."""
PYTHON = "python"
"""The Python of the commands the trainer tests start with ``env()``: the fork server's shim, first on its PATH
(tests/zygote.py), else the venv's."""


def env(package_root: Path = ROOT) -> dict[str, str]:
    """Environment for child processes: the venv first on PATH, the repository importable, one thread each; the
    Python commands the trainer runs (``python -m training...``, torchrun and its workers) forked from this test
    process's fork servers (tests/zygote.py: the repository's, and ``package_root``'s when it holds another copy of
    ``training/``) unless ``FRESH_ENV`` is set."""
    out = dict(os.environ)
    out["PATH"] = f"{VENV_BIN}{os.pathsep}{out.get('PATH', '')}"
    out["PYTHONPATH"] = str(ROOT)
    out["OMP_NUM_THREADS"] = "1"
    return out if os.environ.get(FRESH_ENV) else zygote.environment(out, package_root)


def torchrun_cmd(settings: dict[str, str], nproc: int = 2) -> list[str]:
    return [
        "torchrun", "--standalone", f"--nproc-per-node={nproc}", "-m", "training.trainer", *cli_args(settings),
    ]  # fmt: skip


GUARD_SECONDS = 900
"""The default limit of a trainer run here: a guard against a hang, never a verdict (a tiny run takes seconds on an
idle machine; a 12-step 2-process run took over 3 minutes at a load average of 30 on the shared 2-core machine)."""


def run_trainer(settings: dict[str, str], nproc: int = 2, timeout: float = GUARD_SECONDS) -> str:
    """Run the trainer to completion under torchrun; return stdout+stderr (asserting exit status 0)."""
    proc = subprocess.run(
        torchrun_cmd(settings, nproc), env=env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output


def run_single(settings: dict[str, str], timeout: float = GUARD_SECONDS) -> tuple[int, str]:
    """Run the trainer as one process without torchrun (world size 1); return (exit status, stdout+stderr)."""
    proc = subprocess.run(
        [PYTHON, "-m", "training.trainer", *cli_args(settings)],
        env=env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def step_lines(output: str) -> dict[int, str]:
    """``step=N ...`` lines by step number."""
    return {
        int(line.split()[0][5:].split("/")[0]): line
        for line in output.splitlines()
        if line.startswith("step=")
    }


def fields(line: str) -> dict[str, str]:
    """``key=value`` pairs of a config/step/summary line."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def losses(output: str) -> dict[int, str]:
    """The printed loss of every step (as printed: comparing strings compares every printed digit)."""
    return {step: fields(line)["loss"] for step, line in step_lines(output).items()}


@functools.cache
def build_context() -> Path:
    """training/ as the image build gets it: the folder CDK stages for ``TrainingImageBuild`` (less what
    training/.dockerignore lists), once per test process."""
    from tests.constructs.image.test_build_context import staged

    outdir = Path(tempfile.mkdtemp(prefix="build-context-"))
    tag, _ = staged(ROOT / "training", outdir)
    return outdir / f"asset.{tag}"


@functools.cache
def shared_code() -> Path:
    """The image's ``training/`` package (the build context less Dockerfile and .dockerignore), once per test
    process: every laid-out /opt/ml/code links to it, so one fork server (tests/zygote.py) serves them all."""
    folder = Path(tempfile.mkdtemp(prefix="image-code-"))
    shutil.copytree(
        build_context(), folder / "training", ignore=shutil.ignore_patterns("Dockerfile", ".dockerignore")
    )
    return folder


def container_code_dir(code: Path) -> None:
    """Lay out /opt/ml/code as the image does (training/Dockerfile's COPY lines): the build context in training/
    (no Dockerfile or .dockerignore: Docker keeps those out; a link to ``shared_code``), train.sh, evaluate.sh and
    entrypoint.sh beside it. So a job run from here fails as the image would when .dockerignore leaves out something
    it needs."""
    code.mkdir(parents=True)
    context = build_context()
    for script in (container.ENTRY_POINT, container.EVALUATE_ENTRY_POINT, "entrypoint.sh"):
        shutil.copy2(context / script, code / script)
    (code / "training").symlink_to(shared_code() / "training", target_is_directory=True)


def toolkit_job(
    tmp_path: Path, hyperparameters: dict[str, str], hosts: tuple[str, ...] = ("algo-1",), current: str = ""
) -> tuple[list[str], dict[str, str]]:
    """A SageMaker-shaped /opt/ml under ``tmp_path`` for one host (``current`` of ``hosts``, the first by default)
    with ``hyperparameters`` (JSON strings, as Step Functions sends them); returns the toolkit's ``train`` command
    and its environment (2 CPU workers)."""
    base = tmp_path / "opt_ml"
    config_dir = base / "input" / "config"
    config_dir.mkdir(parents=True)
    (config_dir / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    resources = {"current_host": current or hosts[0], "hosts": list(hosts), "network_interface_name": "eth0"}
    if (
        len(hosts) > 1
    ):  # as SageMaker writes it for a cluster (the loopback here: every "host" is this machine)
        resources.update(network_interface_name="lo", current_instance_type=hardware.DEFAULT_INSTANCE_TYPE)
    (config_dir / "resourceconfig.json").write_text(json.dumps(resources))
    (config_dir / "inputdataconfig.json").write_text("{}")
    container_code_dir(base / "code")
    return toolkit_command(tmp_path)


def toolkit_command(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The toolkit's ``train`` command and its environment for the /opt/ml that ``toolkit_job`` laid out under
    ``tmp_path``."""
    base = tmp_path / "opt_ml"
    child_env = env(shared_code())
    child_env.pop("PYTHONPATH")  # train.sh must find its package by itself
    child_env.update(
        SAGEMAKER_BASE_DIR=str(base),
        SAGEMAKER_PROGRAM=container.ENTRY_POINT,
        SAGEMAKER_SUBMIT_DIRECTORY=str(base / "code"),
        SM_STUDIO_LOCAL_MODE="true",  # skips the toolkit's DNS wait for algo-1
        NPROC_PER_NODE="2",
        TRAINER_PID_DIR=str(tmp_path / "pids"),  # entrypoint.sh's files, per test (not /tmp's defaults)
        TRAINER_REFUSAL_FILE=str(tmp_path / "refused"),
    )
    return [str(VENV_BIN / "train")], child_env


def container_command(command: list[str]) -> list[str]:
    """``command`` under the container's PID-1 entry point (training/entrypoint.sh), as the image runs it."""
    return [str(ROOT / "training" / "entrypoint.sh"), *command]


REFERENCE_STEPS = 12


def reference_settings(tmp: Path, name: str, **extra: str) -> dict[str, str]:
    """A 12-step 2-process run with checkpoints at steps 6 and 12, writing ckpt_<name>/ and model_<name>/."""
    return {
        **TINY,
        "max_steps": str(REFERENCE_STEPS),
        "checkpoint_interval": "6",
        "checkpoint_dir": str(tmp / f"ckpt_{name}"),
        "model_dir": str(tmp / f"model_{name}"),
        **extra,
    }


def free_ports() -> int:
    """A port ``p`` with ``p + 1`` free too (torchrun's rendezvous and the roll call)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two consecutive free ports")
