"""A small corpus in every input format ``training.prepare.sources`` reads, made once per test session."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

WORDS = [
    "the",
    "data",
    "lives",
    "in",
    "a",
    "bucket",
    "and",
    "is",
    "tokenized",
    "where",
    "it",
    "lives",
    "by",
    "many",
    "instances",
    "each",
    "with",
    "its",
    "own",
    "share",
    "of",
    "the",
    "objects",
    "so",
    "that",
    "one",
    "or",
    "four",
    "give",
    "the",
    "same",
    "bytes",
    "a",
    "rerun",
    "skips",
    "what",
    "is",
    "complete",
    "and",
    "never",
    "overwrites",
    "a",
    "shard",
]


def document(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60))) + rng.choice([".", "!", " é ü 字."])


def write_corpus(folder: Path, seed: int = 0) -> dict[str, list[str]]:
    """Seven input objects (plain, gzip and zstd JSON Lines, Parquet, text, a nested folder, a duplicate
    document) and a file that is no input; the documents of each object by key."""
    rng = random.Random(seed)
    docs: dict[str, list[str]] = {}
    (folder / "nested" / "deeper").mkdir(parents=True, exist_ok=True)
    for key in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "nested/deeper/e.jsonl"):
        docs[key] = [document(rng) for _ in range(rng.randint(20, 40))]
        lines = "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs[key]))
        data = lines.encode("utf-8")
        if key.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        elif key.endswith(".zst"):
            data = zstandard.ZstdCompressor().compress(data)
        (folder / key).write_bytes(data)
    docs["d.parquet"] = [document(rng) for _ in range(50)]
    table = pa.table({"text": docs["d.parquet"], "n": list(range(50))})
    pq.write_table(table, folder / "d.parquet", row_group_size=16)
    docs["nested/notes.txt"] = [document(rng) + "\n\n" + document(rng)]
    (folder / "nested" / "notes.txt").write_text(docs["nested/notes.txt"][0], encoding="utf-8")
    docs["z.jsonl"] = [docs["a.jsonl"][0], document(rng)]  # a duplicate of a.jsonl's first document
    (folder / "z.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs["z.jsonl"]))
    (folder / "README.json").write_text("{}")  # not an input format: ignored
    return dict(sorted(docs.items()))
