"""Train a tokenizer on your own text, offline: ``python -m training.prepare.tokenizer notes/ --output
tokenizer.json``.

A byte-level BPE tokenizer (GPT-2's scheme, trained by the ``tokenizers`` library: every text encodes, there is no
unknown token) with ``</s>`` as its end-of-document token, learnt from the same documents ``training.prepare``
reads (files, folders of them, JSON Lines' ``--text-field``). Nothing is downloaded, and the output file must not
exist yet. Then ``prepare ... --tokenizer tokenizer.json`` writes the token files, the trainer stores the tokenizer
with the model, and its Hugging Face export carries it: what evaluation (lm-eval) and ``AutoTokenizer`` need, which
a byte-level model (``prepare``'s default) does not have.

Its vocabulary is at most ``--vocab-size`` (256 byte tokens, ``</s>``, then merges of frequent pairs); a small text
may give fewer, which the line it prints says (train with ``--vocab_size`` at least that: ``prepare`` prints it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from training.prepare.corpus import PrepareError, documents, input_files

END_OF_DOCUMENT = "</s>"
"""One of ``prepare.EOS_CANDIDATES``: prepare ends every document with it."""
MIN_VOCAB = 257
"""The 256 byte tokens and ``</s>``."""


def train(inputs: list[str], output: str, vocab_size: int, text_field: str = "text") -> int:
    """Write the tokenizer trained on ``inputs`` to ``output`` (a new file); returns its vocabulary size."""
    if vocab_size < MIN_VOCAB:
        raise PrepareError(
            f"vocab-size: must be at least {MIN_VOCAB} (256 bytes and {END_OF_DOCUMENT}); got {vocab_size}"
        )
    out = Path(output)
    if out.exists():
        raise PrepareError(f"output: {out} already exists; choose a new file")
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise PrepareError("the 'tokenizers' package is needed (make local installs it)") from None
    files = input_files(inputs)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_DOCUMENT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts: Iterator[str] = documents(files, text_field)
    tokenizer.train_from_iterator(texts, trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    tokenizer.save(str(partial))
    partial.replace(out)
    return tokenizer.get_vocab_size(with_added_tokens=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.prepare.tokenizer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("inputs", nargs="+", help="Text or JSON Lines files, or folders of them.")
    parser.add_argument("--output", required=True, help="The tokenizer.json to write (a new file).")
    parser.add_argument(
        "--vocab-size", type=int, default=4096, help="At most this many tokens (default 4096)."
    )
    parser.add_argument(
        "--text-field", default="text", help="JSON Lines field holding the text (default text)."
    )
    args = parser.parse_args(argv)
    try:
        size = train(args.inputs, args.output, args.vocab_size, args.text_field)
    except PrepareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.output}: byte-level BPE, {size} tokens (asked at most {args.vocab_size}), end of document "
        f"{END_OF_DOCUMENT}; next: python -m training.prepare ... --tokenizer {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
