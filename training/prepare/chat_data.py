"""Conversations -> token ids and a loss mask, through the model's own chat template (transformers'
``apply_chat_template``; no template code of our own).

Input: JSON Lines, one example a line, the shapes TRL's ``SFTTrainer`` takes: ``{"messages": [{"role":
"system"|"user"|"assistant", "content": "...", "train": false?}, ...]}``, ``{"prompt": [messages], "completion":
[messages]}`` (the prompt is context, its assistant turns too; the completion holds the assistant's turns, trained),
``{"prompt": "...", "completion": "..."}`` (a user turn and an assistant turn), or ``{"conversations": [{"from",
"value"}]}`` (read as ``messages``, the keys renamed as TRL's ``maybe_convert_to_chatml`` does). TRL's other types
(prompt-only, preference, unpaired preference, stepwise supervision) and plain text are refused by name.

**Which tokens are trained** (the mask), without relying on ``{% generation %}`` markers, which most stock templates
(Llama 3.x, Qwen 2.5) do not have: for each assistant turn ``i`` the conversation is rendered twice more, up to the
turn with the generation prompt (``messages[:i]``, ``add_generation_prompt=True``: everything the model is given
before it answers) and through the turn (``messages[:i + 1]``). The first must be a prefix of the second and the
second of the whole rendering (a template that renders a turn differently once later turns follow is refused). The
characters between the two ends are what the model writes for that turn; of them the trained ones run up to and
including the template's end-of-turn token (the special token the turn's text ends with, trailing whitespace after
it left out, e.g. Qwen's newline after ``<|im_end|>``). The whole rendering is tokenized once, as
``apply_chat_template`` tokenizes it (``add_special_tokens=False``), and the tokens of each trained span are
transformers' own ``{% generation %}`` mask's: from the token holding its first character through the one holding its
last (``char_to_token``). So a token that straddles the start of an answer (the header's last newline merged with an
answer's leading blank line, as Qwen 2.5's vocabulary merges ``"\n\n"``) is trained, as transformers and TRL's
``assistant_only_loss`` train it. Otherwise system, user and tool text and the template's own headers are never
trained; the assistant's content and its end-of-turn token always are (unless that message says ``"train": false``).

**Refused**, each in one line naming the file and line, before any output file gets its name: a line that is not
UTF-8 or not JSON, an example of another shape, an unknown role, content that is not a string or holds one of the
tokenizer's special tokens (it would be read as template structure), a conversation that opens with an assistant
turn, an assistant turn that yields no trained token, an example every token of which would be trained (the template renders nothing around the answer), a
template that renders a turn differently once later turns follow, or renders no end-of-turn token after an answer,
and a template whose rendering of one conversation takes longer than ``TEMPLATE_SECONDS`` (it is code from the
model's folder: a loop without end is stopped, ``deadline``, and named with the example).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.prepare.deadline import TimeUp, limit

ROLES = ("system", "user", "assistant")
TEMPLATE_SECONDS = 10.0
"""The longest one rendering of a chat template may take (``--template-seconds``): measured, a 1 MB conversation
renders with Qwen 2.5's template in 0.06 s on the 2-core development machine, a typical one in well under 1 ms."""


class ChatDataError(ValueError):
    """An input that cannot be turned into trained tokens; the message names the file and line and why."""


@dataclass(frozen=True)
class Example:
    """One rendered example: token ids, the loss mask (1: the token is trained as a target), and how it came in."""

    ids: np.ndarray
    mask: np.ndarray
    shape: str  # "messages" or "prompt_completion"


def load_tokenizer(folder: str) -> tuple[Any, str]:
    """The model folder's tokenizer (transformers, local files only) and its chat template; refuses a folder with
    no template."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ChatDataError(
            "init-from: rendering conversations needs the 'transformers' package (pip install transformers)"
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as err:  # transformers raises OSError, ValueError and its own types
        raise ChatDataError(f"init-from: cannot load a tokenizer from {folder}: {err}") from None
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template:
        raise ChatDataError(
            f"init-from: {folder} has no chat template (tokenizer_config.json's chat_template, or chat_template.jinja): "
            "a base model's folder often has none; use the instruct model's tokenizer files, or add its template"
        )
    return tokenizer, template


def read_jsonl(path: Path) -> Iterator[tuple[int, list[dict[str, Any]], str]]:
    """``(line number, messages, shape)`` of every non-blank line of ``path``, checked (see the module doc)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ChatDataError(f"{where}: not UTF-8 ({err.reason} at byte {err.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise ChatDataError(f"{where}: not valid JSON ({err})") from None
            yield number, *messages_of(record, where)


def messages_of(record: Any, where: str) -> tuple[list[dict[str, Any]], str]:
    """The checked messages of one JSON record and its shape: ``messages``, ``conversations`` (TRL's from/value
    keys), ``prompt_completion`` (strings) or ``conversational_prompt_completion`` (message lists)."""
    if not isinstance(record, dict):
        raise ChatDataError(f"{where}: {SHAPES}")
    for key in ("messages", "conversations"):
        if key in record:
            messages = _listed(record, key, where)
            if key == "conversations":  # as TRL's maybe_convert_to_chatml: the keys renamed, nothing else
                messages = [_chatml(m) for m in messages]
            return [_message(m, where, i) for i, m in enumerate(messages)], key
    if {"prompt", "completion"} <= record.keys() and "label" not in record:
        prompt, completion = record["prompt"], record["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
            return [_message(m, where, i) for i, m in enumerate(turns)], "prompt_completion"
        if isinstance(prompt, list) and isinstance(completion, list):
            return _prompt_completion(record, where), "conversational_prompt_completion"
        raise ChatDataError(
            f"{where}: 'prompt' and 'completion' must both be strings (standard) or both lists of messages "
            "(conversational)"
        )
    raise ChatDataError(f"{where}: {_other_type(record)}{SHAPES}")


SHAPES = (
    "an example is a JSON object with 'messages' (a list of {'role', 'content'}), or 'prompt' and 'completion' "
    "(both strings, or both lists of messages: TRL's prompt-completion type)"
)


def _other_type(record: dict[str, Any]) -> str:
    """What a record of another of TRL's dataset types is, in words (docs/fine-tuning.md: the data)."""
    keys = record.keys()
    if {"chosen", "rejected"} <= keys:
        return "this is TRL's preference type ('chosen' and 'rejected'), not supervised fine-tuning data; "
    if "label" in keys and {"prompt", "completion"} <= keys:
        return (
            "this is TRL's unpaired preference type ('label' marks a completion good or bad), not supervised "
            "fine-tuning data (drop 'label' once the bad completions are removed); "
        )
    if {"completions", "labels"} <= keys:
        return "this is TRL's stepwise supervision type, not supervised fine-tuning data; "
    if "prompt" in keys:
        return "this is TRL's prompt-only type: a prompt with no completion has nothing to train; "
    if "text" in keys:
        return "this is plain text (TRL's language modeling type): prepare it without --init-from; "
    return ""


def _listed(record: dict[str, Any], key: str, where: str) -> list[Any]:
    messages = record[key]
    if not isinstance(messages, list) or not messages:
        raise ChatDataError(f"{where}: '{key}' must be a non-empty list of messages")
    return messages


def _chatml(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    renamed = {"from": "role", "value": "content"}
    return {renamed.get(key, key): value for key, value in message.items()}


def _prompt_completion(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """TRL's conversational prompt-completion: the prompt's turns are context (its assistant turns too, as TRL's
    ``completion_only_loss`` trains only the completion), the completion's are the assistant's, trained."""
    prompt, completion = _listed(record, "prompt", where), _listed(record, "completion", where)
    context = [_message(m, where, i, "prompt message") for i, m in enumerate(prompt)]
    for index, message in enumerate(prompt):
        if message.get("train") is True:
            raise ChatDataError(
                f'{where}: prompt message {index} ({message["role"]}) says "train": true; the prompt is context: '
                "put the turns to train in the completion"
            )
    answers = [_message(m, where, i, "completion message") for i, m in enumerate(completion)]
    for index, message in enumerate(answers):
        if message["role"] != "assistant":
            raise ChatDataError(
                f"{where}: completion message {index} has role {message['role']!r}; a completion holds the "
                "assistant's turns: put the turns before them in the prompt"
            )
    return [{**m, "train": False} for m in context] + answers


def _message(message: Any, where: str, index: int, label: str = "message") -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ChatDataError(f"{where}: {label} {index} is not an object with 'role' and 'content'")
    role, content, train = message.get("role"), message.get("content"), message.get("train", True)
    if role not in ROLES:
        raise ChatDataError(f"{where}: {label} {index} has role {role!r}; allowed: {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise ChatDataError(f"{where}: {label} {index} ({role}) has no string 'content'")
    if not isinstance(train, bool):
        raise ChatDataError(f"{where}: {label} {index} has 'train' {train!r}; allowed: true or false")
    if train and role != "assistant" and "train" in message:
        raise ChatDataError(
            f'{where}: {label} {index} ({role}) says "train": true; only assistant turns are trained'
        )
    return {"role": role, "content": content, "train": train and role == "assistant"}


class Renderer:
    """Renders checked messages with a tokenizer's chat template into an ``Example``. Each rendering is bounded by
    ``seconds`` (``deadline``; None: no bound): a template is code from the model's folder, and one that loops
    without end is refused naming ``name`` (the template's file) and the example."""

    def __init__(
        self,
        tokenizer: Any,
        template: str,
        *,
        seconds: float | None = TEMPLATE_SECONDS,
        name: str = "the model",
    ):
        self.tokenizer, self.template = tokenizer, template
        self.seconds, self.name = seconds, name
        self.special = sorted(
            {str(t) for t in tokenizer.all_special_tokens}
            | {str(t) for t in tokenizer.added_tokens_decoder.values() if getattr(t, "special", False)},
            key=len,
            reverse=True,
        )
        self.end_of_turn: set[str] = set()

    def _text(self, messages: list[dict[str, Any]], prompt: bool, where: str) -> str:
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        try:
            with limit(self.seconds):
                return self.tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=prompt)
        except TimeUp:
            raise ChatDataError(
                f"{where}: the chat template of {self.name} did not finish rendering this conversation within "
                f"{self.seconds:g} s (--template-seconds) and was stopped: a template that loops without end, or "
                "one far slower than a chat template should be; fix the template, or raise --template-seconds"
            ) from None
        except Exception as err:  # the template's own raise_exception, or a Jinja error
            raise ChatDataError(f"{where}: the chat template refuses this conversation: {err}") from None

    def render(self, messages: list[dict[str, Any]], shape: str, where: str) -> Example | None:
        """The example's ids and mask; None when it has no assistant turn to train (counted, not refused)."""
        for index, message in enumerate(messages):
            inside = next((t for t in self.special if t in message["content"]), None)
            if inside:
                raise ChatDataError(
                    f"{where}: message {index} ({message['role']}) holds the tokenizer's special token {inside!r}, "
                    "which would be read as template structure; remove it from the data"
                )
        if not any(m["train"] for m in messages):
            return None
        full = self._text(messages, False, where)
        spans = [self._span(messages, i, full, where) for i, m in enumerate(messages) if m["train"]]
        encoded = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(encoded["input_ids"], dtype=np.int64)
        offsets = np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        mask = np.zeros(len(ids), dtype=np.uint8)
        for begin, end, turn, eot in spans:
            # as transformers' {% generation %} mask: from the token holding the answer's first character (it may
            # begin in the header before it) through the one holding its last, the end-of-turn token
            first = encoded.char_to_token(begin)
            if (
                first is None
            ):  # no token holds that character (a normalizer dropped it): the next one that begins
                first = int(np.searchsorted(offsets[:, 0], begin))
            last = encoded.char_to_token(end - 1)
            if (
                last is None
                or offsets[last, 0] != end - len(eot)
                or self.tokenizer.convert_ids_to_tokens(int(ids[last])) != eot
            ):
                raise ChatDataError(
                    f"{where}: the end-of-turn token {eot!r} of assistant turn {turn} is not a token of its own"
                )
            mask[first : last + 1] = 1
        if mask.all():
            raise ChatDataError(
                f"{where}: every token of this example would be trained: the chat template renders nothing around "
                "the assistant's answer (no headers, no prompt), so this is not chat data for this template"
            )
        return Example(ids, mask, shape)

    def _span(
        self, messages: list[dict[str, Any]], index: int, full: str, where: str
    ) -> tuple[int, int, int, str]:
        """The characters of ``full`` trained for assistant message ``index``: ``(begin, end, index,
        end-of-turn token)``."""
        if index == 0:
            raise ChatDataError(
                f"{where}: the conversation opens with an assistant turn: with nothing before it the template cannot "
                "show where its answer starts; begin with the system or user message it answers"
            )
        before = self._text(messages[:index], True, where)
        through = self._text(messages[: index + 1], False, where)
        if not through.startswith(before) or not full.startswith(through):
            raise ChatDataError(
                f"{where}: the chat template renders assistant turn {index} differently once later turns follow (or "
                "its generation prompt is not where the answer starts), so which tokens are the answer cannot be "
                "derived; use a template that renders earlier turns as they were"
            )
        turn = through[len(before) :].rstrip()
        if not turn:
            raise ChatDataError(
                f"{where}: assistant turn {index} yields no trained token: the chat template renders nothing for it"
            )
        eot = next((t for t in self.special if turn.endswith(t)), None)
        if eot is None:
            raise ChatDataError(
                f"{where}: the chat template renders assistant turn {index} without an end-of-turn special token "
                f"after it (it ends {turn[-20:]!r}): the model would never learn to stop"
            )
        self.end_of_turn.add(eot)
        return len(before), len(before) + len(turn), index, eot
