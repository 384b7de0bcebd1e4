"""One input object -> one shard: its token files per split and its record (counts, sizes, SHA-256 of each file).

A shard is named by its input object's key alone (``shard_id``), never by the instance or process that made it,
and its bytes depend only on that object and the settings: records in the object's order, each to the split its own
hash gives (``kinds.stable_fraction``). So one instance or forty write the same shards, and a manifest listing
them in key order lists the same bytes as a local run.

Files are written as ``.partial`` beside their final names and named only once the whole object has passed; a bad
record raises ``ShardError`` (one line: the object, the line or row, and why) and leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import IO, Any

import numpy as np

from training.prepare import sources
from training.prepare.kinds import (
    ENCODE_BATCH,
    SPLITS,
    ChatKind,
    Example,
    KindError,
    TextKind,
    stable_fraction,
)
from training.request import data_manifest as manifest
from training.request.data_manifest import RECORD_FILE

RECORD_FORMAT = "training.prepare.shard/1"
SHARDS = manifest.SHARDS
"""Where the shards live under the output prefix (or folder)."""


class ShardError(ValueError):
    """A record of the object that cannot be prepared: the message is one line naming the object and line."""


def shard_id(key: str) -> str:
    """The shard's folder name: a hash of the input key (any key maps to a safe, fixed-length name)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def shard_prefix(key: str) -> str:
    return f"{SHARDS}{shard_id(key)}/"


def record_name(key: str) -> str:
    """The record's name under the output: written last, so its presence marks the shard complete."""
    return shard_prefix(key) + RECORD_FILE


def settings_sha256(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()


class _Split:
    """One split's ``.partial`` files, hashed as they are written."""

    def __init__(self, kind: TextKind | ChatKind, folder: Path, prefix: str, split: str):
        self.kind, self.folder, self.prefix, self.split = kind, folder, prefix, split
        self.handles: dict[str, IO[bytes]] = {}
        self.digests = {key: hashlib.sha256() for key in kind.file_keys}
        self.sizes = dict.fromkeys(kind.file_keys, 0)
        self.tokens = self.trained = self.examples = 0
        self.lengths: Counter = Counter()

    def path(self, key: str) -> Path:
        return self.folder / f"{self.split}{self.kind.file_keys[key]}"

    def _write(self, key: str, data: bytes) -> None:
        if key not in self.handles:
            self.handles[key] = open(self.path(key).with_suffix(self.path(key).suffix + ".partial"), "wb")  # noqa: SIM115
            if key == "documents":  # example offsets start at 0
                self._write(key, np.zeros(1, dtype=np.int64).tobytes())
        self.handles[key].write(data)
        self.digests[key].update(data)
        self.sizes[key] += len(data)

    def add(self, example: Example) -> None:
        self._write("files", example.arrays["files"].astype(self.kind.dtype).tobytes())
        if "masks" in self.kind.file_keys:
            self._write("masks", example.arrays["masks"].astype(np.uint8).tobytes())
        if "documents" in self.kind.file_keys:  # one offset per sequence (a preference pair has two)
            ends = self.tokens + np.cumsum(example.sequences or (example.tokens,), dtype=np.int64)
            self._write("documents", ends.tobytes())
        self.tokens += example.tokens
        self.trained += example.trained
        self.examples += 1
        if self.kind.histograms:
            self.lengths[example.tokens] += 1

    def close(self, keep: bool) -> dict[str, Any] | None:
        for handle in self.handles.values():
            handle.close()
        partials = {
            key: self.path(key).with_suffix(self.path(key).suffix + ".partial") for key in self.handles
        }
        if not keep or not self.examples:
            for path in partials.values():
                path.unlink(missing_ok=True)
            return None
        files = {}
        for key, partial in partials.items():
            os.replace(partial, self.path(key))
            files[key] = {"name": self.prefix + self.path(key).name, "bytes": self.sizes[key],
                          "sha256": self.digests[key].hexdigest()}  # fmt: skip
        entry: dict[str, Any] = {"files": files, "tokens": self.tokens, "trained_tokens": self.trained,
                                 "examples": self.examples}  # fmt: skip
        if self.kind.histograms:
            entry["lengths"] = [[length, n] for length, n in sorted(self.lengths.items())]
        return entry


def write_shard(
    path: Path, key: str, kind: TextKind | ChatKind, validation_fraction: float, folder: Path
) -> dict[str, Any]:
    """Prepare the input object ``key`` (stored at ``path``) into ``folder`` (the shard's own, created); return
    its record. ``ShardError`` for a bad record, with nothing left in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    kind.begin_shard()
    splits = {name: _Split(kind, folder, shard_prefix(key), name) for name in SPLITS}
    counts: Counter = Counter()
    largest, longest = -1, 0
    ok = False
    try:
        stream = sources.records(path, key, text_field=kind.text_field)
        for batch in _batches(stream):
            for (_, record), example in zip(batch, kind.encode(batch, counts), strict=True):
                if example is None:
                    continue
                ids = example.arrays["files"]
                if len(ids):
                    largest = max(largest, int(ids.max()))
                longest = max(longest, example.tokens)
                held_out = (
                    validation_fraction > 0 and stable_fraction(kind.split_key(record)) < validation_fraction
                )
                splits["validation" if held_out else "train"].add(example)
        ok = True
    except (sources.SourceError, KindError) as err:
        raise ShardError(str(err)) from None
    finally:
        entries = {name: split.close(keep=ok) for name, split in splits.items()}
    counts_out = {k: v for k, v in sorted(counts.items()) if not k.startswith("shape:")}
    return {"format": RECORD_FORMAT, "key": key, "source_bytes": path.stat().st_size, "counts": counts_out,
            "input_formats": sorted(k.removeprefix("shape:") for k in counts if k.startswith("shape:")),
            "max_token_id": largest, "max_example_tokens": longest,
            "splits": {name: entry for name, entry in entries.items() if entry}, **kind.extra()}  # fmt: skip


def _batches(stream: Any) -> Any:
    batch: list[tuple[str, Any]] = []
    for item in stream:
        batch.append(item)
        if len(batch) == ENCODE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
