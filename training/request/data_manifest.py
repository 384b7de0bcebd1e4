"""The manifest of prepared data (``metadata.json`` at the top of the output): what the trainer and the request
check read. Pure Python (json only): the request check's Lambda reads it too.

It is built from the shards' records in the order of their input keys (``build``), so it is the same, byte for
byte, whichever instances made the shards. It says: the kind, token dtype, vocabulary and tokenizer (and the chat
template's SHA-256 for conversations), every split's files in order (``files``; for conversations also ``masks`` and
``documents``, one of each per shard) with each file's SHA-256 (``sha256``: name -> hex digest, the field a local
preparation writes, for the trainer to verify), its tokens, trained tokens and examples, the example lengths as a
histogram (conversations; preference pairs: each pair's two sequences together, as local ``prepare`` counts them),
the counts (records read, dropped, truncated), and ``shards``: each input key with its files' sizes and SHA-256. A
folder holding it is what ``train_data_uri`` names: the trainer reads
the listed files in order (the split's token stream is their concatenation).

``listing_problems`` is the request check's side: a manifest missing (shards but no manifest: the preparation has
not finished), damaged, or disagreeing with the objects beside it (a listed file missing or of another size).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

FORMAT = "training.prepare.sharded/1"
MANIFEST_FILE = "metadata.json"
SPLITS = ("train", "validation")
FILE_KEYS = ("files", "masks", "documents")
SHARDS = "shards/"
RECORD_FILE = "record.json"
"""A shard's record (its counts and files), written last: its presence marks the shard complete."""
SHOWN = 5
PREFERENCE_KIND = "preference"
"""A manifest's ``kind`` for preference pairs (``training.request.sft_data.PREFERENCE_KIND``; json only here)."""
"""At most this many problems are named one by one."""


class ManifestError(ValueError):
    """The shards cannot make a manifest (no example to train, an empty validation split, mixed settings)."""


def build(settings: Mapping[str, Any], records: Sequence[Mapping[str, Any]], *, validation_fraction: float,
          settings_sha256: str) -> dict[str, Any]:  # fmt: skip
    """The manifest of ``records`` (every shard's, any order) prepared with ``settings``."""
    ordered = sorted(records, key=lambda r: r["key"])
    splits: dict[str, dict[str, Any]] = {}
    lengths: dict[str, Counter] = {split: Counter() for split in SPLITS}
    counts: Counter = Counter()
    for record in ordered:
        counts.update(record.get("counts") or {})
        for split, entry in (record.get("splits") or {}).items():
            into = splits.setdefault(split, {"tokens": 0, "trained_tokens": 0, "examples": 0})
            for key, file in entry["files"].items():
                into.setdefault(key, []).append(file["name"])
                into.setdefault("sha256", {})[file["name"]] = file["sha256"]
            for name in ("tokens", "trained_tokens", "examples"):
                into[name] += int(entry[name])
            lengths[split].update({int(n): int(c) for n, c in entry.get("lengths") or []})
    chat = settings.get("kind") != "text"
    for split, entry in splits.items():
        if chat:
            entry["lengths"] = [[n, c] for n, c in sorted(lengths[split].items())]
        else:
            entry["documents"] = entry.pop("examples")
            del entry["trained_tokens"]
    _refuse_empty(splits, validation_fraction, counts, len(ordered))
    meta: dict[str, Any] = {
        "format": FORMAT,
        **{k: v for k, v in settings.items() if k not in ("text_field",)},
        "settings_sha256": settings_sha256,
        "max_token_id": max((int(r["max_token_id"]) for r in ordered), default=-1),
        "tokens": sum(entry["tokens"] for entry in splits.values()),
        "validation_fraction": validation_fraction,
        "split_by": "a stable hash of each record (BLAKE2b-64 of the document's UTF-8 text, or of the "
        "conversation's canonical JSON) below validation_fraction",
        "splits": {split: splits[split] for split in SPLITS if split in splits},
        "shards": [_shard_entry(r) for r in ordered],
    }
    if chat:
        _chat_fields(meta, ordered, counts)
    else:
        meta["text_field"] = settings.get("text_field")
        meta["documents"] = int(counts.get("documents", 0))
    return meta


def _refuse_empty(splits: dict, fraction: float, counts: Counter, shards: int) -> None:
    if not splits.get("train"):
        raise ManifestError(
            f"input: no example to train in {shards} input objects ({dict(sorted(counts.items()))})"
        )
    if fraction > 0 and not splits.get("validation"):
        raise ManifestError(
            f"validation-fraction: no record went to validation ({fraction} of {splits['train']['examples']} records "
            "by hash); add records, raise --validation-fraction, or pass --validation-fraction 0"
        )


def _chat_fields(meta: dict[str, Any], ordered: Sequence[Mapping[str, Any]], counts: Counter) -> None:
    """What conversation data's ``metadata.json`` says beyond the splits (``training.request.sft_data`` reads it)."""
    turns = sorted({(t, i) for r in ordered for t, i in zip(r.get("end_of_turn", []), r.get("end_of_turn_ids", []),
                                                             strict=True)})  # fmt: skip
    meta["chat_template"] = {**meta["chat_template"], "end_of_turn": [t for t, _ in turns],
                             "end_of_turn_ids": [i for _, i in turns]}  # fmt: skip
    examples = sum(entry["examples"] for entry in meta["splits"].values())
    meta["input_format"] = "+".join(sorted({f for r in ordered for f in r.get("input_formats", [])}))
    meta["examples"] = examples
    meta["trained_tokens"] = sum(entry["trained_tokens"] for entry in meta["splits"].values())
    meta["max_example_tokens"] = max(int(r.get("max_example_tokens") or 0) for r in ordered)
    preference = meta.get("kind") == PREFERENCE_KIND
    kept = ("read", "truncated", "dropped_for_length") if preference else ("read", "no_assistant_turn", "truncated",
                                                                           "dropped_for_length")  # fmt: skip
    meta["counts"] = {
        **dict.fromkeys(kept, 0),
        **{k: int(v) for k, v in counts.items()},
        "examples": examples,
    }
    if preference:  # as local prepare's pairs metadata: two sequences per pair
        meta["pairs"] = examples
        meta["max_sequence_tokens"] = max(int(r.get("max_sequence_tokens") or 0) for r in ordered)
        for entry in meta["splits"].values():
            entry["sequences"] = 2 * entry["examples"]


def _shard_entry(record: Mapping[str, Any]) -> dict[str, Any]:
    files = [
        dict(file) for entry in (record.get("splits") or {}).values() for file in entry["files"].values()
    ]
    return {"key": record["key"], "source_bytes": record.get("source_bytes"), "files": files}


def files_of(meta: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
    """Every file the manifest lists: name -> (bytes, sha256)."""
    return {
        f["name"]: (int(f["bytes"]), f["sha256"])
        for shard in meta.get("shards") or []
        for f in shard["files"]
    }


def is_sharded(meta: Any) -> bool:
    return isinstance(meta, Mapping) and meta.get("format") == FORMAT


def meta_problems(meta: Mapping[str, Any]) -> list[str]:
    """What in a manifest is not as ``build`` writes it, each ``<field>: must be ...``; empty when well formed."""
    found: list[str] = []
    shards = meta.get("shards")
    if not isinstance(shards, list) or not all(
        isinstance(s, dict) and isinstance(s.get("key"), str) and isinstance(s.get("files"), list)
        for s in shards
    ):
        return ["shards: must be a list of {key, files} objects"]
    for shard in shards:
        for file in shard["files"]:
            ok = (isinstance(file, dict) and isinstance(file.get("name"), str) and file["name"].startswith(SHARDS)
                  and ".." not in file["name"] and isinstance(file.get("bytes"), int) and file["bytes"] >= 0
                  and isinstance(file.get("sha256"), str) and len(file["sha256"]) == 64)  # fmt: skip
            if not ok:
                found.append(f"shards[{shard['key']!r}].files: must be {{name under shards/, bytes, sha256}}; got "
                             f"{json.dumps(file)[:80]}")  # fmt: skip
    if [s["key"] for s in shards] != sorted(s["key"] for s in shards):
        found.append("shards: must be in the order of their keys")
    listed = {f["name"] for s in shards for f in s["files"] if isinstance(f, dict)}
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not isinstance(splits.get("train"), dict):
        return [*found, "splits: must be an object with a train split"]
    for split, entry in splits.items():
        for key in FILE_KEYS:
            names = entry.get(key, []) if isinstance(entry, dict) else None
            if key == "documents" and isinstance(names, int):  # text data counts its documents there
                continue
            if not isinstance(names, list) or not set(names) <= listed:
                found.append(f"splits.{split}.{key}: must list files of shards; got {json.dumps(names)[:80]}")
    return found


def listing_problems(meta: Mapping[str, Any], sizes: Mapping[str, int], where: str) -> list[str]:
    """What disagrees between a manifest and the objects beside it (``sizes``: name relative to the folder ->
    bytes): a listed file missing or of another size. Each a sentence naming ``where``."""
    missing, changed = [], []
    for name, (size, _) in files_of(meta).items():
        if name not in sizes:
            missing.append(name)
        elif sizes[name] != size:
            changed.append(f"{name} ({sizes[name]} bytes, the manifest says {size})")
    found = []
    if missing:
        found.append(f"{where}{MANIFEST_FILE} lists {len(missing)} files that are not there ({', '.join(missing[:SHOWN])}"
                     f"{' ...' if len(missing) > SHOWN else ''}): the data was moved or deleted; prepare it again")  # fmt: skip
    if changed:
        found.append(f"{where}{MANIFEST_FILE} disagrees with {len(changed)} of its files ({', '.join(changed[:SHOWN])}"
                     f"{' ...' if len(changed) > SHOWN else ''}): a file was replaced; prepare the data again")  # fmt: skip
    return found


def unfinished_problem(sizes: Mapping[str, int], where: str) -> list[str]:
    """A folder with shards but no manifest: its preparation has not finished (or failed)."""
    if MANIFEST_FILE in sizes or not any(name.startswith(SHARDS) for name in sizes):
        return []
    records = sum(1 for name in sizes if name.startswith(SHARDS) and name.endswith("/" + RECORD_FILE))
    return [
        f"{where} holds {records} complete shards but no {MANIFEST_FILE}: its preparation has not finished (or "
        "failed); run it again to complete it (complete shards are kept), then train"
    ]
