"""Conversations -> ids and loss mask (training.prepare.chat_data) with the real Llama 3.1 and Qwen 2.5 templates:
the ids are apply_chat_template's, the trained tokens exactly the answers and their end-of-turn token, the same as
transformers' own assistant mask on a copy of each template marked with {% generation %}; every refusal named."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.training.chat_models import FAMILIES, model_folder, template
from training.prepare import chat, chat_data, corpus

POOL = [
    "17",
    "What is 2 + 2?",
    "  spaced out  ",
    "line one\nline two",
    "café 日本 ✓",
    "",
    "Hello!\n",
    "x" * 40,
]
LLAMA_TURN = (
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' }}\n"
)
QWEN_TURN = "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"


def marked(family: str) -> str:
    """The family's template with the assistant's answer and end-of-turn token inside {% generation %}."""
    text = template(family)
    if family == "llama3.1":
        branch = ("        {%- if message['role'] == 'assistant' %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
                  "{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
                  "{%- else %}\n" + LLAMA_TURN + "        {%- endif %}\n")  # fmt: skip
        assert LLAMA_TURN in text
        return text.replace(LLAMA_TURN, branch)
    branch = ("        {%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}{% generation %}"
              "{{- message.content + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}{%- else %}\n" + QWEN_TURN +
              "        {%- endif %}\n")  # fmt: skip
    assert QWEN_TURN in text
    return text.replace(QWEN_TURN, branch)


def conversations(count: int, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        messages = [{"role": "system", "content": rng.choice(POOL)}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 3)):
            messages += [
                {"role": "user", "content": rng.choice(POOL) or "hi"},
                {"role": "assistant", "content": rng.choice(POOL)},
            ]
        out.append(messages)
    return out


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    folder = model_folder(tmp_path_factory.mktemp(request.param) / "model", request.param)
    return request.param, folder, AutoTokenizer.from_pretrained(folder)


def test_ids_are_apply_chat_templates_and_the_mask_is_transformers_own_on_the_marked_template(family):
    name, folder, tokenizer = family
    renderer = chat_data.Renderer(*chat_data.load_tokenizer(str(folder)))
    agreed = total = 0
    for messages in conversations(60):
        checked, _ = chat_data.messages_of({"messages": messages}, "t:1")
        example = renderer.render(checked, "messages", "t:1")
        reference = tokenizer.apply_chat_template(messages, chat_template=marked(name), tokenize=True,
                                                  return_dict=True, return_assistant_tokens_mask=True)  # fmt: skip
        assert example.ids.tolist() == tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=False
        )
        assert example.ids.tolist() == reference["input_ids"]
        agreed += sum(
            int(a == b) for a, b in zip(example.mask.tolist(), reference["assistant_masks"], strict=True)
        )
        total += len(example.ids)
        # the trained spans, decoded, are exactly each answer (Llama trims it) and the end-of-turn token
        spans, current = [], []
        for token, trained in zip([*example.ids.tolist(), -1], [*example.mask.tolist(), 0], strict=True):
            if trained:
                current.append(token)
            elif current:
                spans.append(tokenizer.decode(current))
                current = []
        eot = FAMILIES[name]["end_of_turn"]
        answers = [
            m["content"].strip() if name == "llama3.1" else m["content"]
            for m in messages
            if m["role"] == "assistant"
        ]
        assert spans == [answer + eot for answer in answers]
    assert agreed == total  # every token of 60 conversations
    print(f"{name}: mask agrees with transformers' on {agreed}/{total} tokens")


def test_a_turn_marked_train_false_and_a_conversation_without_an_answer_to_train(family):
    _, folder, tokenizer = family
    renderer = chat_data.Renderer(*chat_data.load_tokenizer(str(folder)))
    record = {"messages": [{"role": "user", "content": "1"}, {"role": "assistant", "content": "bad", "train": False},
                           {"role": "user", "content": "2"}, {"role": "assistant", "content": "3"}]}  # fmt: skip
    example = renderer.render(*chat_data.messages_of(record, "t:1"), "t:1")
    trained = tokenizer.decode([t for t, m in zip(example.ids, example.mask, strict=True) if m])
    assert trained.startswith("3") and "bad" not in trained
    record = {
        "messages": [{"role": "user", "content": "1"}, {"role": "assistant", "content": "x", "train": False}]
    }
    assert renderer.render(*chat_data.messages_of(record, "t:2"), "t:2") is None  # counted, not refused


def write(path: Path, lines: list) -> Path:
    path.write_bytes(
        b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)
    )
    return path


GOOD = {"prompt": "1", "completion": "2"}
ANSWERS_ONLY = (
    "{% for m in messages %}{% if m.role == 'assistant' %}{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
)
FORGETFUL = (
    "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}<|im_start|>assistant\n<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SILENT = "{% for m in messages %}{% if m.role != 'assistant' %}<|im_start|>{{ m.content }}<|im_end|>{% endif %}{% endfor %}"
REFUSED = {
    "not UTF-8": ("qwen2.5", None, [GOOD, b'{"prompt": "\xff", "completion": "2"}'], 2, "not UTF-8"),
    "not JSON": ("qwen2.5", None, [GOOD, GOOD, b'{"prompt": "1",'], 3, "not valid JSON"),
    "unknown role": ("qwen2.5", None, [{"messages": [{"role": "tool", "content": "x"}]}], 1, "has role 'tool'; allowed: system, user, assistant"),
    "special token in content": ("llama3.1", None, [{"prompt": "a<|eot_id|>b", "completion": "2"}], 1, "holds the tokenizer's special token '<|eot_id|>'"),
    "no trained token": ("qwen2.5", SILENT, [GOOD], 1, "assistant turn 1 yields no trained token"),
    "every token trained": ("llama3.1", ANSWERS_ONLY, [GOOD], 1, "every token of this example would be trained"),
    "opens with the assistant": ("llama3.1", None, [{"messages": [{"role": "assistant", "content": "hi"}]}], 1, "opens with an assistant turn"),
    "turn rendered differently": ("qwen2.5", FORGETFUL, [GOOD, {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}], 2, "renders assistant turn 1 differently once later turns follow"),
    "other shape": ("qwen2.5", None, [{"text": "x"}], 1, "an example is a JSON object with 'messages'"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_each_refusal_names_the_file_and_line_and_nothing_is_written(case, tmp_path):
    family, template_text, lines, line, reason = REFUSED[case]
    folder = model_folder(tmp_path / "model", family, template_text=template_text)
    data = write(tmp_path / "chats.jsonl", lines)
    with pytest.raises(chat_data.ChatDataError) as refused:
        chat.prepare_chat([data], str(tmp_path / "out"), str(folder), validation_fraction=0)
    assert str(refused.value).startswith(f"{data}:{line}: ") and reason in str(refused.value), refused.value
    assert len(str(refused.value).splitlines()) == 1
    assert not (tmp_path / "out").exists()  # the folder it would have created is not left behind either


def test_a_refusal_removes_the_folders_it_made_and_keeps_a_folder_the_user_had(tmp_path):
    """chat.py's docstring: a refusal leaves nothing behind; the folders a run created go with it, a folder that was
    there before (with the user's own files) stays as it was."""
    folder = model_folder(tmp_path / "model", "qwen2.5")
    data = write(tmp_path / "chats.jsonl", [GOOD, b'{"prompt": "1",'])
    with pytest.raises(chat_data.ChatDataError, match="not valid JSON"):
        chat.prepare_chat([data], str(tmp_path / "a" / "b" / "out"), str(folder), validation_fraction=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.jsonl", "model"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(chat_data.ChatDataError, match="not valid JSON"):
        chat.prepare_chat([data], str(mine / "out"), str(folder), validation_fraction=0)
    with pytest.raises(chat_data.ChatDataError, match="not valid JSON"):
        chat.prepare_chat([data], str(mine), str(folder), validation_fraction=0)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "keep me"


def test_a_run_stopped_after_its_token_files_were_named_takes_them_back(tmp_path, monkeypatch):
    """All or nothing: stopped while copying the tokenizer (the splits already have their names), nothing stays."""
    folder = model_folder(tmp_path / "model", "qwen2.5")
    data = write(tmp_path / "chats.jsonl", [GOOD] * 4)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(chat, "_copy_tokenizer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        chat.prepare_chat([data], str(tmp_path / "out"), str(folder), validation_fraction=0)
    assert not (tmp_path / "out").exists()


def test_a_model_folder_without_a_template_is_refused_before_anything_is_written(tmp_path):
    folder = model_folder(tmp_path / "model", "qwen2.5", template_text="")
    data = write(tmp_path / "chats.jsonl", [GOOD])
    with pytest.raises(chat_data.ChatDataError, match=f"init-from: {folder} has no chat template"):
        chat.prepare_chat([data], str(tmp_path / "out"), str(folder), validation_fraction=0)
    assert not (tmp_path / "out").exists()


def test_metadata_records_each_files_sha256_and_each_splits_trained_tokens_and_examples(tmp_path):
    """/work/coord/chat-metadata.md: what the trainer verifies before training (issue 53 item 12)."""
    folder = model_folder(tmp_path / "model", "llama3.1")
    lines = [{"messages": m} for m in conversations(12, seed=3)]
    data = write(tmp_path / "chats.jsonl", lines)
    meta = chat.prepare_chat([data], str(tmp_path / "out"), str(folder), validation_fraction=0.25)
    out = tmp_path / "out"
    assert set(meta["splits"]) == {"train", "validation"}
    for split, entry in meta["splits"].items():
        names = [*entry["files"], *entry["masks"], *entry["documents"]]
        assert names == [f"{split}.bin", f"{split}.mask", f"{split}.docs"]
        assert entry["sha256"] == {
            name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in names
        }
        mask = np.fromfile(out / f"{split}.mask", dtype=np.uint8)
        offsets = np.fromfile(out / f"{split}.docs", dtype=np.int64)
        assert entry["trained_tokens"] == int(mask.sum()) > 0
        assert entry["examples"] == len(offsets) - 1
        assert entry["tokens"] == len(mask) == int(offsets[-1])
    assert sum(entry["examples"] for entry in meta["splits"].values()) == 12


ENDLESS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}{% endfor %}{% endfor %}"
    "{% endfor %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)


def test_a_template_that_loops_without_end_is_stopped_and_named_with_the_example(tmp_path, capsys):
    """Issue 53 item 9: a nested-loop template ran until killed; now each rendering is bounded (--template-seconds)
    and the refusal names the template's file and the example's file and line."""
    folder = model_folder(tmp_path / "model", "qwen2.5", template_text=ENDLESS)
    data = write(tmp_path / "chats.jsonl", [GOOD])
    argv = [
        str(data),
        "--init-from",
        str(folder),
        "--output",
        str(tmp_path / "out"),
        "--validation-fraction",
        "0",
    ]
    assert corpus.main([*argv, "--template-seconds", "0.3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"error: {data}:1: the chat template of {folder / 'tokenizer_config.json'} did not finish"
    )
    assert "within 0.3 s (--template-seconds)" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
    with pytest.raises(chat_data.ChatDataError, match="template-seconds: must be above 0"):
        chat.prepare_chat([data], str(tmp_path / "out"), str(folder), template_seconds=0)


def straddling_tokenizer(folder: Path) -> None:
    """Replace the folder's byte-level tokenizer with one whose merges cross the edge of an answer: no regex split,
    and merges "\\n" + "\\n" and "\\n\\n" + "H", so the header's newline and the answer's first characters can be one
    token (as a real vocabulary's merges of blank lines are: Qwen 2.5's "\\n\\n" is one token)."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    newline = next(char for char, index in vocab.items() if index == ord("\n"))
    base = len(vocab)
    vocab.update({newline * 2: base, newline * 2 + "H": base + 1})
    spec["model"]["merges"] = [[newline, newline], [newline * 2, "H"]]
    spec["pre_tokenizer"]["use_regex"] = False
    for shift, token in enumerate(spec["added_tokens"]):
        token["id"] = base + 2 + shift
    (folder / "tokenizer.json").write_text(json.dumps(spec))


STRADDLING = {
    # Llama trims the answer; its header ends in a blank line that merges with the answer's "H"
    "llama3.1": ["Hi there", "  Hello"],
    # Qwen's header ends in one newline; an answer starting with blank lines merges with it (issue 53 item 18)
    "qwen2.5": ["\nHi there", "\n\nHello", "\n\n\nHey"],
}


@pytest.mark.parametrize("name", list(STRADDLING))
def test_a_token_straddling_the_start_of_an_answer_is_trained_as_transformers_generation_mask_trains_it(
    name, tmp_path
):
    """Where a token holds the end of the template's header and the start of the answer, transformers' own
    {% generation %} mask trains it (it marks from the token holding the answer's first character): so does
    prepare, token for token."""
    folder = model_folder(tmp_path / "model", name)
    straddling_tokenizer(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    renderer = chat_data.Renderer(*chat_data.load_tokenizer(str(folder)))
    straddled = 0
    for answer in STRADDLING[name]:
        messages = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": answer},
                    {"role": "user", "content": "and 3 + 3?"}, {"role": "assistant", "content": answer}]  # fmt: skip
        example = renderer.render(*chat_data.messages_of({"messages": messages}, "t:1"), "t:1")
        reference = tokenizer.apply_chat_template(messages, chat_template=marked(name), tokenize=True,
                                                  return_dict=True, return_assistant_tokens_mask=True)  # fmt: skip
        assert example.ids.tolist() == reference["input_ids"]
        assert example.mask.tolist() == reference["assistant_masks"]
        # each trained run begins with a token that begins before the answer: the header's end and the answer's start
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        shown = (answer.strip() if name == "llama3.1" else answer) + FAMILIES[name]["end_of_turn"]
        runs = [k for k, m in enumerate(example.mask.tolist()) if m and (k == 0 or not example.mask[k - 1])]
        assert len(runs) == 2
        for k in runs:
            begin, end = offsets[k]
            assert any(text[p:].startswith(shown) for p in range(begin + 1, end)), (answer, text[begin:end])
        straddled += len(runs)
    assert straddled == 2 * len(STRADDLING[name])


SYSTEM, USER = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "17"}
ANSWER = {"role": "assistant", "content": "18"}
TRL_FORMS = {
    # TRL's conversational prompt-completion: the prompt is context (its assistant turns too), the completion trained
    "conversational prompt-completion": (
        {"prompt": [SYSTEM, USER, {"role": "assistant", "content": "x"}, USER], "completion": [ANSWER]},
        [SYSTEM, USER, {"role": "assistant", "content": "x", "train": False}, USER, ANSWER],
    ),
    # TRL's conversational language modeling, with the from/value keys its SFTTrainer converts (maybe_convert_to_chatml)
    "conversations (from/value)": (
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "user", "value": "17"},
                           {"from": "assistant", "value": "18"}]},
        [SYSTEM, USER, ANSWER],
    ),
}  # fmt: skip


@pytest.mark.parametrize("form", list(TRL_FORMS))
def test_trls_conversational_forms_render_as_the_same_conversation_in_messages(form, family):
    """Issue 53 item 19: TRL's conversational prompt-completion form (message lists) is accepted: its prompt is the
    context, every turn of its completion is trained, as TRL's completion_only_loss does."""
    _, folder, _ = family
    renderer = chat_data.Renderer(*chat_data.load_tokenizer(str(folder)))
    record, same = TRL_FORMS[form]
    example = renderer.render(*chat_data.messages_of(record, "t:1"), "t:1")
    reference = renderer.render(*chat_data.messages_of({"messages": same}, "t:1"), "t:1")
    assert example.ids.tolist() == reference.ids.tolist() and example.mask.tolist() == reference.mask.tolist()
    assert example.shape == ("conversational_prompt_completion" if "prompt" in record else "conversations")


NOT_SFT = {
    "prompt-only": ({"prompt": [USER]}, "TRL's prompt-only type: a prompt with no completion has nothing to train"),
    "preference": ({"prompt": [USER], "chosen": [ANSWER], "rejected": [ANSWER]}, "TRL's preference type"),
    "implicit preference": ({"chosen": [USER, ANSWER], "rejected": [USER, ANSWER]}, "TRL's preference type"),
    "unpaired preference": ({"prompt": [USER], "completion": [ANSWER], "label": False}, "TRL's unpaired preference type"),
    "stepwise": ({"prompt": "9.8 or 9.11?", "completions": ["a", "b"], "labels": [True, False]}, "TRL's stepwise supervision type"),
    "standard language modeling": ({"text": "The sky is blue."}, "plain text (TRL's language modeling type): prepare it without --init-from"),
    "mixed prompt-completion": ({"prompt": [USER], "completion": "18"}, "'prompt' and 'completion' must both be strings (standard) or both lists of messages (conversational)"),
    "user turn in a completion": ({"prompt": [USER], "completion": [ANSWER, USER]}, "completion message 1 has role 'user'; a completion holds the assistant's turns: put the turns before them in the prompt"),
    "trained turn in a prompt": ({"prompt": [USER, {**ANSWER, "train": True}, USER], "completion": [ANSWER]}, 'prompt message 1 (assistant) says "train": true; the prompt is context: put the turns to train in the completion'),
    "empty completion": ({"prompt": [USER], "completion": []}, "'completion' must be a non-empty list of messages"),
    "bad prompt message": ({"prompt": [{"role": "tool", "content": "x"}], "completion": [ANSWER]}, "prompt message 0 has role 'tool'"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(NOT_SFT))
def test_other_trl_types_are_refused_naming_the_type_and_what_to_give(case):
    record, reason = NOT_SFT[case]
    with pytest.raises(chat_data.ChatDataError) as refused:
        chat_data.messages_of(record, "data.jsonl:7")
    assert str(refused.value).startswith("data.jsonl:7: ") and reason in str(refused.value), refused.value


def test_the_suggested_seq_length_is_capped_at_the_models_max_position_embeddings_with_a_word(
    tmp_path, capsys
):
    """Issue 53 item 20: a long example made prepare suggest a seq_length the model cannot take (1,044,056)."""
    folder = model_folder(tmp_path / "model", "qwen2.5")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 256}))
    data = write(tmp_path / "chats.jsonl", [GOOD, GOOD, {"prompt": "x" * 300, "completion": "y"}])
    argv = [str(data), "--init-from", str(folder), "--validation-fraction", "0"]
    assert corpus.main([*argv, "--output", str(tmp_path / "long")]) == 0
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed.startswith(f"train with: --dataset channel --data_dir {tmp_path / 'long'} ")
    assert printed.endswith(
        "--seq_length 256 (the model's max_position_embeddings, config.json; 1 example is longer, up to 400 tokens, "
        "and is refused at training: prepare again with --max-tokens 256 to drop it, or --too-long truncate)"
    )
    data = write(tmp_path / "short.jsonl", [GOOD, {"prompt": "1234", "completion": "5"}])
    assert corpus.main([str(data), "--init-from", str(folder), "--validation-fraction", "0", "--output",
                        str(tmp_path / "short")]) == 0  # fmt: skip
    assert capsys.readouterr().out.splitlines()[-1].endswith("--seq_length 104 (at least)")
    # the sharded preparation (the cloud job's, run here) gives the same advice from its manifest
    assert corpus.main([*argv, "--sharded", "--workers", "1", "--output", str(tmp_path / "sharded")]) == 0
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed.startswith(f"train with: --dataset channel --data_dir {tmp_path / 'sharded'} ")
    assert printed.endswith("--seq_length 256 (the model's max_position_embeddings, config.json; 1 example is longer, "
                            "up to 400 tokens, and is refused at training: prepare again with --max-tokens 256 to "
                            "drop it, or --too-long truncate)")  # fmt: skip


def test_a_validation_file_that_is_not_there_is_refused_by_name_before_anything_is_written(tmp_path):
    folder = model_folder(tmp_path / "model", "qwen2.5")
    data = write(tmp_path / "chats.jsonl", [GOOD])
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(chat_data.ChatDataError, match=f"validation-file: {missing} is not a file"):
        chat.prepare_chat([data], str(tmp_path / "out"), str(folder), validation_file=str(missing))
    assert not (tmp_path / "out").exists()
