"""train.sh under dash: help, fail-fast validation (settings and data, for the world size it will start), GPU
counting, multi-node layout, argument forwarding, and the exit status of a refusal made by the running workers.

Except in the last test, torchrun is replaced by a recording stub (PYTHON points at a wrapper that prints the
launcher's command line and runs everything else with the real interpreter), so these tests check what train.sh
would start.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.training.hf_models import BROKEN, broken_llama
from tests.training.runner import ROOT, TINY, cli_args, env

TRAIN_SH = ROOT / "training" / "train.sh"
GOOD = ["--model_preset", "custom", "--num-layers", "2", "--hidden_size", "64", "--num_heads", "4",
        "--ffn_hidden_size", "128", "--vocab_size", "256", "--seq-length", "32", "--precision", "fp32",
        "--activation_checkpointing", "True", "--max_steps", "5"]  # fmt: skip


@pytest.fixture
def stub_env(tmp_path: Path) -> dict[str, str]:
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "training.trainer.distributed.launch" ]; then shift 2; echo "TORCHRUN $*"; exit 0; fi\n'
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
        ["dash", str(TRAIN_SH), *args], env=environment, capture_output=True, text=True, timeout=300, cwd="/"
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
    # the launcher adds the node options (--standalone here: no resourceconfig.json, one host)
    assert torchrun_line(proc) == "TORCHRUN --nproc-per-node=3 -m training.trainer " + " ".join(GOOD)


def test_gpus_and_the_check_for_every_process_of_every_host_in_resourceconfig_json(stub_env, tmp_path):
    fake_nvidia_smi(tmp_path, 8)
    config = tmp_path / "opt_ml" / "input" / "config" / "resourceconfig.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"current_host": "algo-2", "hosts": ["algo-1", "algo-2", "algo-3"]}))
    environment = {**stub_env, "SAGEMAKER_BASE_DIR": str(tmp_path / "opt_ml")}
    proc = train_sh([*GOOD, "--data_parallel_replicate", "3"], environment)
    assert proc.returncode == 0, proc.stderr
    assert "layout ok: 24 processes, data_parallel_replicate=3 (set)" in proc.stdout
    assert torchrun_line(proc).startswith("TORCHRUN --nproc-per-node=8 -m training.trainer ")
    proc = train_sh([*GOOD, "--data_parallel_replicate", "5"], environment)
    assert proc.returncode == 2 and "TORCHRUN" not in proc.stdout
    assert proc.stderr.strip() == (
        "error: invalid setting data_parallel_replicate: must divide the number of GPUs (24); got 5 (3 node(s) x 8 "
        "processes); or auto"
    )


def files_in(folder: Path) -> dict[str, str]:
    """{relative path: SHA-256} of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file()
    }


def bad_bin(path: Path) -> str:
    path.write_bytes(np.arange(5000, dtype=np.uint16).tobytes() + b"x")  # 10,001 bytes of uint16
    return f"{path} has 10001 bytes, not a whole number of uint16 tokens"


def float_npy(path: Path) -> str:
    np.save(path.with_suffix(".npy"), np.zeros(6000, dtype=np.float32))
    return f"{path.with_suffix('.npy')} holds float32 values; token files hold unsigned integers"


def two_d_npy(path: Path) -> str:
    np.save(path.with_suffix(".npy"), np.zeros((60, 100), dtype=np.uint16))
    return f"{path.with_suffix('.npy')} holds a 2-D array of shape (60, 100) (6000 tokens); a token file holds one"


@pytest.mark.parametrize("damage", [bad_bin, float_npy, two_d_npy])
def test_bad_data_is_one_line_and_exit_2_before_torchrun_creating_nothing(stub_env, tmp_path, damage):
    (tmp_path / "data").mkdir()
    expected = damage(tmp_path / "data" / "train.bin")
    before = files_in(tmp_path)
    settings = {**TINY, "dataset": "channel", "data_dir": str(tmp_path / "data"),
                "checkpoint_dir": str(tmp_path / "out" / "ckpt"), "model_dir": str(tmp_path / "out" / "model")}  # fmt: skip
    proc = train_sh(cli_args(settings), {**stub_env, "NPROC_PER_NODE": "2"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(f"error: invalid setting dataset: {expected}")
    assert "TORCHRUN" not in proc.stdout
    assert files_in(tmp_path) == before and not (tmp_path / "out").exists()  # nothing lost, nothing created


def test_the_check_before_torchrun_counts_every_process_torchrun_will_start(stub_env, tmp_path):
    (tmp_path / "data").mkdir()
    (np.arange(33 * 8, dtype=np.uint16) % 200).tofile(tmp_path / "data" / "train.bin")  # 8 sequences of 33
    settings = {**TINY, "dataset": "channel", "data_dir": str(tmp_path / "data"),
                "checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model")}  # fmt: skip
    proc = train_sh(cli_args(settings), {**stub_env, "NPROC_PER_NODE": "2"})  # 2 x 4 = 8 sequences
    assert proc.returncode == 0 and "TORCHRUN" in proc.stdout
    assert f"data ok: 1 files of 264 tokens in {tmp_path / 'data'}; every token id read" in proc.stdout
    proc = train_sh(cli_args(settings), {**stub_env, "NPROC_PER_NODE": "3"})
    assert proc.returncode == 2 and "TORCHRUN" not in proc.stdout
    assert "one global batch (batch_size 4 x 3 processes) needs 12" in proc.stderr


@pytest.mark.slow
def test_on_unusable_checkpoints_fail_with_2_processes_is_one_line_and_exit_2(reference, tmp_path):
    """A refusal only the running workers can make (no checkpoint loads): train.sh exits 2 with one line, not
    torchrun's 1 and its failure report; nothing is lost, the model folder is not created."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0] / "ckpt_ref", ckpt)
    (ckpt / "step_00000012" / "__0_0.distcp").unlink()
    (ckpt / "step_00000006" / "__1_0.distcp").unlink()
    before = files_in(ckpt)
    settings = {**TINY, "max_steps": "20", "on_unusable_checkpoints": "fail", "checkpoint_dir": str(ckpt),
                "model_dir": str(tmp_path / "model")}  # fmt: skip
    environment = {**env(), "NPROC_PER_NODE": "2"}
    environment.pop("PYTHONPATH")
    proc = subprocess.run(
        ["dash", str(TRAIN_SH), *cli_args(settings)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (
        f"error: on_unusable_checkpoints=fail: no usable checkpoint in {ckpt}, 2 skipped, not training: "
        "step_00000012 (__0_0.distcp is missing; set aside, left as it is: step_00000012.unusable says why); "
        "step_00000006 (__1_0.distcp is missing; set aside, left as it is: step_00000006.unusable says why)\n"
    )
    assert "train.sh: torchrun" in proc.stdout and "step=1/" not in proc.stdout
    after = files_in(ckpt)
    assert {name: after.get(name) for name in before} == before
    assert sorted(set(after) - set(before)) == ["step_00000006.unusable", "step_00000012.unusable"]
    assert not (tmp_path / "model").exists()


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
