"""Model folders with the real chat templates of Llama 3.1 and Qwen 2.5 and a tiny tokenizer, for the conversation
tests: no weights are needed to render and tokenize; ``with_weights`` adds a tiny random ``LlamaForCausalLM``.

The templates in ``chat_templates/`` are the ``chat_template`` strings of ``tokenizer_config.json`` as published with
meta-llama/Llama-3.1-8B-Instruct and Qwen/Qwen2.5-7B-Instruct (copies kept by TRL, trl/chat_templates/llama3_1.jinja
and qwen2_5.jinja, as their "original templates"). The tokenizer is byte-level (``tokenizers``' ByteLevel: every
UTF-8 byte one token, ids 0-255, no merges) plus each model's special tokens as added tokens, so the templates'
control tokens are single tokens as in the real vocabularies; the ids differ from the real ones, the structure does
not."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

TEMPLATES = Path(__file__).parent / "chat_templates"
FAMILIES = {
    "llama3.1": {
        "template": "llama3_1.jinja",
        "special": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"],
        "config": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        "end_of_turn": "<|eot_id|>",
    },
    "qwen2.5": {
        "template": "qwen2_5.jinja",
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "config": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        "end_of_turn": "<|im_end|>",
    },
}  # fmt: skip


def template(family: str) -> str:
    return (TEMPLATES / FAMILIES[family]["template"]).read_text()


def tokenizer_json(special: list[str]) -> str:
    """A byte-level tokenizer: ids 0-255 are ByteLevel's byte characters, then ``special`` as special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = [chr(c) for c in range(256)]
    mapping = {c: i for i, c in enumerate(sorted(alphabet, key=lambda ch: _byte_of(ch, byte_chars)))}
    tokenizer = Tokenizer(models.BPE(vocab=mapping, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(special)
    return tokenizer.to_str()


def compact_tokenizer_json(
    special: list[str], corpus: list[str], merges: int = 200, *, newline_runs: bool = False
) -> str:
    """A byte-level BPE tokenizer whose ``merges`` merges are learnt from ``corpus`` (the template's own text, so
    its headers and preamble take a few tokens each, as in a real vocabulary), digits kept one per token (as
    Llama 3's and Qwen 2.5's pre-tokenizers split numbers), then ``special`` as special tokens.

    ``newline_runs``: a run of newlines is one piece whatever follows it, as Llama 3's and Qwen 2.5's pattern
    (``\\s*[\\r\\n]+``) keeps it. Without it GPT-2's pattern splits ``"\\n\\nThe"`` as ``"\\n" "\\n" "The"`` but
    ``"\\n\\n418"`` as ``"\\n\\n" ...``: a chat template's generation prompt (ending ``"\\n\\n"``) is then not the
    token prefix of a conversation whose answer starts with a letter."""
    tokenizer = Tokenizer(models.BPE())
    pieces = [pre_tokenizers.Split(Regex(r"\s*[\r\n]+"), behavior="isolated")] if newline_runs else []
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *pieces,
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + merges, initial_alphabet=alphabet, show_progress=False
    )
    plain = []
    for text in corpus:
        for token in special:
            text = text.replace(token, "\n")
        plain.append(text)
    tokenizer.train_from_iterator(plain, trainer)
    tokenizer.add_special_tokens(special)
    return tokenizer.to_str()


def _byte_of(char: str, byte_chars: list[str]) -> int:
    """The byte ByteLevel maps to ``char`` (GPT-2's bytes_to_unicode, inverted)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table[char]


def model_folder(
    folder: Path,
    family: str,
    *,
    with_weights: bool = False,
    template_text: str | None = None,
    layers: int = 2,
    hidden: int = 64,
    seed: int = 0,
    corpus: list[str] | None = None,
    newline_runs: bool = False,
) -> Path:
    """A model folder of ``family`` (``FAMILIES``): tokenizer.json (byte-level; with ``corpus``, BPE merges learnt
    from it), tokenizer_config.json with the real chat template (or ``template_text``; ``""``: none),
    generation_config.json; ``with_weights``: a tiny Llama too; ``newline_runs``: see ``compact_tokenizer_json``."""
    spec = FAMILIES[family]
    folder.mkdir(parents=True, exist_ok=True)
    text_json = (
        compact_tokenizer_json(spec["special"], corpus, newline_runs=newline_runs)
        if corpus
        else tokenizer_json(spec["special"])
    )
    (folder / "tokenizer.json").write_text(text_json)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
              "clean_up_tokenization_spaces": False, **spec["config"]}  # fmt: skip
    text = template(family) if template_text is None else template_text
    if text:
        config["chat_template"] = text
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    added = {t["content"]: t["id"] for t in json.loads(text_json)["added_tokens"]}
    vocab, eot = max(added.values()) + 1, added[spec["end_of_turn"]]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot]}))
    if with_weights:
        _tiny_llama(folder, vocab, eot, layers, hidden, seed)
    return folder


def _tiny_llama(folder: Path, vocab: int, eot: int, layers: int, hidden: int, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=-(-vocab // 8) * 8, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=False, eos_token_id=eot, bos_token_id=None)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
