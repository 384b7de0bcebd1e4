"""Resume in real life: damaged checkpoints set aside by all ranks, a different model shape refused, a finished
run left alone, max_steps raised, a validation loss on real text. Real torchrun/gloo runs of a tiny model."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training import checkpoint_places as places
from tests.training.runner import (
    PYTHON,
    ROOT,
    TINY,
    cli_args,
    env,
    fields,
    losses,
    reference_settings,
    run_single,
    run_trainer,
    step_lines,
    torchrun_cmd,
)
from training.contract import container, metric_lines, settings_table
from training.prepare import corpus
from training.trainer.checkpoint import names as checkpoint_names
from training.trainer.checkpoint.folder import complete_checkpoints

pytestmark = pytest.mark.slow


def settings(
    tmp: Path, place: places.FolderPlace | places.S3Place | None = None, **extra: str
) -> dict[str, str]:
    """The reference run's settings, its checkpoints in ``place`` (default: the folder ``tmp/ckpt``)."""
    ckpt = place.setting if place is not None else str(tmp / "ckpt")
    return {**reference_settings(tmp, "x", **extra), "checkpoint_dir": ckpt, "model_dir": str(tmp / "model")}


def damage(path: Path) -> None:
    """Flip bytes in the middle of ``path``; its size stays the same (a truncation check cannot see it)."""
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 8] = bytes(b ^ 0xFF for b in raw[middle : middle + 8])
    path.write_bytes(bytes(raw))


def copy_checkpoint(reference, step: int, place: places.FolderPlace | places.S3Place, as_step: int) -> str:
    """The reference run's checkpoint of ``step`` into ``place`` as that of ``as_step`` (its marker says so; its
    trainer state still says ``step``); returns its name."""
    source = reference[0] / "ckpt_ref" / checkpoint_names.step_dir_name(step)
    name = checkpoint_names.step_dir_name(as_step)
    return places.copy_in(place, source, name, None if as_step == step else as_step)


def contents(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def skipped_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("checkpoints skipped")]
    assert len(lines) == 1, output
    return lines[0]


def test_each_damage_to_the_newest_checkpoint_is_set_aside_with_its_reason_and_the_previous_one_resumes(
    reference, tmp_path, place
):
    """One run, each damage mode on a newer checkpoint than the good one at step 6: every one is set aside on
    every rank and named with its reason in one line, the incomplete folders are reported and left as they are,
    the run resumes at step 6 exactly, its step-12 checkpoint goes to a free name, and keep_checkpoints=1 prunes
    only the checkpoints this run loaded or wrote. In a folder and in a run's S3 prefix alike (S3 has no ``.tmp``
    stage: its interrupted write is the checkpoint without a marker)."""
    copy_checkpoint(reference, 6, place, 3)  # older than the one loaded: not this run's, never pruned
    copy_checkpoint(reference, 6, place, 6)
    size = {p.name: p.stat().st_size for p in (reference[0] / "ckpt_ref" / "step_00000012").iterdir()}
    newer = {step: copy_checkpoint(reference, 12, place, step) for step in (7, 8, 9, 10, 11, 13, 14, 15)}
    places.truncate(place, f"{newer[7]}/__1_0.distcp")
    places.truncate(place, f"{newer[8]}/.metadata")
    places.truncate(place, f"{newer[9]}/rank_00001.pt")
    # rank 1 hashes rank_00001.pt: the local ranks take turns over the sorted names (.metadata, STARTED,
    # __0_0.distcp, __1_0.distcp, rank_00000.pt, rank_00001.pt); on S3 each rank its own shards, then the rest
    # in turns (.metadata, STARTED, rank_00000.pt, rank_00001.pt)
    places.damage(place, f"{newer[10]}/rank_00001.pt")
    place.delete(f"{newer[11]}/__0_0.distcp")
    place.write(f"{newer[13]}/{checkpoint_names.MARKER}", b'{"world_size": 2, "files": {".meta')
    places.truncate(
        place, f"{newer[14]}/rank_00001.pt"
    )  # sealed with its new size and checksum: rank 1's load fails
    places.reseal(place, newer[14])
    places.damage(place, f"{newer[15]}/.metadata")  # rank 0 hashes .metadata
    unsealed = copy_checkpoint(reference, 12, place, 12)
    place.delete(
        f"{unsealed}/{checkpoint_names.MARKER}"
    )  # an interrupted write (or a partial sync) at the step the run saves
    if place.kind == "folder":
        shutil.copytree(reference[0] / "ckpt_ref" / "step_00000012", tmp_path / "ckpt" / "step_00000012.tmp")
    before = place.contents()
    output = run_trainer(settings(tmp_path, place, keep_checkpoints="1"))
    line = skipped_line(output)
    reasons = {
        7: f"__1_0.distcp has {size['__1_0.distcp'] // 2} bytes, COMPLETE lists {size['__1_0.distcp']}",
        8: f".metadata has {size['.metadata'] // 2} bytes, COMPLETE lists {size['.metadata']}",
        9: f"rank_00001.pt has {size['rank_00001.pt'] // 2} bytes, COMPLETE lists {size['rank_00001.pt']}",
        10: "rank 1: checksum mismatch in rank_00001.pt",
        11: "__0_0.distcp is missing",
        13: "unreadable COMPLETE marker (JSONDecodeError: ",
        14: "load failed on rank 1: RuntimeError: PytorchStreamReader failed",
        15: "rank 0: checksum mismatch in .metadata",
    }
    for step, reason in reasons.items():
        name = checkpoint_names.step_dir_name(step)
        assert (
            f"{name} ({reason}" in line and f"set aside, left as it is: {name}.unusable says why)" in line
        ), (
            step,
            line,
        )
    assert "load failed on rank 0" not in line
    assert "step_00000012 (incomplete: no COMPLETE marker, an interrupted write; left as it is)" in line
    if place.kind == "folder":
        assert "step_00000012.tmp (incomplete: an interrupted write; left as it is)" in line
    assert line.endswith(f"resuming from {place.where('step_00000006')}")
    assert losses(output) == {s: v for s, v in losses(reference[1]).items() if s > 6}
    assert f"checkpoint saved to {place.where('step_00000012-2')}" in output
    summary = next(x for x in output.splitlines() if x.startswith("summary "))
    assert "restarted_from" not in summary and "unusable_checkpoints" not in summary  # it resumed
    damaged = {checkpoint_names.step_dir_name(step) for step in reasons}
    tmp = ["step_00000012.tmp"] if place.kind == "folder" else []
    assert place.names() == sorted(
        ["step_00000003", "step_00000012", "step_00000012-2", *tmp]
        + [*damaged, *(f"{name}.unusable" for name in damaged)]
    )  # step 6 (loaded) pruned by keep_checkpoints=1; step 3 was not this run's
    after = place.contents()
    kept = {key: value for key, value in before.items() if not key.startswith("step_00000006/")}
    assert {key: after.get(key) for key in kept} == kept  # set aside and left exactly as they were
    for step, reason in reasons.items():
        record = json.loads(after[f"{checkpoint_names.step_dir_name(step)}.unusable"])
        assert record["reason"].startswith(reason) and record["folder"] == checkpoint_names.step_dir_name(
            step
        )
    assert places.complete(place) == ["step_00000003", "step_00000012-2"]


def test_when_no_checkpoint_loads_one_line_says_why_training_starts_at_step_0_and_nothing_is_lost(
    reference, tmp_path, place
):
    damage_name = copy_checkpoint(reference, 12, place, 12)
    places.damage(place, f"{damage_name}/__1_0.distcp")
    # written before checksums existed: only its load can fail (an unpicklable .metadata), after it has
    # touched nothing or part of the model; the run must start from a clean model all the same
    legacy = copy_checkpoint(reference, 6, place, 6)
    marker = json.loads(place.read(f"{legacy}/{checkpoint_names.MARKER}"))
    place.write(
        f"{legacy}/{checkpoint_names.MARKER}",
        json.dumps({k: v for k, v in marker.items() if k != "sha256"}).encode(),
    )
    places.damage(place, f"{legacy}/.metadata")
    # an interrupted write at a step the new run saves (a folder: an empty .tmp; S3: a second save's STARTED)
    interrupted = "step_00000006.tmp" if place.kind == "folder" else "step_00000006-2"
    if place.kind == "folder":
        (tmp_path / "ckpt" / interrupted).mkdir()
    else:
        place.write(f"{interrupted}/STARTED", b"{}")
    before = place.contents()
    output = run_trainer(settings(tmp_path, place, keep_checkpoints="1"))
    line = skipped_line(output)
    assert line.endswith("no usable checkpoint: starting from step 0"), output
    assert "checksum mismatch in __1_0.distcp" in line and "step_00000006 (load failed on rank" in line
    why = "" if place.kind == "folder" else "no COMPLETE marker, "
    assert f"{interrupted} (incomplete: {why}an interrupted write; left as it is)" in line
    assert "[rank0]: Traceback" not in output and "[rank1]: Traceback" not in output  # DCP logs its own
    assert losses(output) == losses(reference[1])  # from scratch, exactly as the first run
    summary = next(x for x in output.splitlines() if x.startswith("summary "))
    assert summary.endswith(" unusable_checkpoints=3 restarted_from: none (3 checkpoints unusable)")
    assert metric_lines.parse_metric_line(summary)["final:unusable_checkpoints"] == 3
    saved_6 = "step_00000006-2" if place.kind == "folder" else "step_00000006-3"
    assert (
        f"checkpoint saved to {place.where(saved_6)}" in output
    )  # the folder and the .tmp's names are taken
    assert (
        f"checkpoint saved to {place.where('step_00000012-2')}" in output
    )  # a set-aside folder is never written into
    assert place.names() == sorted(
        [
            "step_00000006",
            interrupted,
            "step_00000006.unusable",
            "step_00000012",
            "step_00000012-2",
            "step_00000012.unusable",
        ]
    )  # fmt: skip  (step_00000006-2 (-3 on S3) pruned by keep_checkpoints=1: this run wrote it)
    after = place.contents()
    assert {key: after.get(key) for key in before} == before  # set aside and left exactly as they were


def test_a_different_model_shape_is_refused_with_one_line_naming_both(reference, tmp_path, place):
    copy_checkpoint(reference, 12, place, 12)
    status, output = run_single(settings(tmp_path, place, num_layers="3", max_steps="20"))
    assert status == 2, output
    assert output.strip().splitlines() == [
        f"error: invalid setting checkpoint_dir: {place.where('step_00000012')} holds a model of shape "
        "(num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=128, vocab_size=256), but this run's shape is "
        "(num_layers=3, hidden_size=64, num_heads=4, ffn_hidden_size=128, vocab_size=256); use another "
        "checkpoint_dir or the checkpoint's model settings"
    ]


def test_a_nope_checkpoint_from_before_rope_resumes_with_position_encoding_none_only(tmp_path):
    """Checkpoints written before position_encoding existed record only the shape; those models were NoPE."""
    first = {**settings(tmp_path, max_steps="4", checkpoint_interval="4"), "position_encoding": "none"}
    status, output = run_single(first)
    assert status == 0 and "Hugging Face export skipped: position_encoding=none" in output, output
    marker_path = tmp_path / "ckpt" / "step_00000004" / checkpoint_names.MARKER
    marker = json.loads(marker_path.read_text())
    assert marker["model_shape"]["position_encoding"] == "none" and "rope_theta" not in marker["model_shape"]
    old_shape = {k: v for k, v in marker["model_shape"].items() if k in settings_table.MODEL_DIM_NAMES}
    marker_path.write_text(json.dumps({**marker, "model_shape": old_shape}))  # as written before RoPE

    status, output = run_single({**settings(tmp_path, max_steps="6"), "rope_theta": "20000"})  # rope: default
    assert status == 2, output
    assert output.strip().splitlines() == [
        f"error: invalid setting checkpoint_dir: {marker_path.parent} holds a model trained with "
        "position_encoding=none, but this run has position_encoding=rope, rope_theta=20000; use another "
        "checkpoint_dir or the checkpoint's model settings"
    ]
    status, output = run_single({**first, "max_steps": "6"})
    assert status == 0, output
    assert f"resumed from {marker_path.parent} at step 4" in output and "summary steps=6 " in output


def listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every file with its size and modification time (folders' times change with the writability probe)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def test_a_finished_run_says_so_writes_nothing_and_exits_0(reference, tmp_path, place):
    for step in (6, 12):
        copy_checkpoint(reference, step, place, step)
    shutil.copytree(reference[0] / "model_ref", tmp_path / "model")
    before, kept = listing(tmp_path), place.contents()
    status, output = run_single(settings(tmp_path, place))
    assert status == 0, output
    assert "run already complete: the newest checkpoint is at step 12 and max_steps=12" in output
    assert "nothing trained, nothing written" in output
    assert "summary" not in output and "nan" not in output
    assert listing(tmp_path) == before and place.contents() == kept


def test_a_finished_run_with_an_empty_model_folder_writes_the_checkpoints_model(reference, tmp_path):
    shutil.copytree(reference[0] / "ckpt_ref", tmp_path / "ckpt")
    status, output = run_single(settings(tmp_path))
    assert status == 0 and "held no model, so the checkpoint's model was saved to" in output, output
    assert f"Hugging Face model (float32) exported to {tmp_path / 'model' / 'hf'}" in output
    saved = torch.load(tmp_path / "model" / "model.pt", weights_only=False)
    expected = torch.load(reference[0] / "model_ref" / "model.pt", weights_only=False)
    assert saved["step"] == 12 and saved["state_dict"].keys() == expected["state_dict"].keys()
    for name, tensor in saved["state_dict"].items():
        assert torch.equal(tensor, expected["state_dict"][name]), name


def test_an_end_of_run_export_interrupted_by_sigkill_is_completed_by_a_rerun(reference, tmp_path):
    """A job killed while it exported (model.pt written, hf.partial/ half written, no hf/): the rerun finds the run
    complete and makes the export, the same files an uninterrupted run made; the checkpoints and model.pt are left
    as they are, and a third run writes nothing."""
    shutil.copytree(reference[0] / "ckpt_ref", tmp_path / "ckpt")
    shutil.copytree(reference[0] / "model_ref", tmp_path / "model", ignore=shutil.ignore_patterns("hf"))
    partial = tmp_path / "model" / "hf.partial"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half a file")
    kept = listing(tmp_path / "ckpt") | {"model.pt": (tmp_path / "model" / "model.pt").stat().st_size}
    status, output = run_single(settings(tmp_path))
    assert status == 0, output
    hf = tmp_path / "model" / "hf"
    assert (
        f"run already complete: the newest checkpoint is at step 12 and max_steps=12; {tmp_path / 'model' / 'model.pt'}"
        f" has no Hugging Face export (one was interrupted: hf.partial): Hugging Face model (float32) exported to {hf}"
    ) in output
    assert not partial.exists()
    assert contents(hf) == contents(reference[0] / "model_ref" / "hf")
    assert listing(tmp_path / "ckpt") | {"model.pt": (tmp_path / "model" / "model.pt").stat().st_size} == kept
    before = listing(tmp_path)
    status, output = run_single(settings(tmp_path))
    assert status == 0 and "nothing trained, nothing written" in output, output
    assert listing(tmp_path) == before


def test_raising_max_steps_continues_the_schedule_at_its_floor_and_says_so(reference, tmp_path, place):
    copy_checkpoint(reference, 12, place, 12)
    status, output = run_single(
        settings(tmp_path, place, max_steps="15", log_interval="3", throughput_warmup_steps="5")
    )
    assert status == 0, output
    assert (
        "note: throughput_warmup_steps=5 is not below the 3 steps this run trains; leaving out 2 warm-up steps "
        "from the throughput instead"
    ) in output
    assert (
        "max_steps changed from 12 to 15 (checkpoint at step 12): the learning rate stays at its floor 0.0003 "
        "(0.1 x peak) until step 15"
    ) in output
    line = step_lines(output)[15]
    assert line.startswith("step=15/15 100.0% elapsed=") and " eta=0:00:00 " in line
    assert float(fields(line)["lr"]) == pytest.approx(0.0003)
    summary = fields(next(x for x in output.splitlines() if x.startswith("summary ")))
    assert summary["steps"] == "15" and float(summary["final_loss"]) == float(fields(line)["loss"])
    assert float(summary["tokens_per_sec"]) > 0  # measured, never a 0 for a run that trained
    assert (tmp_path / "model" / "model.pt").is_file()


def stdlib_text() -> list[str]:
    """Real text shipped with Python itself: the source of a few standard-library packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [str(root / name) for name in ("json", "email", "html", "http")]


def test_a_model_trained_on_real_text_beats_the_unigram_entropy_on_held_out_text(tmp_path):
    meta = corpus.prepare(stdlib_text(), str(tmp_path / "data"))
    train = np.fromfile(tmp_path / "data" / "train.bin", dtype=meta["token_dtype"])
    counts = np.bincount(train, minlength=meta["vocab_size"]).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    unigram_entropy = float(-(p * np.log(p)).sum())  # nats per token, like the cross-entropy loss
    cfg = {**TINY, "dataset": "channel", "data_dir": str(tmp_path / "data"), "vocab_size": str(meta["vocab_size"]),
           "seq_length": "64", "batch_size": "8", "max_steps": "120", "learning_rate": "0.01",
           "lr_warmup_steps": "10", "log_interval": "40", "validation_interval": "60", "checkpoint_interval": "0",
           "checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model")}  # fmt: skip
    status, output = run_single(cfg)
    assert status == 0, output
    validation = [fields(x) for x in output.splitlines() if x.startswith("validation step=")]
    assert [v["step"] for v in validation] == ["60/120", "120/120"]
    summary = fields(next(x for x in output.splitlines() if x.startswith("summary ")))
    val_loss = float(summary["val_loss"])
    assert val_loss == float(validation[-1]["val_loss"]) and math.isfinite(val_loss)
    assert 2.5 < unigram_entropy < 4.0  # bytes of Python source
    assert val_loss < unigram_entropy - 0.4, (val_loss, unigram_entropy)


def resume_channel(reference, tmp_path: Path, step: int) -> Path:
    """An earlier run's checkpoint as the workflow hands it over: the read-only ``resume`` input channel."""
    channel = tmp_path / "input" / "data" / container.RESUME_CHANNEL
    shutil.copytree(reference[0] / "ckpt_ref" / checkpoint_names.step_dir_name(step), channel)
    return channel


def run_with_channel(cfg: dict[str, str], channel: Path) -> str:
    for path in (channel, *channel.iterdir()):
        path.chmod(0o555 if path.is_dir() else 0o444)
    child_env = {**env(), f"SM_CHANNEL_{container.RESUME_CHANNEL.upper()}": str(channel)}
    proc = subprocess.run(
        torchrun_cmd(cfg), env=child_env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    return output


def test_when_the_runs_own_checkpoints_all_fail_the_resume_channel_is_tried_and_never_renamed(
    reference, tmp_path, place
):
    places.damage(place, f"{copy_checkpoint(reference, 12, place, 10)}/.metadata")
    channel = resume_channel(reference, tmp_path, 6)
    before = {p.name: p.read_bytes() for p in channel.iterdir()}
    output = run_with_channel(settings(tmp_path, place), channel)
    skipped = [line for line in output.splitlines() if line.startswith("checkpoints skipped")]
    assert len(skipped) == 1, output
    assert "step_00000010 (rank 0: checksum mismatch in .metadata; set aside, left as it is:" in skipped[0]
    assert f"resumed from {channel} at step 6" in output
    assert losses(output) == {s: v for s, v in losses(reference[1]).items() if s > 6}
    assert {p.name: p.read_bytes() for p in channel.iterdir()} == before  # read-only input, as it was
    left = place.contents()
    assert "step_00000010.unusable" in left and "step_00000010/.metadata" in left
    assert places.complete(place) == ["step_00000012"]


def test_a_damaged_resume_channel_is_skipped_with_its_reason_and_left_as_it_is(reference, tmp_path):
    channel = resume_channel(reference, tmp_path, 6)
    channel.chmod(0o755)
    damage(channel / ".metadata")
    before = {p.name: p.read_bytes() for p in channel.iterdir()}
    output = run_with_channel(settings(tmp_path), channel)
    skipped = [line for line in output.splitlines() if line.startswith("checkpoints skipped")]
    assert len(skipped) == 1 and skipped[0].endswith("no usable checkpoint: starting from step 0"), output
    assert f"{channel} (rank 0: checksum mismatch in .metadata; read-only, left as it is)" in skipped[0]
    assert losses(output) == losses(reference[1])  # from scratch, exactly as the first run
    assert {p.name: p.read_bytes() for p in channel.iterdir()} == before
    assert sorted(p.name for p in channel.parent.iterdir()) == [container.RESUME_CHANNEL]


def test_an_earlier_runs_checkpoint_of_another_shape_is_refused_naming_resume_from(reference, tmp_path):
    """The workflow's resume_from with other model settings than the earlier run: one line naming resume_from and
    both shapes, exit 2 before any process group, the earlier run's checkpoint untouched."""
    channel = tmp_path / "input" / "data" / container.RESUME_CHANNEL
    shutil.copytree(reference[0] / "ckpt_ref" / checkpoint_names.step_dir_name(12), channel)
    before = listing(channel)
    proc = subprocess.run(
        [PYTHON, "-m", "training.trainer", *cli_args(settings(tmp_path, num_layers="3", max_steps="20"))],
        env={**env(), f"SM_CHANNEL_{container.RESUME_CHANNEL.upper()}": str(channel)},
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert output.strip().splitlines() == [
        f"error: invalid setting resume_from: {channel} holds a model of shape "
        "(num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=128, vocab_size=256), but this run's shape is "
        "(num_layers=3, hidden_size=64, num_heads=4, ffn_hidden_size=128, vocab_size=256); continue a run of this "
        "model shape, or give this run the earlier run's model settings"
    ]
    assert listing(channel) == before
    assert not complete_checkpoints(tmp_path / "ckpt")
