"""Preference data (``prepare --init-from`` of pairs, ``kind: preference``) as training batches: pairs packed into
``seq_length`` windows, or one pair per window.

The token files are conversation data's (``packing.read_split``), two sequences per pair: the pair's chosen
conversation, then its rejected one. The unit placed into windows is the **pair** (both its sequences, one after the
other in the same window), so that every micro-batch holds whole pairs and its DPO loss needs nothing from another
micro-batch or rank. Packing is conversation data's best-fit decreasing (``packing.best_fit_decreasing``) over the
pairs' lengths; with ``packing=false`` each pair has a window of its own. Each sequence is a document of its own
(it attends only to itself, its positions restart at 0: the chosen answer never sees the rejected one), and each
token's target is the next token of the same sequence where ``prepare`` marked it trained (the answer and its
end-of-turn token), else ``loss.IGNORE_INDEX``.

A batch is ``(tokens, targets, document ids, sequences)``, each ``[batch_size, seq_length]``: ``sequences`` holds
each token's sequence number in the split (pair ``p``'s chosen conversation is ``2p``, its rejected one ``2p + 1``;
-1 for padding), by which the log-probabilities of each answer are summed and the reference's are looked up.
Windows are visited in a seeded permutation per epoch, global sample ``i`` on rank ``i % world_size``, as
conversation data's, so a batch is a pure function of (seed, rank, world size, position) and resumes exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from training.contract import settings_table
from training.request import sft_data
from training.trainer.data import packing, token_files
from training.trainer.loss import IGNORE_INDEX


def is_preference(meta: dict | None) -> bool:
    return bool(meta) and meta.get("kind") == sft_data.PREFERENCE_KIND


def preference_data(cfg) -> bool:
    """Whether ``cfg`` trains on preference data (its data folder's ``metadata.json`` says ``kind: preference``)."""
    return cfg.dataset == "channel" and is_preference(token_files.read_metadata(token_files.channel_dir(cfg)))


class PreferencePairs(token_files._PositionedBatches):
    """One split of preference data as ``(tokens, targets, document ids, sequences)`` batches of ``[batch_size,
    seq_length]`` (see the module doc). ``vocab_size``: a token id not below it is refused as its batch is read,
    naming the file and the position. ``grad_accum_steps``: ``batch_size`` is an optimizer step's windows on this
    rank, that many micro-batches (only the message of too little data names it)."""

    def __init__(
        self,
        directory: str | Path,
        split: str,
        *,
        token_dtype: str,
        seq_length: int,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        packing: bool = True,
        shuffle: bool = True,
        vocab_size: int | None = None,
        grad_accum_steps: int = 1,
    ):
        self.tokens, self.mask, self.offsets = _read(directory, split, token_dtype)
        self.directory, self.split, self.token_dtype = directory, split, token_dtype
        self.vocab_size = vocab_size
        sides = np.diff(self.offsets)
        lengths = sides[0::2] + sides[1::2]
        where = f"{directory}/{token_files.METADATA_FILE}"
        if int(lengths.max()) > seq_length:
            raise settings_table.ContractError(
                "seq_length",
                f"the longest pair of the {split} split has {int(lengths.max())} tokens, its two sequences together "
                f"({where}: {int((lengths > seq_length).sum())} pairs are longer than seq_length {seq_length}); a pair "
                f"is never split at training: raise seq_length, or prepare the data again with --max-tokens "
                f"{seq_length}",
            )
        self.windows = _windows(lengths, seq_length, packing)
        need, what = token_files.batch_need(batch_size // grad_accum_steps, grad_accum_steps, world_size)
        if len(self.windows) < need:
            lower = (
                "batch_size, grad_accum_steps or seq_length"
                if grad_accum_steps > 1
                else "batch_size or seq_length"
            )
            raise settings_table.ContractError(
                "batch_size",
                f"the {split} split in {directory} makes {len(self.windows)} windows of seq_length {seq_length} "
                f"({len(lengths)} pairs, {'packed' if packing else 'one per window'}); {what} needs {need}: lower "
                f"{lower}, or add data",
            )
        super().__init__(batch_size, seed, rank, world_size)
        self.seq_length, self.packing, self.shuffle = seq_length, packing, shuffle
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    @property
    def pairs(self) -> int:
        return (len(self.offsets) - 1) // 2

    @property
    def window_count(self) -> int:
        """The split's windows (every rank's), as conversation data's ``window_count``."""
        return len(self.windows)

    @property
    def sequences(self) -> int:
        return len(self.offsets) - 1

    def trained_per_window(self) -> float:
        """Trained targets per window on average."""
        return float(self.mask.sum()) / len(self.windows)

    def _window_index(self, sample: int) -> int:
        epoch, offset = divmod(sample, len(self.windows))
        if not self.shuffle:
            return offset
        if epoch != self._epoch:
            generator = np.random.default_rng((self.seed, epoch))
            self._epoch, self._order = epoch, generator.permutation(len(self.windows))
        return int(self._order[offset])

    def window(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Window ``index``'s tokens, targets, document ids and sequence numbers (``seq_length`` each)."""
        tokens = np.zeros(self.seq_length, dtype=np.int64)
        targets = np.full(self.seq_length, IGNORE_INDEX, dtype=np.int64)
        ids = np.zeros(self.seq_length, dtype=np.int32)
        sequences = np.full(self.seq_length, -1, dtype=np.int64)
        at = 0
        for number, pair in enumerate(self.windows[index]):
            for side in (0, 1):
                sequence = 2 * pair + side
                begin, end = int(self.offsets[sequence]), int(self.offsets[sequence + 1])
                length = end - begin
                ids_of = np.asarray(self.tokens[begin:end], dtype=np.int64)
                if self.vocab_size is not None and int(ids_of.max()) >= self.vocab_size:
                    self._refuse_token(ids_of, begin)
                trained = np.asarray(self.mask[begin + 1 : end], dtype=bool)
                tokens[at : at + length] = ids_of
                targets[at : at + length - 1] = np.where(trained, ids_of[1:], IGNORE_INDEX)
                ids[at : at + length] = 2 * number + side + 1
                sequences[at : at + length] = sequence
                at += length
        return tokens, targets, ids, sequences

    def _refuse_token(self, ids_of: np.ndarray, begin: int) -> None:
        """Refuse ``vocab_size``, naming the file holding the largest of ``ids_of`` (a sequence from stream position
        ``begin``) and its position there."""
        at = begin + int(np.argmax(ids_of))
        path, position = packing.token_place(self.directory, self.split, self.token_dtype, at)
        raise settings_table.ContractError(
            "vocab_size",
            f"must be above every token id in the data; {path} holds id {int(ids_of.max())} (token {position}), got "
            f"{self.vocab_size}",
        )

    def _batch(self, first_sample: int) -> tuple[torch.Tensor, ...]:
        return self.rows([self._window_index(first_sample + j) for j in range(self.batch_size)])

    def rows(self, windows: list[int]) -> tuple[torch.Tensor, ...]:
        """The batch of these windows, in this order."""
        rows = [self.window(index) for index in windows]
        return tuple(torch.from_numpy(np.stack(parts)) for parts in zip(*rows, strict=True))

    def validation_batches(self, wanted: int) -> list[tuple[torch.Tensor, ...]]:
        """This rank's share of the first ``wanted`` global batches, in order, as conversation data's
        (``token_files.validation_share``): every window once, the last batch filled up with padding windows (no
        pair: sequence number -1, no target, document id 0); every rank gets the same number."""
        per_batch = self.world_size * self.batch_size
        count = len(self.windows)
        batches = []
        for index in range(min(wanted, -(-count // per_batch))):
            first = (index * self.world_size + self.rank) * self.batch_size
            real = max(0, min(self.batch_size, count - first))
            rows = [self.window(first + j) for j in range(real)]
            rows += [self._padding()] * (self.batch_size - real)
            batches.append(tuple(torch.from_numpy(np.stack(parts)) for parts in zip(*rows, strict=True)))
        return batches

    def _padding(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A window holding no pair."""
        length = self.seq_length
        return (np.zeros(length, dtype=np.int64), np.full(length, IGNORE_INDEX, dtype=np.int64),
                np.zeros(length, dtype=np.int32), np.full(length, -1, dtype=np.int64))  # fmt: skip


def _read(directory: str | Path, split: str, token_dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The split's files (``packing.read_split``), refused unless they hold whole pairs."""
    tokens, mask, offsets = packing.read_split(directory, split, token_dtype)
    if (len(offsets) - 1) % 2:
        raise settings_table.ContractError(
            "dataset",
            f"{directory}/{token_files.METADATA_FILE}: the {split} split holds {len(offsets) - 1} sequences, not "
            "whole pairs (a chosen and a rejected sequence each): a file is cut short or was replaced",
        )
    return tokens, mask, offsets


def _windows(lengths: np.ndarray, seq_length: int, packed: bool) -> list[list[int]]:
    return packing.best_fit_decreasing(lengths, seq_length) if packed else [[i] for i in range(len(lengths))]


def make(
    cfg, split: str, rank: int, world_size: int, shuffle: bool = True, grad_accum_steps: int = 1
) -> PreferencePairs:
    """The split ``split`` of the preference data in ``cfg``'s data folder, for this rank."""
    return PreferencePairs(
        token_files.channel_dir(cfg),
        split,
        token_dtype=cfg.token_dtype,
        seq_length=cfg.seq_length,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        rank=rank,
        world_size=world_size,
        packing=cfg.packing,
        shuffle=shuffle,
        vocab_size=cfg.vocab_size,
        grad_accum_steps=grad_accum_steps,
    )


def make_validation(cfg, rank: int, world_size: int) -> PreferencePairs | None:
    """This rank's validation windows (in order), or None when the data has no validation split."""
    meta = token_files.read_metadata(token_files.channel_dir(cfg)) or {}
    if not (meta.get("splits") or {}).get("validation"):
        return None
    return make(cfg, "validation", rank, world_size, shuffle=False)


def check(cfg, directory: str, world_size: int) -> str:
    """The preflight's check of preference data: both splits load and hold at least one global batch of windows
    (``batch_size x grad_accum_steps`` for training), and the data was rendered for ``init_from``; returns what it
    found."""
    accum = getattr(cfg, "grad_accum_steps", 1)
    train = PreferencePairs(directory, "train", token_dtype=cfg.token_dtype, seq_length=cfg.seq_length,
                            batch_size=cfg.batch_size * accum, seed=cfg.seed, rank=0, world_size=world_size,
                            packing=cfg.packing, grad_accum_steps=accum)  # fmt: skip
    note = (
        f"preference pairs: {train.pairs} training pairs in {len(train.windows)} windows of {cfg.seq_length} "
        f"({'packed, best-fit decreasing' if cfg.packing else 'one pair per window, padded'}; "
        f"{train.trained_per_window():.1f} trained tokens per window)"
    )
    meta = token_files.read_metadata(directory) or {}
    if getattr(cfg, "init_from", None):
        packing.check_model(meta, Path(cfg.init_from))
    if (meta.get("splits") or {}).get("validation"):
        PreferencePairs(directory, "validation", token_dtype=cfg.token_dtype, seq_length=cfg.seq_length,
                        batch_size=cfg.batch_size, seed=cfg.seed, rank=0, world_size=world_size, packing=cfg.packing,
                        shuffle=False)  # fmt: skip
    return note
