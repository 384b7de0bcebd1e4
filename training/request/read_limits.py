"""How much of each file the request check reads and parses, bounded by what its Lambda function can hold, and the
refusal, by name, of a file beyond that: the check runs in ``LAMBDA_MEMORY_MB`` (the function's memory), and a
file it reads must never end it with an out-of-memory crash instead of a named refusal.

What a file costs is not its size: Python holds parsed JSON at up to about 25 times its bytes (``[{},{},...]``:
an empty dict of 64 bytes and its 8-byte slot for every 3 bytes; a 16 MB ``metadata.json`` took 443 MB). So a JSON
file is refused when it is larger than ``MAX_JSON_BYTES`` (before it is read, from its size) or when
:func:`estimated_json_bytes` (a count of its brackets, quotes and separators, an upper bound of ``json.loads``'
allocations, fitted on the worst shapes) is above ``JSON_BUDGET_BYTES``. Text files (a chat template, task YAML)
are read whole up to ``MAX_TEXT_BYTES``; ``tokenizer.json`` is only hashed, in chunks, never held
(``MAX_HASHED_BYTES``). At most two parsed files are alive at once (conversation data's ``metadata.json``, kept
for the plan, and the file being read), so the reads take at most about twice ``JSON_BUDGET_BYTES`` above the
runtime, boto3 and the decision's modules: ``training/measure/request_check_memory.py`` measures the check's peak
on the largest files it accepts (docs/measurements.md gives the figure).

Standard library only; part of the request check's Lambda asset.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

LAMBDA_MEMORY_MB = 256
"""The request check's Lambda function's memory (``RequestValidator``)."""
JSON_BUDGET_BYTES = 48 * 1024 * 1024
"""The most one parsed JSON file may take (:func:`estimated_json_bytes`)."""
MAX_JSON_BYTES = 8 * 1024 * 1024
"""The largest JSON file read: its text is held several times over while read and parsed (the response's buffers,
the bytes, their decoded string, a long string value), and 24 MB files took 228 MB together; conversation data's
``metadata.json`` for a million examples of up to 32,768 tokens (its length histograms) is under 1 MB."""
MAX_TEXT_BYTES = 8 * 1024 * 1024
"""The largest text file read whole (a chat template: held as bytes, as a string and hashed; a task YAML file)."""
MAX_HASHED_BYTES = 64 * 1024 * 1024
"""The largest file only hashed (a large vocabulary's ``tokenizer.json``: about 33 MB), read in chunks."""
CHUNK_BYTES = 1024 * 1024

HASHED_FILES = ("tokenizer.json",)
"""Files the check only hashes (``sft_data.check_against_model`` compares their SHA-256)."""
TEXT_SUFFIXES = (".jinja", ".yaml", ".yml")
"""Files the check reads as text, whole."""

BYTES_PER_TEXT_BYTE = 2
"""The text, held as bytes and as its decoded string while parsed."""
BYTES_PER_CONTAINER = 80
"""An object or array: an empty dict is 64 bytes, an empty list 56, each with its 8-byte slot in its parent."""
BYTES_PER_QUOTE = 40
"""Half a string (two quotes each): a 1-character str is 50 bytes, a key's share of its dict's table more."""
BYTES_PER_SEPARATOR = 48
"""A comma or colon, one per value: a float or a large int (24 to 32 bytes) with its slot, a dict entry's table
share."""
BYTES_PER_FILE = 4096
"""The parser's own and the objects' headers, whatever the file."""


class TooLarge(ValueError):
    """A file the request check's Lambda cannot hold: refused naming it, its size and the limit."""


def limit_of(name: str) -> int:
    """The most bytes of the file ``name`` the check reads."""
    if name in HASHED_FILES:
        return MAX_HASHED_BYTES
    return MAX_TEXT_BYTES if name.endswith(TEXT_SUFFIXES) else MAX_JSON_BYTES


def too_large(where: str, size: int, limit: int) -> TooLarge:
    return TooLarge(
        f"{where} takes {size:,} bytes, more than the {limit:,} the request check reads of such a file (its "
        f"Lambda function has {LAMBDA_MEMORY_MB} MB)"
    )


def estimated_json_bytes(raw: bytes | str) -> int:
    """An upper bound of what ``json.loads(raw)`` allocates: the text twice, and for each object or array, string
    and separator what Python's smallest of them takes (every shape measured stays below it: 75 bytes per empty
    object, 135 per two-int array, 128 per distinct key, 36 per float)."""
    data = raw.encode("utf-8") if isinstance(raw, str) else raw
    containers = data.count(b"{") + data.count(b"[")
    separators = data.count(b",") + data.count(b":")
    return (
        BYTES_PER_FILE
        + BYTES_PER_TEXT_BYTE * len(data)
        + BYTES_PER_CONTAINER * containers
        + BYTES_PER_QUOTE * data.count(b'"')
        + BYTES_PER_SEPARATOR * separators
    )


def check_json(raw: bytes | str, where: str) -> None:
    """Refuses (:class:`TooLarge`) JSON text ``raw`` (the file ``where``) that would take more than
    ``JSON_BUDGET_BYTES`` parsed, before it is parsed."""
    size = len(raw)
    if size > MAX_JSON_BYTES:
        raise too_large(where, size, MAX_JSON_BYTES)
    estimate = estimated_json_bytes(raw)
    if estimate > JSON_BUDGET_BYTES:
        raise TooLarge(
            f"{where} would take about {estimate / 2**20:,.0f} MB parsed ({size:,} bytes of many small objects, "
            f"strings and numbers), more than the {JSON_BUDGET_BYTES // 2**20} MB the request check holds of one "
            f"file (its Lambda function has {LAMBDA_MEMORY_MB} MB)"
        )


def parse_json(raw: bytes | str, where: str) -> Any:
    """``raw`` (the file ``where``) parsed, within the budget (:func:`check_json`); a ``ValueError`` naming it for
    text that is not JSON or nests deeper than Python's parser recurses."""
    check_json(raw, where)
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"{where} nests its arrays or objects too deeply to be read") from None


def read_object(s3: Any, bucket: str, key: str, limit: int | None = None) -> bytes:
    """The object's bytes, refused (:class:`TooLarge`) from its size before its body is read when larger than
    ``limit`` (default: :func:`limit_of` its name)."""
    limit = limit_of(key.rsplit("/", 1)[-1]) if limit is None else limit
    got = s3.get_object(Bucket=bucket, Key=key)
    size = int(got.get("ContentLength") or 0)
    if size > limit:
        got["Body"].close()
        raise too_large(f"s3://{bucket}/{key}", size, limit)
    body = got["Body"].read(limit + 1)
    if len(body) > limit:  # grew since: still refused
        raise too_large(f"s3://{bucket}/{key}", len(body), limit)
    return body


def read_local(path: Path, limit: int | None = None) -> bytes:
    """A local file's bytes (:func:`read_object` of a local copy)."""
    limit = limit_of(path.name) if limit is None else limit
    size = path.stat().st_size
    if size > limit:
        raise too_large(str(path), size, limit)
    return path.read_bytes()


class FileDigest(str):
    """The SHA-256 (hex) of a file the check only hashes, read in chunks (``sft_data.sha256`` returns it as is)."""


FileContent = bytes | FileDigest
"""What the check holds of a file it read: its bytes, or its :class:`FileDigest` when it is one of ``HASHED_FILES``
(``Reads.folder_files``)."""


def object_sha256(s3: Any, bucket: str, key: str) -> FileDigest:
    """The SHA-256 of an object of at most ``MAX_HASHED_BYTES``, read in ``CHUNK_BYTES`` chunks."""
    got = s3.get_object(Bucket=bucket, Key=key)
    size = int(got.get("ContentLength") or 0)
    if size > MAX_HASHED_BYTES:
        got["Body"].close()
        raise too_large(f"s3://{bucket}/{key}", size, MAX_HASHED_BYTES)
    digest = hashlib.sha256()
    for chunk in got["Body"].iter_chunks(CHUNK_BYTES):
        digest.update(chunk)
    return FileDigest(digest.hexdigest())


def local_sha256(path: Path) -> FileDigest:
    """:func:`object_sha256` of a local copy."""
    size = path.stat().st_size
    if size > MAX_HASHED_BYTES:
        raise too_large(str(path), size, MAX_HASHED_BYTES)
    with path.open("rb") as handle:
        return FileDigest(hashlib.file_digest(handle, "sha256").hexdigest())
