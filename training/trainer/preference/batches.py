"""A micro-batch of whole preference pairs on the device (``MicroPairs``), and each answer's log-probability from
the model's per-token ones (``answer_log_probs``).

A batch of ``data.pairs`` carries each token's sequence number in its split (``2p`` for pair ``p``'s chosen
conversation, ``2p + 1`` for its rejected one, -1 for padding). The sequences of a micro-batch are numbered 0, 1,
... here (``local``) **per occurrence**, by (row, sequence number), so that consecutive local numbers ``2k`` and
``2k + 1`` are the chosen and rejected answers of the micro-batch's ``k``-th pair. A pair whose window appears in two
rows (a step that crosses an epoch boundary visits a window again) is two pairs here, as it is in every other split
of the step into ranks and micro-batches: each copy has its own log-probabilities, token counts and reference.

An answer's log-probability is the sum of its tokens' (the model gives 0 for every token whose target is not
trained): one product with a 0/1 membership matrix built on the device from the local numbers, deterministic (no
atomic additions) and differentiable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from training.trainer.loss import IGNORE_INDEX
from training.trainer.model import doc_mask


@dataclass
class MicroPairs:
    """One micro-batch of pairs on the device: ``tokens``, ``targets`` and ``documents`` for the model; ``local``
    (``[batch x seq]``, int64: each token's local sequence number, ``len(sequences)`` for padding); ``sequences``
    (host, int64: the split's sequence number of each local one, chosen and rejected alternating; a pair held in two
    rows is there twice); ``answer_tokens`` (``[pairs, 2]`` fp32: each answer's trained tokens); ``chosen``
    (``[batch x seq]`` bool: the chosen answers' trained targets, for the SFT term); ``reference`` (``[pairs, 2]``,
    the reference's log-probabilities when they were computed before, else None: looked up by ``sequences``, so once
    per occurrence); the weights of its losses in the step's (``Dpo.micro_batches``)."""

    tokens: torch.Tensor
    targets: torch.Tensor
    documents: doc_mask.Documents
    local: torch.Tensor
    sequences: np.ndarray
    answer_tokens: torch.Tensor
    chosen: torch.Tensor
    reference: torch.Tensor | None = None
    pair_weight: float = 1.0
    """What the sum of the micro-batch's pair losses is multiplied by: world size / the step's pairs (``Dpo``)."""
    chosen_weight: float = 1.0
    """The same for the SFT term's summed loss: world size / the step's chosen tokens."""

    @property
    def pairs(self) -> int:
        return len(self.sequences) // 2

    @property
    def chosen_tokens(self) -> int:
        return int(self.answer_tokens[:, 0].sum())


def micro_pairs(
    tokens: torch.Tensor,
    targets: torch.Tensor,
    ids: torch.Tensor,
    sequences: torch.Tensor,
    device: torch.device,
) -> MicroPairs:
    """The micro-batch of these host tensors (``data.pairs``' batch rows) on ``device``."""
    flat = sequences.reshape(-1).numpy()
    numbers, local = _local_numbers(sequences.numpy())
    counted = (targets.reshape(-1) != IGNORE_INDEX).numpy()
    per_sequence = np.bincount(local[counted], minlength=len(numbers) + 1)[: len(numbers)]
    chosen = counted & (flat >= 0) & (flat % 2 == 0)
    non_blocking = device.type == "cuda"
    return MicroPairs(
        tokens=tokens.to(device, non_blocking=non_blocking),
        targets=targets.to(device, non_blocking=non_blocking),
        documents=doc_mask.Documents.from_ids(ids, device),
        local=torch.from_numpy(local.astype(np.int64)).to(device, non_blocking=non_blocking),
        sequences=numbers.astype(np.int64),
        answer_tokens=torch.from_numpy(per_sequence.reshape(-1, 2).astype(np.float32)).to(device),
        chosen=torch.from_numpy(chosen).to(device, non_blocking=non_blocking),
    )


def _local_numbers(sequences: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each occurrence of a sequence in ``sequences`` (``[rows, seq]``) numbered by (row, sequence number): the
    split's sequence number of each local one, and each token's local number (``len`` of the first for padding).
    Refused unless local numbers ``2k`` and ``2k + 1`` are one pair's chosen and rejected sequences in one row."""
    stride = int(sequences.max(initial=-1)) + 2  # a row's keys never run into the next row's
    rows = np.arange(sequences.shape[0], dtype=np.int64).reshape(-1, 1)
    keys = np.where(sequences >= 0, rows * stride + sequences, -1).reshape(-1)
    occurrences, local = np.unique(keys, return_inverse=True)
    if len(occurrences) and occurrences[0] < 0:  # padding: the last local number, past every sequence
        occurrences, local = occurrences[1:], np.where(local == 0, len(occurrences) - 1, local - 1)
    numbers = occurrences % stride
    if len(numbers) % 2 or np.any(numbers[0::2] % 2) or np.any(occurrences[1::2] != occurrences[0::2] + 1):
        raise ValueError(
            "a micro-batch of preference data must hold whole pairs (a chosen and a rejected sequence in one row)"
        )
    return numbers, local.reshape(-1)


def answer_log_probs(per_token: torch.Tensor, micro: MicroPairs) -> torch.Tensor:
    """``[pairs, 2]`` fp32: each answer's log-probability, the sum of ``per_token`` (the model's ``log_probs``:
    one per token of the micro-batch, flattened) over the answer's tokens."""
    count = len(micro.sequences)
    members = micro.local.view(1, -1) == torch.arange(count, device=micro.local.device).view(-1, 1)
    return (members.to(per_token.dtype) @ per_token.reshape(-1)).view(-1, 2).float()
