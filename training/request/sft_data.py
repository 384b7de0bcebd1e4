"""Conversation data against the model it fine-tunes: does a prepared folder's ``metadata.json`` (written by
``training.trainer.prepare --init-from``) fit an ``init_from`` model folder? Pure Python (json, hashlib), on the
files' contents, so the trainer reads them from disk and the request check can read the same files from S3.

What must match: the chat template (its SHA-256: the data was rendered with exactly the template the model will be
asked to chat with), the tokenizer (the SHA-256 of ``tokenizer.json``), and the vocabulary (every token id of the
data below the model's ``vocab_size``). Where the model folder has a template, transformers reads it as
``chat_template.jinja`` first and ``tokenizer_config.json``'s ``chat_template`` otherwise (a string, or a list of
named templates of which ``default`` is the one ``apply_chat_template`` uses); ``model_template`` does the same.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

CHAT_KIND = "chat"
"""``metadata.json``'s ``kind`` for conversation data."""
TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")
"""Where a model folder keeps its chat template, in the order transformers looks."""
TOKENIZER_FILE = "tokenizer.json"


def sha256(data: bytes | str) -> str:
    """Hex SHA-256 of bytes, or of a string's UTF-8."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def model_template(files: Mapping[str, bytes]) -> tuple[str, str] | None:
    """The chat template a model folder's files give transformers, and the file it came from; None without one.
    ``files``: file name -> content, for the names in ``TEMPLATE_FILES`` that exist."""
    if files.get("chat_template.jinja"):
        return files["chat_template.jinja"].decode("utf-8"), "chat_template.jinja"
    raw = files.get("tokenizer_config.json")
    if raw is None:
        return None
    try:
        template = json.loads(raw).get("chat_template")
    except (ValueError, AttributeError):
        return None
    if isinstance(template, list):  # named templates: apply_chat_template uses "default"
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    return (template, "tokenizer_config.json") if isinstance(template, str) and template else None


def check_against_model(
    meta: Mapping[str, Any], files: Mapping[str, bytes], config: Mapping[str, Any] | None, where: str
) -> list[str]:
    """What does not match between conversation data's ``meta`` and a model folder (``files``: its
    ``TEMPLATE_FILES`` and ``tokenizer.json`` that exist, by name; ``config``: its config.json, or None), each a
    sentence naming ``where`` (the folder) and what to do; empty when they match or the data is not conversations."""
    if meta.get("kind") != CHAT_KIND:
        return []
    problems = []
    recorded = meta.get("chat_template") or {}
    found = model_template(files)
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
            f"{where}/{TOKENIZER_FILE} is not the tokenizer the data was made with (sha256 "
            f"{sha256(files[TOKENIZER_FILE])[:12]}... against {tokenizer[:12]}...): prepare the data again with "
            "--init-from this folder"
        )
    vocab = (config or {}).get("vocab_size")
    largest = meta.get("max_token_id")
    if vocab is not None and largest is not None and int(largest) >= int(vocab):
        problems.append(
            f"the data holds token id {largest}, but the model of {where} has vocab_size {vocab}: the data was "
            "tokenized for another model"
        )
    return problems
