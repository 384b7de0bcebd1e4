"""What each step holds, counted before step 1 (training.trainer.data.step_counts): the examples and trained tokens
of the run's steps equal those of the very batches every rank then reads (document ids and targets with a loss),
packed and one per window, across an epoch's end, for conversations and for preference pairs; the first line says
them with the batch, and on plain token data that every token is a target."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.training.chat_models import model_folder
from tests.training.data.test_pairs import data as pair_data  # noqa: F401 - the fixture
from tests.training.data.test_pairs import split as pair_split
from training.contract import batch, settings_parse
from training.prepare import chat
from training.trainer.data import packing, step_counts
from training.trainer.loss import IGNORE_INDEX


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("step_counts")
    folder = model_folder(tmp / "model", "qwen2.5")
    lines = [{"prompt": str(n) * (1 + n % 7), "completion": str(n + 1) * (1 + n % 3)} for n in range(60)]
    (tmp / "chats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    chat.prepare_chat([tmp / "chats.jsonl"], str(tmp / "data"), str(folder), validation_fraction=0.1)
    return tmp / "data"


def read_steps(ranks: list, steps: int, pairs: bool = False) -> tuple[list[int], list[int]]:
    """Each step's examples (documents of its rows; a pair's two sequences are one) and targets with a loss, from
    the batches every rank reads."""
    examples, trained = [], []
    for _ in range(steps):
        batches = [rank.next_batch() for rank in ranks]
        ids = np.concatenate([b[2].numpy() for b in batches])
        documents = sum(len(set(row[row > 0].tolist())) for row in ids)
        examples.append(documents // 2 if pairs else documents)
        trained.append(int(sum(int((b[1] != IGNORE_INDEX).sum()) for b in batches)))
    return examples, trained


def ranks_of(prepared: Path, world: int, batch: int, packed: bool) -> list:
    return [packing.Conversations(prepared, "train", token_dtype="uint16", seq_length=512, batch_size=batch,
                                  seed=3, rank=r, world_size=world, packing=packed) for r in range(world)]  # fmt: skip


@pytest.mark.parametrize("packed", [True, False])
def test_the_counted_steps_are_the_batches_the_ranks_read_across_an_epochs_end(prepared, packed):
    ranks = ranks_of(prepared, 2, 3, packed)
    steps = 2 * len(ranks[0].windows) // 6 + 1  # past the first epoch's end
    figures = step_counts.step_figures(ranks[0], 0, 6, steps)
    examples, trained = read_steps(ranks, steps)
    assert figures["counted"] == steps
    assert figures["examples"] == (np.mean(examples), min(examples), max(examples))
    assert figures["trained"] == (np.mean(trained), min(trained), max(trained))
    assert (max(examples) > 6) == packed  # packed: more examples a step than windows


def test_a_resumed_run_counts_from_where_its_data_stands(prepared):
    ranks = ranks_of(prepared, 2, 2, True)
    read_steps(ranks, 5)
    figures = step_counts.step_figures(ranks[0], ranks[0].consumed, 4, 3)
    examples, trained = read_steps(ranks, 3)
    assert figures["examples"][1:] == (min(examples), max(examples)) and figures["trained"][0] == np.mean(
        trained
    )


def test_preference_pairs_are_counted_as_pairs(pair_data):  # noqa: F811
    ranks = [pair_split(pair_data, "train", world_size=2, rank=r) for r in range(2)]
    figures = step_counts.step_figures(ranks[0], 0, 4, 3)
    examples, trained = read_steps(ranks, 3, pairs=True)
    assert figures["examples"] == (np.mean(examples), min(examples), max(examples))
    assert figures["trained"] == (np.mean(trained), min(trained), max(trained))


def test_the_first_line_says_the_batch_and_what_the_steps_hold(prepared):
    values = settings_parse.parse_hyperparameters({"batch_tokens": "3100", "seq_length": "512", "max_steps": "7"},
                                                  world_size=2)  # fmt: skip
    cfg = SimpleNamespace(max_steps=7, as_dict=lambda: values)
    data = ranks_of(prepared, 2, values["batch_size"], True)[0]  # batch_tokens 3100 / (512 x 2) = 3.027: 3
    line = step_counts.step_line(cfg, data, 2, 0)
    f = step_counts.step_figures(data, 0, 6, 7)
    assert line.startswith(
        "step: 6 windows of 512 tokens (batch_size 3 x grad_accum_steps 1 x 2 GPUs) = 3,072 tokens; batch_tokens "
        "3,100 / (seq_length 512 x 2 GPUs x grad_accum_steps 1) = batch_size 3 (rounded down from 3.027: whole windows per "
        f"GPU, never more tokens than asked); holding {f['examples'][0]:,.1f} examples ({f['examples'][1]}-"
    )
    assert "mean (least-most) over its 7 steps, counted from the windows they read (packed: " in line
    assert line.endswith("examples per window, where one per window the same batch_size would hold 6)")
    said = batch.batch_text(values, 2)
    plain = step_counts.step_line(cfg, object(), 2, 0)
    assert plain == f"step: {said}; every token of a window is a target (plain token data)"
    assert step_counts.step_line(cfg, data, 2, 7) == f"step: {said}"  # nothing left to train


def test_a_long_run_on_little_data_counts_its_first_steps_and_says_so(prepared):
    data = ranks_of(prepared, 1, 2, True)[0]
    figures = step_counts.step_figures(data, 0, 2, 10**9)
    assert figures["counted"] == step_counts.MAX_EPOCHS * len(data.windows) // 2 and figures["steps"] == 10**9
    cfg = SimpleNamespace(max_steps=10**9, as_dict=lambda: {"batch_size": 2, "seq_length": 512})
    assert f"over its first {figures['counted']:,} of 1,000,000,000 steps" in step_counts.step_line(
        cfg, data, 1, 0
    )
