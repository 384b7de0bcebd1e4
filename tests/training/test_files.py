"""File names read from files are confined to their folder (issue 53 item 7): a data folder's ``metadata.json``
(token files, masks, document offsets, the tokenizer) and a model's ``model.safetensors.index.json``. A ``../``
name, an absolute name or a symlink that leads out of the folder is refused naming it, before anything is read."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import numpy as np
import pytest

from tests.training.chat_models import model_folder
from tests.training.hf_models import tiny_llama
from tests.training.runner import TINY
from training.contract import settings_table
from training.prepare import chat, corpus
from training.trainer import config, preflight
from training.trainer.checkpoint import export_hf, weights
from training.trainer.data import packing, token_files


def outside_tokens(tmp_path: Path) -> Path:
    """A file outside every folder under test, holding valid tokens (so reading it would succeed)."""
    secret = tmp_path / "secret.bin"
    (np.arange(3000, dtype=np.uint16) % 200).tofile(secret)
    return secret


def escapes(folder: Path, secret: Path) -> dict[str, str]:
    """The three ways out of ``folder`` to ``secret``, by the name a file lists: ``../``, absolute, a symlink."""
    link = folder / "linked.bin"
    link.symlink_to(secret)
    return {"dotdot": os.path.relpath(secret, folder), "absolute": str(secret), "symlink": link.name}


def data_cfg(tmp_path: Path, data: Path) -> config.TrainConfig:
    raw = {**TINY, "checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model"),
           "dataset": "channel", "data_dir": str(data), "vocab_size": "512"}  # fmt: skip
    return config.config_from_mapping(raw)


@pytest.mark.parametrize("way", ["dotdot", "absolute", "symlink"])
def test_a_token_file_named_outside_the_data_folder_is_refused_naming_it(tmp_path, way):
    source = tmp_path / "text.txt"
    source.write_text("abcdefghij" * 300)
    data = tmp_path / "data"
    corpus.prepare([str(source)], str(data), block_tokens=100, validation_fraction=0.2)
    preflight.check(data_cfg(tmp_path, data), 1)
    name = escapes(data, outside_tokens(tmp_path))[way]
    meta = json.loads((data / "metadata.json").read_text())
    meta["splits"]["train"]["files"] = [name]
    (data / "metadata.json").write_text(json.dumps(meta))
    expected = (
        f"dataset: {data}/metadata.json names {name!r} as a file of the train split, which is outside the folder "
        f"{data}: every file it lists must be inside it"
    )
    with pytest.raises(settings_table.ContractError) as info:
        preflight.check(data_cfg(tmp_path, data), 1)
    assert str(info.value).startswith(expected)
    with pytest.raises(settings_table.ContractError) as info:  # where training opens the files
        token_files.split_files(data, "train")
    assert str(info.value).startswith(expected)


def test_without_metadata_a_token_file_linked_from_outside_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (np.arange(3000, dtype=np.uint16) % 200).tofile(data / "own.bin")
    (data / "linked.bin").symlink_to(outside_tokens(tmp_path))
    with pytest.raises(settings_table.ContractError) as info:
        token_files.split_files(data, "train")
    assert str(info.value).startswith(f"dataset: {data}/linked.bin is a link to {tmp_path / 'secret.bin'}")


def test_a_link_inside_the_folder_is_followed(tmp_path):
    data = tmp_path / "data"
    (data / "shards").mkdir(parents=True)
    (np.arange(3000, dtype=np.uint16) % 200).tofile(data / "shards" / "a.bin")
    (data / "b.bin").symlink_to(data / "shards" / "a.bin")
    assert [p.name for p in token_files.split_files(data, "train")] == ["b.bin", "a.bin"]


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("chat")
    folder = model_folder(tmp / "model", "qwen2.5")
    lines = [{"prompt": str(n) * (1 + n % 5), "completion": str(n + 1)} for n in range(20)]
    (tmp / "chats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    chat.prepare_chat([tmp / "chats.jsonl"], str(tmp / "data"), str(folder), validation_fraction=0.1)
    return tmp / "data"


@pytest.mark.parametrize("key", ["masks", "documents"])
@pytest.mark.parametrize("way", ["dotdot", "absolute", "symlink"])
def test_a_conversation_mask_or_offsets_file_named_outside_the_folder_is_refused(
    tmp_path, chat_data, key, way
):
    data = tmp_path / "data"
    data.mkdir()
    for path in chat_data.iterdir():
        (data / path.name).write_bytes(path.read_bytes())
    packing.read_split(data, "train", "uint16")
    name = escapes(data, outside_tokens(tmp_path))[way]
    meta = json.loads((data / "metadata.json").read_text())
    meta["splits"]["train"][key] = [name]
    (data / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(settings_table.ContractError) as info:
        packing.read_split(data, "train", "uint16")
    assert str(info.value).startswith(
        f"dataset: {data}/metadata.json names {name!r} as a file of the train split, which is outside the folder"
    )


def test_a_tokenizer_file_named_outside_the_data_folder_is_not_read_into_the_export(tmp_path, chat_data):
    data = tmp_path / "data"
    data.mkdir()
    for path in chat_data.iterdir():
        (data / path.name).write_bytes(path.read_bytes())
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the export")
    meta = json.loads((data / "metadata.json").read_text())
    meta["tokenizer"].update(kind="tokenizers", file="../secret.txt", path=str(secret))
    (data / "metadata.json").write_text(json.dumps(meta))
    cfg = types.SimpleNamespace(dataset="channel", data_dir=str(data), init_from=None)
    with pytest.raises(settings_table.ContractError, match=r"names '\.\./secret\.txt' as the tokenizer file"):
        export_hf.data_info(cfg)
    meta["tokenizer"]["file"] = None  # the fallback, the path prepare read it from: a tokenizer.json only
    (data / "metadata.json").write_text(json.dumps(meta))
    assert export_hf.data_info(cfg)["tokenizer_json"] is None


@pytest.mark.parametrize("way", ["dotdot", "absolute", "symlink"])
def test_a_weights_file_named_outside_the_model_folder_is_refused_naming_it(tmp_path, way):
    model = tmp_path / "model"
    tiny_llama(model, tied=False)
    cfg = config.config_from_mapping({"init_from": str(model), "precision": "fp32", "seq_length": "32"})
    weights.check_init_from(cfg)
    index = json.loads((model / weights.INDEX_FILE).read_text())
    key = "model.layers.1.mlp.up_proj.weight"
    shard = model / index["weight_map"][key]
    outside = tmp_path / "elsewhere" / shard.name
    outside.parent.mkdir()
    outside.write_bytes(shard.read_bytes())  # a readable shard holding the tensor: reading it would succeed
    name = escapes(model, outside)[way] if way != "symlink" else None
    if way == "symlink":
        (model / "linked.safetensors").symlink_to(outside)
        name = "linked.safetensors"
    index["weight_map"][key] = name
    (model / weights.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(settings_table.ContractError) as info:
        weights.check_init_from(cfg)
    assert str(info.value) == (
        f"init_from: {model}: {weights.INDEX_FILE} names {name!r} for {key}, which is outside the folder {model}: "
        "every file it lists must be inside it"
    )
    assert "\n" not in str(info.value)


def test_a_hugging_face_cache_snapshot_links_to_its_blobs_and_is_read(tmp_path):
    """``hf download`` without ``--local-dir`` leaves snapshots/<revision>/ of links into the repository's blobs/:
    that folder is one model and is read."""
    repo = tmp_path / "models--org--tiny"
    real = tmp_path / "real"
    tiny_llama(real, tied=False)
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for path in real.iterdir():
        (repo / "blobs" / path.name).write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(Path("../..") / "blobs" / path.name)
    weights.check_init_from(
        config.config_from_mapping({"init_from": str(snapshot), "precision": "fp32", "seq_length": "32"})
    )
