"""Checks before step 1, before any process group, creating nothing: the ``init_from`` model's weights (its
safetensors headers: ``weights.check_init_from``), output folders writable (probed without creating them; the run
creates them when it first writes) or an S3 checkpoint prefix reachable, the checkpoint to resume of the run's
model shape, every data file the run will read readable as tokens and consistent with the settings and its metadata
(each file's SHA-256 and each split's counts as ``prepare`` recorded them: ``data.checksums``; token ids below the
vocabulary: read in full, or sampled when the data is large), enough tokens for one optimizer step
(``grad_accum_steps`` micro-batches on every process) and one validation batch.

Each check raises ``settings_table.ContractError`` naming the setting (and the file) and what is allowed, so a bad run
fails in seconds instead of at its first checkpoint or mid-run.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np

from training.contract import settings_table, token_data
from training.trainer import objective
from training.trainer.checkpoint import folder, identity, manager, weights
from training.trainer.data import checksums, packing, pairs, token_files

SCAN_CHUNK = 1 << 24
"""Tokens read at a time when every token id is read."""

ID_CHECK_TOKENS = 1 << 26
"""Token ids read by the vocabulary check: all of them when the data holds at most this many (67,108,864 tokens,
128 MiB of uint16), else a sample of this many, shared by the files in proportion to their size."""

ID_CHECK_BLOCK = 1 << 16
"""A sample is read in blocks of this many consecutive tokens, spread evenly over each file from its first token to
its last."""


def check(cfg, world_size: int) -> list[str]:
    """Every check, for a run of ``world_size`` processes; returns notes on what was checked (how much of the data
    was read), for ``--check-only`` to print."""
    weights.check_init_from(cfg)
    if manager.backend_of(cfg.checkpoint_dir, cfg.checkpoint_backend) == "s3":
        check_reachable(cfg.checkpoint_dir, "checkpoint_dir")
    else:
        check_writable(cfg.checkpoint_dir, "checkpoint_dir")
    check_writable(cfg.model_dir, "model_dir")
    check_checkpoint_shape(cfg)
    objective.check(cfg)
    if cfg.dataset == "channel":
        return [check_data(cfg, world_size)]
    return []


def check_checkpoint_shape(cfg) -> None:
    """The checkpoint the run would resume holds a model of the run's shape and position encoding (a checkpoint
    that does not record one was NoPE, ``position_encoding=none``): the newest complete one of
    ``checkpoint_dir`` (a folder, or the run's S3 prefix), or, when there is none, the earlier run's in the resume
    channel (the workflow's ``resume_from``)."""
    shape = identity.model_identity(cfg)
    if manager.backend_of(cfg.checkpoint_dir, cfg.checkpoint_backend) == "s3":
        from training.trainer.checkpoint import s3  # imports s3torchconnector: only for S3 checkpoints

        newest = s3.newest_sealed(cfg.checkpoint_dir)
        if newest is not None:
            where, found = newest
            message = identity.mismatch(
                where, found.get("model_shape"), shape, identity.REMEDY["checkpoint_dir"]
            )
            if message:
                raise settings_table.ContractError("checkpoint_dir", message)
            return
    else:
        found_here = folder.complete_checkpoints(cfg.checkpoint_dir)
        if found_here:
            message = folder.shape_mismatch(found_here[-1][1], shape, identity.REMEDY["checkpoint_dir"])
            if message:
                raise settings_table.ContractError("checkpoint_dir", message)
            return
    channel = folder.resume_channel_dir()
    if channel is not None:
        message = folder.shape_mismatch(Path(channel), shape, identity.REMEDY["resume_from"])
        if message:
            raise settings_table.ContractError("resume_from", message)


def check_reachable(uri: str, field: str) -> None:
    """The S3 prefix ``uri`` can be listed with this process's credentials (nothing is written: a grant to write
    is the job's role's, checked by the first save)."""
    from training.trainer.checkpoint import s3  # imports s3torchconnector: only for S3 checkpoints

    problem = s3.reach_problem(uri)
    if problem is not None:
        raise settings_table.ContractError(field, problem)


def check_writable(directory: str, field: str) -> None:
    """``directory`` is a writable folder, or can be made one: a probe file is written (and removed) in it or, when
    it does not exist yet, in its nearest existing parent. Nothing is created."""
    path = Path(directory)
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "it is not a folder" if existing == path else f"{existing} is not a folder"
        raise settings_table.ContractError(field, f"{directory} is not a writable folder: {where}")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-check-"):
            pass
    except OSError as err:
        raise settings_table.ContractError(
            field, f"{directory} is not a writable folder: {err.strerror or err}"
        ) from None


def check_data(cfg, world_size: int) -> str:
    """The token files exist, are readable as tokens, match the metadata and the settings, and hold one global
    batch per split; returns what was checked."""
    directory = token_files.channel_dir(cfg)
    if not Path(directory).is_dir():
        raise settings_table.ContractError("dataset", f"the data folder {directory} does not exist")
    meta = token_files.read_metadata(directory)
    splits = {split: token_files.split_files(directory, split) for split in ("train", "validation")}
    if not splits["train"]:
        raise settings_table.ContractError("dataset", f"no .bin or .npy token files under {directory}")
    missing = [str(p) for files in splits.values() for p in files if not p.is_file()]
    if missing:
        raise settings_table.ContractError(
            "dataset", f"{token_files.METADATA_FILE} lists missing files: {', '.join(missing)}"
        )
    if meta is not None:
        _check_metadata(cfg, meta, directory)
    counts = {p: token_files.token_count(p, cfg.token_dtype) for files in splits.values() for p in files}
    verified = ""
    if meta is not None:
        _check_split_sizes(
            meta, directory, splits, counts
        )  # a file cut short: said as such, before its digest
        if not pairs.is_preference(meta):  # preference pairs: their own files (not verified here yet)
            verified = "; " + checksums.verify(directory, meta, packing.is_chat(meta))
    note = _check_ids(cfg, counts)
    if pairs.is_preference(meta):  # pairs in windows: their own check
        return (
            f"data ok: {len(counts)} files of {sum(counts.values())} tokens in {directory}; {note}; "
            + pairs.check(cfg, directory, world_size)
        )
    if packing.is_chat(meta):  # examples in windows, not a token stream: packing checks them
        return (
            f"data ok: {len(counts)} files of {sum(counts.values())} tokens in {directory}; {note}{verified}; "
            + packing.check(cfg, directory, world_size)
        )
    for split, files in splits.items():
        _check_one_batch(cfg, world_size, directory, split, {p: counts[p] for p in files})
    return f"data ok: {len(counts)} files of {sum(counts.values())} tokens in {directory}; {note}{verified}"


def _check_one_batch(cfg, world_size: int, directory: str, split: str, counts: dict[Path, int]) -> None:
    """The split holds what one step reads: for training one optimizer step, batch_size x grad_accum_steps
    sequences on every process (``data.batch_need``); for validation one batch of batch_size on every process."""
    accum = cfg.grad_accum_steps if split == "train" else 1
    need, what = token_files.batch_need(cfg.batch_size, accum, world_size)
    windows = sum(count // (cfg.seq_length + 1) for count in counts.values())
    if counts and windows < need:
        lower = "batch_size, grad_accum_steps or seq_length" if accum > 1 else "batch_size or seq_length"
        raise settings_table.ContractError(
            "batch_size",
            f"the {split} split in {directory} holds {sum(counts.values())} tokens, {windows} sequences of "
            f"seq_length + 1 = {cfg.seq_length + 1}; {what} needs {need}: lower {lower}, or add data",
        )


def _check_metadata(cfg, meta: dict, directory: str) -> None:
    where = f"{directory}/{token_files.METADATA_FILE}"
    if any(p.suffix == ".bin" for p in token_files.split_files(directory, "train")):
        refused = token_data.token_dtype_refusal(str(meta["token_dtype"]), cfg.token_dtype, where)
        if refused is not None:  # the request check refuses the same before launch, in these words
            raise refused
    vocab = int(meta["vocab_size"])
    if vocab > cfg.vocab_size:
        tokenizer = meta.get("tokenizer", {}).get("name", "its tokenizer")
        raise settings_table.ContractError(
            "vocab_size",
            f"must be at least {vocab}, the vocabulary of {tokenizer} that made the data ({where}); "
            f"got {cfg.vocab_size}",
        )
    largest = meta.get("max_token_id")
    if largest is not None and int(largest) >= cfg.vocab_size:
        raise settings_table.ContractError(
            "vocab_size",
            f"must be above the largest token id {largest} in the data ({where}); got {cfg.vocab_size}",
        )


def _check_split_sizes(meta: dict, directory: str, splits: dict, counts: dict) -> None:
    """Each split's files hold the number of tokens ``metadata.json`` recorded (a file cut short or replaced
    does not)."""
    for split, files in splits.items():
        recorded = (meta["splits"].get(split) or {}).get("tokens")
        held = sum(counts[p] for p in files)
        if recorded is not None and int(recorded) != held:
            raise settings_table.ContractError(
                "dataset",
                f"{directory}/{token_files.METADATA_FILE} records {recorded} tokens in the {split} split, but its files "
                f"({', '.join(p.name for p in files)}) hold {held}: a file is cut short or was replaced",
            )


def _check_ids(cfg, counts: dict[Path, int]) -> str:
    """Every token id read (or, for large data, a sample of ``ID_CHECK_TOKENS``) is below vocab_size; says how
    many were read."""
    total = sum(counts.values())
    read, largest = 0, -1
    for path, count in counts.items():
        if count == 0:
            continue
        tokens = token_files.open_tokens(path, cfg.token_dtype)
        share = count if total <= ID_CHECK_TOKENS else max(ID_CHECK_BLOCK, ID_CHECK_TOKENS * count // total)
        for begin, end in _ranges(count, share):
            block = tokens[begin:end]
            peak = int(np.max(block))
            if peak >= cfg.vocab_size:
                at = begin + int(np.argmax(block))
                raise settings_table.ContractError(
                    "vocab_size",
                    f"must be above every token id in the data; {path} holds id {peak} (token {at}), "
                    f"got {cfg.vocab_size}",
                )
            read, largest = read + end - begin, max(largest, peak)
    if read == total:
        return f"every token id read: the largest, {largest}, is below vocab_size {cfg.vocab_size}"
    return (
        f"token ids sampled: {read} of {total} read ({100 * read / total:.2g}%, in blocks of {ID_CHECK_BLOCK} "
        f"spread over each file), the largest, {largest}, is below vocab_size {cfg.vocab_size}; training checks "
        "the ids of every batch it reads"
    )


def _ranges(count: int, share: int) -> list[tuple[int, int]]:
    """(begin, end) token ranges to read: the whole file in chunks when ``share`` covers it, else ``share`` tokens
    in blocks spread evenly from the first token to the last."""
    blocks = math.ceil(share / ID_CHECK_BLOCK)
    if blocks * ID_CHECK_BLOCK >= count:
        return [(begin, min(begin + SCAN_CHUNK, count)) for begin in range(0, count, SCAN_CHUNK)]
    if blocks == 1:
        return [(0, ID_CHECK_BLOCK)]
    starts = [i * (count - ID_CHECK_BLOCK) // (blocks - 1) for i in range(blocks)]
    return [(begin, begin + ID_CHECK_BLOCK) for begin in starts]
