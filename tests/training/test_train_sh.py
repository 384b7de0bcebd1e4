"""train.sh under dash: help, fail-fast validation, GPU counting, multi-node layout, argument forwarding.

torchrun is replaced by a recording stub (PYTHON points at a wrapper that prints the torchrun command line and
runs everything else with the real interpreter), so these tests check what train.sh would start.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .hf_models import BROKEN, broken_llama
from .runner import ROOT, env

TRAIN_SH = ROOT / "training" / "train.sh"
GOOD = ["--model_preset", "custom", "--num-layers", "2", "--hidden_size", "64", "--num_heads", "4",
        "--ffn_hidden_size", "128", "--vocab_size", "256", "--seq-length", "32", "--precision", "fp32",
        "--activation_checkpointing", "True", "--max_steps", "5"]  # fmt: skip


@pytest.fixture
def stub_env(tmp_path: Path) -> dict[str, str]:
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "torch.distributed.run" ]; then shift 2; echo "TORCHRUN $*"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    out = env()
    out.pop("PYTHONPATH")
    out.update(PYTHON=str(wrapper), PATH=f"{tmp_path}:/usr/bin:/bin")
    return out


def fake_nvidia_smi(directory: Path, gpus: int) -> None:
    script = directory / "nvidia-smi"
    lines = "".join(f'echo "GPU {i}: NVIDIA B200 (UUID: GPU-{i})"\n' for i in range(gpus))
    script.write_text("#!/bin/sh\n" + lines)
    script.chmod(0o755)


def train_sh(args: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["dash", str(TRAIN_SH), *args], env=environment, capture_output=True, text=True, timeout=60, cwd="/"
    )


def torchrun_line(proc: subprocess.CompletedProcess) -> str:
    return next(line for line in proc.stdout.splitlines() if line.startswith("TORCHRUN "))


def test_help_lists_trainer_options_without_starting_torchrun(stub_env):
    proc = train_sh(["--help"], stub_env)
    assert proc.returncode == 0
    assert (
        "Usage: train.sh" in proc.stdout and "--num_layers" in proc.stdout and "--num-layers" in proc.stdout
    )
    assert "TORCHRUN" not in proc.stdout


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (["--precision", "fp9"], "precision"),
        (["--batch_size", "0"], "batch_size"),
        (["--seq-length", "33"], "seq_length"),
    ],
)
def test_bad_setting_fails_before_torchrun(stub_env, bad, field):
    proc = train_sh([*GOOD, *bad], stub_env)
    assert proc.returncode == 2
    assert f"error: invalid setting {field}:" in proc.stderr
    assert "TORCHRUN" not in proc.stdout


def test_cpu_single_node_forwards_every_argument(stub_env):
    proc = train_sh(GOOD, {**stub_env, "NPROC_PER_NODE": "3"})
    assert proc.returncode == 0, proc.stderr
    assert torchrun_line(proc) == "TORCHRUN --standalone --nproc-per-node=3 -m training.trainer " + " ".join(
        GOOD
    )


def test_gpus_and_multi_node_layout_from_sm_hosts(stub_env, tmp_path):
    fake_nvidia_smi(tmp_path, 8)
    environment = {**stub_env, "SM_HOSTS": '["algo-1", "algo-2", "algo-3"]', "SM_CURRENT_HOST": "algo-2"}
    proc = train_sh(GOOD, environment)
    assert proc.returncode == 0, proc.stderr
    assert torchrun_line(proc).startswith(
        "TORCHRUN --nnodes=3 --node-rank=1 --master-addr=algo-1 --master-port=29500 --nproc-per-node=8 "
    )
    proc = train_sh(GOOD, {**environment, "MASTER_PORT": "6000"})
    assert "--master-port=6000 " in torchrun_line(proc)


@pytest.mark.parametrize("kind", list(BROKEN))
def test_an_unusable_init_from_folder_fails_before_torchrun_and_becomes_the_failure_reason(
    stub_env, tmp_path, kind
):
    folder = broken_llama(tmp_path / "source", kind)
    output = tmp_path / "output"
    environment = {**stub_env, "SM_MODEL_DIR": str(tmp_path / "sm_model"), "SM_OUTPUT_DIR": str(output)}
    args = ["--init_from", str(folder), "--precision", "fp32", "--seq-length", "32",
            "--checkpoint_dir", str(tmp_path / "ckpt"), "--model_dir", str(tmp_path / "model")]  # fmt: skip
    proc = train_sh(args, environment)
    assert proc.returncode == 2 and "TORCHRUN" not in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: invalid setting init_from: {folder}: "), (
        proc.stderr
    )
    assert BROKEN[kind] in errors[0]
    assert (output / "failure").read_text() == errors[0].removeprefix("error: ") + "\n"
    written = [name for name in ("ckpt", "model", "sm_model") if (tmp_path / name).exists()]
    assert written == []  # nothing but the failure reason
