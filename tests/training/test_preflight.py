"""Checks before step 1 and before any process group: output folders, data, metadata, vocabulary, batch size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist

from tests.training.hf_models import BROKEN, broken_llama
from tests.training.runner import TINY, cli_args, run_single
from training.contract import container, settings_table
from training.prepare import corpus
from training.trainer import config, preflight, sagemaker_job
from training.trainer.__main__ import main
from training.trainer.data import token_files


def cfg_for(tmp_path, **extra):
    raw = {**TINY, "checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model"), **extra}
    return config.config_from_mapping(raw)


def prepared(tmp_path, tokens: int = 3000) -> str:
    source = tmp_path / "text.txt"
    source.write_text("abcdefghij" * (tokens // 10))
    corpus.prepare([str(source)], str(tmp_path / "data"), block_tokens=100, validation_fraction=0.2)
    return str(tmp_path / "data")


def field_of(cfg, world_size: int = 2) -> str:
    with pytest.raises(settings_table.ContractError) as info:
        preflight.check(cfg, world_size)
    return f"{info.value.field}: {info.value}"


def test_output_folders_must_be_writable_and_the_check_creates_nothing(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    message = field_of(cfg_for(tmp_path, model_dir=str(tmp_path / "file" / "model")))
    assert (
        message
        == f"model_dir: model_dir: {tmp_path}/file/model is not a writable folder: {tmp_path}/file is not a folder"
    )
    message = field_of(cfg_for(tmp_path, checkpoint_dir=str(tmp_path / "file")))
    assert message.endswith(f"{tmp_path}/file is not a writable folder: it is not a folder")
    assert preflight.check(cfg_for(tmp_path, model_dir=str(tmp_path / "deep" / "er" / "model")), 2) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no folder made, no probe left behind
    (tmp_path / "ckpt").mkdir()
    preflight.check(cfg_for(tmp_path), 2)
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_prepared_data_passes_and_its_metadata_is_checked_against_the_settings(tmp_path):
    data_dir = prepared(tmp_path)
    channel = {"dataset": "channel", "data_dir": data_dir, "vocab_size": "512"}
    preflight.check(cfg_for(tmp_path, **channel), 2)
    assert field_of(cfg_for(tmp_path, **{**channel, "vocab_size": "200"})).startswith(
        "vocab_size: vocab_size: must be at least 257, the vocabulary of bytes"
    )
    assert "must be uint16, the dtype the data was written in" in field_of(
        cfg_for(tmp_path, **channel, token_dtype="uint32")
    )
    # 3000 tokens: 80% train = 2400 tokens = 72 sequences of 33; validation 600 tokens = 18 sequences
    assert field_of(cfg_for(tmp_path, **channel, batch_size="10")).startswith(
        "batch_size: batch_size: the validation split"
    )
    assert "the train split" in field_of(cfg_for(tmp_path, **channel, batch_size="40"))


def test_missing_data_fails_with_the_folder_named(tmp_path):
    message = field_of(cfg_for(tmp_path, dataset="channel", data_dir=str(tmp_path / "nowhere")))
    assert message.startswith("dataset: ") and "nowhere does not exist" in message
    (tmp_path / "empty").mkdir()
    assert "no .bin or .npy token files" in field_of(
        cfg_for(tmp_path, dataset="channel", data_dir=str(tmp_path / "empty"))
    )
    data_dir = prepared(tmp_path)
    (tmp_path / "data" / "validation.bin").unlink()
    assert "lists missing files" in field_of(
        cfg_for(tmp_path, dataset="channel", data_dir=data_dir, vocab_size="512")
    )


def test_without_metadata_every_token_id_is_scanned_once(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "SCAN_CHUNK", 1000)  # the id sits in the last of several chunks
    tokens = np.arange(5000, dtype=np.uint16) % 250
    tokens[-1] = 300
    tokens.tofile(tmp_path / "tokens.bin")
    message = field_of(cfg_for(tmp_path, dataset="channel", data_dir=str(tmp_path)))
    assert message.startswith("vocab_size: ") and "tokens.bin holds id 300 (token 4999), got 256" in message
    (note,) = preflight.check(
        cfg_for(tmp_path, dataset="channel", data_dir=str(tmp_path), vocab_size="301"), 2
    )
    assert note == (
        f"data ok: 1 files of 5000 tokens in {tmp_path}; every token id read: the largest, 300, is below "
        "vocab_size 301"
    )


def test_large_data_is_sampled_and_the_note_says_how_much(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "ID_CHECK_TOKENS", 1000)  # the data holds 10,000 + 5,000 tokens
    monkeypatch.setattr(preflight, "ID_CHECK_BLOCK", 100)
    big, small = np.full(10_000, 7, dtype=np.uint16), np.full(5_000, 9, dtype=np.uint16)
    big[5_500] = 300  # between two sampled blocks (4,950-5,049 and 6,600-6,699)
    big.tofile(tmp_path / "a.bin")
    small.tofile(tmp_path / "b.bin")
    cfg = cfg_for(tmp_path, dataset="channel", data_dir=str(tmp_path))
    (note,) = preflight.check(cfg, 2)
    # shares in proportion to size: 666 tokens of a.bin (7 blocks), 333 of b.bin (4 blocks)
    assert note.endswith(
        "token ids sampled: 1100 of 15000 read (7.3%, in blocks of 100 spread over each file), the largest, 9, is "
        "below vocab_size 256; training checks the ids of every batch it reads"
    )
    assert preflight._ranges(10_000, 666)[::6] == [(0, 100), (9_900, 10_000)]  # the first token to the last
    big[-1] = 400  # in the last block
    big.tofile(tmp_path / "a.bin")
    assert "a.bin holds id 400 (token 9999), got 256" in field_of(cfg)


def test_a_metadata_max_id_beyond_the_vocabulary_is_refused(tmp_path):
    data_dir = prepared(tmp_path)
    meta_path = tmp_path / "data" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "vocab_size": 100, "max_token_id": 260}))
    assert "above the largest token id 260" in field_of(
        cfg_for(tmp_path, dataset="channel", data_dir=data_dir)
    )


def test_main_refuses_bad_data_before_any_process_group(tmp_path, capsys):
    args = cli_args({**TINY, "dataset": "channel", "data_dir": str(tmp_path / "nowhere"),
                     "checkpoint_dir": str(tmp_path / "c"), "model_dir": str(tmp_path / "m")})  # fmt: skip
    assert main(args) == 2
    assert "error: invalid setting dataset: the data folder" in capsys.readouterr().err
    assert not dist.is_initialized()


def test_outside_sagemaker_outputs_default_to_a_local_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("SM_MODEL_DIR", raising=False)
    monkeypatch.setattr(sagemaker_job, "RESOURCE_CONFIG", tmp_path / "absent.json")
    cfg, _ = config.parse_args(cli_args(TINY))
    folder = config.run_folder(TINY)
    assert folder.startswith("trainer-output/custom-2x64-fp32-") and len(folder.rsplit("-", 1)[1]) == 8
    assert (cfg.checkpoint_dir, cfg.model_dir) == (f"{folder}/checkpoints", f"{folder}/model")
    # One folder per run: the same settings (spelt another way, or another max_steps) continue it; any other
    # change, or a tuning job of the same base, gets a folder of its own; a given folder is kept.
    respelt = {k.replace("_", "-"): v for k, v in TINY.items()}
    assert config.run_folder({**respelt, "max_steps": "500"}) == folder
    others = [
        config.run_folder({**TINY, "num_layers": "3"}),
        config.run_folder({**TINY, "learning_rate": "0.5"}),
        config.run_folder({**TINY, "dataset": "channel", "data_dir": "data/"}),
        config.local_defaults(TINY, kind="tune", salt={"tune_trials": "batch_size=2"})["checkpoint_dir"],
    ]
    assert len({folder, *others}) == 5 and others[0].startswith("trainer-output/custom-3x64-fp32-")
    assert others[3].startswith("trainer-output/tune-custom-2x64-fp32-")
    given, _ = config.parse_args(cli_args({**TINY, "checkpoint_dir": "mine"}))
    assert (given.checkpoint_dir, given.model_dir) == ("mine", f"{folder}/model")
    monkeypatch.setenv("SM_MODEL_DIR", "/opt/ml/model")
    cfg, _ = config.parse_args(cli_args(TINY))
    assert (cfg.checkpoint_dir, cfg.model_dir) == (container.CHECKPOINT_LOCAL_PATH, container.MODEL_DIR)


def sealed_checkpoint(root, model_shape: dict) -> None:
    """A complete (empty) checkpoint whose marker records ``model_shape``."""
    folder = root / "step_00000003"
    folder.mkdir(parents=True)
    (folder / "COMPLETE").write_text(
        json.dumps({"world_size": 1, "step": 3, "model_shape": model_shape, "files": {}})
    )


def test_a_checkpoint_of_other_position_settings_is_refused_and_one_without_them_counts_as_nope(tmp_path):
    dims = {name: int(TINY[name]) for name in settings_table.MODEL_DIM_NAMES}
    sealed_checkpoint(tmp_path / "ckpt", {**dims, "position_encoding": "rope", "rope_theta": 10000.0})
    preflight.check_checkpoint_shape(cfg_for(tmp_path))  # the defaults: rope, 10000
    message = field_of(cfg_for(tmp_path, rope_theta="500000"))
    assert message.endswith(
        "holds a model trained with position_encoding=rope, rope_theta=10000, but this run has "
        "position_encoding=rope, rope_theta=500000; use another checkpoint_dir or the checkpoint's model settings"
    )
    assert "position_encoding=none" in field_of(cfg_for(tmp_path, position_encoding="none"))
    # written before rms_norm_eps was recorded: 1e-5, the only epsilon there was; another one is refused
    assert field_of(cfg_for(tmp_path, rms_norm_eps="1e-6")).endswith(
        "holds a model trained with rms_norm_eps=1e-05, position_encoding=rope, rope_theta=10000, but this run has "
        "rms_norm_eps=1e-06, position_encoding=rope, rope_theta=10000; use another checkpoint_dir or the "
        "checkpoint's model settings"
    )

    (tmp_path / "ckpt" / "step_00000003" / "COMPLETE").unlink()
    sealed_checkpoint(tmp_path / "old", dims)  # written before position_encoding was recorded: NoPE
    old = {"checkpoint_dir": str(tmp_path / "old")}
    preflight.check_checkpoint_shape(cfg_for(tmp_path, position_encoding="none", rope_theta="777", **old))
    message = field_of(cfg_for(tmp_path, **old))
    assert (
        "holds a model trained with position_encoding=none, but this run has position_encoding=rope"
        in message
    )


def channel(tmp_path, **extra) -> config.TrainConfig:
    return cfg_for(tmp_path, dataset="channel", data_dir=str(tmp_path / "data"), **extra)


def data_file(tmp_path, name: str) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    return tmp_path / "data" / name


def test_a_bin_file_that_is_not_a_whole_number_of_tokens_is_refused_naming_it(tmp_path):
    path = data_file(tmp_path, "train.bin")
    path.write_bytes(np.arange(5000, dtype=np.uint16).tobytes() + b"x")  # 10,001 bytes
    assert field_of(channel(tmp_path)) == (
        f"dataset: dataset: {path} has 10001 bytes, not a whole number of uint16 tokens (2 bytes each): the file is "
        "cut short, or was written in another dtype than token_dtype=uint16"
    )
    assert "not a whole number of uint32 tokens (4 bytes each)" in field_of(
        channel(tmp_path, token_dtype="uint32")
    )


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        (np.zeros(6000, dtype=np.float32), "holds float32 values; token files hold unsigned integers"),
        (np.zeros(6000, dtype=np.int64), "holds int64 values; token files hold unsigned integers"),
        (
            np.zeros((60, 100), dtype=np.uint16),
            "holds a 2-D array of shape (60, 100) (6000 tokens); a token file holds one stream of token ids (1-D)",
        ),
    ],
)
def test_an_npy_file_must_hold_one_dimension_of_unsigned_integers(tmp_path, array, expected):
    path = data_file(tmp_path, "tokens.npy")
    np.save(path, array)
    message = field_of(channel(tmp_path))
    assert message.startswith(f"dataset: dataset: {path} {expected}"), message


def test_a_damaged_npy_file_is_refused_naming_it(tmp_path):
    path = data_file(tmp_path, "tokens.npy")
    path.write_bytes(b"not numpy at all")
    assert field_of(channel(tmp_path)).endswith(
        f"cannot read {path} as token ids: it is not a .npy file (no NumPy header)"
    )
    np.save(path, np.arange(1000, dtype=np.uint16))
    path.write_bytes(path.read_bytes()[:-10])  # cut short
    assert field_of(channel(tmp_path)).endswith(
        f"cannot read {path} as token ids: mmap length is greater than file size"
    )


def test_tokens_are_counted_by_element_and_checked_against_the_metadata(tmp_path):
    path = data_file(tmp_path, "tokens.npy")
    np.save(path, np.arange(6000, dtype=np.uint16) % 200)
    assert token_files.token_count(path, "uint16") == 6000
    (note,) = preflight.check(channel(tmp_path), 2)
    assert note.startswith("data ok: 1 files of 6000 tokens in ")
    data_dir = prepared(tmp_path)  # train.bin 2401 tokens (with the end-of-document), validation.bin 600
    with open(f"{data_dir}/train.bin", "r+b") as handle:
        handle.truncate(4000)  # cut short to 2000 tokens
    assert field_of(channel(tmp_path, vocab_size="512")) == (
        f"dataset: dataset: {data_dir}/metadata.json records 2401 tokens in the train split, but its files "
        "(train.bin) hold 2000: a file is cut short or was replaced"
    )


def test_the_batch_check_counts_the_processes_train_sh_will_start(tmp_path):
    path = data_file(tmp_path, "tokens.bin")
    (np.arange(33 * 8, dtype=np.uint16) % 200).tofile(path)  # 8 sequences of seq_length + 1 = 33
    preflight.check(channel(tmp_path, batch_size="4"), 2)
    assert "needs 12" in field_of(channel(tmp_path, batch_size="4"), world_size=3)


def test_the_batch_check_counts_grad_accum_steps_and_names_the_product(tmp_path):
    """One optimizer step reads batch_size x grad_accum_steps sequences on every process."""
    path = data_file(tmp_path, "tokens.bin")
    (np.arange(33 * 8, dtype=np.uint16) % 200).tofile(path)  # 8 sequences: a batch of 4 on 2 processes
    preflight.check(channel(tmp_path, batch_size="4"), 2)
    assert field_of(channel(tmp_path, batch_size="4", grad_accum_steps="8"), world_size=2) == (
        f"batch_size: batch_size: the train split in {tmp_path / 'data'} holds 264 tokens, 8 sequences of "
        "seq_length + 1 = 33; one optimizer step (batch_size 4 x grad_accum_steps 8 x 2 processes) needs 64: lower "
        "batch_size, grad_accum_steps or seq_length, or add data"
    )
    with pytest.raises(
        settings_table.ContractError
    ) as info:  # the data source's own check, when training starts
        token_files.TokenFiles([path], "uint16", 256, 32, 4 * 8, 0, 0, 2, grad_accum_steps=8)
    assert str(info.value) == (
        f"batch_size: the token files {path} hold 8 windows of 33 tokens; one optimizer step (batch_size 4 x "
        "grad_accum_steps 8 x 2 processes) needs 64"
    )


@pytest.mark.parametrize("nested", [False, True])
def test_a_folder_holding_the_same_tokens_as_bin_and_npy_is_refused_naming_both(tmp_path, nested):
    """Without metadata.json every token file under the folder is read: tokens.bin beside tokens.npy (a file
    converted and the original left behind) would train on both."""
    folder = "part" if nested else ""
    (tmp_path / "data" / folder).mkdir(parents=True)
    tokens = np.arange(33 * 8, dtype=np.uint16) % 200
    tokens.tofile(tmp_path / "data" / folder / "tokens.bin")
    np.save(tmp_path / "data" / folder / "tokens.npy", tokens)
    both = tmp_path / "data" / folder / "tokens"
    expected = (
        f"dataset: {both}.bin and {both}.npy are both token files of the data folder {tmp_path / 'data'}, so both "
        "would be read (the same tokens twice, when one was converted from the other): keep one"
    )
    assert field_of(channel(tmp_path)) == f"dataset: {expected}"
    with pytest.raises(settings_table.ContractError) as info:  # and where training opens the files
        token_files.make_dataset(channel(tmp_path), 0, 1)
    assert str(info.value) == expected


@pytest.mark.parametrize("kind", list(BROKEN))
def test_an_unusable_init_from_folder_fails_before_step_1_with_one_line_and_writes_nothing(tmp_path, kind):
    folder = broken_llama(tmp_path / "source", kind)
    outputs = {"checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model")}
    status, output = run_single(
        {"init_from": str(folder), "precision": "fp32", "seq_length": "32", **outputs}
    )
    assert status == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: invalid setting init_from: {folder}: "), output
    assert BROKEN[kind] in errors[0]
    assert "step=" not in output and sorted(p.name for p in tmp_path.iterdir()) == ["source"]
