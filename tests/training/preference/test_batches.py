"""A micro-batch of pairs (``training.trainer.preference.batches``): its sequences numbered per occurrence, so that a
window held twice (a step crossing an epoch boundary) is two pairs with one copy's tokens and log-probability each,
and a micro-batch that does not hold whole pairs, each in one row, is refused."""

from __future__ import annotations

import json

import pytest
import torch

from tests.training.chat_models import model_folder
from training.prepare import pairs as prepare_pairs
from training.trainer.data import pairs
from training.trainer.loss import IGNORE_INDEX
from training.trainer.preference.batches import answer_log_probs, micro_pairs

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> pairs.PreferencePairs:
    """Five pairs of different lengths, one per window."""
    root = tmp_path_factory.mktemp("batches")
    model_folder(root / "model", "llama3.1")
    lines = [{"prompt": f"q{i}", "chosen": "yes " * (1 + i), "rejected": "no " * (2 + i)} for i in range(5)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    prepare_pairs.prepare_pairs(
        [root / "pairs.jsonl"], str(root / "data"), str(root / "model"), validation_fraction=0
    )
    token_dtype = json.loads((root / "data/metadata.json").read_text())["token_dtype"]
    return pairs.PreferencePairs(root / "data", "train", token_dtype=token_dtype, seq_length=512, batch_size=2,
                                 seed=0, rank=0, world_size=1, packing=False)  # fmt: skip


def test_a_window_held_twice_is_two_pairs_each_with_one_copys_tokens_and_log_probability(split):
    once = micro_pairs(*split.rows([3]), CPU)
    twice = micro_pairs(*split.rows([3, 3]), CPU)
    assert once.sequences.tolist() == [6, 7] and twice.sequences.tolist() == [6, 7, 6, 7]
    assert twice.pairs == 2 * once.pairs == 2
    # each copy's own count and log-probability, not the sum of both
    assert twice.answer_tokens.tolist() == 2 * once.answer_tokens.tolist()
    assert twice.chosen_tokens == 2 * once.chosen_tokens
    row = torch.arange(once.local.numel(), dtype=torch.float32) % 7 + 1  # any values, the same in both rows
    assert answer_log_probs(row.repeat(2), twice).tolist() == 2 * answer_log_probs(row, once).tolist()


def test_a_mixed_micro_batch_numbers_every_occurrence_in_row_order_and_padding_last(split):
    rows = split.rows([4, 1, 4])
    micro = micro_pairs(*rows, CPU)
    assert micro.sequences.tolist() == [8, 9, 2, 3, 8, 9]
    local = micro.local.view(3, -1)
    sequences = rows[3]
    for row, first in enumerate((0, 2, 4)):
        assert set(local[row][sequences[row] == sequences[row][0]].tolist()) == {first}
        assert set(local[row][sequences[row] < 0].tolist()) == {6}  # padding: past every sequence
    counted = rows[1] != IGNORE_INDEX
    for index in range(6):
        assert micro.answer_tokens.view(-1)[index] == int(counted.view(-1)[micro.local == index].sum())


def window_of(sequences: list[list[int]]) -> tuple[torch.Tensor, ...]:
    """A batch whose rows hold these sequence numbers, one token each, every target trained."""
    numbers = torch.tensor(sequences, dtype=torch.int64)
    return torch.zeros_like(numbers), torch.zeros_like(numbers), (numbers + 1).to(torch.int32), numbers


@pytest.mark.parametrize(
    "sequences",
    [
        [[0, 1], [2, -1]],  # a chosen sequence without its rejected one
        [[0, -1], [1, -1]],  # a pair cut across two rows
        [[1, -1], [0, -1]],  # the same, rejected first
    ],
)
def test_a_micro_batch_without_whole_pairs_each_in_one_row_is_refused(sequences):
    with pytest.raises(ValueError, match="whole pairs"):
        micro_pairs(*window_of(sequences), CPU)
