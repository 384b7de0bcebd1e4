"""``prepare --init-from MODEL``: conversations (JSON Lines) -> the trainer's conversation data.

Per split (``train``, ``validation``) three files: ``<split>.bin`` (token ids, uint16, or uint32 when the
vocabulary needs it: Llama 3's 128,256), ``<split>.mask`` (one uint8 per token: 1 when the token is trained as a
target, ``chat_data``) and ``<split>.docs`` (int64 offsets of the examples, from 0 to the token count). Next to them
the model's ``tokenizer.json`` and ``tokenizer_config.json`` (its chat template: a run's Hugging Face export carries
it), and ``metadata.json``: ``kind: chat``, the input format, the template's and the tokenizer's SHA-256
(``training.request.sft_data`` checks them against a model folder), the counts (examples read and kept, tokens,
trained tokens, examples truncated, dropped for length, and without an assistant turn), each split's example lengths
(a histogram: the request's plan counts the packed windows from it), trained tokens, examples and each file's
SHA-256 (the trainer verifies them before training), and how truncation was done.

Validation: every k-th example (k = 1 / ``validation_fraction``), or the examples of ``validation_file``. Too long
(above ``max_tokens``): ``drop`` (the default) leaves the example out; ``truncate`` keeps its first ``max_tokens``
tokens (an answer cut there loses its end-of-turn token, so its model learns no stop for it; an example left with
no trained token is dropped). Files are written as ``.partial`` and named only once every example has passed:
a refusal leaves nothing behind, not even the output folder when this run made it (``output``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.prepare.chat_data import TEMPLATE_SECONDS, ChatDataError, Renderer, load_tokenizer, read_jsonl
from training.prepare.output import output_folder
from training.request import sft_data
from training.trainer.data.token_files import METADATA_FILE

TOO_LONG = ("drop", "truncate")
SPLIT_FILES = sft_data.SPLIT_FILES  # the per-split files the request check reads in metadata.json


@dataclass
class _Split:
    """One split's ``.partial`` files (each hashed as it is written), and its counts."""

    name: str
    out: Path
    dtype: np.dtype
    handles: dict[str, Any] = field(default_factory=dict)
    digests: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0
    trained: int = 0
    examples: int = 0
    lengths: list[int] = field(default_factory=list)

    def open(self) -> None:
        for key, suffix in SPLIT_FILES.items():
            self.handles[key] = open(self.out / f"{self.name}{suffix}.partial", "wb")  # noqa: SIM115 (closed below)
            self.digests[key] = hashlib.sha256()
        self._write("documents", np.zeros(1, dtype=np.int64))

    def _write(self, key: str, values: np.ndarray) -> None:
        data = values.tobytes()
        self.handles[key].write(data)
        self.digests[key].update(data)

    def add(self, ids: np.ndarray, mask: np.ndarray) -> None:
        self._write("files", ids.astype(self.dtype))
        self._write("masks", mask.astype(np.uint8))
        self.tokens += len(ids)
        self.trained += int(mask.sum())
        self.examples += 1
        self.lengths.append(len(ids))
        self._write("documents", np.array([self.tokens], dtype=np.int64))

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()

    def discard(self) -> None:
        self.close()
        for suffix in SPLIT_FILES.values():
            (self.out / f"{self.name}{suffix}.partial").unlink(missing_ok=True)

    def publish(self) -> dict[str, Any]:
        """Name the files; the split's entry of ``metadata.json``: its files, counts (``trained_tokens``: the mask's
        ones; ``examples``: the documents, one offset fewer than ``.docs`` holds), length histogram and each file's
        SHA-256 (what the trainer verifies before training)."""
        entry: dict[str, Any] = {}
        for key, suffix in SPLIT_FILES.items():
            os.replace(self.out / f"{self.name}{suffix}.partial", self.out / f"{self.name}{suffix}")
            entry[key] = [f"{self.name}{suffix}"]
        digests = {
            f"{self.name}{suffix}": self.digests[key].hexdigest() for key, suffix in SPLIT_FILES.items()
        }
        return {**entry, "tokens": self.tokens, "trained_tokens": self.trained, "examples": self.examples,
                sft_data.LENGTHS: sft_data.length_histogram(self.lengths), "sha256": digests}  # fmt: skip


def own_files(out: Path) -> list[Path]:
    """The files conversation preparation writes into ``out``."""
    names = [f"{split}{suffix}" for split in ("train", "validation") for suffix in SPLIT_FILES.values()]
    return [out / name for name in (*names, METADATA_FILE, "tokenizer.json", "tokenizer_config.json")]


def prepare_chat(
    inputs: list[Path],
    output: str,
    init_from: str,
    *,
    validation_fraction: float = 0.05,
    validation_file: str | None = None,
    max_tokens: int | None = None,
    too_long: str = "drop",
    template_seconds: float = TEMPLATE_SECONDS,
) -> dict[str, Any]:
    """Render ``inputs`` (JSON Lines) with ``init_from``'s chat template into ``output``; return the metadata.
    Raises ``ChatDataError`` naming the option, or the file and line, and why. ``template_seconds``: the longest
    one rendering may take (``chat_data.TEMPLATE_SECONDS``)."""
    if not template_seconds > 0:
        raise ChatDataError(f"template-seconds: must be above 0; got {template_seconds}")
    if too_long not in TOO_LONG:
        raise ChatDataError(f"too-long: must be one of {', '.join(TOO_LONG)}; got {too_long!r}")
    if max_tokens is not None and max_tokens < 2:
        raise ChatDataError(f"max-tokens: must be at least 2; got {max_tokens}")
    if validation_file and not Path(validation_file).is_file():
        raise ChatDataError(f"validation-file: {validation_file} is not a file")
    out = Path(output)
    taken = [p.name for p in own_files(out) if p.exists()]
    if taken:
        raise ChatDataError(f"output: {output} already holds {', '.join(taken)}; choose an empty folder")
    tokenizer, template = load_tokenizer(init_from)
    source = _template_source(init_from, template)
    renderer = Renderer(tokenizer, template, seconds=template_seconds, name=str(Path(init_from) / source))
    dtype = np.dtype(np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32)
    sources = [(path, None) for path in inputs] + (
        [(Path(validation_file), "validation")] if validation_file else []
    )
    every = round(1 / validation_fraction) if validation_fraction > 0 and not validation_file else None
    with output_folder(out, [p.name for p in own_files(out)], ChatDataError):
        splits = {name: _Split(name, out, dtype) for name in ("train", "validation")}
        counts, shapes, longest, largest = _render_into(
            splits, renderer, sources, every, max_tokens, too_long
        )
        _check_counts(splits, counts, every, validation_file, inputs)
        published = {name: split.publish() for name, split in splits.items() if split.examples}
        for split in splits.values():
            if not split.examples:
                split.discard()
        tokenizer_info, template_info = _copy_tokenizer(init_from, out, template, source, renderer)
        meta = {
            "format": "training.trainer.prepare/1",
            "kind": sft_data.CHAT_KIND,
            "input_format": "+".join(sorted(shapes)),
            "token_dtype": dtype.name,
            "vocab_size": len(tokenizer),
            "max_token_id": largest,
            "tokenizer": tokenizer_info,
            "chat_template": template_info,
            "init_from": str(Path(init_from).resolve()),
            "examples": sum(split.examples for split in splits.values()),
            "tokens": sum(split.tokens for split in splits.values()),
            "trained_tokens": sum(split.trained for split in splits.values()),
            "max_example_tokens": longest,
            "counts": {**counts, "examples": sum(split.examples for split in splits.values())},
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


def _render_into(
    splits: dict[str, _Split],
    renderer: Renderer,
    sources: list[tuple[Path, str | None]],
    every: int | None,
    max_tokens: int | None,
    too_long: str,
) -> tuple[dict[str, int], set[str], int, int]:
    """Render every example of ``sources`` into its split's ``.partial`` files (closed at the end, removed on a
    refusal); returns the counts, the input shapes seen, the longest example and the largest token id."""
    counts = dict.fromkeys(("read", "no_assistant_turn", "truncated", "dropped_for_length"), 0)
    shapes: set[str] = set()
    longest, largest = 0, -1
    for split in splits.values():
        split.open()
    try:
        for path, forced in sources:
            for number, messages, shape in read_jsonl(path):
                counts["read"] += 1
                example = renderer.render(messages, shape, f"{path}:{number}")
                if example is None:
                    counts["no_assistant_turn"] += 1
                    continue
                ids, mask = _fit(example.ids, example.mask, max_tokens, too_long, counts)
                if ids is None:
                    continue
                shapes.add(shape)
                target = forced or ("validation" if every and counts["read"] % every == 0 else "train")
                splits[target].add(ids, mask)
                longest, largest = max(longest, len(ids)), max(largest, int(ids.max()))
    except BaseException:
        for split in splits.values():
            split.discard()
        raise
    for split in splits.values():
        split.close()
    return counts, shapes, longest, largest


def _fit(ids: np.ndarray, mask: np.ndarray, max_tokens: int | None, too_long: str, counts: dict) -> tuple:
    """The example within ``max_tokens``, or (None, None) when it is dropped (counted)."""
    if max_tokens is None or len(ids) <= max_tokens:
        return ids, mask
    if too_long == "drop" or not mask[:max_tokens].any():
        counts["dropped_for_length"] += 1
        return None, None
    counts["truncated"] += 1
    return ids[:max_tokens], mask[:max_tokens]


def _how(max_tokens: int | None, too_long: str) -> str:
    if max_tokens is None:
        return "none: every example kept whole (the trainer refuses one longer than seq_length)"
    if too_long == "drop":
        return f"examples longer than {max_tokens} tokens dropped"
    return (
        f"examples longer than {max_tokens} tokens cut to their first {max_tokens} (the end of the conversation, "
        "with its trained tokens there, is lost); those left with no trained token dropped"
    )


def _check_counts(
    splits: dict, counts: dict, every: int | None, validation_file: str | None, inputs: list
) -> None:
    """Refuse data that would train on nothing, or a validation split that came out empty."""
    if not splits["train"].examples:
        raise ChatDataError(
            f"input: no example to train in {', '.join(str(p) for p in inputs)} ({counts['read']} read, "
            f"{counts['no_assistant_turn']} without an assistant turn to train, {counts['dropped_for_length']} "
            "dropped for length)"
        )
    if (every or validation_file) and not splits["validation"].examples:
        where = validation_file or f"every {every}th example"
        raise ChatDataError(
            f"validation: no example went to validation ({where}; {counts['read']} read): add examples, lower "
            "--validation-fraction's k, or pass --validation-fraction 0"
        )


def _model_files(folder: Path) -> dict[str, bytes]:
    names = (*sft_data.TEMPLATE_FILES, sft_data.TOKENIZER_FILE)
    return {name: (folder / name).read_bytes() for name in names if (folder / name).is_file()}


def _template_source(init_from: str, template: str) -> str:
    """The file of ``init_from`` the template comes from, read as the request check reads it
    (``sft_data.model_template``): it must be the one transformers renders with, or the hashes would disagree."""
    found = sft_data.model_template(_model_files(Path(init_from)))
    if found is None or found[0] != template:
        raise ChatDataError(
            f"init-from: transformers reads a chat template from {init_from} that its files do not hold as "
            f"{' or '.join(sft_data.TEMPLATE_FILES)}; keep the template in one of them"
        )
    return found[1]


def _copy_tokenizer(
    init_from: str, out: Path, template: str, source: str, renderer: Renderer
) -> tuple[dict, dict]:
    """Copy the model's tokenizer files next to the data; describe them and the template for ``metadata.json``."""
    folder = Path(init_from)
    files = _model_files(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            shutil.copyfile(folder / name, out / (name + ".partial"))
            os.replace(out / (name + ".partial"), out / name)
    if source == "chat_template.jinja":  # the export finds the template in tokenizer_config.json
        config = (
            json.loads((out / "tokenizer_config.json").read_text())
            if (out / "tokenizer_config.json").is_file()
            else {}
        )
        (out / "tokenizer_config.json").write_text(
            json.dumps({**config, "chat_template": template}, indent=2) + "\n"
        )
    tokenizer_json = files.get(sft_data.TOKENIZER_FILE)
    eot = sorted(renderer.end_of_turn)
    tokenizer = renderer.tokenizer
    info = {
        "name": folder.name or str(folder),
        "kind": "tokenizers" if tokenizer_json else "transformers",
        "path": str((folder / sft_data.TOKENIZER_FILE).resolve()),
        "file": sft_data.TOKENIZER_FILE if tokenizer_json else None,
        "sha256": sft_data.sha256(tokenizer_json) if tokenizer_json else None,
        "eos_id": tokenizer.eos_token_id,
    }
    template_info = {
        "sha256": sft_data.sha256(template),
        "source": source,
        "source_path": str((folder / source).resolve()),
        "file": "tokenizer_config.json",
        "end_of_turn": eot,
        "end_of_turn_ids": [int(tokenizer.convert_tokens_to_ids(t)) for t in eot],
    }
    return info, template_info


def seq_length_advice(meta: dict, init_from: str) -> str:
    """``--seq_length N (at least)``: the longest example rounded up to a multiple of 8; capped, with the reason, at
    the model's ``max_position_embeddings`` (its ``config.json``) when the longest is above it."""
    longest = meta["max_example_tokens"]
    need = max(8, -(-longest // 8) * 8)
    limit = _max_positions(Path(init_from))
    if limit is None or need <= limit:
        return f"--seq_length {need} (at least)"
    lengths = [n for entry in meta["splits"].values() for n, count in entry["lengths"] for _ in range(count)]
    longer = sum(1 for n in lengths if n > limit)
    one = longer == 1
    return (
        f"--seq_length {limit} (the model's max_position_embeddings, config.json; {longer} "
        f"example{' is' if one else 's are'} longer, up to {longest} tokens, and {'is' if one else 'are'} refused at "
        f"training: prepare again with --max-tokens {limit} to drop {'it' if one else 'them'}, or --too-long truncate)"
    )


def _max_positions(folder: Path) -> int | None:
    """The model folder's ``max_position_embeddings`` (``config.json``), rounded down to a multiple of 8; None when
    it records none."""
    try:
        value = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value // 8 * 8 if isinstance(value, int) and value >= 8 else None
