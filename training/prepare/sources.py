"""Reading one input object: its records in order, each with where it came from (``<object>:<line>``).

Formats by the object's name: ``.jsonl`` (one JSON object a line), ``.parquet`` (rows, read by pyarrow one record
batch at a time), and any other name (``.txt``, ``.md``, ``.rst``, ``.py``, ...) one whole document. A ``.gz``
(the standard library's gzip) or ``.zst`` (``zstandard``) ending is taken off first: ``part-0001.jsonl.zst`` is
JSON Lines compressed with Zstandard. A record is a string (the text kinds: the whole file, or a JSON Lines
record's / Parquet row's ``text_field``) or a mapping (the conversation kinds: the whole JSON object or row).

Every refusal is one line naming the object and the line (or row) and why: ``SourceError``.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

COMPRESSIONS = (".gz", ".zst")
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".text")
"""Whole-document formats (also under a compression ending)."""
RECORD_SUFFIXES = (".jsonl", ".parquet")
SUFFIXES = (*TEXT_SUFFIXES, *RECORD_SUFFIXES)
PARQUET_BATCH_ROWS = 1024


class SourceError(ValueError):
    """An input that cannot be read; the message names the object and the line (or row)."""


def split_name(name: str) -> tuple[str, str | None]:
    """(format suffix, compression suffix or None) of an object name: ``a.jsonl.zst`` -> (``.jsonl``, ``.zst``)."""
    path = Path(name)
    compression = path.suffix if path.suffix in COMPRESSIONS else None
    inner = Path(path.stem) if compression else path
    return inner.suffix, compression


def is_input(name: str) -> bool:
    """Whether an object of this name is read (its format, after an optional compression ending, is known)."""
    return split_name(name)[0] in SUFFIXES


@contextmanager
def opened(path: Path, compression: str | None) -> Iterator[Any]:
    """The object's bytes, decompressed."""
    with open(path, "rb") as raw:
        if compression == ".gz":
            with gzip.GzipFile(fileobj=raw) as stream:
                yield stream
        elif compression == ".zst":
            import zstandard  # noqa: PLC0415 - only for .zst objects

            with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as stream:
                yield stream
        else:
            yield raw


def records(path: Path, name: str, *, text_field: str | None) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` of every record of the object ``name`` (stored at ``path``): a string per document
    when ``text_field`` is given (the text kinds; a whole-document format ignores it), else the JSON object or
    Parquet row as a dict."""
    suffix, compression = split_name(name)
    if suffix not in SUFFIXES:
        raise SourceError(
            f"{name}: not an input format ({', '.join(SUFFIXES)}, optionally {' or '.join(COMPRESSIONS)})"
        )
    try:
        if suffix == ".parquet":
            if compression:
                raise SourceError(
                    f"{name}: a Parquet file is compressed inside; store it without {compression}"
                )
            yield from _parquet(path, name, text_field)
            return
        with opened(path, compression) as stream:
            if suffix == ".jsonl":
                yield from _jsonl(stream, name, text_field)
            elif text_field is None:
                raise SourceError(
                    f"{name}: a whole-document file holds no conversation; give JSON Lines or Parquet"
                )
            else:
                yield f"{name}:1", _decode(stream.read(), f"{name}:1")
    except SourceError:
        raise
    except (OSError, EOFError, ValueError) as err:  # a damaged gzip stream, a cut-short object
        raise SourceError(f"{name}: cannot be read as {compression or suffix}: {err}") from None
    except Exception as err:
        if type(err).__name__ != "ZstdError":  # zstandard's own (no OSError), for a damaged .zst
            raise
        raise SourceError(f"{name}: cannot be read as {compression or suffix}: {err}") from None


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SourceError(f"{where}: not UTF-8 ({err.reason} at byte {err.start})") from None


def _jsonl(stream: Any, name: str, text_field: str | None) -> Iterator[tuple[str, Any]]:
    for number, raw in enumerate(
        io.BufferedReader(stream, 1 << 20) if not hasattr(stream, "peek") else stream, 1
    ):
        where = f"{name}:{number}"
        line = _decode(raw, where)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            raise SourceError(f"{where}: not valid JSON ({err})") from None
        yield where, _field(record, text_field, where) if text_field is not None else record


def _field(record: Any, text_field: str, where: str) -> str:
    if not isinstance(record, dict) or text_field not in record:
        raise SourceError(f"{where}: not a JSON object with a string field {text_field!r}")
    text = record[text_field]
    if not isinstance(text, str):
        raise SourceError(f"{where}: field {text_field!r} is not a string")
    return text


def _parquet(path: Path, name: str, text_field: str | None) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq  # noqa: PLC0415 - only for Parquet objects

    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid and OSError subclasses
        raise SourceError(f"{name}: not a Parquet file ({err})") from None
    columns = [text_field] if text_field is not None else None
    if text_field is not None and text_field not in table.schema_arrow.names:
        raise SourceError(
            f"{name}: has no column {text_field!r} (columns: {', '.join(table.schema_arrow.names)})"
        )
    row = 0
    for batch in table.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
        values = batch.column(0).to_pylist() if text_field is not None else batch.to_pylist()
        for value in values:
            row += 1
            where = f"{name}:row {row}"
            if text_field is not None and not isinstance(value, str):
                raise SourceError(
                    f"{where}: column {text_field!r} is not a string (got {type(value).__name__})"
                )
            yield where, value
