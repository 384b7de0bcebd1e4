"""The batch of an optimizer step, given as windows or as tokens: ``batch_size`` (``seq_length``-token windows per
GPU per micro-batch) or ``batch_tokens`` (tokens per optimizer step over every GPU), never both
(:func:`check_exclusive`); ``batch_tokens`` converted once into ``batch_size`` for the run's data-parallel size
(:func:`batch_size_for`), rounded down to whole windows per GPU, and the rounding said in words
(:func:`batch_text`).

Every GPU of a run is a data-parallel rank (FSDP2 shards the model's states over them and each reads its own
windows, hybrid sharding's replicas too), so an optimizer step reads ``batch_size x grad_accum_steps x GPUs``
windows of ``seq_length`` tokens. Part of the contract between the infrastructure (``constructs_lib``) and the
trainer: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.contract.settings_table import HYPERPARAMETERS_BY_NAME, ContractError

WINDOWS = "batch_size"
TOKENS = "batch_tokens"


def check_exclusive(given: Mapping[str, Any]) -> None:
    """Refuse settings (names normalized, values parsed) that give the batch twice: ``batch_size`` and
    ``batch_tokens``."""
    if given.get(WINDOWS) is not None and given.get(TOKENS) is not None:
        raise ContractError(
            TOKENS,
            f"give the batch once: batch_size (windows of seq_length per GPU per micro-batch) or batch_tokens "
            f"(tokens per optimizer step over every GPU), not both; got batch_size {given[WINDOWS]} and "
            f"batch_tokens {given[TOKENS]}",
        )


def batch_size_for(batch_tokens: int, seq_length: int, world_size: int, grad_accum_steps: int = 1) -> int:
    """The ``batch_size`` (windows per GPU per micro-batch) of ``batch_tokens`` tokens per optimizer step on
    ``world_size`` data-parallel GPUs: ``batch_tokens / (seq_length x world_size x grad_accum_steps)`` rounded down,
    so that a step never holds more tokens than asked. Refused (naming ``batch_tokens``) when that is below one
    window per GPU or above ``batch_size``'s largest."""
    per_window = seq_length * world_size * grad_accum_steps
    windows = batch_tokens // per_window
    largest = int(HYPERPARAMETERS_BY_NAME[WINDOWS].maximum or 0)
    product = f"seq_length {seq_length:,} x {gpus(world_size)} x grad_accum_steps {grad_accum_steps}"
    if windows < 1:
        raise ContractError(
            TOKENS, f"must be at least {per_window:,} ({product}: one window per GPU); got {batch_tokens:,}"
        )
    if windows > largest:
        raise ContractError(
            TOKENS,
            f"must be at most {largest * per_window:,} (batch_size's largest, {largest}, x {product}); got "
            f"{batch_tokens:,}",
        )
    return windows


def gpus(count: int) -> str:
    """``1 GPU``, ``8 GPUs``."""
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def resolve(values: dict[str, Any], world_size: int | None) -> None:
    """Set parsed ``values``' ``batch_size`` from their ``batch_tokens`` (when given) for ``world_size`` GPUs; a
    ``world_size`` of None (not known where the settings are read) is refused by name."""
    if values.get(TOKENS) is None:
        return
    if world_size is None:
        raise ContractError(
            TOKENS,
            "is converted into batch_size for the run's GPUs, which are not known here; give batch_size",
        )
    values[WINDOWS] = batch_size_for(
        int(values[TOKENS]), int(values["seq_length"]), world_size, int(values.get("grad_accum_steps") or 1)
    )


def step_windows(values: Mapping[str, Any], world_size: int) -> int:
    """Windows of ``seq_length`` one optimizer step reads over every GPU."""
    return int(values[WINDOWS]) * int(values.get("grad_accum_steps") or 1) * world_size


def batch_text(values: Mapping[str, Any], world_size: int) -> str:
    """What one optimizer step reads, in words: ``32 windows of 256 tokens (batch_size 4 x grad_accum_steps 1 x 8
    GPUs) = 8,192 tokens``, and, for a batch given in tokens, how ``batch_tokens`` became that ``batch_size``."""
    seq, accum = int(values["seq_length"]), int(values.get("grad_accum_steps") or 1)
    windows = step_windows(values, world_size)
    text = (
        f"{windows:,} windows of {seq:,} tokens (batch_size {values[WINDOWS]} x grad_accum_steps {accum} x "
        f"{gpus(world_size)}) = {windows * seq:,} tokens"
    )
    asked = values.get(TOKENS)
    if asked is None:
        return text
    exact = int(asked) / (seq * world_size * accum)
    kept = "exactly" if exact == int(values[WINDOWS]) else f"rounded down from {exact:,.3f}"
    return (
        f"{text}; batch_tokens {int(asked):,} / (seq_length {seq:,} x {gpus(world_size)} x grad_accum_steps "
        f"{accum}) = batch_size {values[WINDOWS]} ({kept}: whole windows per GPU, never more tokens than asked)"
    )
