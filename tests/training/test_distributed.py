"""End-to-end trainer runs: 2 processes under real torchrun on gloo, a tiny model, CPU."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.training.agreement import assert_same_printed, assert_same_weights
from tests.training.checkpoint_places import FolderPlace, S3Place, complete, copy_in
from tests.training.runner import (
    REFERENCE_STEPS,
    ROOT,
    TINY,
    env,
    fields,
    losses,
    reference_settings,
    run_trainer,
    step_lines,
    torchrun_cmd,
)
from training.contract import container, metric_lines
from training.trainer.checkpoint.folder import complete_checkpoints
from training.trainer.checkpoint.names import step_dir_name

pytestmark = pytest.mark.slow
STEPS = REFERENCE_STEPS
LEARNING_RATE = float(TINY["learning_rate"])
settings = reference_settings


def load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(model_dir / "model.pt", weights_only=False)["state_dict"]


def test_loss_falls_on_synthetic_data(reference):
    _, output = reference
    by_step = {step: float(loss) for step, loss in losses(output).items()}
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert by_step[STEPS] < by_step[1] - 1.0


def test_activation_checkpointing_gives_the_same_losses(reference, tmp_path):
    _, output = reference
    with_ac = run_trainer(settings(tmp_path, "ac", activation_checkpointing="true"))
    assert "activation_checkpointing=full" in with_ac
    assert losses(with_ac) == losses(output)
    for name, tensor in load_weights(tmp_path / "model_ac").items():
        torch.testing.assert_close(
            tensor, load_weights(reference[0] / "model_ref")[name], rtol=1e-6, atol=1e-6
        )


def test_chunked_loss_gives_the_same_training(reference, tmp_path):
    """128 tokens per rank in chunks of 48, 48 and 32 (recomputed in backward) against the reference's one chunk."""
    _, output = reference
    chunked = run_trainer(settings(tmp_path, "chunk", loss_chunk_tokens="48"))
    assert "loss_chunk_tokens=48" in chunked
    # the same training, within fp32 round-off of another summation order: agreement's docstring says how close
    assert_same_printed(chunked, output)
    assert_same_weights(
        load_weights(tmp_path / "model_chunk"), load_weights(reference[0] / "model_ref"), LEARNING_RATE
    )


def resume_from_step_6(reference, tmp_path: Path, name: str, place=None) -> tuple[str, Path]:
    """A run that finds the reference's step-6 checkpoint in its own folder (or ``place``) and trains to the end."""
    ref_dir, _ = reference
    ckpt = tmp_path / f"ckpt_{name}"
    if place is None:
        ckpt.mkdir(exist_ok=True)
        shutil.copytree(ref_dir / "ckpt_ref" / "step_00000006", ckpt / "step_00000006")
        return run_trainer(settings(tmp_path, name)), ckpt
    copy_in(place, ref_dir / "ckpt_ref" / "step_00000006", "step_00000006")
    return run_trainer(settings(tmp_path, name, checkpoint_dir=place.setting)), ckpt


def test_resume_continues_bit_for_bit(reference, tmp_path, place):
    """From a folder and from a run's S3 prefix alike: the losses, learning rates and gradient norms of the
    uninterrupted run, and its final weights bit for bit."""
    ref_dir, ref_output = reference
    output, _ = resume_from_step_6(reference, tmp_path, "resume", place)
    assert "at step 6" in output and str(place.where("step_00000006")) in output
    assert sorted(step_lines(output)) == list(range(7, STEPS + 1))
    for step in range(7, STEPS + 1):
        # loss, lr and grad_norm as printed; throughput fields differ by nature
        keys = ("loss", "lr", "grad_norm")
        assert [fields(step_lines(output)[step])[k] for k in keys] == [
            fields(step_lines(ref_output)[step])[k] for k in keys
        ]
    resumed, uninterrupted = load_weights(tmp_path / "model_resume"), load_weights(ref_dir / "model_ref")
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in resumed.items():
        assert torch.equal(tensor, uninterrupted[name]), name
    assert complete(place) == ["step_00000006", "step_00000012"]


def test_metric_definitions_read_real_trainer_output(reference):
    _, output = reference
    last = step_lines(output)[STEPS]
    summary = next(line for line in output.splitlines() if line.startswith("summary "))
    parsed = metric_lines.parse_metric_line(last)
    printed = fields(last)
    # on a CPU there is no peak, so no MFU (rather than a 0), and fp32 has no bf16-equivalent one; no caching
    # allocator either, so of the memory over every rank only the peak resident set; synthetic data has no
    # validation split, so no val_loss; a first run found no checkpoints at all, so no unusable_checkpoints; a
    # next-token run prints no preference fields (DPO_STEP_METRICS: tests/training/preference read them)
    skipped = ("mfu", "mfu_bf16", *metric_lines.DPO_STEP_METRICS)
    step_keys = [k for k in metric_lines.STEP_METRICS if k not in skipped]
    assert {f"train:{k}" for k in step_keys} == set(parsed)
    for key in step_keys:
        assert parsed[f"train:{key}"] == float(printed[key])
    parsed_summary = metric_lines.parse_metric_line(summary)
    summary_keys = {
        k
        for k in metric_lines.SUMMARY_METRICS
        if k
        not in (
            "steps",
            "val_loss",
            "val_accuracy",
            "empty_micro_batches",
            "mfu",
            "mfu_bf16",
            "unusable_checkpoints",
            "max_reserved_gb",
            "alloc_retries",
            "alloc_ooms",
            "val_reward_accuracy",
            "val_reward_margin",
        )
    }
    assert {f"final:{k}" for k in summary_keys} == set(parsed_summary)
    for key, value in fields(summary).items():
        if key != "steps":
            assert parsed_summary[f"final:{key}"] == float(value)
    assert float(fields(summary)["final_loss"]) == float(printed["loss"])
    assert float(fields(summary)["max_allocated_gb"]) >= float(
        fields(summary)["peak_mem_gb"]
    )  # over every rank
    config = next(line for line in output.splitlines() if line.startswith("config "))
    assert metric_lines.parse_metric_line(config) == {}


def run_until_sigterm(cfg: dict[str, str], after_step_seen: int) -> str:
    """Start the trainer, send SIGTERM to torchrun once ``after_step_seen`` steps were logged; return output."""
    proc = subprocess.Popen(
        torchrun_cmd(cfg), env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("step=") and len(step_lines("".join(seen))) >= after_step_seen:
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return "".join(seen) + rest


def test_sigterm_saves_a_complete_checkpoint_and_the_next_start_resumes(tmp_path):
    """SIGTERM with an asynchronous save (the default): the save of the step it stopped at is sealed before the
    processes end, and the next start resumes there (S3 direct: the second run of the SIGKILL test below)."""
    place = FolderPlace(tmp_path / "ckpt_term")
    cfg = settings(
        tmp_path, "term", max_steps="100000", checkpoint_interval="0", checkpoint_dir=place.setting
    )
    first = run_until_sigterm(cfg, after_step_seen=3)
    assert "stopping at step" in first, first
    stopped_at = max(step_lines(first))
    assert complete(place) == [step_dir_name(stopped_at)]
    assert not Path(cfg["model_dir"], "model.pt").exists()  # stopped early: no final model

    second = run_until_sigterm(cfg, after_step_seen=2)
    assert f"at step {stopped_at}" in second
    assert min(step_lines(second)) == stopped_at + 1
    assert complete(place)[-1] == step_dir_name(max(step_lines(second)))


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts each worker in a session of its own, so no process group
    holds them all)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def run_until_killed(cfg: dict[str, str], seals_seen: int) -> str:
    """Start the trainer; once it has printed ``seals_seen`` sealed checkpoints, SIGKILL torchrun and every worker
    at once (no process gets to finish anything); return the output."""
    proc = subprocess.Popen(
        torchrun_cmd(cfg), env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: list[str] = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if sum("checkpoint saved to " in x for x in seen) >= seals_seen:
                for pid in [*_descendants(proc.pid), proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                break
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return "".join(seen) + rest


def test_a_run_killed_with_sigkill_resumes_from_its_newest_sealed_s3_checkpoint(
    tmp_path, s3_server, s3_bucket
):
    """S3 direct, the trainer under torchrun on gloo against moto's server on loopback: every process SIGKILLed
    right after its second sealed save (the next one may be uploading). Nothing is set aside; a save the kill cut
    short is reported incomplete and left as it is (or, when every rank's upload had completed, sealed from the
    receipts); the next start resumes from the newest sealed checkpoint at the step after it, and the SIGTERM that
    ends it seals the save of the step it stopped at before the processes end."""
    place = S3Place(s3_server.client(), s3_bucket)
    cfg = settings(
        tmp_path, "killed", max_steps="100000", checkpoint_interval="2", checkpoint_dir=place.setting
    )
    first = run_until_killed(cfg, seals_seen=2)
    sealed_before = complete(place)
    assert len(sealed_before) >= 2, first[-3000:]

    second = run_until_sigterm(cfg, after_step_seen=2)
    resumed = re.search(r"resumed from (\S+) at step (\d+)", second)
    assert resumed is not None, second[-3000:]
    step = int(resumed.group(2))
    assert resumed.group(1) == place.where(step_dir_name(step))
    assert step >= int(sealed_before[-1].removeprefix("step_")) and min(step_lines(second)) == step + 1
    assert not any(name.endswith(".unusable") for name in place.names())  # a kill is never damage
    sealed = complete(place)
    for name in place.names():
        if name not in sealed:
            assert f"{name} (incomplete: no COMPLETE marker, an interrupted write; left as it is)" in second
    # the SIGTERM save, under the next free name when the killed run's cut-short save holds the step's own
    assert sealed[-1].split("-")[0] == step_dir_name(max(step_lines(second)))


def test_an_earlier_runs_checkpoint_in_the_resume_channel_is_continued_and_left_alone(reference, tmp_path):
    """The workflow's resume_from: the earlier run's checkpoint arrives read-only as the resume channel."""
    ref_dir, ref_output = reference
    channel = tmp_path / "input" / "data" / container.RESUME_CHANNEL
    shutil.copytree(ref_dir / "ckpt_ref" / "step_00000006", channel)
    before = {p.name: p.read_bytes() for p in channel.iterdir()}
    for path in (channel, *channel.iterdir()):
        path.chmod(0o555 if path.is_dir() else 0o444)
    child_env = {**env(), f"SM_CHANNEL_{container.RESUME_CHANNEL.upper()}": str(channel)}
    proc = subprocess.run(
        torchrun_cmd(settings(tmp_path, "continued")),
        env=child_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert f"resumed from {channel} at step 6" in output
    assert losses(output) == {s: v for s, v in losses(ref_output).items() if s > 6}
    assert {p.name: p.read_bytes() for p in channel.iterdir()} == before
    assert [step for step, _ in complete_checkpoints(tmp_path / "ckpt_continued")] == [12]
