r"""Conversations -> ids and loss mask with the published chat templates of Qwen 3 (its thinking block), Mistral
7B Instruct v0.3 (``[INST]``) and Gemma 3 (``<start_of_turn>``), as ``test_chat_data`` does for Llama 3.1 and Qwen
2.5 (ChatML): the ids are ``apply_chat_template``'s, the trained tokens exactly what the model writes for each
answer and its end-of-turn token, the same as transformers' own assistant mask on a copy of the template marked
with ``{% generation %}``; ``prepare`` writes them; what a template cannot give is refused in one line.

Templates (``chat_templates/``), the ``chat_template`` of each model's ``tokenizer_config.json`` as TRL keeps them
(``trl/chat_templates/``, "original templates, used for identity comparison"): ``qwen3.jinja`` (Qwen/Qwen3-*),
``gemma3.jinja`` ("as shipped by google/gemma-3-* checkpoints"), both at huggingface/trl 909d0c16;
``mistral_v0_3.jinja`` (mistralai/Mistral-7B-Instruct-v0.3's v3-tokenizer template with ``[AVAILABLE_TOOLS]``, TRL's
``mistral.jinja`` at 4a56de4b; the format of mistralai/cookbook's ``concept-deep-dive/tokenization/templates.md``,
Tokenizer V3: ``<s>[INST] Hello[/INST] Fine</s>``); ``qwen3_training_trl.jinja``, TRL's prefix-preserving training
variant of Qwen 3's (the thinking block on every assistant turn).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer
from transformers import AutoTokenizer

from tests.prepare.test_chat_data import POOL, write
from tests.training.chat_models import TEMPLATES, tokenizer_json
from training.prepare import chat, chat_data

FAMILIES = {
    "qwen3": {
        "template": "qwen3.jinja",
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "plain": ["<think>", "</think>"],  # added tokens of Qwen 3's vocabulary that are not special
        "config": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        "end_of_turn": "<|im_end|>",
    },
    "mistral": {
        "template": "mistral_v0_3.jinja",
        "special": ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                    "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
        "plain": [],
        "config": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        "end_of_turn": "</s>",
    },
    "gemma3": {
        "template": "gemma3.jinja",
        "special": ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        "plain": [],
        "config": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
        "end_of_turn": "<end_of_turn>",
    },
}  # fmt: skip

QWEN3_TURN = r"""        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
"""
QWEN3_MARKED = r"""        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\n' }}{% generation %}{{- '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') + '<|im_end|>' }}{% endgeneration %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' }}{% generation %}{{- content + '<|im_end|>' }}{% endgeneration %}
        {%- endif %}
"""
QWEN3_END = "        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}"
MISTRAL_TURN = '{{- " " + message["content"]|trim + eos_token}}'
GEMMA_CONTENT = "{{ message['content'] | trim }}"
GEMMA_END = "{{ '<end_of_turn>\n' }}"


def template(family: str, name: str | None = None) -> str:
    return (TEMPLATES / (name or FAMILIES[family]["template"])).read_text()


def marked(family: str) -> str:
    """The family's template with what the model writes for an answer (and its end-of-turn token) inside
    ``{% generation %}``: the role header the template writes before it and the newline after it stay outside."""
    text = template(family)
    if family == "qwen3":
        assert QWEN3_TURN in text and QWEN3_END in text
        return text.replace(QWEN3_TURN, QWEN3_MARKED).replace(QWEN3_END, QWEN3_END.replace("<|im_end|>", ""))
    if family == "mistral":
        assert MISTRAL_TURN in text
        return text.replace(MISTRAL_TURN, "{% generation %}" + MISTRAL_TURN + "{% endgeneration %}")
    assert GEMMA_CONTENT in text and GEMMA_END in text
    branch = (
        "{% if role == 'model' %}{% generation %}" + GEMMA_CONTENT + "<end_of_turn>{% endgeneration %}"
        "{% else %}" + GEMMA_CONTENT + "<end_of_turn>{% endif %}"
    )
    return text.replace(GEMMA_CONTENT, branch).replace(GEMMA_END, "{{ '\n' }}")


def model_folder(folder: Path, family: str, template_text: str | None = None) -> Path:
    """A model folder of ``family``: a byte-level tokenizer with the family's special (and other added) tokens as
    single tokens, tokenizer_config.json with the published template, generation_config.json."""
    spec = FAMILIES[family]
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_str(tokenizer_json(spec["special"]))
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec["plain"]])
    (folder / "tokenizer.json").write_text(tokenizer.to_str())
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
              "clean_up_tokenization_spaces": False, **spec["config"],
              "chat_template": template(family) if template_text is None else template_text}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    eot = tokenizer.token_to_id(spec["end_of_turn"])
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot]}))
    return folder


REASONED = ["<think>\nfirst 2, then 2\n</think>\n\n4", "<think>\n</think>\n\nno", "<think>a</think>b"]


def conversations(family: str, count: int, seed: int = 0) -> list[list[dict]]:
    """Random conversations the family's template renders prefix by prefix: Qwen 3's moves its thinking block
    to the last answer, so one answer each (some with reasoning); Mistral's puts the system prompt into the last
    user turn, so none."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        messages = (
            [{"role": "system", "content": rng.choice(POOL)}]
            if family != "mistral" and rng.random() < 0.5
            else []
        )
        for _ in range(1 if family == "qwen3" else rng.randint(1, 3)):
            answer = rng.choice(POOL + (REASONED if family == "qwen3" else []))
            messages += [
                {"role": "user", "content": rng.choice(POOL) or "hi"},
                {"role": "assistant", "content": answer},
            ]
        out.append(messages)
    return out


def written(family: str, answer: str) -> str:
    """What the model writes for ``answer`` under the family's published template (its end-of-turn included)."""
    if family == "mistral":
        return " " + answer.strip() + "</s>"
    if family == "gemma3":
        return answer.strip() + "<end_of_turn>"
    reasoning, content = "", answer
    if "<think>" in answer and "</think>" in answer:
        reasoning = answer.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        content = answer.split("</think>")[-1].lstrip("\n")
    return "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n") + "<|im_end|>"


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    folder = model_folder(tmp_path_factory.mktemp(request.param) / "model", request.param)
    return request.param, folder, AutoTokenizer.from_pretrained(folder)


def _spans(tokenizer, ids: list[int], mask: list[int]) -> list[str]:
    spans, current = [], []
    for token, trained in zip([*ids, -1], [*mask, 0], strict=True):
        if trained:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    return spans


def test_ids_are_apply_chat_templates_and_the_mask_is_transformers_own_on_the_marked_template(family):
    name, folder, tokenizer = family
    renderer = chat_data.Renderer(*chat_data.load_tokenizer(str(folder)))
    agreed = total = 0
    for messages in conversations(name, 60):
        example = renderer.render(*chat_data.messages_of({"messages": messages}, "t:1"), "t:1")
        reference = tokenizer.apply_chat_template(messages, chat_template=marked(name), tokenize=True,
                                                  return_dict=True, return_assistant_tokens_mask=True)  # fmt: skip
        assert example.ids.tolist() == tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=False
        )
        assert example.ids.tolist() == reference["input_ids"]
        mask = example.mask.tolist()
        agreed += sum(int(a == b) for a, b in zip(mask, reference["assistant_masks"], strict=True))
        total += len(mask)
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        assert _spans(tokenizer, example.ids.tolist(), mask) == [written(name, a) for a in answers]
    assert agreed == total
    print(f"{name}: mask agrees with transformers' on {agreed}/{total} tokens")


@pytest.mark.parametrize(
    ("name", "messages", "fragment"),
    [
        ("qwen3", [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"},
                   {"role": "user", "content": "3"}, {"role": "assistant", "content": "4"}],
         "renders assistant turn 1 differently once later turns follow"),
        ("mistral", [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1"},
                     {"role": "assistant", "content": "2"}],
         "renders assistant turn 2 differently once later turns follow"),
        ("gemma3", [{"role": "user", "content": "1"}, {"role": "user", "content": "2"},
                    {"role": "assistant", "content": "3"}], "roles must alternate"),
    ],
)  # fmt: skip
def test_what_a_published_template_cannot_give_is_refused_in_one_line(name, messages, fragment, tmp_path):
    folder = model_folder(tmp_path / "model", name)
    data = write(tmp_path / "chat.jsonl", [{"messages": messages}])
    with pytest.raises(chat_data.ChatDataError) as caught:
        chat.prepare_chat([data], str(tmp_path / "out"), str(folder), validation_fraction=0)
    assert (
        fragment in str(caught.value) and f"{data}:1" in str(caught.value) and "\n" not in str(caught.value)
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_qwen3_earlier_answers_train_with_the_prefix_preserving_template_or_as_context(tmp_path):
    """Qwen 3's published template drops the thinking block of earlier answers: with TRL's training variant every
    answer is trained with its block; with the published one an earlier answer marked ``"train": false`` is
    context, rendered as the published template renders history."""
    messages = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "<think>x</think>2"},
                {"role": "user", "content": "3"}, {"role": "assistant", "content": "4"}]  # fmt: skip
    folder = model_folder(tmp_path / "trl", "qwen3", template("qwen3", "qwen3_training_trl.jinja"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    renderer = chat_data.Renderer(*chat_data.load_tokenizer(str(folder)))
    example = renderer.render(*chat_data.messages_of({"messages": messages}, "t:1"), "t:1")
    assert _spans(tokenizer, example.ids.tolist(), example.mask.tolist()) == [
        written("qwen3", "<think>x</think>2"),
        written("qwen3", "4"),
    ]
    folder = model_folder(tmp_path / "published", "qwen3")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    renderer = chat_data.Renderer(*chat_data.load_tokenizer(str(folder)))
    context = [dict(m) for m in messages]
    context[1]["train"] = False
    example = renderer.render(*chat_data.messages_of({"messages": context}, "t:1"), "t:1")
    assert example.ids.tolist() == tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert _spans(tokenizer, example.ids.tolist(), example.mask.tolist()) == [written("qwen3", "4")]
    assert "<|im_start|>assistant\n2<|im_end|>" in tokenizer.decode(example.ids.tolist())  # history: no block


def test_prepare_writes_each_familys_conversations_and_names_its_end_of_turn(family, tmp_path):
    name, folder, _ = family
    data = write(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations(name, 8, seed=3)])
    meta = chat.prepare_chat([data], str(tmp_path / "out"), str(folder), validation_fraction=0)
    assert meta["chat_template"]["end_of_turn"] == [FAMILIES[name]["end_of_turn"]]
    assert meta["examples"] == 8
