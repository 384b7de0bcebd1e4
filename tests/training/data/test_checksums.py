"""What prepare recorded about each split, verified before training (issue 53 item 12): each file's SHA-256
(``splits.<split>.sha256``, as ``training.prepare`` writes them), and for
conversation data the trained-token and example counts; and a run whose every step trained nothing fails. An
all-zero mask, a removed document boundary and a mask shifted by one each trained (or exited 0) before."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.training.chat_models import model_folder
from tests.training.runner import TINY, run_single
from training.contract import settings_table
from training.prepare import chat, corpus
from training.trainer import config, preflight
from training.trainer.data import packing

CHAT = {"vocab_size": "272", "seq_length": "256", "batch_size": "2"}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("checksums")
    folder = model_folder(tmp / "model", "qwen2.5")
    lines = [{"prompt": str(n) * (1 + n % 5), "completion": str(n + 1)} for n in range(40)]
    (tmp / "chats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    chat.prepare_chat([tmp / "chats.jsonl"], str(tmp / "data"), str(folder), validation_fraction=0.1)
    return tmp / "data"


def copy_of(prepared: Path, tmp_path: Path, checksums: bool = True) -> Path:
    """The prepared folder with each split's ``sha256`` as prepare recorded it (or without, as data prepared
    before prepare recorded them)."""
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    meta = json.loads((data / "metadata.json").read_text())
    for entry in meta["splits"].values():
        if checksums:
            names = [name for key in ("files", "masks", "documents") for name in entry.get(key, [])]
            assert sorted(entry["sha256"]) == sorted(names)  # prepare's record, verified as it is
        else:
            entry.pop("sha256", None)
    (data / "metadata.json").write_text(json.dumps(meta))
    return data


def cfg_for(tmp_path: Path, data: Path, **extra: str) -> config.TrainConfig:
    raw = {**TINY, **CHAT, "checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model"),
           "dataset": "channel", "data_dir": str(data), **extra}  # fmt: skip
    return config.config_from_mapping(raw)


def refusal(tmp_path: Path, data: Path) -> str:
    with pytest.raises(settings_table.ContractError) as info:
        preflight.check(cfg_for(tmp_path, data), 1)
    assert info.value.field == "dataset" and "\n" not in str(info.value)
    return str(info.value)


def zero_mask(data: Path) -> None:
    (data / "train.mask").write_bytes(bytes((data / "train.mask").stat().st_size))


def shift_mask(data: Path) -> None:
    mask = (data / "train.mask").read_bytes()
    (data / "train.mask").write_bytes(b"\0" + mask[:-1])


def merge_two_examples(data: Path) -> None:
    """One document boundary removed: the first two conversations become one example."""
    offsets = np.fromfile(data / "train.docs", dtype=np.int64)
    np.delete(offsets, 1).tofile(data / "train.docs")


def test_intact_data_passes_and_the_note_says_the_checksums_were_verified(prepared, tmp_path):
    (note,) = preflight.check(cfg_for(tmp_path, copy_of(prepared, tmp_path)), 1)
    assert "checksums: 6 files verified (SHA-256 as metadata.json records them" in note, note


@pytest.mark.parametrize("damage", [zero_mask, shift_mask, merge_two_examples])
def test_a_changed_file_is_refused_by_its_checksum_naming_it(prepared, tmp_path, damage):
    data = copy_of(prepared, tmp_path)
    damage(data)
    message = refusal(tmp_path, data)
    name = "train.docs" if damage is merge_two_examples else "train.mask"
    assert message.startswith(f"dataset: {data / name} does not hold what {data}/metadata.json records of it: its "
                              "SHA-256 is ")  # fmt: skip
    assert message.endswith("the file was changed or replaced after prepare wrote it: prepare the data again")


def test_without_checksums_the_counts_refuse_an_all_zero_mask_and_a_merged_example(prepared, tmp_path):
    data = copy_of(prepared, tmp_path, checksums=False)
    meta = json.loads((data / "metadata.json").read_text())["splits"]["train"]
    zero_mask(data)
    assert refusal(tmp_path, data) == (
        f"dataset: {data}/metadata.json records {meta['trained_tokens']} trained tokens in the train split, but "
        f"{data / 'train.mask'} marks 0: the file was changed or replaced after prepare wrote it: prepare the data "
        "again"
    )
    shutil.rmtree(data)
    data = copy_of(prepared, tmp_path, checksums=False)
    merge_two_examples(data)
    assert refusal(tmp_path, data) == (
        f"dataset: {data}/metadata.json records {meta['examples']} examples in the train split, but "
        f"{data / 'train.docs'} holds {meta['examples'] - 1}: the file was changed or replaced after prepare wrote "
        "it: prepare the data again"
    )


def test_without_checksums_the_note_says_the_contents_were_not_verified(prepared, tmp_path):
    data = copy_of(prepared, tmp_path, checksums=False)
    shift_mask(data)  # the same count of trained tokens: only a checksum tells
    (note,) = preflight.check(cfg_for(tmp_path, data), 1)
    assert "checksums: none recorded in metadata.json (data prepared before prepare recorded them): the files' " \
        "contents could not be verified, their counts were" in note  # fmt: skip


def test_data_recorded_as_training_nothing_is_refused(prepared, tmp_path):
    data = copy_of(prepared, tmp_path)
    zero_mask(data)
    meta = json.loads((data / "metadata.json").read_text())
    meta["splits"]["train"]["trained_tokens"] = 0
    meta["splits"]["train"]["sha256"]["train.mask"] = hashlib.sha256(
        (data / "train.mask").read_bytes()
    ).hexdigest()
    (data / "metadata.json").write_text(json.dumps(meta))
    assert refusal(tmp_path, data) == (
        f"dataset: the train split of {data} has no trained token (metadata.json records 0 and train.mask marks "
        "none): a run on it would train nothing; prepare the data again with examples that hold an answer to train"
    )


def test_a_missing_checksum_of_a_listed_file_is_refused(prepared, tmp_path):
    data = copy_of(prepared, tmp_path)
    meta = json.loads((data / "metadata.json").read_text())
    del meta["splits"]["validation"]["sha256"]["validation.docs"]
    (data / "metadata.json").write_text(json.dumps(meta))
    assert refusal(tmp_path, data) == (
        f"dataset: {data}/metadata.json records the SHA-256 of the validation split's files but not of "
        "validation.docs: the file was changed or replaced after prepare wrote it: prepare the data again"
    )


def test_a_token_file_of_plain_text_data_is_checked_by_its_checksum(tmp_path):
    source = tmp_path / "text.txt"
    source.write_text("abcdefghij" * 300)
    data = tmp_path / "plain"
    corpus.prepare([str(source)], str(data), block_tokens=100, validation_fraction=0.2)
    cfg = cfg_for(tmp_path, data, vocab_size="512", seq_length="32")
    assert "checksums: 2 files verified" in preflight.check(cfg, 1)[0]
    tokens = np.fromfile(data / "train.bin", dtype=np.uint16)
    tokens[:10] = 7  # the same size: only the checksum tells
    tokens.tofile(data / "train.bin")
    with pytest.raises(
        settings_table.ContractError, match=r"train\.bin does not hold what .* its SHA-256 is "
    ):
        preflight.check(cfg, 1)


def test_an_all_zero_mask_is_refused_even_where_metadata_records_no_count(prepared, tmp_path):
    """A hand-made folder whose metadata records no checksum and no trained tokens: the mask itself tells."""
    data = copy_of(prepared, tmp_path, checksums=False)
    zero_mask(data)
    meta = json.loads((data / "metadata.json").read_text())
    meta["splits"]["train"].pop("trained_tokens")
    (data / "metadata.json").write_text(json.dumps(meta))
    assert refusal(tmp_path, data) == (
        f"dataset: the train split of {data} has no trained token (train.mask marks none): a run on it would train "
        "nothing; prepare the data again with examples that hold an answer to train"
    )


def test_a_run_whose_every_step_trained_nothing_fails_with_one_line_and_saves_no_model(prepared, tmp_path):
    """Data that no check before training can tell from good data (a hand-made folder recording no counts or
    checksums, whose only trained tokens are in windows this run does not reach): every step counts no target,
    and the run fails instead of exiting 0 with an export of the unchanged model."""
    data = copy_of(prepared, tmp_path, checksums=False)
    meta = json.loads((data / "metadata.json").read_text())
    for entry in meta["splits"].values():
        entry.pop("trained_tokens", None)
    (data / "metadata.json").write_text(json.dumps(meta))
    settings = {**TINY, **CHAT, "dataset": "channel", "data_dir": str(data), "max_steps": "2",
                "checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model")}  # fmt: skip
    cfg = cfg_for(tmp_path, data, max_steps="2")
    windows = packing.make(cfg, "train", 0, 1)
    read = {windows._window_index(sample) for sample in range(2 * cfg.batch_size)}
    kept = next(index for index in range(len(windows.windows)) if index not in read)
    offsets = np.fromfile(data / "train.docs", dtype=np.int64)
    mask = np.fromfile(data / "train.mask", dtype=np.uint8)
    keep = np.zeros_like(mask)
    for example in windows.windows[kept]:
        keep[offsets[example] : offsets[example + 1]] = 1
    (mask * keep).tofile(data / "train.mask")
    assert (mask * keep).sum() > 0
    status, output = run_single(settings)
    assert status == 1, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: every step of this run trained nothing (2 steps, 0 trained tokens: every target of the windows it "
        "read is masked out), so no model is saved: check the data's masks (prepare the data again)"
    ], output
    assert not list((tmp_path / "model").glob("model*.pt")) and "summary" not in output
