"""Batches of (tokens, targets): synthetic by default, or pre-tokenized files from the train channel.

Both sources are indexed by a position (the number of batches this rank has consumed), so a batch is a pure
function of (seed, rank, world size, position). The position is saved in checkpoints; resuming restores it and
continues with exactly the batches an uninterrupted run would have seen. A resume on another number of ranks or
another batch per rank (another layout) continues the same stream of samples from the first one not yet trained
on: the samples consumed so far become an offset, and the new ranks read on from it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from training.contract import container, settings_table
from training.trainer import files
from training.trainer.loss import IGNORE_INDEX


class _PositionedBatches:
    """A batch source indexed by position: batch ``position`` of rank ``rank`` holds the global samples
    ``offset + (position * world_size + rank) * batch_size`` onwards (``offset``: the samples an earlier layout
    consumed). Subclasses turn a first sample into a ``(batch_size, seq_length + 1)`` tensor of token ids
    (``_sequences``), or into the whole batch (``_batch``: ``packing.Conversations``' tokens, targets and document
    ids)."""

    def __init__(self, batch_size: int, seed: int, rank: int, world_size: int):
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.position = 0
        self.offset = 0
        # (position, batch) read ahead by check_next
        self._ahead: tuple[int, tuple[torch.Tensor, ...]] | None = None

    def _sequences(self, first_sample: int) -> torch.Tensor:
        raise NotImplementedError

    def _batch(self, first_sample: int) -> tuple[torch.Tensor, ...]:
        """The batch whose first global sample is ``first_sample``: (tokens, targets)."""
        seq = self._sequences(first_sample)
        return seq[:, :-1], seq[:, 1:]

    def _first_sample(self) -> int:
        return self.offset + (self.position * self.world_size + self.rank) * self.batch_size

    def next_batch(self) -> tuple[torch.Tensor, ...]:
        ahead, self._ahead = self._ahead, None
        batch = (
            ahead[1] if ahead is not None and ahead[0] == self.position else self._batch(self._first_sample())
        )
        self.position += 1
        return batch

    def check_next(self) -> str | None:
        """Read the batch ``next_batch`` returns next (it is kept for it) and say what is wrong with it: a token
        id not below the vocabulary, naming the file and the position. None when nothing is."""
        try:
            self._ahead = (self.position, self._batch(self._first_sample()))
        except settings_table.ContractError as err:
            return str(err)
        return None

    @property
    def consumed(self) -> int:
        """Global samples trained on so far (every rank's)."""
        return self.offset + self.position * self.world_size * self.batch_size

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "offset": self.offset, "world_size": self.world_size,
                "batch_size": self.batch_size}  # fmt: skip

    def load_state_dict(self, state: dict[str, int]) -> str | None:
        """Continue where ``state`` (a checkpoint's) stopped. Written by another layout (world size or batch per
        rank), the samples it consumed become the offset and this layout reads on from there; the sentence saying
        so is returned (None for the same layout). A checkpoint from before layouts were recorded is taken as this
        layout's."""
        world = int(state.get("world_size", self.world_size))
        batch = int(state.get("batch_size", self.batch_size))
        offset, position = int(state.get("offset", 0)), int(state["position"])
        self._ahead = None  # read for the position before this one
        if (world, batch) == (self.world_size, self.batch_size):
            self.offset, self.position = offset, position
            return None
        self.offset, self.position = offset + position * world * batch, 0
        return (
            f"data: the checkpoint's {world} ranks x {batch} samples per step consumed {self.offset} samples; "
            f"{self.world_size} ranks x {self.batch_size} continue from sample {self.offset} of the same order"
        )


def pins(device: torch.device) -> bool:
    """Whether batches for ``device`` go through pinned (page-locked) host memory: for a CUDA device only (pinning
    needs CUDA; a CPU-only torch refuses it)."""
    return device.type == "cuda"


def to_device(
    tokens: torch.Tensor, targets: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's ``tokens`` and ``targets`` (host memory, the same shape) on ``device``, in one copy. For a CUDA
    GPU they are stacked into pinned memory (torch's caching host allocator: no new page-locking per step), then
    copied to the GPU with ``non_blocking=True``: an asynchronous copy on the current stream, ordered before the
    kernels that read it, and the host goes on at once. From ordinary (pageable) memory a ``non_blocking`` copy is
    not asynchronous: CUDA stages it through a pinned buffer of its own and the host waits. Elsewhere a plain
    copy."""
    both = torch.stack((tokens, targets))
    both = both.pin_memory().to(device, non_blocking=True) if pins(device) else both.to(device)
    return both[0], both[1]


class SyntheticTokens(_PositionedBatches):
    """Deterministic tokens with a learnable pattern: the vocabulary is laid out in one fixed random cycle;
    each sequence starts at a random point and walks the cycle, so every next token is a function of the
    previous one (a bigram rule) and the loss falls towards 0. Sample ``i`` starts where a generator seeded by
    (seed, i) says: a pure function of its index, whatever the batch it falls in (so another layout reads the
    same samples)."""

    def __init__(
        self, vocab_size: int, seq_length: int, batch_size: int, seed: int, rank: int, world_size: int
    ):
        super().__init__(batch_size, seed, rank, world_size)
        self.seq_length = seq_length
        self.cycle = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))

    def _sequences(self, first_sample: int) -> torch.Tensor:
        samples = np.arange(first_sample, first_sample + self.batch_size, dtype=np.uint64)
        starts = torch.from_numpy((_mix(samples, self.seed) % np.uint64(len(self.cycle))).astype(np.int64))
        return self.cycle[(starts[:, None] + torch.arange(self.seq_length + 1)) % len(self.cycle)]


def _mix(samples: np.ndarray, seed: int) -> np.ndarray:
    """A well-spread 64-bit number per sample index and seed: SplitMix64's finalizer (Steele, Lea and Flood,
    "Fast splittable pseudorandom number generators", OOPSLA 2014), in wrapping uint64 arithmetic."""
    z = samples + np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class TokenFiles(_PositionedBatches):
    """Pre-tokenized ``.bin`` (raw ``token_dtype``) and ``.npy`` files, memory-mapped.

    ``source`` is a folder (every token file under it, or the train split its ``metadata.json`` lists) or a
    list of files. Each file is cut into non-overlapping windows of ``seq_length + 1`` tokens (windows never
    cross files). Windows are visited in a seeded permutation per epoch; global sample ``i`` goes to rank
    ``i % world_size``. ``shuffle=False`` (validation) visits them in order.
    """

    def __init__(
        self,
        source: str | list[Path],
        token_dtype: str,
        vocab_size: int,
        seq_length: int,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        shuffle: bool = True,
        grad_accum_steps: int = 1,
    ):
        """``batch_size``: the sequences one step reads on this rank (for training, an optimizer step's:
        ``grad_accum_steps`` micro-batches, which only the message of a too-small dataset names)."""
        paths = split_files(source, "train") if isinstance(source, str) else list(source)
        opened = [(p, open_tokens(p, token_dtype)) for p in paths]
        opened = [(p, tokens) for p, tokens in opened if len(tokens)]  # an empty file holds no window
        if not opened:
            raise settings_table.ContractError(
                "dataset", f"no non-empty .bin or .npy token files in {source}"
            )
        self.paths = paths = [p for p, _ in opened]
        self.arrays = [tokens for _, tokens in opened]
        self.window = seq_length + 1
        counts = np.array([len(a) // self.window for a in self.arrays], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        need, what = batch_need(batch_size // grad_accum_steps, grad_accum_steps, world_size)
        if self.starts[-1] < need:
            raise settings_table.ContractError(
                "batch_size",
                f"the token files {_names(paths)} hold {self.starts[-1]} windows of {self.window} tokens; "
                f"{what} needs {need}",
            )
        super().__init__(batch_size, seed, rank, world_size)
        self.vocab_size, self.shuffle = vocab_size, shuffle
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    @property
    def windows(self) -> int:
        return int(self.starts[-1])

    @property
    def window_count(self) -> int:
        return self.windows

    def _window(self, sample: int) -> np.ndarray:
        file, begin = self._where(sample)
        return np.asarray(self.arrays[file][begin : begin + self.window], dtype=np.int64)

    def _where(self, sample: int) -> tuple[int, int]:
        """(file index, first token) of global sample ``sample``'s window."""
        total = int(self.starts[-1])
        epoch, offset = divmod(sample, total)
        if not self.shuffle:
            index = offset
        else:
            if epoch != self._epoch:
                self._epoch, self._order = epoch, np.random.default_rng((self.seed, epoch)).permutation(total)
            index = int(self._order[offset])
        file = int(np.searchsorted(self.starts, index, side="right")) - 1
        return file, (index - int(self.starts[file])) * self.window

    def _sequences(self, first_sample: int) -> torch.Tensor:
        windows = [self._window(first_sample + j) for j in range(self.batch_size)]
        seq = torch.from_numpy(np.stack(windows))
        if int(seq.max()) >= self.vocab_size:
            j = next(j for j, window in enumerate(windows) if int(window.max()) >= self.vocab_size)
            file, begin = self._where(first_sample + j)
            peak = int(windows[j].max())
            raise settings_table.ContractError(
                "vocab_size",
                f"must be above every token id in the data; {self.paths[file]} holds id {peak} (token "
                f"{begin + int(np.argmax(windows[j]))}), got {self.vocab_size}",
            )
        return seq

    def validation_batches(self, wanted: int) -> list[tuple[torch.Tensor, ...]]:
        """This rank's share of the first ``wanted`` global batches, in order (``validation_share``)."""
        return validation_share(self, wanted, self.windows)


def validation_share(source: _PositionedBatches, wanted: int, windows: int) -> list[tuple[torch.Tensor, ...]]:
    """``source``'s (a split read in order) share of the first ``wanted`` global batches of its ``windows``: every
    window once, the last batch filled up with padding windows (token 0, no target counted, document id 0), so
    every window is scored when ``wanted`` allows (``validation_note`` says how many are otherwise); every rank gets
    the same number of batches (the validation loss is a collective)."""
    per_batch = source.world_size * source.batch_size
    batches = []
    for index in range(min(wanted, -(-windows // per_batch))):
        first = (index * source.world_size + source.rank) * source.batch_size
        batch = source._batch(first)
        real = max(0, min(source.batch_size, windows - first))
        if real < source.batch_size:  # the rows past the end wrapped round to the first windows: blank them
            batch = tuple(part.clone() for part in batch)
            for number, part in enumerate(batch):
                part[real:] = IGNORE_INDEX if number == 1 else 0
        batches.append(batch)
    return batches


def validation_note(windows: int, wanted: int, batch_size: int, world_size: int) -> str | None:
    """The line a run prints when ``validation_batches`` scores fewer windows than the split holds; None when it
    scores them all."""
    scored = min(windows, wanted * batch_size * world_size)
    if scored == windows:
        return None
    return (
        f"validation: scores {scored} of the split's {windows} windows each time (validation_batches {wanted} "
        f"x batch_size {batch_size} x {world_size} processes); raise validation_batches to "
        f"{-(-windows // (batch_size * world_size))} to score them all"
    )


def batch_need(batch_size: int, grad_accum_steps: int, world_size: int) -> tuple[int, str]:
    """The sequences one step reads over every process, and the words for them: ``one optimizer step (batch_size
    4 x grad_accum_steps 8 x 2 processes)``, or ``one global batch (batch_size 4 x 2 processes)``."""
    if grad_accum_steps > 1:
        what = (
            f"one optimizer step (batch_size {batch_size} x grad_accum_steps {grad_accum_steps} x {world_size} "
            "processes)"
        )
    else:
        what = f"one global batch (batch_size {batch_size} x {world_size} processes)"
    return batch_size * grad_accum_steps * world_size, what


def _names(paths: list[Path]) -> str:
    shown = ", ".join(str(p) for p in paths[:3])
    return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


METADATA_FILE = container.DATA_METADATA_FILE
"""Written by ``training.prepare`` next to the token files: token dtype, vocabulary size, tokenizer,
token counts and the files of each split (``train``, ``validation``)."""


def read_metadata(directory: str | Path) -> dict | None:
    """The folder's ``metadata.json``, or None when it has none (token files made by other tools)."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
        meta["splits"]["train"]["files"]  # noqa: B018 (shape check)
        int(meta["vocab_size"])
        str(meta["token_dtype"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise settings_table.ContractError(
            "dataset", f"{path} is not a valid metadata file: {err!r}"
        ) from None
    return meta


def split_files(directory: str | Path, split: str) -> list[Path]:
    """Token files of ``split``: those ``metadata.json`` lists, or without metadata every ``.bin``/``.npy``
    under the folder as ``train`` (and no ``validation``)."""
    meta = read_metadata(directory)
    if meta is not None:
        entry = meta["splits"].get(split)
        return [listed_file(directory, name, split) for name in entry["files"]] if entry else []
    if split != "train":
        return []
    found = sorted(p for p in Path(directory).rglob("*") if p.suffix in (".bin", ".npy") and p.is_file())
    for path in found:
        try:
            files.found_inside(directory, path)
        except files.OutsideFolderError as err:
            raise settings_table.ContractError("dataset", str(err)) from None
    _refuse_twins(found, directory)
    return found


def listed_file(directory: str | Path, name: str, split: str) -> Path:
    """The file ``name`` of ``split`` that the folder's ``metadata.json`` lists, confined to the folder
    (``training.trainer.files``: a ``../``, absolute or linked-out name refused, naming it)."""
    try:
        return files.inside(
            directory, name, f"{Path(directory) / METADATA_FILE}", f"as a file of the {split} split"
        )
    except files.OutsideFolderError as err:
        raise settings_table.ContractError("dataset", str(err)) from None


def _refuse_twins(files: list[Path], directory: str | Path) -> None:
    """Refuse ``x.bin`` beside ``x.npy``: a file converted and the original left behind would be read twice."""
    seen: set[Path] = set()
    for twin in (path.with_suffix("") for path in files):
        if twin not in seen:
            seen.add(twin)
            continue
        raise settings_table.ContractError(
            "dataset",
            f"{twin}.bin and {twin}.npy are both token files of the data folder {directory}, so both would be read "
            "(the same tokens twice, when one was converted from the other): keep one",
        )


NPY_MAGIC = b"\x93NUMPY"
"""The first bytes of every .npy file."""


def open_tokens(path: Path, token_dtype: str) -> np.ndarray:
    """The token ids of one file, memory-mapped (nothing is read yet): a ``.bin`` of raw ``token_dtype`` values,
    or a ``.npy`` of a 1-D array of an unsigned integer type (its own dtype). Raises ``ContractError`` naming the
    file and what is wrong with it."""
    try:
        if path.suffix == ".npy":
            return _open_npy(path)
        size, itemsize = path.stat().st_size, np.dtype(token_dtype).itemsize
    except settings_table.ContractError:
        raise
    except (OSError, ValueError, EOFError) as err:  # what numpy raises for a damaged or cut-short .npy
        raise settings_table.ContractError(
            "dataset", f"cannot read {path} as token ids: {_why(err)}"
        ) from None
    if size % itemsize:
        raise settings_table.ContractError(
            "dataset",
            f"{path} has {size} bytes, not a whole number of {token_dtype} tokens ({itemsize} bytes each): the file "
            f"is cut short, or was written in another dtype than token_dtype={token_dtype}",
        )
    if size == 0:  # np.memmap refuses an empty file
        return np.empty(0, dtype=np.dtype(token_dtype))
    return np.memmap(path, dtype=np.dtype(token_dtype), mode="r")


def _open_npy(path: Path) -> np.ndarray:
    with open(path, "rb") as handle:
        if handle.read(len(NPY_MAGIC)) != NPY_MAGIC:
            raise ValueError("it is not a .npy file (no NumPy header)")
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    if array.dtype.kind != "u":
        raise settings_table.ContractError(
            "dataset",
            f"{path} holds {array.dtype} values; token files hold unsigned integers (uint8, uint16, uint32, uint64): "
            "save it with array.astype(np.uint32), or np.uint16 when every id is below 65536",
        )
    if array.ndim != 1:
        raise settings_table.ContractError(
            "dataset",
            f"{path} holds a {array.ndim}-D array of shape {tuple(array.shape)} ({array.size} tokens); a token file "
            "holds one stream of token ids (1-D): save it with array.reshape(-1)",
        )
    return array


def _why(err: BaseException) -> str:
    return (getattr(err, "strerror", None) or str(err) or type(err).__name__).strip()


def token_count(path: Path, token_dtype: str) -> int:
    """How many tokens the file holds (its elements; ``open_tokens``'s checks apply)."""
    return int(open_tokens(path, token_dtype).size)


def channel_dir(cfg=None) -> str:
    """The token files' folder: ``cfg.data_dir`` when set, else the train channel's local folder
    (``SM_CHANNEL_TRAIN``, set by the SageMaker toolkit)."""
    if cfg is not None and cfg.data_dir:
        return cfg.data_dir
    env = f"SM_CHANNEL_{container.TRAIN_CHANNEL.upper()}"
    directory = os.environ.get(env)
    if not directory:
        raise settings_table.ContractError(
            "dataset", f"dataset=channel needs the '{container.TRAIN_CHANNEL}' channel ({env})"
        )
    return directory


def make_dataset(cfg, rank: int, world_size: int, grad_accum_steps: int = 1) -> SyntheticTokens | TokenFiles:
    """The data source ``cfg.dataset`` names, for this rank (``cfg.batch_size``: the sequences of one optimizer
    step, ``grad_accum_steps`` micro-batches, which only the message of too little data names)."""
    if cfg.dataset == "synthetic":
        return SyntheticTokens(cfg.vocab_size, cfg.seq_length, cfg.batch_size, cfg.seed, rank, world_size)
    return TokenFiles(
        split_files(channel_dir(cfg), "train"),
        cfg.token_dtype,
        cfg.vocab_size,
        cfg.seq_length,
        cfg.batch_size,
        cfg.seed,
        rank,
        world_size,
        grad_accum_steps=grad_accum_steps,
    )


def make_validation(cfg, rank: int, world_size: int) -> TokenFiles | None:
    """This rank's validation windows (in order), or None when the data has no validation split."""
    if cfg.dataset == "synthetic":
        return None
    files = split_files(channel_dir(cfg), "validation")
    if not files:
        return None
    return TokenFiles(
        files, cfg.token_dtype, cfg.vocab_size, cfg.seq_length, cfg.batch_size, cfg.seed, rank, world_size,
        shuffle=False,
    )  # fmt: skip
