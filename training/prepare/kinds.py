"""What a record becomes: one kind per kind of data, each a tokenizer and the files an example writes.

* ``text`` (pretraining): a document's token ids followed by the tokenizer's end-of-document token; one file per
  split (``<split>.bin``). Tokenizer: a local Hugging Face ``tokenizer.json`` (``tokenizers``), or byte-level
  (UTF-8 bytes are ids 0-255, end-of-document 256) without one, as local ``prepare`` does.
* ``chat`` (fine-tuning): a conversation rendered with the model's own chat template (``chat_data.Renderer``:
  transformers' ``apply_chat_template``), its loss mask and its place among the split's examples: ``<split>.bin``,
  ``<split>.mask``, ``<split>.docs``, and each split's example lengths as a histogram.

* ``pairs`` (preference tuning): a preference pair in TRL's forms, checked and rendered as local ``prepare`` does
  (``training.prepare.pairs``: ``pair_of``, ``render_pair``, ``fit_pair``), written as conversation data's files, two
  sequences per pair (the chosen conversation, then the rejected one); its manifest's ``kind`` is ``preference`` and
  its histograms count pairs by the tokens of both sequences, as local ``prepare``'s ``metadata.json``.

A kind is chosen by name (``KINDS``): a reader of the record's fields, an ``encode`` giving its arrays by file key,
its files and the fields its manifest adds. Every kind says
what it was made with (``settings``: tokenizer and template hashes, token dtype, the options), and a shard or a
manifest made with other settings is never mixed with these.

The split of a record is decided by a stable hash of the record itself (``split_key``: the document's UTF-8 text,
or the conversation's canonical JSON), never by its position: the same record lands in the same split whatever
the instance, the number of instances or the order of the objects (and duplicates never straddle the two splits).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.prepare import chat_data
from training.request import sft_data

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]")
"""A tokenizer's end-of-document token: the first of these it has (as local ``prepare`` picks it)."""
BYTE_EOS = 256
"""The byte-level tokenizer's end of document (ids 0-255 are the UTF-8 bytes)."""
TOO_LONG = ("drop", "truncate")
SPLITS = ("train", "validation")
TOKENIZER_FILE = "tokenizer.json"
ENCODE_BATCH = 64
"""Documents handed to the Rust tokenizer at once (``encode_batch``: fewer crossings into Python)."""


class KindError(ValueError):
    """Bad options for a kind (a tokenizer that cannot be loaded, a model folder without a template)."""


@dataclass
class Example:
    """One encoded record: an array per file key (token ids first), its length in tokens and trained tokens."""

    arrays: dict[str, np.ndarray]
    tokens: int
    trained: int
    sequences: tuple[int, ...] = ()
    """The lengths of its sequences when it is more than one (a preference pair: chosen, rejected); each gets its own
    entry in ``<split>.docs``."""


def stable_fraction(data: bytes) -> float:
    """A number in [0, 1) fixed by ``data`` alone: the first 8 bytes of its BLAKE2b digest over 2^64."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") / 2.0**64


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class TextKind:
    """Pretraining text: ``tokenizer`` a local ``tokenizer.json`` (None: byte-level), ``text_field`` the JSON
    Lines field or Parquet column holding a document."""

    tokenizer: str | None = None
    text_field: str = "text"
    name: str = "text"
    file_keys: dict[str, str] = field(default_factory=lambda: {"files": ".bin"})
    histograms: bool = False
    _encoder: Any = None

    def __post_init__(self) -> None:
        if self.tokenizer is None:
            self.vocab_size, self.eos, self.info = BYTE_EOS + 1, BYTE_EOS, {
                "name": "bytes", "kind": "byte-level UTF-8", "eos_id": BYTE_EOS, "sha256": None}  # fmt: skip
            return
        path = Path(self.tokenizer)
        try:
            from tokenizers import Tokenizer  # noqa: PLC0415 - the byte-level kind needs none

            self._encoder = Tokenizer.from_file(str(path))
        except ImportError:
            raise KindError("tokenizer: the 'tokenizers' package is needed for a tokenizer.json") from None
        except Exception as err:  # the library raises its own exception types
            raise KindError(f"tokenizer: cannot load {path}: {err}") from None
        encoder = self._encoder
        self.eos = next(
            (encoder.token_to_id(t) for t in EOS_CANDIDATES if encoder.token_to_id(t) is not None), None
        )
        self.vocab_size = encoder.get_vocab_size(with_added_tokens=True)
        self.info = {"name": path.name, "kind": "tokenizers", "eos_id": self.eos, "file": TOKENIZER_FILE,
                     "sha256": file_sha256(path)}  # fmt: skip

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    def settings(self) -> dict[str, Any]:
        return {"kind": self.name, "text_field": self.text_field, "token_dtype": self.dtype.name,
                "vocab_size": self.vocab_size, "tokenizer": self.info}  # fmt: skip

    def model_files(self) -> dict[str, Path]:
        """The files copied next to the manifest (the trainer keeps the tokenizer with the model)."""
        return {TOKENIZER_FILE: Path(self.tokenizer)} if self.tokenizer else {}

    def split_key(self, record: str) -> bytes:
        return record.encode("utf-8")

    def begin_shard(self) -> None:
        pass

    def extra(self) -> dict[str, Any]:
        return {}

    def encode(self, records: list[tuple[str, Any]], counts: Counter) -> list[Example | None]:
        texts = [text for _, text in records]
        if self._encoder is None:
            ids = [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts]
        else:
            ids = [
                np.asarray(e.ids, dtype=np.int64)
                for e in self._encoder.encode_batch(texts, add_special_tokens=False)
            ]
        out = []
        for array in ids:
            if self.eos is not None:
                array = np.append(array, self.eos)
            counts["documents"] += 1
            out.append(Example({"files": array}, len(array), len(array)))
        return out


@dataclass
class ChatKind:
    """Conversations: ``init_from`` a model folder (its tokenizer and chat template), examples above
    ``max_tokens`` dropped or truncated (``too_long``), each rendering bounded by ``template_seconds``, as
    ``prepare --init-from`` does locally."""

    init_from: str
    max_tokens: int | None = None
    too_long: str = "drop"
    template_seconds: float = chat_data.TEMPLATE_SECONDS
    name: str = "chat"
    text_field: None = None
    file_keys: dict[str, str] = field(
        default_factory=lambda: {"files": ".bin", "masks": ".mask", "documents": ".docs"}
    )
    histograms: bool = True

    def __post_init__(self) -> None:
        from training.prepare import chat  # noqa: PLC0415 - the trainer's data module (torch): chat only

        if self.too_long not in TOO_LONG:
            raise KindError(f"too-long: must be one of {', '.join(TOO_LONG)}; got {self.too_long!r}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise KindError(f"max-tokens: must be at least 2; got {self.max_tokens}")
        try:
            tokenizer, template = chat_data.load_tokenizer(self.init_from)
            source = chat._template_source(self.init_from, template)
        except chat_data.ChatDataError as err:
            raise KindError(str(err)) from None
        self.renderer = chat_data.Renderer(
            tokenizer, template, seconds=self.template_seconds, name=str(Path(self.init_from) / source)
        )
        self.vocab_size = len(tokenizer)
        folder = Path(self.init_from)
        tokenizer_json = folder / TOKENIZER_FILE
        self.info = {"name": folder.name or str(folder), "kind": "tokenizers" if tokenizer_json.is_file() else
                     "transformers", "file": TOKENIZER_FILE if tokenizer_json.is_file() else None,
                     "sha256": file_sha256(tokenizer_json) if tokenizer_json.is_file() else None,
                     "eos_id": tokenizer.eos_token_id}  # fmt: skip
        self.template = {
            "sha256": sft_data.sha256(template),
            "source": source,
            "file": "tokenizer_config.json",
        }

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    def settings(self) -> dict[str, Any]:
        from training.prepare import chat  # noqa: PLC0415

        return {"kind": self.name, "token_dtype": self.dtype.name, "vocab_size": self.vocab_size,
                "tokenizer": self.info, "chat_template": self.template,
                "truncation": {"max_tokens": self.max_tokens, "too_long": self.too_long,
                               "how": chat._how(self.max_tokens, self.too_long)}}  # fmt: skip

    def model_files(self) -> dict[str, Path]:
        folder = Path(self.init_from)
        return {name: folder / name for name in (TOKENIZER_FILE, "tokenizer_config.json", "chat_template.jinja")
                if (folder / name).is_file()}  # fmt: skip

    def split_key(self, record: Any) -> bytes:
        return json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def encode(self, records: list[tuple[str, Any]], counts: Counter) -> list[Example | None]:
        from training.prepare import chat  # noqa: PLC0415

        out: list[Example | None] = []
        for where, record in records:
            counts["read"] += 1
            if isinstance(record, dict) and {"chosen", "rejected"} <= record.keys():
                raise KindError(
                    f"{where}: a preference pair ('chosen' and 'rejected') among conversations: prepare pairs on "
                    "their own, with --kind pairs (docs/preference-tuning.md)"
                )
            try:
                messages, shape = chat_data.messages_of(record, where)
                example = self.renderer.render(messages, shape, where)
            except chat_data.ChatDataError as err:
                raise KindError(str(err)) from None
            if example is None:
                counts["no_assistant_turn"] += 1
                out.append(None)
                continue
            ids, mask = chat._fit(example.ids, example.mask, self.max_tokens, self.too_long, counts)
            if ids is None:
                out.append(None)
                continue
            counts[f"shape:{shape}"] += 1
            out.append(Example({"files": ids, "masks": mask.astype(np.uint8)}, len(ids), int(mask.sum())))
        return out

    def begin_shard(self) -> None:
        self.renderer.end_of_turn = set()  # a shard's record says what its own examples showed

    def extra(self) -> dict[str, Any]:
        """What rendering found (the template's end-of-turn tokens), for the shard's record."""
        tokens = sorted(self.renderer.end_of_turn)
        ids = [int(self.renderer.tokenizer.convert_tokens_to_ids(t)) for t in tokens]
        return {"end_of_turn": tokens, "end_of_turn_ids": ids}


@dataclass
class PairsKind(ChatKind):
    """Preference pairs: as ``ChatKind`` (the model folder's template, ``max_tokens`` and ``too_long``), each pair
    checked, rendered and fitted as local ``prepare`` does (``training.prepare.pairs``); ``max_tokens`` bounds a
    pair's two sequences together."""

    name: str = sft_data.PREFERENCE_KIND
    longest_sequence: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 4:
            raise KindError(
                f"max-tokens: must be at least 4 for pairs (two sequences); got {self.max_tokens}"
            )
        super().__post_init__()

    def settings(self) -> dict[str, Any]:
        from training.prepare import pairs  # noqa: PLC0415

        return {**super().settings(), "truncation": {"max_tokens": self.max_tokens, "too_long": self.too_long,
                                                     "how": pairs._how(self.max_tokens, self.too_long)}}  # fmt: skip

    def encode(self, records: list[tuple[str, Any]], counts: Counter) -> list[Example | None]:
        from training.prepare import pairs  # noqa: PLC0415

        out: list[Example | None] = []
        for where, record in records:
            counts["read"] += 1
            try:
                pair = pairs.pair_of(record, where)
                sides = pairs.fit_pair(
                    pairs.render_pair(self.renderer, pair, where), self.max_tokens, self.too_long, counts
                )
            except chat_data.ChatDataError as err:
                raise KindError(str(err)) from None
            if sides is None:
                out.append(None)
                continue
            counts[f"shape:{pair.shape}"] += 1
            lengths = tuple(len(ids) for ids, _ in sides)
            self.longest_sequence = max(self.longest_sequence, *lengths)
            ids = np.concatenate([ids for ids, _ in sides])
            mask = np.concatenate([mask for _, mask in sides]).astype(np.uint8)
            out.append(Example({"files": ids, "masks": mask}, len(ids), int(mask.sum()), lengths))
        return out

    def begin_shard(self) -> None:
        super().begin_shard()
        self.longest_sequence = 0

    def extra(self) -> dict[str, Any]:
        return {**super().extra(), "max_sequence_tokens": self.longest_sequence}


KINDS = {"text": TextKind, "chat": ChatKind, "pairs": PairsKind}
"""Kinds by name (``--kind``)."""


def make_kind(name: str, **options: Any) -> TextKind | ChatKind:
    """The kind ``name`` with its options (``tokenizer``, ``text_field``; ``init_from``, ``max_tokens``,
    ``too_long``, ``template_seconds``); ``KindError`` naming the option otherwise."""
    if name not in KINDS:
        raise KindError(f"kind: must be one of {', '.join(KINDS)}; got {name!r}")
    if name == "text":
        return TextKind(tokenizer=options.get("tokenizer"), text_field=options.get("text_field") or "text")
    if not options.get("init_from"):
        raise KindError(f"init-from: the {name} kind needs a model folder with a chat template")
    seconds = options.get("template_seconds", chat_data.TEMPLATE_SECONDS)
    made = PairsKind if name == "pairs" else ChatKind
    return made(options["init_from"], options.get("max_tokens"), options.get("too_long") or "drop", seconds)


def single_threaded() -> None:
    """One core per process: the Rust tokenizer's own thread pool off (a process pool keeps every core busy)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
