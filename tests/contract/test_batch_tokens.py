"""The batch given in tokens (``batch_tokens``, training.contract.batch): converted once into ``batch_size`` for the
run's GPUs, rounded down to whole windows and said so, refused by name beside ``batch_size``, below one window per
GPU, above ``batch_size``'s largest, or where the GPUs are not known; the trainer converts it for its own
processes."""

from __future__ import annotations

import pytest

from training.contract import batch, settings_parse
from training.contract.settings_table import ContractError
from training.trainer import config


def parsed(world: int | None, **raw: object) -> dict:
    return settings_parse.parse_hyperparameters({k: str(v) for k, v in raw.items()}, world_size=world)


def test_batch_tokens_becomes_the_batch_size_of_whole_windows_per_gpu_rounded_down_and_says_so():
    values = parsed(8, batch_tokens=100_000, seq_length=256)
    assert values["batch_size"] == 48 and values["batch_tokens"] == 100_000  # 100,000 / (256 x 8) = 48.83
    said = batch.batch_text(values, 8)
    assert said.startswith(
        "384 windows of 256 tokens (batch_size 48 x grad_accum_steps 1 x 8 GPUs) = 98,304 tokens"
    )
    assert "batch_tokens 100,000 / (seq_length 256 x 8 GPUs x grad_accum_steps 1) = batch_size 48 (rounded down " \
           "from 48.828: whole windows per GPU, never more tokens than asked)" in said  # fmt: skip
    exact = parsed(2, batch_tokens=4096, seq_length=256, grad_accum_steps=4)
    assert exact["batch_size"] == 2 and "= batch_size 2 (exactly:" in batch.batch_text(exact, 2)
    assert batch.step_windows(exact, 2) * 256 == 4096


def test_a_batch_given_as_windows_is_said_without_a_conversion():
    values = parsed(1, batch_size=4, seq_length=64)
    assert (
        batch.batch_text(values, 1)
        == "4 windows of 64 tokens (batch_size 4 x grad_accum_steps 1 x 1 GPU) = 256 tokens"
    )


@pytest.mark.parametrize(
    ("raw", "world", "said"),
    [
        ({"batch_size": 4, "batch_tokens": 65536}, 8, "give the batch once: batch_size (windows of seq_length per GPU "
         "per micro-batch) or batch_tokens (tokens per optimizer step over every GPU), not both; got batch_size 4 and "
         "batch_tokens 65536"),
        ({"batch_tokens": 1000, "seq_length": 256}, 8, "must be at least 2,048 (seq_length 256 x 8 GPUs x "
         "grad_accum_steps 1: one window per GPU); got 1,000"),
        ({"batch_tokens": 10**9, "seq_length": 8}, 1, "must be at most 32,768 (batch_size's largest, 4096, x "
         "seq_length 8 x 1 GPU x grad_accum_steps 1); got 1,000,000,000"),
        ({"batch_tokens": 65536}, None, "is converted into batch_size for the run's GPUs, which are not known here"),
        ({"batch_tokens": 0}, 8, "must be an integer in [1, 1000000000000]; got '0'"),
    ],
)  # fmt: skip
def test_a_batch_that_cannot_be_is_refused_naming_batch_tokens_and_what_is_allowed(raw, world, said):
    with pytest.raises(ContractError) as err:
        parsed(world, **raw)
    assert err.value.field == "batch_tokens" and said in str(err.value)


def test_the_trainer_converts_batch_tokens_for_its_own_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    cfg = config.config_from_mapping({"batch_tokens": "8192", "seq_length": "256", "max_steps": "2"})
    assert (cfg.batch_size, cfg.batch_tokens) == (8, 8192)  # 8192 / (256 x 4)
    assert (
        config.config_from_mapping({"batch_tokens": "8192", "seq_length": "256"}, world_size=1).batch_size
        == 32
    )
    monkeypatch.delenv("WORLD_SIZE")
    assert config.config_from_mapping({"batch_tokens": "8192", "seq_length": "256"}).batch_size == 32  # alone
    with pytest.raises(ContractError, match="^batch_tokens: give the batch once"):
        config.config_from_mapping({"batch_tokens": "8192", "batch_size": "2"})
