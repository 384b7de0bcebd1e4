"""training.prepare: text and JSON Lines -> token files + metadata, byte-level or a local tokenizer.json."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from tests.docs import runs
from tests.docs.pages import ROOT, Page
from training.prepare import corpus
from training.trainer.data import token_files

DOCS = ["héllo wörld\n" * 40, "second document, plain ascii. " * 30, "third: ünïcode ✓ " * 25]


def write_inputs(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text(DOCS[0], encoding="utf-8")
    with open(folder / "b.jsonl", "w", encoding="utf-8") as handle:
        for doc in DOCS[1:]:
            handle.write(json.dumps({"text": doc, "id": 1}) + "\n")
        handle.write("\n")  # blank lines are skipped
    return folder


def test_byte_level_splits_every_kth_block_and_loses_no_token(tmp_path):
    meta = corpus.prepare([str(write_inputs(tmp_path))], str(tmp_path / "out"), block_tokens=64,
                           validation_fraction=0.25)  # fmt: skip
    out = tmp_path / "out"
    assert json.loads((out / token_files.METADATA_FILE).read_text()) == meta
    assert meta["vocab_size"] == 257 and meta["token_dtype"] == "uint16" and meta["documents"] == 3
    assert meta["tokenizer"]["name"] == "bytes" and meta["max_token_id"] == 256
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "validation.bin", dtype=np.uint16)
    digest = {
        name: hashlib.sha256((out / name).read_bytes()).hexdigest()
        for name in ("train.bin", "validation.bin")
    }
    assert meta["splits"] == {
        "train": {"files": ["train.bin"], "tokens": len(train), "sha256": {"train.bin": digest["train.bin"]}},
        "validation": {"files": ["validation.bin"], "tokens": len(val),
                       "sha256": {"validation.bin": digest["validation.bin"]}},
    }  # fmt: skip
    # Re-interleave: blocks 4, 8, 12, ... went to validation; the stream is every document's bytes + EOS.
    blocks, t, v = [], 0, 0
    while t < len(train) or v < len(val):
        if (len(blocks) + 1) % 4 == 0:
            blocks.append(val[v : v + 64])
            v += 64
        else:
            blocks.append(train[t : t + 64])
            t += 64
    expected = b"".join(doc.encode("utf-8") + b"\x00" for doc in DOCS)
    stream = np.concatenate(blocks)
    assert len(stream) == len(expected) == meta["tokens"]
    eos = stream == 256
    assert eos.sum() == 3
    assert bytes(stream[~eos].astype(np.uint8)) == b"".join(doc.encode("utf-8") for doc in DOCS)
    assert token_files.split_files(out, "validation") == [out / "validation.bin"]


def test_without_metadata_every_token_file_is_training_data(tmp_path):
    """docs/trainer.md: the validation split is what metadata.json lists; without one, validation.bin is trained on
    like any other token file, and there is no validation split."""
    out = tmp_path / "out"
    corpus.prepare([str(write_inputs(tmp_path))], str(out), block_tokens=64, validation_fraction=0.25)
    assert token_files.split_files(out, "train") == [out / "train.bin"]
    (out / token_files.METADATA_FILE).unlink()
    assert token_files.split_files(out, "train") == [out / "train.bin", out / "validation.bin"]
    assert token_files.split_files(out, "validation") == []


def tiny_tokenizer_json(tmp_path) -> str:
    """A word-level tokenizer.json built here with the tokenizers library (no download)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"])
    tokenizer.train_from_iterator(DOCS, trainer)
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def test_a_local_tokenizer_json_is_used_with_its_end_of_document_token(tmp_path):
    path = tiny_tokenizer_json(tmp_path)
    meta = corpus.prepare([str(write_inputs(tmp_path))], str(tmp_path / "out"), tokenizer=path,
                           validation_fraction=0, block_tokens=8)  # fmt: skip
    tokenizer = Tokenizer.from_file(path)
    eos = tokenizer.token_to_id("</s>")
    assert meta["vocab_size"] == tokenizer.get_vocab_size() and meta["tokenizer"]["eos_id"] == eos
    assert list(meta["splits"]) == ["train"] and not (tmp_path / "out" / "validation.bin").exists()
    tokens = np.fromfile(tmp_path / "out" / "train.bin", dtype=meta["token_dtype"]).tolist()
    expected = [i for doc in DOCS for i in (*tokenizer.encode(doc, add_special_tokens=False).ids, eos)]
    assert tokens == expected


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"validation_fraction": 0.6}, "validation-fraction: must be in [0, 0.5)"),
        ({"block_tokens": 0}, "block-tokens: must be at least 1"),
        ({"block_tokens": 100_000}, "no block went to validation"),
        ({"text_field": "body"}, "text-field: "),
        ({"tokenizer": "/nonexistent/tokenizer.json"}, "tokenizer: cannot load"),
    ],
)
def test_bad_options_name_the_option_and_leave_no_files(tmp_path, kwargs, fragment):
    with pytest.raises(corpus.PrepareError, match=fragment.replace("[", r"\[").replace(")", r"\)")):
        corpus.prepare([str(write_inputs(tmp_path))], str(tmp_path / "out"), **kwargs)
    assert not (tmp_path / "out").exists()  # no empty folder left behind either


def test_a_refusal_keeps_a_folder_the_user_had(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    inputs = [str(write_inputs(tmp_path))]
    with pytest.raises(corpus.PrepareError, match="no block went to validation"):
        corpus.prepare(inputs, str(mine), block_tokens=100_000)
    with pytest.raises(corpus.PrepareError, match="no block went to validation"):
        corpus.prepare(inputs, str(mine / "x" / "y"), block_tokens=100_000)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_an_output_folder_with_prepared_data_is_never_overwritten(tmp_path, capsys):
    inputs = str(write_inputs(tmp_path))
    assert corpus.main([inputs, "--output", str(tmp_path / "out"), "--block-tokens", "64"]) == 0
    assert "--vocab_size 257 --token_dtype uint16" in capsys.readouterr().out
    before = (tmp_path / "out" / "train.bin").read_bytes()
    assert corpus.main([inputs, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "error: output: " in err and "already holds metadata.json, train.bin, validation.bin" in err
    assert (tmp_path / "out" / "train.bin").read_bytes() == before
    assert corpus.main([str(tmp_path / "missing"), "--output", str(tmp_path / "o2")]) == 2
    assert "input: " in capsys.readouterr().err


def test_the_exit_status_page_shows_what_a_refused_prepare_prints(tmp_path):
    """docs/exit-status.md's prepare example runs as printed (the docs run only each page's opening): the refusal,
    exit 2, and no output folder."""
    page = Page.read(ROOT / "docs" / "exit-status.md")
    block = next(b for b in page.blocks if b.language == "console" and "training.prepare" in b.text)
    root = tmp_path / "checkout"
    root.mkdir()
    for name in (".venv", "training"):
        (root / name).symlink_to(ROOT / name)
    runner = runs.Runner(root, tmp_path)
    assert runner.console(page, block), runner.outcome.failures
    assert not (root / "hello-data").exists()
