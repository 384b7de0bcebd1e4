"""Conversation data against the model it fine-tunes: does a prepared folder's ``metadata.json`` (written by
``training.prepare --init-from``) fit an ``init_from`` model folder? Pure Python (json, hashlib), on the
files' contents, so the trainer reads them from disk and the request check can read the same files from S3.

What must match: the chat template (its SHA-256: the data was rendered with exactly the template the model will be
asked to chat with), the tokenizer (the SHA-256 of ``tokenizer.json``), and the vocabulary (every token id of the
data below the model's ``vocab_size``). Where the model folder has a template, transformers reads it as
``chat_template.jinja`` first and ``tokenizer_config.json``'s ``chat_template`` otherwise (a string, or a list of
named templates of which ``default`` is the one ``apply_chat_template`` uses); ``model_template`` does the same.

How the examples pack: ``prepare`` records each split's example lengths as a histogram (``LENGTHS``: ``[[tokens,
examples], ...]``), which is all best-fit decreasing depends on for its number of windows (examples of one length
are interchangeable), so the request's plan counts the packed windows of a ``seq_length`` exactly
(``packed_windows``) without reading the token files.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeGuard

from training.contract.token_data import TOKEN_DTYPES
from training.request import read_limits

CHAT_KIND = "chat"
"""``metadata.json``'s ``kind`` for conversation data."""
PREFERENCE_KIND = "preference"
"""``metadata.json``'s ``kind`` for preference pairs (``training.prepare.pairs``): conversation data whose examples
are pairs of a chosen and a rejected conversation (two sequences each), rendered and checked the same way."""
TEMPLATE_KINDS = (CHAT_KIND, PREFERENCE_KIND)
"""The kinds of data rendered with a model's chat template: checked against the model folder alike."""
TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")
"""Where a model folder keeps its chat template, in the order transformers looks."""
TOKENIZER_FILE = "tokenizer.json"
MODEL_FILES = (*TEMPLATE_FILES, TOKENIZER_FILE)
"""The files of a model folder that ``check_against_model`` reads (besides its config.json)."""
LENGTHS = "lengths"
"""A split's entry of ``metadata.json``: its example lengths as ``[[tokens, examples], ...]``, shortest first."""
SPLIT_FILES = {"files": ".bin", "masks": ".mask", "documents": ".docs"}
"""A split's files as ``prepare`` writes them (``<split>.bin``, ...) and the key of ``metadata.json``'s split entry
that lists each: the token ids, the loss mask (one byte per token) and where each example starts."""


def sha256(data: bytes | str) -> str:
    """Hex SHA-256 of bytes, or of a string's UTF-8; a file only hashed (``read_limits.FileDigest``) is its own."""
    if isinstance(data, read_limits.FileDigest):
        return str(data)
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


class TemplateError(ValueError):
    """A model folder's template file that transformers cannot read as a template (not UTF-8 text)."""


def joined(folder: str, name: str) -> str:
    """``name`` in ``folder`` (an S3 prefix ending in ``/``, or a local path): one slash between them."""
    return f"{folder}{name}" if folder.endswith("/") else f"{folder}/{name}"


def model_template(files: Mapping[str, bytes], where: str = "the model folder") -> tuple[str, str] | None:
    """The chat template a model folder's files give transformers, and the file it came from; None without one.
    ``files``: file name -> content, for the names in ``TEMPLATE_FILES`` that exist. A ``chat_template.jinja``
    that is not UTF-8 is a :class:`TemplateError` naming it in ``where`` (transformers reads it as UTF-8)."""
    jinja = files.get("chat_template.jinja")
    if jinja:
        try:
            return jinja.decode("utf-8"), "chat_template.jinja"
        except UnicodeDecodeError as err:
            raise TemplateError(
                f"{joined(where, 'chat_template.jinja')} is not UTF-8 text (byte {err.start}: "
                f"{jinja[err.start : err.start + 4]!r}); transformers reads a template as UTF-8: save it as UTF-8"
            ) from None
    config = files.get("tokenizer_config.json")
    if config is None:
        return None
    try:
        template = json.loads(config).get("chat_template")
    except (ValueError, AttributeError, RecursionError):
        return None
    if isinstance(template, list):  # named templates: apply_chat_template uses "default"
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    return (template, "tokenizer_config.json") if isinstance(template, str) and template else None


def check_against_model(
    meta: Mapping[str, Any],
    files: Mapping[str, read_limits.FileContent],
    config: Mapping[str, Any] | None,
    where: str,
) -> list[str]:
    """What does not match between conversation data's ``meta`` and a model folder (``files``: its
    ``TEMPLATE_FILES`` and ``tokenizer.json`` that exist, by name, each its bytes or, for a file only hashed, its
    ``read_limits.FileDigest``; ``config``: its config.json, or None), each a sentence naming ``where`` (the
    folder) and what to do; empty when they match or the data is not conversations."""
    if meta.get("kind") not in TEMPLATE_KINDS:
        return []
    problems = []
    recorded = meta.get("chat_template") or {}
    templates = {name: raw for name in TEMPLATE_FILES if isinstance(raw := files.get(name), bytes)}
    try:
        found = model_template(templates, where)
    except TemplateError as err:
        return [str(err)]
    if found is None:
        problems.append(
            f"{where} has no chat template ({' or '.join(TEMPLATE_FILES)}), but the data was rendered with one "
            f"(sha256 {str(recorded.get('sha256'))[:12]}...): fine-tune from the model folder the data was prepared "
            "with"
        )
    elif sha256(found[0]) != recorded.get("sha256"):
        problems.append(
            f"the chat template of {where} ({found[1]}, sha256 {sha256(found[0])[:12]}...) is not the one the data "
            f"was rendered with (sha256 {str(recorded.get('sha256'))[:12]}..., from {recorded.get('source_path')}): "
            "prepare the data again with --init-from this folder"
        )
    tokenizer = (meta.get("tokenizer") or {}).get("sha256")
    if tokenizer and TOKENIZER_FILE in files and sha256(files[TOKENIZER_FILE]) != tokenizer:
        problems.append(
            f"{joined(where, TOKENIZER_FILE)} is not the tokenizer the data was made with (the folder's has sha256 "
            f"{sha256(files[TOKENIZER_FILE])[:12]}..., the data's metadata.json records {str(tokenizer)[:12]}...): "
            "prepare the data again with --init-from this folder"
        )
    vocab = (config or {}).get("vocab_size")  # not a count: the config.json's own check names it
    largest = meta.get("max_token_id")
    if _is_count(vocab, 1) and _is_count(largest) and largest >= vocab:
        problems.append(
            f"the data holds token id {largest}, but the model of {where} has vocab_size {vocab}: the data was "
            "tokenized for another model"
        )
    return problems


def length_histogram(lengths: Iterable[int]) -> list[list[int]]:
    """``[[tokens, examples], ...]`` of example lengths, shortest first (what ``LENGTHS`` records)."""
    return [[int(length), count] for length, count in sorted(Counter(int(n) for n in lengths).items())]


def split_lengths(meta: Mapping[str, Any], split: str = "train") -> dict[int, int] | None:
    """A split's recorded length histogram (tokens -> examples), or None when ``prepare`` recorded none."""
    entry = ((meta.get("splits") or {}).get(split) or {}).get(LENGTHS)
    if not isinstance(entry, list):
        return None
    try:
        return {int(length): int(count) for length, count in entry if int(count) > 0}
    except (TypeError, ValueError):
        return None


def packed_windows(histogram: Mapping[int, int], capacity: int) -> int:
    """How many ``capacity``-token windows best-fit decreasing fills with examples of these lengths
    (``histogram``: tokens -> examples, each length in [1, capacity]): the count
    ``training.trainer.data.packing.best_fit_decreasing`` gives, computed per length rather than per example.

    Longest first, each example goes into the open window with the least room that still holds it. For one length
    L, the window with the least room r >= L takes r // L examples in a row (after each it keeps the least room
    that holds another), leaving r % L; so the windows of room r are filled r // L at a time, and with none left a
    new window takes capacity // L."""
    rooms: dict[int, int] = {}  # room left -> open windows with that room
    order: list[int] = []  # the rooms with windows, ascending
    windows = 0

    def move(room: int, count: int) -> None:
        if room <= 0 or count == 0:
            return
        if room not in rooms:
            bisect.insort(order, room)
            rooms[room] = 0
        rooms[room] += count

    for length in sorted(histogram, reverse=True):
        left = int(histogram[length])
        if not 1 <= length <= capacity:
            raise ValueError(f"example length {length} is not in [1, {capacity}]")
        while left:
            at = bisect.bisect_left(order, length)
            room = order[at] if at < len(order) else capacity
            each = room // length
            available = rooms.get(room, 0) if at < len(order) else left  # new windows: as many as needed
            full = min(available, left // each)
            if at == len(order):
                windows += full + (1 if left % each else 0)
            else:
                rooms[room] -= full + (1 if full < available and left % each else 0)
                if not rooms[room]:
                    del rooms[room]
                    order.pop(at)
            move(room - each * length, full)
            if full < available and left % each:  # one more window takes the rest
                move(room - (left % each) * length, 1)
            left -= full * each + (left % each if full < available else 0)
    return windows


@dataclass(frozen=True)
class ChatData:
    """Prepared conversation data as read for the request: ``uri`` (``train_data_uri``), its ``metadata.json``
    (``meta``, ``kind: chat``), the ``init_from`` folder it was checked against (``model``; None without
    ``init_from`` or when that folder cannot be read where the decision runs) and what does not match it
    (``mismatches``, each a sentence)."""

    uri: str
    meta: Mapping[str, Any]
    model: str | None
    mismatches: tuple[str, ...]

    @cached_property
    def longest(self) -> int:
        """The longest example's tokens (every split): the recorded ``max_example_tokens``, or a longer length the
        splits' ``LENGTHS`` hold (what the trainer counts, from the token files, is never below either)."""
        recorded = [max(lengths) for split in ("train", "validation") if (lengths := self.lengths(split))]
        return max([int(self.meta.get("max_example_tokens") or 0), *recorded])

    @cached_property
    def _parsed(self) -> dict[str, dict[int, int] | None]:
        """Each split's length histogram, parsed once (``split_lengths``)."""
        return {split: split_lengths(self.meta, split) for split in (self.meta.get("splits") or {})}

    @cached_property
    def _windows(self) -> dict[tuple[str, int, bool], tuple[int, bool]]:
        """``windows``' answers so far: a tuning run asks the same few ``seq_length`` for many candidates."""
        return {}

    def lengths(self, split: str = "train") -> dict[int, int] | None:
        """A split's example lengths (tokens -> examples), or None when ``prepare`` recorded none."""
        return self._parsed.get(split)

    def split(self, split: str = "train") -> Mapping[str, Any]:
        return (self.meta.get("splits") or {}).get(split) or {}

    def windows(self, split: str, seq_length: int, packing: bool) -> tuple[int, bool]:
        """How many windows of ``seq_length`` the split makes (``packing``: best-fit decreasing; otherwise one
        example each), and whether that is exact (the recorded lengths) or, without them, the lower bound of its
        tokens over ``seq_length`` (each answer counted once: best-fit decreasing over a long context's lengths
        takes a tenth of a second)."""
        key = (split, seq_length, packing)
        if key not in self._windows:
            self._windows[key] = self._count_windows(split, seq_length, packing)
        return self._windows[key]

    def _count_windows(self, split: str, seq_length: int, packing: bool) -> tuple[int, bool]:
        entry, lengths = self.split(split), self.lengths(split)
        if not packing:
            return int(entry.get("examples") or 0), True
        if lengths is not None and max(lengths, default=0) <= seq_length:
            return packed_windows(lengths, seq_length), True
        return math.ceil(int(entry.get("tokens") or 0) / seq_length), False


MAX_LENGTHS = 1 << 20
"""The most ``[tokens, examples]`` pairs a split's ``LENGTHS`` may hold (``prepare`` writes one per distinct
length, so at most its longest example's tokens)."""
MAX_TEXT_CHARS = 1024
"""The most characters a text of ``metadata.json`` that the request shows (``truncation.too_long``) may take."""


def _is_count(value: Any, least: int = 0) -> TypeGuard[int]:
    """An integer (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


MAX_SHARDS = 100_000
"""The most shards a split may list (a sharded preparation writes one per input object)."""


def _is_file_name(value: Any) -> bool:
    """A file inside the data folder: a name beside ``metadata.json`` (``prepare``) or a relative path below it
    (a sharded preparation's ``shards/<key>/train.bin``), never absolute, never through ``..`` (the trainer confines
    every listed name to its folder too: training/trainer/files.py)."""
    if not isinstance(value, str) or not value or "\\" in value or value.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in value.split("/"))


def meta_problems(meta: Mapping[str, Any]) -> list[str]:
    """What in conversation data's ``metadata.json`` (``kind: chat``) is not what ``prepare`` writes, for each
    value the request reads (each ``<field>: must be ...; got ...``): a damaged or hand-edited file is refused by
    name rather than read as something else."""
    found: list[str] = []

    def obj(value: Any) -> Mapping[str, Any]:
        return value if isinstance(value, dict) else {}

    def want(ok: bool, where: str, allowed: str, got: Any) -> None:
        if not ok:
            found.append(f"{where}: must be {allowed}; got {json.dumps(got)[:80]}")

    want(meta.get("token_dtype") in TOKEN_DTYPES, "token_dtype",
         f"one of {', '.join(TOKEN_DTYPES)} (the integer types the trainer reads)", meta.get("token_dtype"))  # fmt: skip
    want(meta.get("max_token_id") is None or _is_count(meta["max_token_id"]), "max_token_id",
         "a token id (an integer >= 0)", meta.get("max_token_id"))  # fmt: skip
    want(_is_count(meta.get("max_example_tokens"), 1), "max_example_tokens", "an integer >= 1",
         meta.get("max_example_tokens"))  # fmt: skip
    for name in ("chat_template", "tokenizer", "truncation", "counts"):
        want(meta.get(name) is None or isinstance(meta[name], dict), name, "an object", meta.get(name))
    for name in ("chat_template", "tokenizer"):
        entry = obj(meta.get(name))
        want(entry.get("sha256") is None or isinstance(entry["sha256"], str), f"{name}.sha256",
             "a SHA-256 in hex", entry.get("sha256"))  # fmt: skip
    truncation = obj(meta.get("truncation"))
    want(truncation.get("max_tokens") is None or _is_count(truncation["max_tokens"], 1), "truncation.max_tokens",
         "null or an integer >= 1", truncation.get("max_tokens"))  # fmt: skip
    too_long = truncation.get("too_long")
    want(too_long is None or (isinstance(too_long, str) and len(too_long) <= MAX_TEXT_CHARS), "truncation.too_long",
         f"null or a word of at most {MAX_TEXT_CHARS} characters", too_long)  # fmt: skip
    counts = obj(meta.get("counts"))
    for name, value in counts.items():
        want(_is_count(value), f"counts.{name}", "an integer >= 0", value)
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not isinstance(splits.get("train"), dict):
        return [
            *found,
            f"splits: must be an object with a train split (an object); got {json.dumps(splits)[:80]}",
        ]
    for name, entry in splits.items():
        if not isinstance(entry, dict):
            found.append(f"splits.{name}: must be an object; got {json.dumps(entry)[:80]}")
            continue
        for key in ("examples", "tokens", "trained_tokens"):
            want(_is_count(entry.get(key)), f"splits.{name}.{key}", "an integer >= 0", entry.get(key))
        shards = entry.get("files")
        count = len(shards) if isinstance(shards, list) and 0 < len(shards) <= MAX_SHARDS else 1
        for key, suffix in SPLIT_FILES.items():
            listed = entry.get(key)
            allowed = (
                f'a list of one file name (["{name}{suffix}"] from prepare)'
                if count == 1
                else f"a list of {count:,} file names inside the folder, one per shard as files lists "
                f"(shards/<key>/{name}{suffix} from a sharded preparation)"
            )
            want(isinstance(listed, list) and len(listed) == count and all(map(_is_file_name, listed)),
                 f"splits.{name}.{key}", allowed, listed if not isinstance(listed, list) else listed[:4])  # fmt: skip
        lengths = entry.get(LENGTHS)
        pairs = (
            isinstance(lengths, list)
            and len(lengths) <= MAX_LENGTHS
            and all(
                isinstance(pair, list) and len(pair) == 2 and _is_count(pair[0], 1) and _is_count(pair[1], 1)
                for pair in lengths
            )
        )
        want(lengths is None or pairs, f"splits.{name}.{LENGTHS}",
             f"[[tokens, examples], ...], at most {MAX_LENGTHS} pairs of integers >= 1",
             lengths if not isinstance(lengths, list) else lengths[:4])  # fmt: skip
    return found
