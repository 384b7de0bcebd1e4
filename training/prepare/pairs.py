"""``prepare --init-from MODEL`` of preference pairs (JSON Lines) -> the trainer's preference data (``objective``
dpo).

Input, one pair a line, in TRL's forms (``trl/trainer/dpo_trainer.py``; they may be mixed):

* conversational, explicit prompt: ``{"prompt": [messages], "chosen": [{"role": "assistant", ...}], "rejected":
  [{"role": "assistant", ...}]}``;
* conversational, implicit prompt: ``{"chosen": [messages], "rejected": [messages]}``, two whole conversations that
  share every message but their last, the assistant's answer;
* standard: ``{"prompt": "...", "chosen": "...", "rejected": "..."}``, taken as a user turn and two assistant
  answers (rendered with the chat template, as ``prompt``/``completion`` conversations are; TRL would tokenize such
  text without the template).

Each side is rendered with the model's own chat template as conversations are (``chat_data.Renderer``: the ids are
``apply_chat_template``'s), the prompt as context and the answer trained: its content and its end-of-turn token.
Refused, in one line naming the file and line: identical chosen and rejected answers (as given or as rendered),
prompts that differ (implicit form), an empty answer, an answer that is not one assistant turn at the end of the
conversation, and everything ``chat_data`` refuses in a conversation.

Output, per split (``train``, ``validation``): ``<split>.bin`` (token ids), ``<split>.mask`` (1: trained) and
``<split>.docs`` (sequence offsets) as conversation data's, two sequences per pair: the pair's chosen conversation,
then its rejected one. ``metadata.json``: ``kind: preference``, the template's and the tokenizer's SHA-256, the
counts (pairs read, kept, truncated, dropped for length) and each split's pair lengths (``lengths``: the tokens of
both sequences, the unit the trainer packs into a ``seq_length`` window).

Too long (a pair above ``max_tokens``, both sequences together): ``drop`` (the default) leaves it out; ``truncate``
cuts the end of its sequences (TRL's ``keep_start``) until the pair fits, the longer one first and neither below
half of ``max_tokens``; a cut answer loses its end-of-turn token, and a pair left with an answer without trained
tokens, or with two answers the same, is dropped. Files are written as ``.partial`` and named only once every pair
has passed: a refusal leaves nothing behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.prepare import chat
from training.prepare.chat_data import ChatDataError, Renderer, load_tokenizer, messages_of
from training.request import sft_data
from training.trainer.data.token_files import METADATA_FILE

SHAPES = ("explicit_prompt", "implicit_prompt", "standard")
"""How a pair came in (``metadata.json``'s ``input_format``): TRL's conversational forms with an explicit or an
implicit prompt, and its standard (text) form."""
FIELDS = ("chosen", "rejected")


def is_preference(path: Path) -> bool:
    """Whether ``path``'s first record is a preference pair (``chosen`` and ``rejected``), not a conversation."""
    with open(path, "rb") as handle:
        for raw in handle:
            if raw.strip():
                try:
                    record = json.loads(raw)
                except ValueError:
                    return False  # the conversation reader names the line
                return isinstance(record, dict) and set(FIELDS) <= record.keys()
    return False


@dataclass(frozen=True)
class Pair:
    """A checked pair: the prompt's messages (context, not trained) and the two answers (assistant messages)."""

    prompt: list[dict[str, Any]]
    chosen: dict[str, Any]
    rejected: dict[str, Any]
    shape: str


def read_pairs(path: Path) -> Iterator[tuple[int, Pair]]:
    """``(line number, pair)`` of every non-blank line of ``path``, checked (see the module doc)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ChatDataError(f"{where}: not UTF-8 ({err.reason} at byte {err.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise ChatDataError(f"{where}: not valid JSON ({err})") from None
            yield number, pair_of(record, where)


def pair_of(record: Any, where: str) -> Pair:
    """The checked pair of one JSON record."""
    if not isinstance(record, dict) or not set(FIELDS) <= record.keys():
        raise ChatDataError(
            f"{where}: a preference pair is a JSON object with 'chosen' and 'rejected' (and 'prompt', unless both are "
            "whole conversations sharing their prompt)"
        )
    chosen, rejected = record["chosen"], record["rejected"]
    if "prompt" in record and all(isinstance(v, str) for v in (record["prompt"], chosen, rejected)):
        prompt = messages_of({"messages": [{"role": "user", "content": record["prompt"]}]}, where)[0]
        answers = [_answer([{"role": "assistant", "content": text}], name, where) for name, text in
                   zip(FIELDS, (chosen, rejected), strict=True)]  # fmt: skip
        return _checked(Pair(prompt, *answers, "standard"), where)
    if any(isinstance(v, str) for v in (chosen, rejected, record.get("prompt"))):
        raise ChatDataError(
            f"{where}: 'prompt', 'chosen' and 'rejected' must be all strings (the standard form) or all lists of "
            "messages (the conversational form)"
        )
    if "prompt" in record:
        prompt = _messages(record["prompt"], "prompt", where)
        pair = Pair(
            prompt, _answer(chosen, "chosen", where), _answer(rejected, "rejected", where), "explicit_prompt"
        )
        return _checked(pair, where)
    full = {
        name: _messages(value, name, where) for name, value in zip(FIELDS, (chosen, rejected), strict=True)
    }
    if full["chosen"][:-1] != full["rejected"][:-1]:
        raise ChatDataError(
            f"{where}: 'chosen' and 'rejected' have different prompts (every message but the last must be the same "
            "when no 'prompt' is given); give the shared part as 'prompt' and one answer each"
        )
    answers = [_answer(full[name][-1:], name, where) for name in FIELDS]
    return _checked(Pair(full["chosen"][:-1], *answers, "implicit_prompt"), where)


def _messages(value: Any, name: str, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ChatDataError(
            f"{where}: '{name}' must be a non-empty list of messages (or, with the others, a string)"
        )
    messages = messages_of({"messages": value}, where)[0]
    return [{**message, "train": False} for message in messages]


def _answer(value: Any, name: str, where: str) -> dict[str, Any]:
    """The one assistant message of an answer, trained."""
    messages = _messages(value, name, where)
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        roles = ", ".join(m["role"] for m in messages)
        raise ChatDataError(
            f"{where}: '{name}' must be one assistant turn, the conversation's last ({roles} given): the answer "
            "preferred or not is the assistant's last turn"
        )
    if not messages[0]["content"].strip():
        raise ChatDataError(
            f"{where}: the '{name}' answer is empty: a preference needs two answers to compare"
        )
    return {**messages[0], "train": True}


def _checked(pair: Pair, where: str) -> Pair:
    if not pair.prompt:
        raise ChatDataError(
            f"{where}: the pair has no prompt: with nothing before the answers the template cannot show where they "
            "start; give the system or user message they answer"
        )
    if pair.chosen["content"] == pair.rejected["content"]:
        raise ChatDataError(
            f"{where}: 'chosen' and 'rejected' are the same answer: a pair must prefer one of two"
        )
    return pair


@dataclass
class _Split:
    """One split's ``.partial`` files and counts: two sequences per pair."""

    name: str
    out: Path
    dtype: np.dtype
    handles: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0
    trained: int = 0
    pairs: int = 0
    lengths: list[int] = field(default_factory=list)

    def open(self) -> None:
        for key, suffix in chat.SPLIT_FILES.items():
            self.handles[key] = open(self.out / f"{self.name}{suffix}.partial", "wb")  # noqa: SIM115 (closed below)
        self.handles["documents"].write(np.zeros(1, dtype=np.int64).tobytes())

    def add(self, sides: list[tuple[np.ndarray, np.ndarray]]) -> None:
        for ids, mask in sides:
            self.handles["files"].write(ids.astype(self.dtype).tobytes())
            self.handles["masks"].write(mask.astype(np.uint8).tobytes())
            self.tokens += len(ids)
            self.trained += int(mask.sum())
            self.handles["documents"].write(np.array([self.tokens], dtype=np.int64).tobytes())
        self.pairs += 1
        self.lengths.append(sum(len(ids) for ids, _ in sides))

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()

    def discard(self) -> None:
        self.close()
        for suffix in chat.SPLIT_FILES.values():
            (self.out / f"{self.name}{suffix}.partial").unlink(missing_ok=True)

    def publish(self) -> dict[str, Any]:
        entry: dict[str, Any] = {}
        for key, suffix in chat.SPLIT_FILES.items():
            os.replace(self.out / f"{self.name}{suffix}.partial", self.out / f"{self.name}{suffix}")
            entry[key] = [f"{self.name}{suffix}"]
        return {**entry, "tokens": self.tokens, "trained_tokens": self.trained, "examples": self.pairs,
                "sequences": 2 * self.pairs, sft_data.LENGTHS: sft_data.length_histogram(self.lengths)}  # fmt: skip


def prepare_pairs(
    inputs: list[Path],
    output: str,
    init_from: str,
    *,
    validation_fraction: float = 0.05,
    validation_file: str | None = None,
    max_tokens: int | None = None,
    too_long: str = "drop",
) -> dict[str, Any]:
    """Render the pairs of ``inputs`` (JSON Lines) with ``init_from``'s chat template into ``output``; return the
    metadata. Raises ``ChatDataError`` naming the option, or the file and line, and why."""
    if too_long not in chat.TOO_LONG:
        raise ChatDataError(f"too-long: must be one of {', '.join(chat.TOO_LONG)}; got {too_long!r}")
    if max_tokens is not None and max_tokens < 4:
        raise ChatDataError(f"max-tokens: must be at least 4 for pairs (two sequences); got {max_tokens}")
    out = Path(output)
    taken = [p.name for p in chat.own_files(out) if p.exists()]
    if taken:
        raise ChatDataError(f"output: {output} already holds {', '.join(taken)}; choose an empty folder")
    tokenizer, template = load_tokenizer(init_from)
    source = chat._template_source(init_from, template)
    renderer = Renderer(tokenizer, template)
    dtype = np.dtype(np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32)
    out.mkdir(parents=True, exist_ok=True)
    splits = {name: _Split(name, out, dtype) for name in ("train", "validation")}
    counts = dict.fromkeys(("read", "truncated", "dropped_for_length"), 0)
    shapes: set[str] = set()
    sources = [(path, None) for path in inputs] + (
        [(Path(validation_file), "validation")] if validation_file else []
    )
    every = round(1 / validation_fraction) if validation_fraction > 0 and not validation_file else None
    longest, longest_sequence, largest = 0, 0, -1
    for split in splits.values():
        split.open()
    try:
        for path, forced in sources:
            for number, pair in read_pairs(path):
                counts["read"] += 1
                sides = render_pair(renderer, pair, f"{path}:{number}")
                sides = fit_pair(sides, max_tokens, too_long, counts)
                if sides is None:
                    continue
                shapes.add(pair.shape)
                target = forced or ("validation" if every and counts["read"] % every == 0 else "train")
                splits[target].add(sides)
                longest = max(longest, sum(len(ids) for ids, _ in sides))
                longest_sequence = max([longest_sequence, *(len(ids) for ids, _ in sides)])
                largest = max([largest, *(int(ids.max()) for ids, _ in sides)])
        _check_counts(splits, counts, every, validation_file, inputs)
    except BaseException:
        for split in splits.values():
            split.discard()
        raise
    for split in splits.values():
        split.close()
    published = {name: split.publish() for name, split in splits.items() if split.pairs}
    for split in splits.values():
        if not split.pairs:
            split.discard()
    tokenizer_info, template_info = chat._copy_tokenizer(init_from, out, template, source, renderer)
    kept = sum(split.pairs for split in splits.values())
    meta = {
        "format": "training.trainer.prepare/1",
        "kind": sft_data.PREFERENCE_KIND,
        "input_format": "+".join(sorted(shapes)),
        "token_dtype": dtype.name,
        "vocab_size": len(tokenizer),
        "max_token_id": largest,
        "tokenizer": tokenizer_info,
        "chat_template": template_info,
        "init_from": str(Path(init_from).resolve()),
        "examples": kept,
        "pairs": kept,
        "tokens": sum(split.tokens for split in splits.values()),
        "trained_tokens": sum(split.trained for split in splits.values()),
        "max_example_tokens": longest,
        "max_sequence_tokens": longest_sequence,
        "counts": {**counts, "examples": kept},
        "truncation": {"max_tokens": max_tokens, "too_long": too_long, "how": _how(max_tokens, too_long)},
        "sources": [str(p) for p, _ in sources],
        "validation_fraction": None if validation_file else validation_fraction,
        "validation_file": validation_file,
        "splits": published,
    }
    tmp = out / (METADATA_FILE + ".partial")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, out / METADATA_FILE)
    return meta


def render_pair(renderer: Renderer, pair: Pair, where: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(ids, mask) of the chosen conversation, of the rejected one]``: the prompt as context, the answer trained."""
    sides = []
    for name, answer in zip(FIELDS, (pair.chosen, pair.rejected), strict=True):
        example = renderer.render([*pair.prompt, answer], pair.shape, f"{where} ({name})")
        assert example is not None  # the answer is trained
        sides.append((example.ids, example.mask))
    if _answer_ids(sides[0]) == _answer_ids(sides[1]):
        raise ChatDataError(
            f"{where}: 'chosen' and 'rejected' render to the same answer tokens with this chat template (it trims or "
            "rewrites them): a pair must prefer one of two"
        )
    return sides


def _answer_ids(side: tuple[np.ndarray, np.ndarray]) -> list[int]:
    ids, mask = side
    return ids[mask.astype(bool)].tolist()


def fit_pair(
    sides: list[tuple[np.ndarray, np.ndarray]], max_tokens: int | None, too_long: str, counts: dict
) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """The pair within ``max_tokens`` (see the module doc), or None when it is dropped (counted)."""
    lengths = [len(ids) for ids, _ in sides]
    if max_tokens is None or sum(lengths) <= max_tokens:
        return sides
    if too_long == "drop":
        counts["dropped_for_length"] += 1
        return None
    half = max_tokens // 2
    short = int(np.argmin(lengths))
    keep = [0, 0]
    if lengths[short] <= half:
        keep[short], keep[1 - short] = lengths[short], max_tokens - lengths[short]
    else:
        keep = [half, max_tokens - half]
    cut = [(ids[:n], mask[:n]) for (ids, mask), n in zip(sides, keep, strict=True)]
    if not all(mask.any() for _, mask in cut) or _answer_ids(cut[0]) == _answer_ids(cut[1]):
        counts["dropped_for_length"] += 1
        return None
    counts["truncated"] += 1
    return cut


def _how(max_tokens: int | None, too_long: str) -> str:
    if max_tokens is None:
        return "none: every pair kept whole (the trainer refuses one longer than seq_length)"
    if too_long == "drop":
        return f"pairs longer than {max_tokens} tokens (both sequences) dropped"
    return (
        f"pairs longer than {max_tokens} tokens (both sequences) cut at the end of their sequences, the longer first "
        f"and neither below {max_tokens // 2} (TRL's keep_start; a cut answer loses its end-of-turn token); those "
        "left with an answer without trained tokens, or with the same two answers, dropped"
    )


def _check_counts(
    splits: dict, counts: dict, every: int | None, validation_file: str | None, inputs: list
) -> None:
    """Refuse data that would train on nothing, or a validation split that came out empty."""
    if not splits["train"].pairs:
        raise ChatDataError(
            f"input: no pair to train in {', '.join(str(p) for p in inputs)} ({counts['read']} read, "
            f"{counts['dropped_for_length']} dropped for length)"
        )
    if (every or validation_file) and not splits["validation"].pairs:
        where = validation_file or f"every {every}th pair"
        raise ChatDataError(
            f"validation: no pair went to validation ({where}; {counts['read']} read): add pairs, lower "
            "--validation-fraction's k, or pass --validation-fraction 0"
        )


def summary(meta: dict[str, Any], output: str, init_from: str) -> list[str]:
    """What ``python -m training.prepare`` prints after preparing pairs."""
    counts = meta["counts"]
    splits = ", ".join(f"{name} {s['examples']} pairs ({s['tokens']} tokens, {s['trained_tokens']} trained)"
                       for name, s in meta["splits"].items())  # fmt: skip
    return [
        f"prepared {counts['examples']} of {counts['read']} preference pairs into {output}: {splits}; "
        f"{counts['dropped_for_length']} dropped and {counts['truncated']} truncated for length; longest pair "
        f"{meta['max_example_tokens']} tokens (both sequences); template {meta['chat_template']['source']} (end of "
        f"turn {', '.join(meta['chat_template']['end_of_turn'])})",
        f"train with: --dataset channel --data_dir {output} --init_from {init_from} --token_dtype "
        f"{meta['token_dtype']} --seq_length {max(8, -(-meta['max_example_tokens'] // 8) * 8)} (at least)",
    ]
