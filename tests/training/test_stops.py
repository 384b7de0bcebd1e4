"""Runs that stop on every rank together, through ``train.sh`` with 2 processes: a token id the check before
training did not read (it samples large data: token files, and packed conversation data) and a non-finite loss (full
fine-tuning, and LoRA's adapter-only checkpoints). Each ends in one ``error:`` line and exit
status 1; every checkpoint written before is kept, sealed, and left byte for byte as it was by a rerun; nothing
non-finite is saved."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.training.hf_models import tiny_llama
from tests.training.runner import ROOT, TINY, cli_args, env
from training.contract import metric_lines
from training.trainer import preflight
from training.trainer.checkpoint import folder as checkpoint_folder
from training.trainer.checkpoint import names
from training.trainer.data import packing, token_files
from training.trainer.distributed import launch

pytestmark = pytest.mark.slow

TRAIN_SH = ROOT / "training" / "train.sh"
TOKENS = 100_000_000
"""Above ``preflight.ID_CHECK_TOKENS``: the check before training reads a sample (a third of the file is not read),
and, as zeros of a sparse file, nothing to write or store."""


def train_sh(settings: dict[str, str]) -> tuple[int, str]:
    """``train.sh`` with 2 processes: its exit status and output. Every worker of a run that stops together ends
    when torchrun stops it: the silent one (local rank 1, waiting for the first to exit) by torchrun's SIGTERM,
    never by the SIGKILL torchrun sends after waiting its whole close timeout (30 s) for a worker that outlived
    its SIGTERM; the launcher shows torchrun's record of such a kill (``launch.KILLED_RECORD``)."""
    environment = {**env(), "NPROC_PER_NODE": "2"}
    environment.pop("PYTHONPATH")  # train.sh finds its package by itself
    proc = subprocess.run(
        ["dash", str(TRAIN_SH), *cli_args(settings)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,  # a guard: one call took ~40-60 s on the loaded 2-core machine
    )
    output = proc.stdout + proc.stderr
    assert launch.KILLED_RECORD not in output, output
    return proc.returncode, output


def checksums(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` (relative path -> digest)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def nothing_exported(model_dir: Path) -> bool:
    """No model.pt, hf/ or adapter/: at most the run's settings.json, which a run that trains writes first."""
    return not model_dir.exists() or sorted(p.name for p in model_dir.iterdir()) == ["settings.json"]


def errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if "error:" in line]


def bad_id_where_step_reads(folder: Path, settings: dict[str, str], step: int) -> tuple[Path, int]:
    """A sparse token file of ``TOKENS`` zeros with id 300 in a window one rank reads at ``step`` and the check's
    sample does not cover; returns the file and the id's position."""
    folder.mkdir()
    path = folder / "tokens.bin"
    with open(path, "wb") as handle:
        handle.truncate(TOKENS * 2)
    sampled = preflight._ranges(TOKENS, preflight.ID_CHECK_TOKENS)
    batch, seq = int(settings["batch_size"]), int(settings["seq_length"])
    for rank in (0, 1):
        source = token_files.TokenFiles([path], "uint16", 256, seq, batch, 1234, rank, 2)
        for j in range(batch):
            _, begin = source._where(((step - 1) * 2 + rank) * batch + j)
            if all(end <= begin or first >= begin + seq + 1 for first, end in sampled):
                with open(path, "r+b") as handle:
                    handle.seek(2 * (begin + 3))
                    handle.write(np.array([300], dtype=np.uint16).tobytes())
                return path, begin + 3
    raise AssertionError("no window of that step lies outside the sample: choose another step")


def bad_id_stop_line(path: Path, at: int, ckpt: Path) -> str:
    """The one line every rank stops with when the batch of step 3 holds id 300 at token ``at`` of ``path``."""
    return (
        f"error: vocab_size: must be above every token id in the data; {path} holds id 300 (token {at}), got 256, "
        "in the batch of step 3: the check before training reads a sample of large data; stopped after step 2: "
        f"the newest checkpoint, {ckpt / 'step_00000002'}, is kept; fix or remove that file, then run again to "
        "continue from there"
    )


def unseal(folder: Path) -> None:
    """What a save written whole but never sealed leaves (a run killed before its seal)."""
    (folder / names.MARKER).unlink()
    folder.rename(folder.with_name(folder.name + ".tmp"))


def test_a_bad_token_id_past_the_checks_sample_stops_every_rank_in_one_line_and_reruns_resume_there(tmp_path):
    """The id is in a batch of step 3 (past the sample the check before training read). With asynchronous saves
    (the default) and checkpoint_interval 2: the run stops after step 2 with one line naming the file and the
    position, its step-2 save sealed; a rerun that finds that save written whole but unsealed (a run killed before
    its seal) seals it, resumes there and stops there again, changing nothing. (A rerun from the sealed save: the
    packed conversations' test below.)"""
    ckpt = tmp_path / "ckpt"
    settings = {**TINY, "dataset": "channel", "data_dir": str(tmp_path / "data"), "max_steps": "10",
                "checkpoint_interval": "2", "checkpoint_dir": str(ckpt), "model_dir": str(tmp_path / "model")}  # fmt: skip
    path, at = bad_id_where_step_reads(tmp_path / "data", settings, 3)
    line = bad_id_stop_line(path, at, ckpt)
    status, output = train_sh(settings)
    assert status == 1, output
    assert errors(output) == [line], output
    assert "Traceback" not in output and "FAILED" not in output  # no worker's traceback, no torchrun block
    assert "step=2/10" in output and "step=3/10" not in output
    assert "token ids sampled" in output  # the check before training read a sample
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000002"]
    assert checkpoint_folder.complete_checkpoints(ckpt)[0][0] == 2 and nothing_exported(tmp_path / "model")
    before = checksums(ckpt)

    unseal(ckpt / "step_00000002")
    status, output = train_sh(settings)
    assert status == 1 and errors(output) == [line], output
    assert "checkpoint step_00000002.tmp: every file of its save was written" in output
    assert (
        "sealed now as step_00000002" in output
        and f"resumed from {ckpt / 'step_00000002'} at step 2" in output
    )
    assert "step=3/10" not in output
    assert checksums(ckpt) == before  # COMPLETE included: the same bytes the first seal wrote


def finite(folder: Path, scratch: Path) -> bool:
    """Whether every tensor of the checkpoint ``folder`` (model and optimizer state) is finite."""
    dcp_to_torch_save(str(folder), str(scratch))
    state = torch.load(scratch, weights_only=False)
    tensors: list[torch.Tensor] = []

    def collect(value: object) -> None:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list | tuple):
            for item in value:
                collect(item)

    collect(state)
    return bool(tensors) and all(
        bool(torch.isfinite(t.float()).all()) for t in tensors if t.is_floating_point()
    )


def diverges_and_keeps_every_good_checkpoint(
    settings: dict[str, str], tmp_path: Path, losses: str, earliest: int
) -> tuple[str, list[tuple[int, Path]]]:
    """Run ``settings`` (16 steps, a checkpoint after each) through ``train.sh`` to its non-finite stop: one
    ``error:`` line naming the step (from ``earliest`` on) whose loss (``losses``: a regex) was not finite and the
    newest checkpoint, the one before it; every step before it logged and checkpointed (finite), none after it, no
    model file or export; a rerun resumes from that checkpoint, stops with the same line and changes no file.
    Returns the first run's output and its checkpoints."""
    ckpt = Path(settings["checkpoint_dir"])
    status, output = train_sh(settings)
    assert status == 1, output
    (line,) = errors(output)
    match = re.fullmatch(
        rf"error: non-finite training: step (\d+) gave loss ({losses}) \(rank \d\); stopped before saving "
        r"anything from that step on: every checkpoint written before it is kept \(the newest: (.+)\); lower "
        r"learning_rate \(or raise lr_warmup_steps\), or train in another precision",
        line,
    )
    assert match, line
    bad = int(match.group(1))
    assert earliest <= bad <= 16 and match.group(3) == str(ckpt / names.step_dir_name(bad - 1)), line
    assert "Traceback" not in output and "FAILED" not in output
    assert f"step={bad}/16" in output and f"step={bad + 1}/16" not in output
    saved = checkpoint_folder.complete_checkpoints(ckpt)
    assert [step for step, _ in saved] == list(range(1, bad))
    assert sorted(p.name for p in ckpt.iterdir()) == [names.step_dir_name(s) for s in range(1, bad)]
    for step, folder in saved:
        assert finite(folder, tmp_path / f"state_{step}.pt"), folder
    assert nothing_exported(Path(settings["model_dir"]))  # no model.pt, no hf/, no adapter/
    before = checksums(ckpt)

    status, rerun = train_sh(settings)
    assert status == 1 and errors(rerun) == [line], rerun
    assert f"resumed from {ckpt / names.step_dir_name(bad - 1)} at step {bad - 1}" in rerun
    assert checksums(ckpt) == before and nothing_exported(Path(settings["model_dir"]))
    return output, saved


def test_a_run_that_diverges_stops_before_saving_anything_non_finite_and_keeps_every_good_checkpoint(
    tmp_path,
):
    """fp16 at learning rate 10 (after 6 warm-up steps) diverges: the first step whose loss is not finite stops the
    run in one line naming it; every checkpoint of the steps before it is kept and finite, none after it, no model
    file or export; a rerun resumes from the last good one, stops at the same step and changes nothing."""
    settings = {**TINY, "precision": "fp16", "learning_rate": "10", "lr_warmup_steps": "6", "max_steps": "16",
                "checkpoint_interval": "1", "keep_checkpoints": "100", "checkpoint_dir": str(tmp_path / "ckpt"),
                "model_dir": str(tmp_path / "model")}  # fmt: skip
    diverges_and_keeps_every_good_checkpoint(settings, tmp_path, losses="nan", earliest=3)


def test_an_init_from_model_with_a_nan_is_refused_before_step_1_naming_the_tensor(tmp_path):
    """The check before torchrun reads only the files' headers; the values are read once, as the ranks load their
    shares: each checks its own rows and they refuse together, in one line naming the tensor and its file."""
    from safetensors.torch import load_file, save_file

    source = tmp_path / "source"
    tiny_llama(source, tied=False)
    name = "model.layers.1.mlp.up_proj.weight"
    index = json.loads((source / "model.safetensors.index.json").read_text())
    shard = source / index["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name][5, 7] = float("nan")
    save_file(tensors, str(shard), metadata={"format": "pt"})
    settings = {"init_from": str(source), "precision": "fp32", "seq_length": "32", "max_steps": "4",
                "checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model")}  # fmt: skip
    status, output = train_sh(settings)
    assert status == 2, output
    assert errors(output) == [
        f"error: init_from: {source}: {name} in {shard.name} holds 1 non-finite value(s) (nan); a model cannot be "
        "trained from non-finite weights: use another folder, or repair that tensor"
    ], output
    assert not [line for line in output.splitlines() if line.startswith("step=")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


def packed_chat_with_a_bad_id(folder: Path, settings: dict[str, str], step: int) -> tuple[Path, int]:
    """Conversation data in ``prepare --init-from``'s layout (``metadata.json`` of kind chat; tokens, loss mask and
    example offsets), ``TOKENS`` tokens of examples of 1,536 and 512 tokens (packed two to a window of 2,048), the
    windows the run reads up to ``step`` trained (their answers' mask set), and id 300 in a window one rank reads
    at ``step`` that the check's sample does not cover; returns the token file and the id's position."""
    folder.mkdir()
    seq = int(settings["seq_length"])
    lengths = np.tile([seq * 3 // 4, seq // 4], TOKENS // seq)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])
    tokens, mask = folder / "train.bin", folder / "train.mask"
    with open(tokens, "wb") as handle:
        handle.truncate(total * 2)
    with open(mask, "wb") as handle:
        handle.truncate(total)
    offsets.tofile(folder / "train.docs")
    split = {"files": ["train.bin"], "masks": ["train.mask"], "documents": ["train.docs"], "tokens": total}
    meta = {"format": "training.trainer.prepare/1", "kind": packing.CHAT_KIND, "token_dtype": "uint16",
            "vocab_size": 256, "splits": {"train": split}}  # fmt: skip
    (folder / token_files.METADATA_FILE).write_text(json.dumps(meta))
    sampled = preflight._ranges(total, preflight.ID_CHECK_TOKENS)
    accum, batch = int(settings["grad_accum_steps"]), int(settings["batch_size"])
    marks = np.memmap(mask, dtype=np.uint8, mode="r+")
    bad = None
    for rank in (0, 1):  # the windows as the trainer reads them: an optimizer step's on each rank
        source = packing.Conversations(folder, "train", token_dtype="uint16", seq_length=seq, seed=1234, rank=rank,
                                       batch_size=batch * accum, world_size=2)  # fmt: skip
        for position in range(step):
            for j in range(batch * accum):
                window = source.windows[source._window_index((position * 2 + rank) * batch * accum + j)]
                for example in window:
                    begin, end = int(offsets[example]), int(offsets[example + 1])
                    marks[(begin + end) // 2 : end] = 1  # the second half: the answer
                    at = begin + 3
                    if bad is None and position == step - 1 and all(e <= at or f > at for f, e in sampled):
                        bad = at
    marks.flush()
    if bad is None:
        raise AssertionError("no example of that step lies outside the sample: choose another step")
    with open(tokens, "r+b") as handle:
        handle.seek(2 * bad)
        handle.write(np.array([300], dtype=np.uint16).tobytes())
    return tokens, bad


def test_a_bad_token_id_in_packed_conversations_past_the_checks_sample_stops_in_one_line_and_keeps_the_save(
    tmp_path,
):
    """Packed conversation data read two micro-batches a step (grad_accum_steps 2): the id is in an example of a
    window of step 3; the run stops after step 2 in one line naming the token file and the position, its step-2
    save sealed and kept; a rerun resumes there and stops again, changing nothing."""
    ckpt = tmp_path / "ckpt"
    settings = {**TINY, "dataset": "channel", "data_dir": str(tmp_path / "data"), "seq_length": "2048",
                "batch_size": "1", "grad_accum_steps": "2", "max_steps": "10", "checkpoint_interval": "2",
                "checkpoint_dir": str(ckpt), "model_dir": str(tmp_path / "model")}  # fmt: skip
    path, at = packed_chat_with_a_bad_id(tmp_path / "data", settings, 3)
    line = bad_id_stop_line(path, at, ckpt)
    status, output = train_sh(settings)
    assert status == 1, output
    assert errors(output) == [line], output
    assert "Traceback" not in output and "FAILED" not in output
    assert "token ids sampled" in output and "packed, best-fit decreasing" in output  # the check (preflight)
    assert "step=2/10" in output and "step=3/10" not in output
    steps = [metric_lines.parse_step_line(row) for row in output.splitlines() if row.startswith("step=")]
    assert all(s[1]["trained_tokens"] > 0 for s in steps if s)  # the marked answers trained
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000002"]
    assert nothing_exported(tmp_path / "model")
    before = checksums(ckpt)

    status, output = train_sh(settings)
    assert status == 1 and errors(output) == [line], output
    assert f"resumed from {ckpt / 'step_00000002'} at step 2" in output and "step=3/10" not in output
    assert checksums(ckpt) == before


def test_a_lora_run_that_diverges_stops_before_saving_and_keeps_its_adapter_only_checkpoints(tmp_path):
    """LoRA adapters in fp16 at learning rate 10 diverge: the first non-finite step stops the run in one line; the
    adapter-only checkpoints before it are kept and finite, none after it, no model file, merged folder or peft
    adapter; a rerun resumes from the last good one (its frozen base compared) and stops at the same step."""
    settings = {**TINY, "precision": "fp16", "learning_rate": "10", "lr_warmup_steps": "6", "max_steps": "16",
                "lora_rank": "4", "lora_targets": "q,v,o,gate,down", "checkpoint_interval": "1",
                "keep_checkpoints": "100", "checkpoint_dir": str(tmp_path / "ckpt"),
                "model_dir": str(tmp_path / "model")}  # fmt: skip
    output, saved = diverges_and_keeps_every_good_checkpoint(
        settings, tmp_path, losses="nan|inf|-inf", earliest=2
    )
    assert "lora rank=4" in output
    for _, folder in saved:
        assert json.loads((folder / names.MARKER).read_text())["model_shape"]["lora"]["lora_rank"] == 4
