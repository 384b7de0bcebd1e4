"""The chat template in a fine-tuned model's Hugging Face export, so that ``transformers`` chats with it as it was
trained: the template the conversations were rendered with (``prepare --init-from``), and generation that stops at
the template's end-of-turn token.

A run on conversation data records, in ``model.pt`` (``chat_info``): the template's text and SHA-256 and the
end-of-turn token ids, from the data folder (``prepare`` copies the model's ``tokenizer_config.json`` there and
lists the ids in ``metadata.json``). The export (``write``) then makes the folder's template that one: in
``chat_template.jinja`` when the folder has that file (transformers reads it first), else as
``tokenizer_config.json``'s ``chat_template``; and adds the end-of-turn ids to ``generation_config.json``'s
``eos_token_id`` when they are missing (a base model's generation config often stops only at end-of-text, so
``generate`` would run past every answer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.request import sft_data


def chat_info(directory: Path, meta: dict[str, Any]) -> dict[str, Any] | None:
    """What the export needs of conversation data in ``directory`` (preference pairs too: rendered the same way;
    None for other data, or when the data folder no longer holds its template)."""
    if meta.get("kind") not in sft_data.TEMPLATE_KINDS:
        return None
    recorded = meta.get("chat_template") or {}
    files = {
        name: (directory / name).read_bytes()
        for name in sft_data.TEMPLATE_FILES
        if (directory / name).is_file()
    }
    found = sft_data.model_template(files)
    if found is None or sft_data.sha256(found[0]) != recorded.get("sha256"):
        return None
    return {
        "template": found[0],
        "sha256": recorded["sha256"],
        "end_of_turn_ids": recorded.get("end_of_turn_ids") or [],
    }


def write(data: dict[str, Any] | None, out: Path) -> str | None:
    """Put the run's chat template and stop tokens into the export folder ``out`` (see the module doc); returns
    the README's paragraph, or None for a run not on conversation data."""
    chat = (data or {}).get("chat")
    if not chat:
        return None
    jinja = out / "chat_template.jinja"
    if jinja.is_file():
        jinja.write_text(chat["template"])
    else:
        config_path = out / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        config_path.write_text(json.dumps({**config, "chat_template": chat["template"]}, indent=2) + "\n")
    generation_path = out / "generation_config.json"
    generation = json.loads(generation_path.read_text()) if generation_path.is_file() else {}
    eos = generation.get("eos_token_id")
    eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
    stops = [*eos, *(i for i in chat["end_of_turn_ids"] if i not in eos)]
    generation_path.write_text(json.dumps({**generation, "eos_token_id": stops}, indent=2) + "\n")
    return (
        f"Fine-tuned on conversations rendered with this folder's chat template (sha256 {chat['sha256'][:12]}...): "
        "`tokenizer.apply_chat_template(messages, add_generation_prompt=True)` gives the prompt it was trained to "
        f"answer, and `generate` stops at its end-of-turn token (ids {stops} in `generation_config.json`)."
    )
