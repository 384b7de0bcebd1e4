"""Data preparation: text files or JSON Lines -> the trainer's token files and their ``metadata.json``.

    python -m training.prepare notes.txt more/ --output data/
    python -m training.prepare corpus.jsonl --text-field body --tokenizer tokenizer.json --output data/
    python -m training.prepare conversations.jsonl --init-from llama-3.1-8b-instruct/ --output chat/

With ``--init-from`` (a model folder holding its tokenizer and chat template) the inputs are conversations, rendered
with that model's own chat template and trained only on the assistant's turns: ``training.prepare.chat``; or
preference pairs (``chosen`` and ``rejected`` answers, for ``objective`` dpo): ``training.prepare.pairs``.

Inputs are files or folders (searched for ``*.txt``, ``*.md``, ``*.jsonl``, ``*.py``, ``*.rst``). A ``.jsonl``
file holds one JSON object per line whose ``--text-field`` is a document; any other file is one document.
Documents are tokenized by a byte-level tokenizer (UTF-8 bytes are ids 0-255, end-of-document is 256, vocabulary
257) or by a local Hugging Face ``tokenizer.json`` (the ``tokenizers`` library; no downloads), each followed by
the tokenizer's end-of-document token when it has one.

With ``--sharded`` the output is the cloud's instead: the SageMaker Processing job's code (``training.prepare.job``)
run here, one shard per input file, each document to validation by its own hash, one manifest; byte for byte what
the job writes for the same files and settings (docs/data.md). It also reads Parquet and ``.gz``/``.zst`` files.

The token stream is cut into blocks of ``--block-tokens``; every k-th block (k = 1 / ``--validation-fraction``)
goes to ``validation.bin``, the rest to ``train.bin`` (spread over the whole input, also for one long file).
``metadata.json`` records token dtype, vocabulary size, tokenizer, token counts, largest id and the files of each
split with their SHA-256; a ``tokenizer.json`` is copied next to them (the trainer stores it with the model for the
Hugging Face export). The trainer (``--dataset channel --data_dir <output>``) checks it against its settings. The
output folder must hold none of these files already: nothing is overwritten. A refusal leaves nothing behind
(``output``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from training.prepare import chat as chat_prepare
from training.prepare import chat_data, pairs
from training.prepare.output import output_folder
from training.trainer.data.token_files import METADATA_FILE

TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".py", ".rst")
SHARDED_ONLY = (".parquet", ".gz", ".zst")
"""Inputs only ``--sharded`` reads (``training.prepare.sources``); read here, they would be taken for text."""
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]")
BYTE_EOS = 256
TOKENIZER_FILE = "tokenizer.json"
"""A Hugging Face tokenizer is copied into the output folder under this name (``metadata.json``: tokenizer.file)."""


class PrepareError(ValueError):
    """Bad input or options; the message names the option or file."""


def input_files(inputs: list[str]) -> list[Path]:
    """The files named, and the text files under the folders named, in a stable order."""
    files: list[Path] = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        elif path.is_file() and path.suffix in SHARDED_ONLY:
            raise PrepareError(f"input: {name} is {path.suffix[1:]}: read with --sharded (docs/data.md)")
        elif path.is_file():
            files.append(path)
        else:
            raise PrepareError(f"input: {name} is neither a file nor a folder")
    if not files:
        raise PrepareError(
            f"input: no text files in {', '.join(inputs)} (looked for {', '.join(TEXT_SUFFIXES)}; "
            f"{', '.join(SHARDED_ONLY)} with --sharded)"
        )
    return files


def documents(files: list[Path], text_field: str) -> Iterator[str]:
    """Every document of ``files``: a whole text file, or each JSON Lines record's ``text_field``."""
    for path in files:
        if path.suffix != ".jsonl":
            yield path.read_text(encoding="utf-8", errors="replace")
            continue
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    text = record[text_field]
                except (ValueError, KeyError, TypeError):
                    raise PrepareError(
                        f"text-field: {path}:{number} is not a JSON object with a string field {text_field!r}"
                    ) from None
                if not isinstance(text, str):
                    raise PrepareError(f"text-field: {path}:{number} field {text_field!r} is not a string")
                yield text


def byte_tokenizer() -> tuple[Callable[[str], list[int] | np.ndarray], int, int | None, dict]:
    """(encode, vocabulary size, end-of-document id, description)."""

    def encode(text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    return encode, BYTE_EOS + 1, BYTE_EOS, {"name": "bytes", "kind": "byte-level UTF-8", "eos_id": BYTE_EOS}


def hf_tokenizer(path: str) -> tuple[Callable[[str], list[int] | np.ndarray], int, int | None, dict]:
    """A local Hugging Face ``tokenizer.json`` through the ``tokenizers`` library."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise PrepareError("tokenizer: the 'tokenizers' package is needed for a tokenizer.json") from None
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as err:  # the library raises its own exception types
        raise PrepareError(f"tokenizer: cannot load {path}: {err}") from None
    eos = next(
        (tokenizer.token_to_id(t) for t in EOS_CANDIDATES if tokenizer.token_to_id(t) is not None), None
    )

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    info = {"name": Path(path).name, "kind": "tokenizers", "path": str(Path(path).resolve()), "eos_id": eos}
    return encode, vocab, eos, info


class _SplitWriter:
    """Cuts the token stream into blocks and appends every k-th block to validation, the rest to train."""

    def __init__(self, output: Path, dtype: np.dtype, block: int, every: int | None):
        self.dtype, self.block, self.every = dtype, block, every
        self.paths = {"train": output / "train.bin", "validation": output / "validation.bin"}
        # closed by close() or discard()
        self.handles = {split: open(_partial(p), "wb") for split, p in self.paths.items()}  # noqa: SIM115
        self.counts = {"train": 0, "validation": 0}
        self.digests = {split: hashlib.sha256() for split in self.paths}
        self.pending: list[np.ndarray] = []
        self.pending_len = self.blocks = 0
        self.max_id = -1

    def add(self, ids: np.ndarray) -> None:
        if len(ids):
            self.max_id = max(self.max_id, int(ids.max()))
        self.pending.append(ids.astype(self.dtype, copy=False))
        self.pending_len += len(ids)
        if self.pending_len >= self.block:
            stream = np.concatenate(self.pending)
            cut = len(stream) - len(stream) % self.block
            for begin in range(0, cut, self.block):
                self._emit(stream[begin : begin + self.block])
            self.pending, self.pending_len = [stream[cut:]], len(stream) - cut

    def _emit(self, block: np.ndarray) -> None:
        self.blocks += 1
        split = "validation" if self.every and self.blocks % self.every == 0 else "train"
        data = block.tobytes()
        self.handles[split].write(data)
        self.digests[split].update(data)
        self.counts[split] += len(block)

    def close(self) -> None:
        if self.pending_len:
            self._emit(np.concatenate(self.pending))
        for handle in self.handles.values():
            handle.close()

    def discard(self) -> None:
        """Remove this run's unfinished ``.partial`` files (they are ours; nothing else is touched)."""
        for split, handle in self.handles.items():
            handle.close()
            _partial(self.paths[split]).unlink(missing_ok=True)

    def publish(self) -> dict[str, dict]:
        """Give the files their final names (empty splits are dropped); the metadata's ``splits``: each split's
        files, tokens and each file's SHA-256."""
        splits = {}
        for split, path in self.paths.items():
            if self.counts[split]:
                os.replace(_partial(path), path)
                splits[split] = {"files": [path.name], "tokens": self.counts[split],
                                 "sha256": {path.name: self.digests[split].hexdigest()}}  # fmt: skip
            else:
                os.unlink(_partial(path))
        return splits


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def prepare(
    inputs: list[str],
    output: str,
    tokenizer: str | None = None,
    validation_fraction: float = 0.05,
    block_tokens: int = 4096,
    text_field: str = "text",
) -> dict:
    """Write the token files and ``metadata.json`` into ``output``; return the metadata."""
    if not 0 <= validation_fraction < 0.5:
        raise PrepareError(f"validation-fraction: must be in [0, 0.5); got {validation_fraction}")
    if block_tokens < 1:
        raise PrepareError(f"block-tokens: must be at least 1; got {block_tokens}")
    out = Path(output)
    # the tokenizer already in the output folder under its name is used in place (not copied onto itself)
    in_place = bool(tokenizer) and Path(tokenizer).resolve() == (out / TOKENIZER_FILE).resolve()
    own = (out / METADATA_FILE, out / "train.bin", out / "validation.bin", out / TOKENIZER_FILE)
    taken = [p.name for p in own[: 3 if in_place else 4] if p.exists()]
    if taken:
        raise PrepareError(f"output: {output} already holds {', '.join(taken)}; choose an empty folder")
    files = input_files(inputs)
    encode, vocab, eos, info = hf_tokenizer(tokenizer) if tokenizer else byte_tokenizer()
    dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)
    with output_folder(out, [p.name for p in own[: 3 if in_place else 4]], PrepareError):
        every = round(1 / validation_fraction) if validation_fraction > 0 else None
        writer = _SplitWriter(out, dtype, block_tokens, every)
        count = 0
        try:
            for text in documents(files, text_field):
                ids = np.asarray(encode(text), dtype=np.int64)
                writer.add(np.append(ids, eos) if eos is not None else ids)
                count += 1
        except BaseException:
            writer.discard()
            raise
        writer.close()
        if every and not writer.counts["validation"]:
            writer.discard()
            raise PrepareError(
                f"validation-fraction: the input has {writer.counts['train']} tokens, fewer than {every} blocks of "
                f"{block_tokens}, so no block went to validation; lower --block-tokens or pass --validation-fraction 0"
            )
        meta = {
            "format": "training.trainer.prepare/1",
            "token_dtype": dtype.name,
            "vocab_size": vocab,
            "max_token_id": writer.max_id,
            "tokenizer": info,
            "documents": count,
            "sources": [str(p) for p in files],
            "validation_fraction": validation_fraction,
            "block_tokens": block_tokens,
            "splits": writer.publish(),
        }
        meta["tokens"] = sum(split["tokens"] for split in meta["splits"].values())
        # next to the tokens, so that the trainer (and its Hugging Face export) finds it in the channel
        if tokenizer:
            if not in_place:
                shutil.copyfile(tokenizer, out / (TOKENIZER_FILE + ".partial"))
                os.replace(out / (TOKENIZER_FILE + ".partial"), out / TOKENIZER_FILE)
            info["file"] = TOKENIZER_FILE
        tmp = out / (METADATA_FILE + ".partial")
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp, out / METADATA_FILE)
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.prepare", description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="Text or JSON Lines files, or folders of them.")
    parser.add_argument(
        "--output", required=True, help="Folder for train.bin, validation.bin, metadata.json."
    )
    parser.add_argument("--tokenizer", help="A local Hugging Face tokenizer.json (default: byte-level).")
    parser.add_argument(
        "--validation-fraction",
        type=float,
        help="Share held out (default 0.05; with --sharded 0.01, the cloud job's).",
    )
    parser.add_argument("--block-tokens", type=int, help="Split granularity (default 4096).")
    parser.add_argument(
        "--text-field", default="text", help="JSON Lines field holding the text (default text)."
    )
    parser.add_argument(
        "--sharded",
        action="store_true",
        help="Write what the cloud's Processing job writes (shards, a manifest, the split by each record's hash), "
        "byte for byte: the same code, run here (docs/data.md).",
    )
    parser.add_argument("--workers", type=int, help="With --sharded: processes (default: one per core).")
    _chat_options(parser)
    args = parser.parse_args(argv)
    if args.sharded:
        from training.prepare import job  # noqa: PLC0415 - the sharded run's modules, only for it

        args.validation_fraction = 0.01 if args.validation_fraction is None else args.validation_fraction
        return job.main_local(args)
    args.validation_fraction = 0.05 if args.validation_fraction is None else args.validation_fraction
    args.block_tokens = 4096 if args.block_tokens is None else args.block_tokens
    if args.init_from:
        return _main_chat(args)
    try:
        meta = prepare(
            args.inputs,
            args.output,
            args.tokenizer,
            args.validation_fraction,
            args.block_tokens,
            args.text_field,
        )
    except PrepareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    splits = ", ".join(f"{name} {split['tokens']} tokens" for name, split in meta["splits"].items())
    print(
        f"prepared {meta['documents']} documents into {args.output}: {splits}; tokenizer {meta['tokenizer']['name']}, "
        f"vocab_size {meta['vocab_size']}, token_dtype {meta['token_dtype']}"
    )
    print(
        f"train with: --dataset channel --data_dir {args.output} --vocab_size {meta['vocab_size']} "
        f"--token_dtype {meta['token_dtype']}"
    )
    return 0


def _chat_options(parser: argparse.ArgumentParser) -> None:
    chat = parser.add_argument_group("conversations (--init-from)")
    chat.add_argument(
        "--init-from",
        help="A model folder (tokenizer files with a chat template): the inputs are JSON Lines of 'messages' or "
        "'prompt'/'completion' (strings or message lists, as TRL's SFTTrainer takes them), rendered with its "
        "template; only the assistant's turns are trained. Or of preference pairs ('chosen' and 'rejected', with or "
        "without 'prompt'): the answers are trained.",
    )
    chat.add_argument("--validation-file", help="JSON Lines held out for validation (instead of a fraction).")
    chat.add_argument(
        "--max-tokens",
        type=int,
        help="Longest example kept, a pair's two sequences together (default: no limit).",
    )
    chat.add_argument(
        "--too-long",
        default="drop",
        choices=chat_prepare.TOO_LONG,
        help="An example above --max-tokens: drop it (default) or truncate it.",
    )
    chat.add_argument(
        "--template-seconds",
        type=float,
        default=chat_data.TEMPLATE_SECONDS,
        help=f"The longest one rendering of the chat template may take (default {chat_data.TEMPLATE_SECONDS:g}); "
        "a template that loops without end is stopped and named.",
    )


def _main_chat(args: argparse.Namespace) -> int:
    try:
        files = [p for p in input_files(args.inputs) if p.suffix == ".jsonl" or str(p) in args.inputs]
        if files and pairs.is_preference(files[0]):  # chosen and rejected answers: preference data
            return _main_pairs(args, files)
        meta = chat_prepare.prepare_chat(
            files,
            args.output,
            args.init_from,
            validation_fraction=args.validation_fraction,
            validation_file=args.validation_file,
            max_tokens=args.max_tokens,
            too_long=args.too_long,
            template_seconds=args.template_seconds,
        )
    except (PrepareError, chat_data.ChatDataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    counts = meta["counts"]
    splits = ", ".join(f"{name} {s['examples']} examples ({s['tokens']} tokens, {s['trained_tokens']} trained)"
                       for name, s in meta["splits"].items())  # fmt: skip
    print(
        f"prepared {counts['examples']} of {counts['read']} conversations into {args.output}: {splits}; "
        f"{counts['no_assistant_turn']} without an assistant turn to train, {counts['dropped_for_length']} dropped "
        f"and {counts['truncated']} truncated for length; longest {meta['max_example_tokens']} tokens; template "
        f"{meta['chat_template']['source']} (end of turn {', '.join(meta['chat_template']['end_of_turn'])})"
    )
    print(
        f"train with: --dataset channel --data_dir {args.output} --init_from {args.init_from} --token_dtype "
        f"{meta['token_dtype']} {chat_prepare.seq_length_advice(meta, args.init_from)}"
    )
    return 0


def _main_pairs(args: argparse.Namespace, files: list[Path]) -> int:
    """``prepare --init-from`` of preference pairs (``training.prepare.pairs``)."""
    meta = pairs.prepare_pairs(
        files,
        args.output,
        args.init_from,
        validation_fraction=args.validation_fraction,
        validation_file=args.validation_file,
        max_tokens=args.max_tokens,
        too_long=args.too_long,
    )
    for line in pairs.summary(meta, args.output, args.init_from):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
