"""The reference model's log-probability of every answer, computed once (``dpo_reference`` precomputed) and kept
with the run.

DPO compares the policy with the model it started from. With full fine-tuning that model is not kept: before step
1 one pass of the initial model (the run's own model, before it has trained) over every pair of the training and
validation splits computes each answer's log-probability (``compute``: the same forward as training, in eval mode,
without gradients; each rank a share of the windows, summed over the ranks), and they are stored in the checkpoint
folder (``reference/<split>.npy``, float32 by sequence number, with ``reference/identity.json`` saying what they
were computed from: the data's ``metadata.json`` SHA-256, the ``init_from`` model or the seed of a generated one,
the precision). The checkpoint folder travels with the run (SageMaker syncs it to S3 and brings it back at a
relaunch), so a resumed run reads them (``load``: rank 0 reads, every rank gets them) and never recomputes them from
a model that has moved; when a resumed run finds none (a folder that lost them), the initial model is built again for
the pass (``Dpo.prepare``). Stored log-probabilities of other data or another model are refused, never overwritten.
Memory: 4 bytes per answer on every rank; the training model holds no second copy of any weight.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.fsdp import FSDPModule

from training.contract import container
from training.trainer import refusal
from training.trainer.data import pairs, token_files
from training.trainer.model import lora
from training.trainer.preference.batches import answer_log_probs, micro_pairs

FOLDER = "reference"
IDENTITY_FILE = "identity.json"


def identity(cfg: Any, splits: dict[str, int]) -> dict[str, Any]:
    """What stored log-probabilities must have been computed from to serve this run: the data (its
    ``metadata.json``'s SHA-256 and each split's sequences), the initial model (``lora.base_reference``: the
    ``init_from`` folder's sampled SHA-256, or the seed of a generated model) and the precision. The tokenizer is
    not named on its own: ``prepare`` records its SHA-256 and the template's in ``metadata.json``, so data rendered
    with another one has another ``data_metadata_sha256``. ``loss_chunk_tokens`` is not either: it only cuts the same
    computation of the log-probabilities into pieces."""
    meta = Path(token_files.channel_dir(cfg)) / container.DATA_METADATA_FILE
    return {
        "data_metadata_sha256": hashlib.sha256(meta.read_bytes()).hexdigest(),
        "sequences": splits,
        "model": lora.base_reference(cfg.init_from, cfg.seed),
        "precision": cfg.precision,
    }


@torch.no_grad()
def compute(net: Any, split: pairs.PreferencePairs, env: Any, plan: Any) -> torch.Tensor:
    """Every answer's log-probability under ``net`` (eval mode, no gradients), ``[sequences]`` float32 on the host,
    by sequence number: rank ``r`` scores windows ``r, r + world, ...`` in batches of ``split.batch_size``; every
    rank runs the same number of forwards (FSDP2's collectives need them all: a rank out of windows runs its first
    batch again and keeps nothing of it), then one all-reduce sums the ranks' shares."""
    windows = list(range(env.rank, len(split.windows), env.world_size))
    per_round = split.batch_size
    rounds = math.ceil(len(split.windows) / (env.world_size * per_round))
    out = torch.zeros(split.sequences, dtype=torch.float32, device=env.device)
    was_training = net.training
    net.eval()
    try:
        for index in range(rounds):
            mine = windows[index * per_round : (index + 1) * per_round]
            rows = split.rows(mine or windows[:1] or [0])
            micro = micro_pairs(*rows, env.device)
            with plan.autocast():
                per_token = net(micro.tokens, micro.targets, micro.documents, log_probs=True)
            if mine:
                numbers = torch.from_numpy(micro.sequences).to(env.device)
                out[numbers] = answer_log_probs(per_token, micro).reshape(-1)
    finally:
        net.train(was_training)
        _reshard(net)
    torch.distributed.all_reduce(out)
    return out.cpu()


def _reshard(net: Any) -> None:
    """Every FSDP2 module of ``net`` back to its sharded parameters. The root and the last block are not resharded
    after a forward (``parallel.shard_model``: a backward follows at once in training); after this pass none
    follows, and a model left unsharded would hand the training loop its unsharded parameters (``net.parameters()``
    then lists them, so gradient clipping would miss the gradients FSDP2 gives the sharded ones)."""
    for module in net.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def folder(cfg: Any) -> Path:
    return Path(cfg.checkpoint_dir) / FOLDER


def load(cfg: Any, env: Any, wanted: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """The stored log-probabilities of this run (every rank gets rank 0's), or None when there are none. Stored ones
    of another identity stop the run (``refusal.TrainingFailure``): they are not this run's, and are kept."""
    found: list[Any] = [None]
    if env.is_main:
        found[0] = _read(folder(cfg), wanted)
    torch.distributed.broadcast_object_list(found, src=0, group=env.cpu_group)
    if isinstance(found[0], str):
        raise refusal.TrainingFailure(found[0])
    return None if found[0] is None else {name: torch.from_numpy(array) for name, array in found[0].items()}


def _read(where: Path, wanted: dict[str, Any]) -> dict[str, np.ndarray] | str | None:
    """The arrays in ``where`` (None when it holds none), or why they cannot serve (a sentence)."""
    record = where / IDENTITY_FILE
    if not record.is_file():
        return None
    try:
        stored = json.loads(record.read_text())
        arrays = {name: np.load(where / f"{name}.npy", allow_pickle=False) for name in wanted["sequences"]}
    except (OSError, ValueError) as err:
        return f"reference log-probabilities in {where} cannot be read ({err}): move the folder away to compute them again"
    if stored != wanted or any(len(arrays[name]) != count for name, count in wanted["sequences"].items()):
        differ = sorted(key for key in {*stored, *wanted} if stored.get(key) != wanted.get(key))
        return (
            f"the reference log-probabilities in {where} were computed for other {', '.join(differ) or 'sequences'} "
            f"({json.dumps({k: stored.get(k) for k in differ})[:300]}; this run: "
            f"{json.dumps({k: wanted.get(k) for k in differ})[:300]}): they are kept; give this run another "
            "checkpoint_dir, or move that folder away"
        )
    return arrays


def store(cfg: Any, env: Any, wanted: dict[str, Any], arrays: dict[str, torch.Tensor]) -> Path:
    """Rank 0 writes ``arrays`` and their identity (each file as ``.partial``, then renamed; the identity last, so
    a folder without it holds nothing that counts); returns the folder."""
    where = folder(cfg)
    if env.is_main:
        where.mkdir(parents=True, exist_ok=True)
        for name, array in arrays.items():
            with open(where / f"{name}.npy.partial", "wb") as handle:
                np.save(handle, array.numpy().astype(np.float32), allow_pickle=False)
            os.replace(where / f"{name}.npy.partial", where / f"{name}.npy")
        (where / f"{IDENTITY_FILE}.partial").write_text(json.dumps(wanted, indent=2) + "\n")
        os.replace(where / f"{IDENTITY_FILE}.partial", where / IDENTITY_FILE)
    torch.distributed.barrier(group=env.cpu_group)
    return where
