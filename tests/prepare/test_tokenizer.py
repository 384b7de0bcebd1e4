"""``python -m training.prepare.tokenizer``: a byte-level BPE tokenizer from your own text, offline, that
``prepare`` uses and ``transformers`` loads, ending documents with ``</s>``; bad options refused, nothing written
over."""

from __future__ import annotations

import json

from tokenizers import Tokenizer

from training.prepare import corpus
from training.prepare import tokenizer as train_tokenizer

TEXT = (
    "Question: what colour is a ripe banana? Answer: yellow\nQuestion: what colour is the sky? Answer: blue\n"
)


def test_a_tokenizer_from_your_text_is_what_prepare_and_transformers_read(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text(TEXT * 20)
    out = tmp_path / "tok" / "tokenizer.json"
    assert (
        train_tokenizer.main([str(tmp_path / "notes.txt"), "--vocab-size", "300", "--output", str(out)]) == 0
    )
    line = capsys.readouterr().out
    tokenizer = Tokenizer.from_file(str(out))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    assert 257 < size <= 300 and f"{size} tokens (asked at most 300)" in line
    ids = tokenizer.encode("Question: what colour is a lime? Answer: green ü").ids
    assert tokenizer.decode(ids) == "Question: what colour is a lime? Answer: green ü"  # any text, no unknown
    assert len(ids) < len("Question: what colour is a lime?")  # merges learnt from the text
    meta = corpus.prepare(
        [str(tmp_path / "notes.txt")], str(tmp_path / "data"), tokenizer=str(out), validation_fraction=0
    )
    assert meta["vocab_size"] == size and meta["tokenizer"]["eos_id"] == tokenizer.token_to_id("</s>")
    from transformers import PreTrainedTokenizerFast

    loaded = PreTrainedTokenizerFast(tokenizer_file=str(out), eos_token="</s>")
    assert loaded.decode(loaded("the sky? Answer: blue").input_ids) == "the sky? Answer: blue"


def test_bad_options_are_refused_and_nothing_is_written_over(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text(TEXT)
    existing = tmp_path / "tokenizer.json"
    existing.write_text(json.dumps({"mine": True}))
    assert train_tokenizer.main([str(tmp_path / "notes.txt"), "--output", str(existing)]) == 2
    assert "already exists" in capsys.readouterr().err and json.loads(existing.read_text()) == {"mine": True}
    new = tmp_path / "new.json"
    assert (
        train_tokenizer.main([str(tmp_path / "notes.txt"), "--vocab-size", "100", "--output", str(new)]) == 2
    )
    assert "vocab-size: must be at least 257" in capsys.readouterr().err
    assert train_tokenizer.main([str(tmp_path / "missing"), "--output", str(new)]) == 2
    assert "input: " in capsys.readouterr().err and not new.exists()
