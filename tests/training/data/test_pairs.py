"""Preference data as the trainer reads it (``training.trainer.data.pairs``): every pair whole in one window, its
chosen then its rejected sequence, each a document of its own with only the answers' targets; packed windows hold
every pair once; the validation batches score every window once, the last batch filled up with windows holding no
pair (every rank the same number)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.training.chat_models import model_folder
from training.contract import settings_table
from training.prepare import pairs as prepare_pairs
from training.trainer.data import pairs
from training.trainer.loss import IGNORE_INDEX


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pairs")
    model_folder(root / "model", "llama3.1")
    lines = [{"prompt": f"question {i} " + "x" * (i % 5), "chosen": "yes " * (1 + i % 3), "rejected": f"no {i}"}
             for i in range(23)]  # fmt: skip
    (root / "pairs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    prepare_pairs.prepare_pairs([root / "pairs.jsonl"], str(root / "data"), str(root / "model"),
                                validation_fraction=0.2)  # fmt: skip
    return root / "data"


def split(data: Path, name: str, **more) -> pairs.PreferencePairs:
    options = {
        "token_dtype": "uint16",
        "seq_length": 512,
        "batch_size": 2,
        "seed": 0,
        "rank": 0,
        "world_size": 1,
    }
    return pairs.PreferencePairs(data, name, **{**options, **more})


@pytest.mark.parametrize("packing", [True, False])
def test_every_pair_is_whole_in_one_window_chosen_then_rejected_each_its_own_document(data, packing):
    train = split(data, "train", packing=packing)
    seen = []
    for index in range(len(train.windows)):
        tokens, targets, ids, sequences = train.window(index)
        numbers = [n for n in dict.fromkeys(sequences.tolist()) if n >= 0]
        assert all(numbers[i + 1] == numbers[i] + 1 for i in range(0, len(numbers), 2))
        assert all(n % 2 == 0 for n in numbers[0::2])  # chosen (2p) first, its rejected (2p + 1) next
        for number in numbers:
            where = sequences == number
            assert len(set(ids[where].tolist())) == 1  # one document per sequence
            begin, end = int(train.offsets[number]), int(train.offsets[number + 1])
            assert tokens[where].tolist() == np.asarray(train.tokens[begin:end]).tolist()
            trained = targets[where][:-1] != IGNORE_INDEX
            assert trained.tolist() == np.asarray(train.mask[begin + 1 : end], dtype=bool).tolist()
            assert targets[where][-1] == IGNORE_INDEX  # no target across into the next sequence
        assert (targets[sequences < 0] == IGNORE_INDEX).all() and (ids[sequences < 0] == 0).all()
        seen += numbers
        if not packing:
            assert len(numbers) == 2
    assert sorted(seen) == list(range(train.sequences))
    assert train.window_count == len(train.windows)


def test_validation_scores_every_window_once_and_pads_the_last_batch_with_no_pair(data):
    for world in (1, 2, 3):
        shares = [split(data, "validation", packing=False, batch_size=1, rank=r, world_size=world, shuffle=False)
                  for r in range(world)]  # fmt: skip
        batches = [share.validation_batches(1000) for share in shares]
        assert len({len(b) for b in batches}) == 1  # every rank the same number
        numbers = sorted(int(n) for rank in batches for batch in rank for n in np.unique(batch[3]) if n >= 0)
        assert numbers == list(range(shares[0].sequences))  # every pair once
        padding = [row for rank in batches for batch in rank for row in range(len(batch[3]))
                   if (batch[3][row] < 0).all()]  # fmt: skip
        assert len(padding) == len(batches[0]) * world - shares[0].window_count


def sharded(data: Path, into: Path, cut: int) -> Path:
    """A copy of ``data`` whose train split is two shards (tokens, mask and offsets each), cut before pair ``cut``,
    as a sharded preparation lists them."""
    shutil.copytree(data, into)
    tokens = np.fromfile(into / "train.bin", dtype=np.uint16)
    mask = np.fromfile(into / "train.mask", dtype=np.uint8)
    offsets = np.fromfile(into / "train.docs", dtype=np.int64)
    at = int(offsets[2 * cut])
    for index, (begin, end) in enumerate(((0, at), (at, len(tokens)))):
        tokens[begin:end].tofile(into / f"train-{index}.bin")
        mask[begin:end].tofile(into / f"train-{index}.mask")
    offsets[: 2 * cut + 1].tofile(into / "train-0.docs")
    (offsets[2 * cut :] - at).tofile(into / "train-1.docs")
    meta = json.loads((into / "metadata.json").read_text())
    meta["splits"]["train"].update({key: [f"train-0.{suffix}", f"train-1.{suffix}"] for key, suffix in
                                    (("files", "bin"), ("masks", "mask"), ("documents", "docs"))})  # fmt: skip
    (into / "metadata.json").write_text(json.dumps(meta))
    return into


def test_a_token_id_past_vocab_size_is_refused_naming_the_shard_holding_it_and_its_place(data, tmp_path):
    folder = sharded(data, tmp_path / "sharded", cut=5)
    whole, parts = split(data, "train", packing=False), split(folder, "train", packing=False)
    assert np.array_equal(parts.tokens, whole.tokens) and np.array_equal(parts.offsets, whole.offsets)
    # pair 7's chosen sequence, in the second shard
    begin, end = int(parts.offsets[14]), int(parts.offsets[15])
    ids = np.asarray(parts.tokens[begin:end])
    peak, at = int(ids.max()), begin + int(np.argmax(ids)) - int(parts.offsets[10])
    refusing = split(folder, "train", packing=False, vocab_size=peak)
    with pytest.raises(settings_table.ContractError) as refused:
        refusing.window(7)
    assert refused.value.field == "vocab_size"
    assert f"{folder / 'train-1.bin'} holds id {peak} (token {at}), got {peak}" in str(refused.value)
