"""training.request.sft_data: conversation data's metadata against a model folder (what the request check will read
from S3, and the trainer reads at start): the template, tokenizer and vocabulary must be the model's."""

from __future__ import annotations

import json

from training.request import sft_data

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
TOKENIZER = b'{"model": "tiny"}'
META = {"kind": "chat", "chat_template": {"sha256": sft_data.sha256(TEMPLATE), "source_path": "/m/tokenizer_config.json"},
        "tokenizer": {"sha256": sft_data.sha256(TOKENIZER)}, "max_token_id": 300}  # fmt: skip


def files(
    template: str | None = TEMPLATE, tokenizer: bytes = TOKENIZER, jinja: str | None = None
) -> dict[str, bytes]:
    out = {"tokenizer.json": tokenizer}
    if template is not None:
        out["tokenizer_config.json"] = json.dumps({"chat_template": template}).encode()
    if jinja is not None:
        out["chat_template.jinja"] = jinja.encode()
    return out


def test_the_model_the_data_was_prepared_with_matches():
    assert sft_data.check_against_model(META, files(), {"vocab_size": 320}, "s3://b/model") == []
    named = files(template=None) | {"tokenizer_config.json": json.dumps({"chat_template": [
        {"name": "tool_use", "template": "x"}, {"name": "default", "template": TEMPLATE}]}).encode()}  # fmt: skip
    assert sft_data.check_against_model(META, named, None, "m") == []
    assert sft_data.check_against_model({"kind": "tokens"}, {}, None, "m") == []  # not conversations


def test_another_template_tokenizer_or_vocabulary_is_named():
    problems = sft_data.check_against_model(META, files(jinja="other"), {"vocab_size": 256}, "s3://b/model")
    assert len(problems) == 2
    assert problems[0].startswith("the chat template of s3://b/model (chat_template.jinja, sha256 ")
    assert "prepare the data again with --init-from this folder" in problems[0]
    assert problems[1] == (
        "the data holds token id 300, but the model of s3://b/model has vocab_size 256: the data was tokenized for "
        "another model"
    )
    (missing,) = sft_data.check_against_model(META, files(template=None), None, "m")
    assert missing.startswith("m has no chat template (chat_template.jinja or tokenizer_config.json)")
    (tokenizer,) = sft_data.check_against_model(META, files(tokenizer=b"{}"), None, "m")
    assert tokenizer.startswith("m/tokenizer.json is not the tokenizer the data was made with")


def test_a_template_that_is_not_utf8_is_named_not_raised():
    (problem,) = sft_data.check_against_model(
        META, {**files(), "chat_template.jinja": b"{{ x }}\xff\xfe"}, None, "s3://b/model/"
    )
    assert problem.startswith("s3://b/model/chat_template.jinja is not UTF-8 text (byte 7: ")
    assert problem.endswith("transformers reads a template as UTF-8: save it as UTF-8")


def test_a_vocab_size_that_is_not_an_integer_leaves_the_vocabulary_to_the_config_check():
    """The config.json's own check (``hf_config.architecture``, the init_from read) names such a vocab_size; the
    comparison with the data's largest token id skips it rather than raising."""
    for vocab in ("abc", float("inf"), 1e400, None, True, -3, 2.5):
        assert sft_data.check_against_model(META, files(), {"vocab_size": vocab}, "m") == []


def test_the_tokenizer_mismatch_says_whose_hash_is_whose_and_joins_the_path_once():
    (problem,) = sft_data.check_against_model(META, files(tokenizer=b"{}"), None, "s3://b/data/model/")
    found, recorded = sft_data.sha256(b"{}")[:12], sft_data.sha256(TOKENIZER)[:12]
    assert problem == (
        f"s3://b/data/model/tokenizer.json is not the tokenizer the data was made with (the folder's has sha256 "
        f"{found}..., the data's metadata.json records {recorded}...): prepare the data again with --init-from "
        "this folder"
    )
