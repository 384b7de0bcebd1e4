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

* :func:`objective`, :func:`objective_problems`: the objective the data makes (``auto``: dpo on preference pairs)
  and the trainer's refusals of one that does not fit it; a DPO run's plan (``training.plan.preference``).

Pure Python (standard library, ``training.request`` and ``training.plan``): part of the request check's Lambda
asset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from training.contract import hardware, settings_table, tuning
from training.plan import step_batch
from training.plan.estimate import with_preference
from training.request import sft_data
from training.request.sft_data import ChatData

if TYPE_CHECKING:
    from training.plan.estimate import Plan
    from training.request.value import Request


def objective(request: Request) -> str | None:
    """The objective the trainer will run (``objective``, with ``auto`` decided by the data as the trainer decides
    it: ``dpo`` for preference pairs, else ``next_token``), or None when ``auto`` meets data that was not read."""
    values = request.settings.values or {}
    chosen = values.get("objective", "auto")
    if chosen != "auto":
        return str(chosen)
    if request.chat is not None:
        return "dpo" if request.chat.meta.get("kind") == sft_data.PREFERENCE_KIND else "next_token"
    if request.fields.train_data_uri is not None and not request.data_read:
        return None
    return "next_token"


def objective_problems(request: Request) -> list[str]:
    """The trainer's refusal of an objective that does not fit the data (``training.trainer.objective.check``),
    before launch: dpo on data that is not preference pairs (synthetic data, token files, conversations), next_token
    on preference pairs; and preference tuning's settings on a run that trains the next-token loss."""
    values = request.settings.values
    if values is None or any(problem.startswith("train_data_uri:") for problem in request.read_problems):
        return []
    chosen, kind = (
        values.get("objective", "auto"),
        None if request.chat is None else request.chat.meta.get("kind"),
    )
    uri = request.fields.train_data_uri
    known = uri is None or request.data_read
    if chosen == "dpo" and known and kind != sft_data.PREFERENCE_KIND:
        what = (
            "synthetic data (no train_data_uri)"
            if uri is None
            else f"the data in {uri} ({kind or 'token files'})"
        )
        return [
            "hyperparameters.objective: dpo trains on preference data (pairs of a chosen and a rejected answer, prepared with python "
            f"-m training.prepare PAIRS.jsonl --init-from MODEL); {what} is not; got dpo"
        ]
    if chosen == "next_token" and kind == sft_data.PREFERENCE_KIND:
        return [
            f"hyperparameters.objective: next_token cannot train on preference data ({uri} holds pairs of chosen and rejected "
            "answers): use objective dpo (or auto); got next_token"
        ]
    if objective(request) == "next_token":
        for name in settings_table.DPO_SETTINGS:
            given = (request.fields.hyperparameters or {}).get(name)
            if given is not None and values.get(name) != settings_table.HYPERPARAMETERS_BY_NAME[name].default:
                return [
                    f"hyperparameters.{name}: only for preference tuning (objective dpo, or auto on preference data); this run "
                    f"trains the next-token loss on {'synthetic data' if uri is None else uri}; got {given!r}"
                ]
    return []


def problems(request: Request) -> list[str]:
    """The decision's step for conversation and preference data: every problem, each naming its field (the
    objective against the data; none else without such data, or, with ``init_from`` not read here, only the
    model's mismatches: the settings wait for its shape)."""
    chat = request.chat
    if chat is None:
        return objective_problems(request)
    found = [f"train_data_uri: {mismatch}" for mismatch in chat.mismatches]
    values = request.settings.values
    if values is None:
        return found
    found += objective_problems(request)
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
        longer = "" if None in splits else f"{counted} {_examples(chat)} "
        return [
            f"seq_length: must be at least {chat.longest}, the longest {_example_of(chat)} in "
            f"{chat.uri} ({longer}longer than {seq}; {sft_data_how(chat)}); {_examples(chat)} are never cut at training: "
            f"raise seq_length, or prepare the data again with --max-tokens {seq}; got {seq}"
        ]
    accumulate = int(values.get(tuning.GRAD_ACCUM_SETTING) or 1)
    tokens = values.get("batch_tokens")  # the batch given in tokens: batch_size is what it made
    field, lower, got = (
        ("batch_size", "batch_size", values["batch_size"])
        if tokens is None
        else ("hyperparameters.batch_tokens", "batch_tokens", tokens)
    )
    made = "" if tokens is None else f", from batch_tokens {tokens:,}"
    found = []
    for split, batch in (("train", values["batch_size"] * accumulate), ("validation", values["batch_size"])):
        if not chat.split(split):
            continue
        windows, exact = chat.windows(split, seq, packing)
        if exact and windows < world * batch:
            found.append(
                f"{field}: the {split} split of {chat.uri} makes {windows} windows of seq_length {seq} "
                f"({chat.split(split).get('examples')} examples, {'packed' if packing else 'one per window'}); one "
                f"global batch (batch_size {values['batch_size']}{f' x grad_accum_steps {accumulate}' if split == 'train' and accumulate > 1 else ''} "
                f"x {world} GPUs{made}) needs {world * batch}: lower {lower} or seq_length, or add data; got {got}"
            )
    return found


def _examples(chat: ChatData) -> str:
    """What the data's examples are, in a word: conversations' ``examples``, preference data's ``pairs`` (a chosen
    and a rejected sequence each, packed together)."""
    return "pairs" if chat.meta.get("kind") == sft_data.PREFERENCE_KIND else "examples"


def _example_of(chat: ChatData) -> str:
    return (
        "pair of the preference data"
        if chat.meta.get("kind") == sft_data.PREFERENCE_KIND
        else "example of the conversation data"
    )


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
        "kind": chat.meta.get("kind", sft_data.CHAT_KIND),
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
            f"{entry.get('examples')} training {_examples(chat)} in {counted}{windows} windows of {seq} tokens ({way}; "
            f"{100 * tokens / (windows * seq) if windows else 0:.1f}% filled, "
            f"{trained / windows if windows else 0:.1f} trained tokens per window); {steps:.1f} steps per epoch, "
            f"max_steps {values['max_steps']} = {epochs:.1f} epochs; {truncation_said(chat)}"
        ),
    }


def step_of_data(
    step: Mapping[str, Any] | None, chat: ChatData, values: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The plan's step (``step_batch.step_plan``) with the examples and trained tokens its windows hold on average,
    from the train split's ``metadata.json`` (its examples and trained tokens over the windows it makes)."""
    if step is None:
        return None
    packing = bool(values.get("packing", True))
    entry = chat.split("train")
    windows, exact = chat.windows("train", values["seq_length"], packing)
    return step_batch.with_examples(
        step,
        examples=int(entry.get("examples") or 0),
        windows=windows,
        trained=int(entry.get("trained_tokens") or 0),
        packing=packing,
        exact=exact,
        what=_examples(chat),
    )


def with_data_plan(estimate: Plan, request: Request, values: Mapping[str, Any] | None = None) -> Plan:
    """``estimate`` with the data's part (:func:`data_plan`) when the request trains on conversation or preference
    data, and as a DPO run's (``training.plan.preference``: the reference's pass over the data's windows, or the
    adapters switched off every step) when it runs the objective dpo. ``values``: the settings ``estimate`` was
    planned for (a tuning candidate's; default: the request's own)."""
    from dataclasses import replace  # noqa: PLC0415 - dataclasses is cheap; kept next to its one use

    values, chat = values or request.settings.values, request.chat
    if values is None:
        return estimate
    if chat is not None:
        estimate = replace(
            estimate,
            data=data_plan(chat, values, estimate.setup.world_size),
            step=step_of_data(estimate.step, chat, values),
        )
    if objective(request) != "dpo":
        return estimate
    windows = answers = None
    if chat is not None:
        packing = bool(values.get("packing", True))
        splits = [split for split in ("train", "validation") if chat.split(split)]
        windows = sum(chat.windows(split, values["seq_length"], packing)[0] for split in splits)
        answers = sum(2 * int(chat.split(split).get("examples") or 0) for split in splits)
    return with_preference(estimate, values, windows=windows, answers=answers)


def candidate_plan(request: Request) -> Callable[[Plan, Mapping[str, Any]], Plan] | None:
    """For a tuning run of the objective dpo: a candidate's plan (of its own settings) made the DPO run's as the
    request's is (:func:`with_data_plan`: its step with the reference's cost applied once, its reference pass over
    the windows of its own ``seq_length``); None for any other run."""
    if objective(request) != "dpo":
        return None
    return lambda planned, settings: with_data_plan(planned, request, settings)


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
