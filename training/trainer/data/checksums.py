"""What ``prepare`` recorded of each split in ``metadata.json``, verified before training: each listed file's
SHA-256 (``splits.<split>.sha256``: file name -> lowercase hex digest of the whole file) and, for conversation data,
the split's trained tokens (``trained_tokens``: the mask's ones) and examples (``examples``: the document offsets
less one). A mask zeroed, shifted by one, or a document boundary removed keeps each file's size and token count;
only these tell. A train split that trains no token is refused too (a run on it would change nothing).

Data prepared before prepare recorded checksums has no ``sha256``: its counts are still checked and the note says
that the contents could not be verified. Each refusal is one ``settings_table.ContractError`` on ``dataset``
naming the file and what ``metadata.json`` records.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from training.contract import settings_table
from training.trainer.data import token_files

CHUNK = 1 << 24
"""Bytes hashed at a time (16 MiB)."""

LISTS = ("files", "masks", "documents")
"""The keys of a split's entry that list its files (a sharded text preparation's ``documents`` is a count: skipped)."""

CHANGED = "the file was changed or replaced after prepare wrote it: prepare the data again"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def verify(directory: str, meta: dict, chat: bool) -> str:
    """Checks every split of ``meta`` (``directory``'s ``metadata.json``): each listed file's SHA-256 where the
    split records them, then, for conversation data (``chat``), its trained tokens and examples; refuses a train
    split with no trained token. Returns the note on what was verified."""
    where = f"{directory}/{token_files.METADATA_FILE}"
    started, hashed, read, unrecorded = time.monotonic(), 0, 0, []
    for split, entry in (meta.get("splits") or {}).items():
        if not entry:
            continue
        names = [name for key in LISTS if isinstance(entry.get(key), list) for name in entry[key]]
        recorded = entry.get("sha256")
        if recorded is None:
            unrecorded.append(split)
        else:
            for name in names:
                read += _check_digest(directory, where, split, name, recorded)
                hashed += 1
        if chat:
            _check_counts(directory, where, split, entry)
    took = time.monotonic() - started
    if not unrecorded:
        return (
            f"checksums: {hashed} files verified (SHA-256 as metadata.json records them, {read / 1e6:.3g} MB read "
            f"in {took:.2g} s)"
        )
    counts = "their counts were" if chat else "their token counts were"
    return (
        f"checksums: none recorded in metadata.json (data prepared before prepare recorded them): the files' "
        f"contents could not be verified, {counts} ({', '.join(unrecorded)} split)"
    )


def _check_digest(directory: str, where: str, split: str, name: str, recorded: object) -> int:
    """Refuses ``name`` unless its SHA-256 is the one ``recorded`` (the split's ``sha256`` object) holds for it;
    returns the bytes read."""
    if not isinstance(recorded, dict) or name not in recorded:
        raise settings_table.ContractError(
            "dataset",
            f"{where} records the SHA-256 of the {split} split's files but not of {name}: {CHANGED}",
        )
    path = token_files.listed_file(directory, name, split)
    digest = sha256_of(path)
    if digest != str(recorded[name]).lower():
        raise settings_table.ContractError(
            "dataset",
            f"{path} does not hold what {where} records of it: its SHA-256 is {digest}, metadata.json records "
            f"{recorded[name]}: {CHANGED}",
        )
    return path.stat().st_size


def _check_counts(directory: str, where: str, split: str, entry: dict) -> None:
    """A conversation split's mask marks the ``trained_tokens`` and its offsets hold the ``examples`` that
    ``metadata.json`` records (each when recorded); a train split trains at least one token."""
    masks, documents = entry.get("masks") or [], entry.get("documents") or []
    if len(masks) != 1 or len(documents) != 1:
        return  # packing.read_split refuses the split, naming what it must list
    mask_path = token_files.listed_file(directory, masks[0], split)
    docs_path = token_files.listed_file(directory, documents[0], split)
    marked = int(np.count_nonzero(_array(mask_path, np.uint8)))
    recorded = entry.get("trained_tokens")
    if recorded is not None and int(recorded) != marked:
        raise settings_table.ContractError(
            "dataset",
            f"{where} records {recorded} trained tokens in the {split} split, but {mask_path} marks {marked}: "
            f"{CHANGED}",
        )
    examples = entry.get("examples")
    held = max(len(_array(docs_path, np.int64)) - 1, 0)
    if examples is not None and int(examples) != held:
        raise settings_table.ContractError(
            "dataset",
            f"{where} records {examples} examples in the {split} split, but {docs_path} holds {held}: {CHANGED}",
        )
    if split == "train" and marked == 0:
        said = "metadata.json records 0 and " if recorded is not None else ""
        raise settings_table.ContractError(
            "dataset",
            f"the train split of {directory} has no trained token ({said}{mask_path.name} marks none): a run on it "
            "would train nothing; prepare the data again with examples that hold an answer to train",
        )


def _array(path: Path, dtype: type) -> np.ndarray:
    size = path.stat().st_size
    if not size or size % np.dtype(dtype).itemsize:
        return np.empty(0, dtype=dtype)  # packing.read_split names a file cut short
    return np.memmap(path, dtype=dtype, mode="r")
