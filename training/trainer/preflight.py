"""Checks before step 1, before any process group: the ``init_from`` model's weights
(``weights.check_init_from``), output folders writable, the checkpoint to resume of the run's model shape, data
present and consistent with the settings (metadata, token ids below the vocabulary), enough tokens for one global
batch.

Each check raises ``contract.ContractError`` naming the setting and what is allowed, so a bad run fails in
seconds instead of at its first checkpoint or mid-run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from training.request import contract
from training.trainer import checkpoint, data, weights

SCAN_CHUNK = 1 << 24
"""Tokens read at a time by the full scan of files without metadata."""


def check(cfg, world_size: int) -> None:
    """Every check, for a run of ``world_size`` processes."""
    weights.check_init_from(cfg)  # first: a refused init_from folder leaves nothing written
    for field in ("checkpoint_dir", "model_dir"):
        check_writable(getattr(cfg, field), field)
    check_checkpoint_shape(cfg)
    if cfg.dataset == "channel":
        check_data(cfg, world_size)


def check_checkpoint_shape(cfg) -> None:
    """The checkpoint the run would resume holds a model of the run's shape and position encoding (a checkpoint
    that does not record one was NoPE, ``position_encoding=none``): the newest complete one of
    ``checkpoint_dir``, or, when there is none, the earlier run's in the resume channel (the workflow's
    ``resume_from``)."""
    shape = checkpoint.model_identity(cfg)
    found = checkpoint.complete_checkpoints(cfg.checkpoint_dir)
    if found:
        field, path = "checkpoint_dir", found[-1][1]
    else:
        field, path = "resume_from", checkpoint.resume_channel_dir()
    if path is not None:
        message = checkpoint.shape_mismatch(Path(path), shape, checkpoint.REMEDY[field])
        if message:
            raise contract.ContractError(field, message)


def check_writable(directory: str, field: str) -> None:
    """Create ``directory`` if needed and write (then remove) a probe file in it."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-check-"):
            pass
    except OSError as err:
        raise contract.ContractError(
            field, f"{directory} is not a writable folder: {err.strerror or err}"
        ) from None


def check_data(cfg, world_size: int) -> None:
    """The token files exist, match the metadata and the settings, and hold one global batch per split."""
    directory = data.channel_dir(cfg)
    if not Path(directory).is_dir():
        raise contract.ContractError("dataset", f"the data folder {directory} does not exist")
    meta = data.read_metadata(directory)
    train = data.split_files(directory, "train")
    if not train:
        raise contract.ContractError("dataset", f"no .bin or .npy token files under {directory}")
    missing = [str(p) for p in (*train, *data.split_files(directory, "validation")) if not p.is_file()]
    if missing:
        raise contract.ContractError(
            "dataset", f"{data.METADATA_FILE} lists missing files: {', '.join(missing)}"
        )
    if meta is not None:
        _check_metadata(cfg, meta, directory)
    else:
        _check_ids_by_scan(cfg, train)
    need = world_size * cfg.batch_size
    for split in ("train", "validation"):
        files = data.split_files(directory, split)
        if not files:
            continue
        windows = sum(_length(p, cfg.token_dtype) // (cfg.seq_length + 1) for p in files)
        if windows < need:
            tokens = sum(_length(p, cfg.token_dtype) for p in files)
            raise contract.ContractError(
                "batch_size",
                f"the {split} split in {directory} holds {tokens} tokens, {windows} sequences of seq_length + 1 = "
                f"{cfg.seq_length + 1}; one global batch (batch_size {cfg.batch_size} x {world_size} processes) "
                f"needs {need}: lower batch_size or seq_length, or add data",
            )


def _check_metadata(cfg, meta: dict, directory: str) -> None:
    where = f"{directory}/{data.METADATA_FILE}"
    if any(p.suffix == ".bin" for p in data.split_files(directory, "train")) and (
        meta["token_dtype"] != cfg.token_dtype
    ):
        raise contract.ContractError(
            "token_dtype", f"must be {meta['token_dtype']}, the dtype the data was written in ({where}); "
            f"got {cfg.token_dtype}"
        )  # fmt: skip
    vocab = int(meta["vocab_size"])
    if vocab > cfg.vocab_size:
        tokenizer = meta.get("tokenizer", {}).get("name", "its tokenizer")
        raise contract.ContractError(
            "vocab_size",
            f"must be at least {vocab}, the vocabulary of {tokenizer} that made the data ({where}); "
            f"got {cfg.vocab_size}",
        )
    largest = meta.get("max_token_id")
    if largest is not None and int(largest) >= cfg.vocab_size:
        raise contract.ContractError(
            "vocab_size",
            f"must be above the largest token id {largest} in the data ({where}); got {cfg.vocab_size}",
        )


def _check_ids_by_scan(cfg, files: list[Path]) -> None:
    """No metadata: read every token once and compare the largest id with vocab_size."""
    for path in files:
        if _length(path, cfg.token_dtype) == 0:
            continue
        tokens = _open(path, cfg.token_dtype)
        for begin in range(0, len(tokens), SCAN_CHUNK):
            largest = int(np.max(tokens[begin : begin + SCAN_CHUNK]))
            if largest >= cfg.vocab_size:
                raise contract.ContractError(
                    "vocab_size",
                    f"must be above every token id in the data; {path} holds id {largest}, got {cfg.vocab_size}",
                )


def _open(path: Path, token_dtype: str) -> np.ndarray:
    if path.suffix == ".npy":
        return np.load(path, mmap_mode="r")
    return np.memmap(path, dtype=np.dtype(token_dtype), mode="r")


def _length(path: Path, token_dtype: str) -> int:
    if path.suffix == ".npy":
        return len(np.load(path, mmap_mode="r"))
    return os.path.getsize(path) // np.dtype(token_dtype).itemsize
