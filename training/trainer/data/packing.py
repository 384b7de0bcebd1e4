"""Conversation data (``prepare --init-from``) as training batches: examples packed into ``seq_length`` windows, or
one example per window, padded.

Packing is **best-fit decreasing**, computed once from the examples' lengths (deterministic, so every rank and every
resume computes the same windows): examples are taken longest first, each placed into the open window with the least
room that still holds it (a Fenwick tree over the rooms left finds it in O(log seq_length)), or a new window. Whole
examples only: nothing is split across windows, so an example longer than ``seq_length`` is refused before training
(``prepare --max-tokens`` shortens or drops those). With ``packing=false`` each example has a window of its own.

A window holds its examples one after another, then padding. Each token's target is the next token of the same
example when ``prepare`` marked that next token as trained (the assistant's answers and their end-of-turn token),
else ``loss.IGNORE_INDEX``; an example's last token and padding predict nothing. The window's document ids (1, 2, ...
per example, 0 for padding) go with it: the model restarts positions and blocks attention at their boundaries
(``doc_mask``). Windows are visited in a seeded permutation per epoch, global sample ``i`` on rank ``i % world_size``,
as ``data.TokenFiles`` does, so a batch is a pure function of (seed, rank, world size, position) and resumes exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.contract import settings_table
from training.request import sft_data
from training.trainer.data import token_files
from training.trainer.loss import IGNORE_INDEX

CHAT_KIND = sft_data.CHAT_KIND


def is_chat(meta: dict | None) -> bool:
    return bool(meta) and meta.get("kind") == CHAT_KIND


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Windows of example indices: each example (longest first; ties in input order) goes into the open window
    with the least room left that holds it, else a new one. Every length must be in [1, capacity]."""
    tree = np.zeros(capacity + 1, dtype=np.int64)  # Fenwick tree: open windows per room left (1..capacity)
    by_room: list[list[int]] = [[] for _ in range(capacity + 1)]
    windows: list[list[int]] = []
    top = 1 << (capacity.bit_length() - 1)

    def add(room: int, delta: int) -> None:
        while room <= capacity:
            tree[room] += delta
            room += room & -room

    def first_at_least(need: int) -> int:
        """The smallest room >= need with an open window, or 0: the (count below need + 1)-th window by room."""
        below, room = 0, need - 1
        while room > 0:
            below += tree[room]
            room -= room & -room
        position, remaining, step = 0, below + 1, top
        while step:
            probe = position + step
            if probe <= capacity and tree[probe] < remaining:
                position, remaining = probe, remaining - tree[probe]
            step >>= 1
        return position + 1 if position + 1 <= capacity else 0

    for index in np.argsort(-np.asarray(lengths), kind="stable"):
        length = int(lengths[index])
        room = first_at_least(length)
        if room:
            window = by_room[room].pop()
            add(room, -1)
        else:
            window, room = len(windows), capacity
            windows.append([])
        windows[window].append(int(index))
        left = room - length
        if left:
            by_room[left].append(window)
            add(left, 1)
    return windows


class Conversations(token_files._PositionedBatches):
    """One split of conversation data as ``(tokens, targets, document ids)`` batches of ``[batch_size,
    seq_length]`` (see the module doc); ``packing`` False: one example per window. ``vocab_size``: a token id not
    below it is refused as its batch is read, naming the file and the position (the check before training samples
    large data; the trainer reads each batch a step ahead, ``data._PositionedBatches.check_next``).
    ``grad_accum_steps``: ``batch_size`` is an optimizer step's sequences on this rank, that many micro-batches
    (only the message of too little data names it)."""

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
        self.tokens, self.mask, self.offsets = read_split(directory, split, token_dtype)
        self.directory, self.split, self.token_dtype = directory, split, token_dtype
        self.vocab_size = vocab_size
        lengths = np.diff(self.offsets)
        where = f"{directory}/{token_files.METADATA_FILE}"
        if len(lengths) and int(lengths.max()) > seq_length:
            raise settings_table.ContractError(
                "seq_length",
                f"the longest example of the {split} split has {int(lengths.max())} tokens ({where}: "
                f"{int((lengths > seq_length).sum())} examples are longer than seq_length {seq_length}); examples "
                "are never cut at training: raise seq_length, or prepare the data again with --max-tokens "
                f"{seq_length}",
            )
        self.windows = (
            best_fit_decreasing(lengths, seq_length) if packing else [[i] for i in range(len(lengths))]
        )
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
                f"({len(lengths)} examples, {'packed' if packing else 'one per window'}); {what} needs {need}: "
                f"lower {lower}, or add data",
            )
        super().__init__(batch_size, seed, rank, world_size)
        self.seq_length, self.packing, self.shuffle = seq_length, packing, shuffle
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def trained_per_window(self) -> float:
        """Trained targets per window on average (packing efficiency: packed windows hold more)."""
        return float(self.mask.sum()) / len(self.windows)

    def _window_index(self, sample: int) -> int:
        epoch, offset = divmod(sample, len(self.windows))
        if not self.shuffle:
            return offset
        if epoch != self._epoch:
            generator = np.random.default_rng((self.seed, epoch))
            self._epoch, self._order = epoch, generator.permutation(len(self.windows))
        return int(self._order[offset])

    def window(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Window ``index``'s tokens, targets and document ids (``seq_length`` each)."""
        tokens = np.zeros(self.seq_length, dtype=np.int64)
        targets = np.full(self.seq_length, IGNORE_INDEX, dtype=np.int64)
        ids = np.zeros(self.seq_length, dtype=np.int32)
        at = 0
        for number, example in enumerate(self.windows[index], 1):
            begin, end = int(self.offsets[example]), int(self.offsets[example + 1])
            length = end - begin
            ids_of = np.asarray(self.tokens[begin:end], dtype=np.int64)
            if self.vocab_size is not None and int(ids_of.max()) >= self.vocab_size:
                path, position = token_place(
                    self.directory, self.split, self.token_dtype, begin + int(np.argmax(ids_of))
                )
                raise settings_table.ContractError(
                    "vocab_size",
                    f"must be above every token id in the data; {path} holds id {int(ids_of.max())} (token "
                    f"{position}), got {self.vocab_size}",
                )
            trained = np.asarray(self.mask[begin + 1 : end], dtype=bool)
            tokens[at : at + length] = ids_of
            targets[at : at + length - 1] = np.where(trained, ids_of[1:], IGNORE_INDEX)
            ids[at : at + length] = number
            at += length
        return tokens, targets, ids

    def _batch(self, first_sample: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = [self.window(self._window_index(first_sample + j)) for j in range(self.batch_size)]
        tokens, targets, ids = (torch.from_numpy(np.stack(parts)) for parts in zip(*rows, strict=True))
        return tokens, targets, ids

    def validation_batches(self, wanted: int) -> list[tuple[torch.Tensor, ...]]:
        """This rank's share of the first ``wanted`` global batches, in order (``token_files.validation_share``:
        every window once, the last batch filled up with padding)."""
        return token_files.validation_share(self, wanted, len(self.windows))

    @property
    def window_count(self) -> int:
        return len(self.windows)


def read_split(
    directory: str | Path, split: str, token_dtype: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A split's token ids, loss mask (1: the token is trained as a target) and example offsets (``examples + 1``
    int64, from 0 to the token count); refuses files that disagree with each other. One file each (``prepare
    --init-from``) is memory-mapped; a sharded preparation's several (``training.prepare.job``: one of each per
    shard, in the manifest's order) are read into memory as one stream, their offsets shifted to follow on."""
    meta = token_files.read_metadata(directory) or {}
    entry = (meta.get("splits") or {}).get(split) or {}
    names = [entry.get(key) or [] for key in ("files", "masks", "documents")]
    where = f"{directory}/{token_files.METADATA_FILE}"
    if not names[0] or any(len(listed) != len(names[0]) for listed in names):
        raise settings_table.ContractError(
            "dataset",
            f"{where}: the {split} split must list as many files, masks and documents (at least one)",
        )
    parts = [_shard(directory, triple, token_dtype, split) for triple in zip(*names, strict=True)]
    if len(parts) == 1:
        return parts[0]
    starts = np.cumsum([0] + [len(tokens) for tokens, _, _ in parts[:-1]])
    offsets = np.concatenate(
        [[0], *[offsets[1:] + start for (_, _, offsets), start in zip(parts, starts, strict=True)]]
    )
    return (np.concatenate([tokens for tokens, _, _ in parts]), np.concatenate([mask for _, mask, _ in parts]),
            offsets.astype(np.int64))  # fmt: skip


def token_place(directory: str | Path, split: str, token_dtype: str, position: int) -> tuple[Path, int]:
    """Where token ``position`` of ``read_split``'s stream is: its file and its position in that file (the files
    are opened, memory-mapped, only to tell their lengths: for an error message)."""
    for path in token_files.split_files(directory, split):
        count = len(token_files.open_tokens(path, token_dtype))
        if position < count:
            return path, position
        position -= count
    raise IndexError(f"token {position} is past the {split} split of {directory}")


def _shard(directory: str | Path, names: tuple[str, str, str], token_dtype: str, split: str) -> tuple:
    """One shard's token ids, mask and offsets (each name confined to the folder), memory-mapped and checked
    against each other."""
    paths = [token_files.listed_file(directory, name, split) for name in names]
    where = f"{directory}/{token_files.METADATA_FILE}"
    tokens = token_files.open_tokens(paths[0], token_dtype)
    mask = _raw(paths[1], np.uint8)
    offsets = _raw(paths[2], np.int64)
    if len(mask) != len(tokens) or len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != len(tokens):
        raise settings_table.ContractError(
            "dataset",
            f"{where}: the {split} split's files disagree ({names[0]}: {len(tokens)} tokens, {len(mask)} mask "
            f"entries, example offsets ending at {int(offsets[-1]) if len(offsets) else 'none'}): a file is cut "
            "short or was replaced",
        )
    if np.any(np.diff(offsets) < 1):
        raise settings_table.ContractError(
            "dataset", f"{where}: the {split} split's example offsets are not increasing ({names[2]})"
        )
    return tokens, mask, np.asarray(offsets)


def _raw(path: Path, dtype: type) -> np.ndarray:
    try:
        size = path.stat().st_size
    except OSError as err:
        raise settings_table.ContractError("dataset", f"cannot read {path}: {err.strerror or err}") from None
    if size % np.dtype(dtype).itemsize:
        raise settings_table.ContractError("dataset", f"{path} is cut short ({size} bytes)")
    return np.memmap(path, dtype=dtype, mode="r") if size else np.empty(0, dtype=dtype)


def chat_data(cfg) -> bool:
    """Whether ``cfg`` trains on conversation data (its data folder's ``metadata.json`` says ``kind: chat``)."""
    return cfg.dataset == "channel" and is_chat(token_files.read_metadata(token_files.channel_dir(cfg)))


def packs(cfg) -> bool:
    """Whether the run's batches hold several documents per window (conversation data with ``packing`` on, and
    preference data always: a window holds a pair's two sequences, ``data.pairs``): the model then blocks
    attention between them."""
    if cfg.dataset != "channel":
        return False
    kind = (token_files.read_metadata(token_files.channel_dir(cfg)) or {}).get("kind")
    return kind == sft_data.PREFERENCE_KIND or (bool(getattr(cfg, "packing", False)) and kind == CHAT_KIND)


def make_dataset(cfg, rank: int, world_size: int, grad_accum_steps: int = 1) -> Any:
    """The training batches of ``cfg`` for this rank: conversations, or what ``data.make_dataset`` gives
    (``cfg.batch_size``: an optimizer step's sequences, ``grad_accum_steps`` micro-batches)."""
    if chat_data(cfg):
        return make(cfg, "train", rank, world_size, grad_accum_steps=grad_accum_steps)
    return token_files.make_dataset(cfg, rank, world_size, grad_accum_steps=grad_accum_steps)


def make_validation(cfg, rank: int, world_size: int) -> Any:
    """This rank's validation windows (in order), or None when the data has no validation split."""
    if not chat_data(cfg):
        return token_files.make_validation(cfg, rank, world_size)
    meta = token_files.read_metadata(token_files.channel_dir(cfg)) or {}
    if not (meta.get("splits") or {}).get("validation"):
        return None
    return make(cfg, "validation", rank, world_size, shuffle=False)


def make(
    cfg, split: str, rank: int, world_size: int, shuffle: bool = True, grad_accum_steps: int = 1
) -> Conversations:
    """The split ``split`` of the conversation data in ``cfg``'s data folder, for this rank (token ids checked
    against ``cfg.vocab_size`` as batches are read)."""
    return Conversations(
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


def check_model(meta: dict, folder: Path) -> None:
    """Refuse conversation data rendered for another model than the ``init_from`` folder (its chat template,
    tokenizer or vocabulary: ``sft_data.check_against_model``)."""
    names = (*sft_data.TEMPLATE_FILES, sft_data.TOKENIZER_FILE)
    files = {name: (folder / name).read_bytes() for name in names if (folder / name).is_file()}
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else None
    problems = sft_data.check_against_model(meta, files, config, str(folder))
    if problems:
        raise settings_table.ContractError("init_from", "; ".join(problems))


def check(cfg, directory: str, world_size: int) -> str:
    """The preflight's check of conversation data: both splits load and pack into at least one global batch (of
    ``batch_size x grad_accum_steps`` for training); returns what it found."""
    accum = getattr(cfg, "grad_accum_steps", 1)
    train = Conversations(directory, "train", token_dtype=cfg.token_dtype, seq_length=cfg.seq_length,
                          batch_size=cfg.batch_size * accum, seed=cfg.seed, rank=0, world_size=world_size,
                          packing=cfg.packing, grad_accum_steps=accum)  # fmt: skip
    note = (
        f"conversations: {len(train.offsets) - 1} training examples in {len(train.windows)} windows of "
        f"{cfg.seq_length} ({'packed, best-fit decreasing' if cfg.packing else 'one per window, padded'}; "
        f"{train.trained_per_window():.1f} trained tokens per window)"
    )
    meta = token_files.read_metadata(directory) or {}
    if getattr(cfg, "init_from", None):
        check_model(meta, Path(cfg.init_from))
    if (meta.get("splits") or {}).get("validation"):
        Conversations(directory, "validation", token_dtype=cfg.token_dtype, seq_length=cfg.seq_length,
                      batch_size=cfg.batch_size, seed=cfg.seed, rank=0, world_size=world_size, packing=cfg.packing,
                      shuffle=False)  # fmt: skip
    return note
