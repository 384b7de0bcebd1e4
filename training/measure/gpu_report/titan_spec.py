"""Imported inside torchtitan's own trainer (``--experimental.custom_import``; torchtitan 0.2.2, ``Trainer.__init__``
imports it before it looks up the model): registers the train spec ``gpukit_llama3`` through torchtitan's public
``register_train_spec``. It is torchtitan's Llama 3 spec (its model, parallelize function: FSDP2, activation
checkpointing and per-block compile, its optimizer, LR schedule and loss) with two changes: the flavor ``run``
has the shape of the model our trainer ran (``GPU_REPORT_TITAN_SHAPE``, JSON, set by :mod:`titan`), and the data
are our trainer's synthetic tokens (``training.trainer.data.token_files.SyntheticTokens``: the same batches our trials train
on), so no tokenizer or data set needs carrying; no validator, no checkpoint adapter.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.models.llama3 import TransformerModelArgs, get_train_spec
from torchtitan.models.llama3.model.args import RoPEScalingArgs
from torchtitan.protocols.train_spec import register_train_spec

from training.trainer.data.token_files import SyntheticTokens

NAME = "gpukit_llama3"
FLAVOR = "run"
SHAPE_ENV = "GPU_REPORT_TITAN_SHAPE"


class Tokens(IterableDataset):
    """One sample at a time of our trainer's synthetic batches (torchtitan's loader batches them)."""

    def __init__(self, vocab_size: int, seq_length: int, seed: int, rank: int, world_size: int) -> None:
        self.source = SyntheticTokens(vocab_size, seq_length, 1, seed, rank, world_size)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            tokens, targets = self.source.next_batch()
            yield {"input": tokens[0]}, targets[0]


def model_args(shape: dict[str, Any]) -> TransformerModelArgs:
    """torchtitan's Llama 3 arguments for our shape: its FFN width is ``multiple_of`` x ceil(multiplier x
    int(8 dim / 3) / multiple_of), so multiplier (ffn + 0.5) / int(8 dim / 3) with ``multiple_of`` 1 gives ours."""
    dim, ffn = shape["hidden_size"], shape["ffn_hidden_size"]
    return TransformerModelArgs(
        dim=dim,
        n_layers=shape["num_layers"],
        n_heads=shape["num_heads"],
        n_kv_heads=shape["num_kv_heads"],
        vocab_size=shape["vocab_size"],
        multiple_of=1,
        ffn_dim_multiplier=(ffn + 0.5) / int(2 * 4 * dim / 3),
        norm_eps=shape["norm_eps"],
        rope_theta=shape["rope_theta"],
        rope_scaling_args=RoPEScalingArgs(scaling_factor=shape.get("rope_scaling_factor") or 8.0),
    )


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer: Any, job_config: Any, **_: Any):
    shape = json.loads(os.environ[SHAPE_ENV])
    training = job_config.training
    seed = job_config.debug.seed if job_config.debug.seed is not None else 1234
    dataset = Tokens(shape["vocab_size"], training.seq_len, seed, dp_rank, dp_world_size)
    return ParallelAwareDataloader(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                   batch_size=training.local_batch_size)  # fmt: skip


def register() -> None:
    shape = json.loads(os.environ[SHAPE_ENV])
    spec = dataclasses.replace(
        get_train_spec(),
        model_args={FLAVOR: model_args(shape)},
        build_dataloader_fn=build_dataloader,
        build_tokenizer_fn=None,
        build_validator_fn=None,
        state_dict_adapter=None,
    )
    register_train_spec(NAME, spec)


register()
