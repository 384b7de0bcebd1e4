"""Fine-tuning on prepared conversations, as the request sees it: the data ``train_data_uri`` names (its
``metadata.json``, written by ``prepare --init-from``) against the ``init_from`` model and the trainer settings,
decided before launch, as the trainer would decide it at its start after the instances are paid for.

* ``sft_data.ChatData``: what was read (``reads.Reads.chat_data``, once, into the request: ``value.Request.chat``);
* :func:`problems`: the decision's step (``decision.decide_request``): the data rendered for another model (its
  chat template's or tokenizer's SHA-256, a token id past the vocabulary: ``sft_data.check_against_model``, the
  trainer's own check), a ``seq_length`` below the longest example (examples are never cut at training), and
  fewer windows than one global batch;
* :func:`data_plan`: what the plan says about the data: the windows ``seq_length`` packs it into (counted exactly
  from the lengths ``prepare`` recorded, ``sft_data.packed_windows``), the epochs ``max_steps`` makes, the trained
  tokens per window and what truncation did at preparation;
* :func:`candidate_check`: a tuning run's candidates keep the data's constraints (a ``seq_length`` or micro-batch
  the data cannot fill is left out, with the reason);
* :func:`skipped_checks`, :func:`model_unread`: what could not be checked where the decision ran (offline, without
  the folders), for ``decision.skipped_checks``.

Pure Python (standard library and ``training.request`` only): part of the request check's Lambda asset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from training.contract import hardware, tuning
from training.request import sft_data
from training.request.sft_data import ChatData

if TYPE_CHECKING:
    from training.plan.estimate import Plan
    from training.request.value import Request


def problems(request: Request) -> list[str]:
    """The decision's step for conversation data: every problem, each naming its field (none without such data,
    or, with ``init_from`` not read here, only the model's mismatches: the settings wait for its shape)."""
    chat = request.chat
    if chat is None:
        return []
    found = [f"train_data_uri: {mismatch}" for mismatch in chat.mismatches]
    values = request.settings.values
    if values is None:
        return found
    if request.fields.init_from is None and int(chat.meta.get("max_token_id", -1)) >= values["vocab_size"]:
        found.append(
            f"train_data_uri: the data holds token id {chat.meta['max_token_id']}, but vocab_size is "
            f"{values['vocab_size']}: the data was tokenized for another vocabulary (fine-tune from its model with "
            "init_from, or raise vocab_size)"
        )
    world = hardware.GPU_INSTANCE_TYPES[request.fields.instance_type].gpus * request.fields.instance_count
    found += constraint_problems(chat, values, world)
    return found


def constraint_problems(chat: ChatData, values: Mapping[str, Any], world: int) -> list[str]:
    """What the trainer refuses before step 1 for these settings on this data (``training.trainer.data.packing``):
    an example longer than ``seq_length``, and a split with fewer windows than one global batch."""
    seq, packing = values["seq_length"], bool(values.get("packing", True))
    if chat.longest > seq:
        splits = [chat.lengths(split) for split in ("train", "validation") if chat.split(split)]
        counted = sum(n for lengths in splits if lengths for t, n in lengths.items() if t > seq)
        longer = "" if None in splits else f"{counted} examples "
        return [
            f"seq_length: must be at least {chat.longest}, the longest example of the conversation data in "
            f"{chat.uri} ({longer}longer than {seq}; {sft_data_how(chat)}); examples are never cut at training: "
            f"raise seq_length, or prepare the data again with --max-tokens {seq}; got {seq}"
        ]
    accumulate = int(values.get(tuning.GRAD_ACCUM_SETTING) or 1)
    found = []
    for split, batch in (("train", values["batch_size"] * accumulate), ("validation", values["batch_size"])):
        if not chat.split(split):
            continue
        windows, exact = chat.windows(split, seq, packing)
        if exact and windows < world * batch:
            found.append(
                f"batch_size: the {split} split of {chat.uri} makes {windows} windows of seq_length {seq} "
                f"({chat.split(split).get('examples')} examples, {'packed' if packing else 'one per window'}); one "
                f"global batch (batch_size {values['batch_size']}{f' x grad_accum_steps {accumulate}' if split == 'train' and accumulate > 1 else ''} "
                f"x {world} GPUs) needs {world * batch}: lower batch_size or seq_length, or add data; got "
                f"{values['batch_size']}"
            )
    return found


def sft_data_how(chat: ChatData) -> str:
    """How the data was bounded at preparation, in a few words."""
    truncation = chat.meta.get("truncation") or {}
    if truncation.get("max_tokens") is None:
        return "prepared without --max-tokens"
    return f"prepared with --max-tokens {truncation['max_tokens']} --too-long {truncation.get('too_long')}"


def truncation_said(chat: ChatData) -> str:
    """What truncation did at preparation, in one sentence."""
    counts = chat.meta.get("counts") or {}
    truncation = chat.meta.get("truncation") or {}
    if truncation.get("max_tokens") is None:
        return "no example was cut or dropped for length (prepared without --max-tokens)"
    return (
        f"{counts.get('truncated', 0)} examples cut to their first {truncation['max_tokens']} tokens (an answer cut "
        f"there loses its end-of-turn token) and {counts.get('dropped_for_length', 0)} dropped for length, of "
        f"{counts.get('read', '?')} read ({sft_data_how(chat)})"
    )


def data_plan(chat: ChatData, values: Mapping[str, Any], world: int) -> dict[str, Any]:
    """What the plan says of the data for these settings: its training windows of ``seq_length`` (packed or one
    example each), how full they are, the optimizer steps of one epoch, the epochs ``max_steps`` makes, and what
    truncation did at preparation."""
    seq, packing = values["seq_length"], bool(values.get("packing", True))
    entry = chat.split("train")
    windows, exact = chat.windows("train", seq, packing)
    tokens, trained = int(entry.get("tokens") or 0), int(entry.get("trained_tokens") or 0)
    per_step = world * values["batch_size"] * int(values.get(tuning.GRAD_ACCUM_SETTING) or 1)
    steps = windows / per_step if per_step else 0.0
    epochs = values["max_steps"] / steps if steps else 0.0
    counted = "" if exact else "at least "
    way = "packed by best-fit decreasing" if packing else "one example per window, padded"
    return {
        "kind": sft_data.CHAT_KIND,
        "uri": chat.uri,
        "examples": int(entry.get("examples") or 0),
        "longest_example_tokens": chat.longest,
        "packing": packing,
        "windows": windows,
        "windows_exact": exact,
        "fill": round(tokens / (windows * seq), 4) if windows else None,
        "trained_tokens_per_window": round(trained / windows, 1) if windows else None,
        "steps_per_epoch": round(steps, 2),
        "epochs": round(epochs, 2),
        "truncation": truncation_said(chat),
        "checked_against": chat.model,
        "summary": (
            f"{entry.get('examples')} training examples in {counted}{windows} windows of {seq} tokens ({way}; "
            f"{100 * tokens / (windows * seq) if windows else 0:.1f}% filled, "
            f"{trained / windows if windows else 0:.1f} trained tokens per window); {steps:.1f} steps per epoch, "
            f"max_steps {values['max_steps']} = {epochs:.1f} epochs; {truncation_said(chat)}"
        ),
    }


def with_data_plan(estimate: Plan, request: Request) -> Plan:
    """``estimate`` with the data's part (:func:`data_plan`) when the request trains on conversation data."""
    from dataclasses import replace  # noqa: PLC0415 - dataclasses is cheap; kept next to its one use

    if request.chat is None or request.settings.values is None:
        return estimate
    world = estimate.setup.world_size
    return replace(estimate, data=data_plan(request.chat, request.settings.values, world))


def candidate_check(request: Request) -> Callable[[Mapping[str, Any], int], str | None] | None:
    """For a tuning run on conversation data: the reason a candidate's settings (and world size) cannot run on the
    data (:func:`constraint_problems`), else None; None without such data."""
    chat = request.chat
    if chat is None:
        return None

    def check(settings: Mapping[str, Any], world: int) -> str | None:
        found = constraint_problems(chat, settings, world)
        return found[0] if found else None

    return check


def skipped_checks(request: Request) -> list[str]:
    """The checks of conversation data the decision could not make where it ran (``decision.skipped_checks``):
    ``train_data_uri``'s metadata.json when its folder was read neither from S3 nor from a local copy."""
    if request.fields.train_data_uri is None or request.data_read:
        return []
    return [
        "train_data_uri: its metadata.json (read from S3 before launch): prepared conversations against init_from's "
        "chat template, tokenizer and vocabulary, seq_length against the longest example, and the windows per "
        "global batch (offline: a local copy of the folder, --data-folder DIR)"
    ]


def model_unread(request: Request) -> str:
    """What an unread ``init_from`` folder leaves unchecked of conversation data that was read, as the end of
    ``decision.skipped_checks``' line on that folder (empty without such data)."""
    chat = request.chat
    if chat is None or chat.model is not None:
        return ""
    return ", and the conversation data against its chat template, tokenizer and vocabulary"
