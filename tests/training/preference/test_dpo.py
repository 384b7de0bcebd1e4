"""A DPO step's loss is the mean over every pair of the step whatever its split into ranks and micro-batches
(``training.trainer.preference.dpo``), also when the step crosses an epoch boundary and holds a pair twice: 9 pairs,
one per window, 8 windows a step, so every step from the second visits windows of two epochs, some twice in one
micro-batch. One micro-batch of 8, two of 4 (``grad_accum_steps`` 2) and two ranks of 4 (torchrun, gloo) give the
same step lines (loss with the SFT term, rewards, accuracy, margin, log-probabilities, gradient norm), and the two
ranks' reference pass (each a share of the windows, one rank running a batch it keeps nothing of) stores the same
log-probabilities as one rank's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.training.chat_models import model_folder
from tests.training.preference.test_trl_agreement import records, settings
from tests.training.runner import run_trainer
from training.contract import metric_lines
from training.prepare import pairs as prepare_pairs
from training.trainer import config, loop
from training.trainer.data import pairs

PAIRS, STEPS = 9, 3
COMPARED = ("loss", "grad_norm", "trained_tokens", "rewards_chosen", "rewards_rejected", "reward_accuracy",
            "reward_margin", "logps_chosen", "logps_rejected")  # fmt: skip
PRINTED = 1e-5
"""The step line prints 6 significant digits: the same values may round apart in the last one."""


@pytest.fixture(scope="module")
def wrapping(tmp_path_factory) -> Path:
    """A tiny Llama folder and 9 pairs prepared with it (no validation split)."""
    root = tmp_path_factory.mktemp("dpo_wrapping")
    model_folder(root / "model", "llama3.1", with_weights=True, layers=2, hidden=64)
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(PAIRS)))
    prepare_pairs.prepare_pairs(
        [root / "pairs.jsonl"], str(root / "data"), str(root / "model"), validation_fraction=0
    )
    return root


def run_settings(root: Path, run: str, **more: str) -> dict[str, str]:
    return settings(root, run, max_steps=str(STEPS), dpo_sft_weight="1", **more)


def step_values(lines: list[str]) -> list[dict[str, float]]:
    parsed = [metric_lines.parse_step_line(line) for line in lines]
    return [{name: fields[name] for name in COMPARED} for _, fields in filter(None, parsed)]


def here(root: Path, run: str, env, **more: str) -> list[dict[str, float]]:
    """The step lines' values of a run in this process (a world of one)."""
    lines: list[str] = []
    loop.run(config.config_from_mapping(run_settings(root, run, **more)), env, emit=lines.append)
    return step_values(lines)


def assert_same_steps(one: list[dict[str, float]], other: list[dict[str, float]]) -> None:
    assert len(one) == len(other) == STEPS
    for step, (mine, theirs) in enumerate(zip(one, other, strict=True), start=1):
        assert mine == pytest.approx(theirs, rel=PRINTED, abs=PRINTED), (step, mine, theirs)


def held_twice(root: Path, per_micro: int) -> int:
    """How many windows the run's steps of 8 hold twice in one micro-batch of ``per_micro``."""
    token_dtype = json.loads((root / "data/metadata.json").read_text())["token_dtype"]
    split = pairs.PreferencePairs(root / "data", "train", token_dtype=token_dtype, seq_length=512, batch_size=8,
                                  seed=0, rank=0, world_size=1, packing=False)  # fmt: skip
    samples = [split._window_index(sample) for sample in range(STEPS * 8)]
    micro = [samples[at : at + per_micro] for at in range(0, len(samples), per_micro)]
    return sum(len(windows) - len(set(windows)) for windows in micro)


def test_a_step_crossing_an_epoch_boundary_has_one_loss_for_one_micro_batch_and_for_accumulation(
    wrapping, process_group
):
    assert held_twice(wrapping, 8) > held_twice(wrapping, 4) > 0  # so merging copies would tell the two apart
    one = here(wrapping, "one", process_group, batch_size="8")
    accumulated = here(wrapping, "accumulated", process_group, batch_size="4", grad_accum_steps="2")
    assert_same_steps(one, accumulated)


@pytest.mark.slow
def test_two_ranks_train_and_score_the_reference_as_one_rank_does(wrapping, process_group):
    one = here(wrapping, "one_rank", process_group, batch_size="8")
    output = run_trainer(run_settings(wrapping, "two_ranks", batch_size="4"), nproc=2)
    assert_same_steps(one, step_values(output.splitlines()))
    folders = [wrapping / run / "checkpoints/reference" for run in ("one_rank", "two_ranks")]
    stored = [np.load(folder / "train.npy") for folder in folders]
    assert len(stored[0]) == 2 * PAIRS and np.all(stored[0] < 0)  # every answer scored
    assert np.array_equal(stored[0], stored[1])
