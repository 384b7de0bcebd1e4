"""The execution input read once: one typed value, :class:`Request`, which every check, the plan, the tuning
candidates and the ``CreateTrainingJob`` request read. Nothing after :func:`read_request` reads the raw input or
parses the trainer settings again.

* ``fields``: every input field of the fields' table (``fields.FIELDS``), the input's value or the workflow's
  default (:class:`Fields`: a frozen dataclass made from the table, so a new row is a new attribute);
* ``settings``: the trainer settings (``hyperparameters``, the top-level settings, the ``init_from`` channel's
  folder and the data switch), parsed by the contract's own parsers in one function, :func:`read_settings`:
  as given, each one parsed on its own, all of them parsed with every default and cross-checked, and the exact
  ``HyperParameters`` map (:class:`TrainerSettings`);
* ``evaluate``: the ``evaluate`` block with its defaults (:class:`EvaluateBlock`, made from
  ``fields.EVALUATE_DEFAULTS``); ``tune``: the ``tune`` block parsed (:class:`TuneBlock`);
* ``architecture``: the ``init_from`` model's settings, read once from its config.json (``reads.Reads``), first:
  the settings and the plan need its shape;
* ``chat``: the conversation data ``train_data_uri`` names (its metadata.json), read once with the ``init_from``
  model's template and tokenizer files (``sft_data.ChatData``).

A new trainer setting (a row of ``settings_table.HYPERPARAMETERS``) and a new input field (a row of ``fields.FIELDS``)
flow through this value with no edit here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from training.contract import batch, container, hardware, settings_parse, settings_table, token_data
from training.plan import inputs, memory
from training.request import sft_data, tuning
from training.request.fields import EVALUATE_DEFAULTS, INPUT_FIELDS, check_field, suggest
from training.request.reads import Reads
from training.request.rules import (
    DATA_HYPERPARAMETER,
    INPUT_FIELD_HYPERPARAMETERS,
    PLATFORM_HYPERPARAMETERS,
    TOP_LEVEL_HYPERPARAMETERS,
    RequestRules,
    size_problems,
)


class _TableRow:
    """What :class:`Fields` and :class:`EvaluateBlock` share: their values by name, and a copy with some changed."""

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def but(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _table_value(name: str, names: Sequence[str], doc: str) -> type:
    """A frozen dataclass with one attribute per name of a table, in the table's order."""
    made = dataclasses.make_dataclass(
        name, [(n, Any) for n in names], bases=(_TableRow,), frozen=True, namespace={"__doc__": doc}
    )
    made.__module__ = __name__
    return made


if TYPE_CHECKING:  # made from the tables below; for a type checker, any attribute of theirs

    class Fields(_TableRow):
        def __init__(self, **values: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...

    class EvaluateBlock(_TableRow):
        def __init__(self, **values: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...

else:
    Fields = _table_value(
        "Fields",
        INPUT_FIELDS,
        "Every input field (``fields.FIELDS``, in its order): the input's value, else the workflow's default.",
    )
    EvaluateBlock = _table_value(
        "EvaluateBlock",
        tuple(EVALUATE_DEFAULTS),
        "The ``evaluate`` block's fields (``fields.EVALUATE_DEFAULTS``): the input's value, else the default.",
    )


@dataclass(frozen=True)
class TrainerSettings:
    """The trainer settings of one request, parsed once (:func:`read_settings`)."""

    given: Mapping[str, Any]
    """The settings the job gets, as given (names normalized): the input's ``hyperparameters`` that each parsed, and
    (when every field is valid) the top-level settings, the ``init_from`` channel's folder and the data switch."""
    each: Mapping[str, Any]
    """Each setting of the input's ``hyperparameters`` parsed on its own (those that parse)."""
    values: Mapping[str, Any] | None
    """Every setting parsed with its default and cross-checked (``settings_parse.parse_hyperparameters``); None when they
    cannot be (a problem), or with ``init_from`` before its config.json is read (the trainer checks them then)."""
    hyperparameters: Mapping[str, str]
    """The ``HyperParameters`` map (the platform's paths included); empty when the settings have problems."""
    problems: tuple[str, ...]


@dataclass(frozen=True)
class TuneBlock:
    """The ``tune`` block parsed (``tuning.parse_tune``) for the request's instance type and count, or its problems."""

    settings: tuning.TuneSettings | None
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Request:
    """One execution input, read once (:func:`read_request`)."""

    keys: tuple[str, ...]
    """The input's own field names, in its order (an evaluation-only input may set only some)."""
    fields: Fields
    unknown: tuple[str, ...]
    """The problem of each name of the input that is no input field."""
    field_problems: tuple[str, ...]
    """Each field's own problem (its row of the fields' table), in the table's order."""
    settings: TrainerSettings
    evaluate: EvaluateBlock | None
    """The ``evaluate`` block with its defaults; None without one, or when it is not an object of its fields."""
    tune: TuneBlock | None
    """The ``tune`` block parsed; None without one, or when the fields have problems (it needs the instance type)."""
    architecture: Mapping[str, Any] | None
    """The ``init_from`` model's settings (its config.json), when read."""
    read_problems: tuple[str, ...] = ()
    """The problem of the ``init_from`` folder, when it was read and the trainer cannot start from it (and of a
    ``train_data_uri`` whose metadata.json cannot be read)."""
    chat: sft_data.ChatData | None = None
    """The conversation data ``train_data_uri`` names, read with its ``init_from`` model's files; None for other
    data, or when it was not read."""
    data_read: bool = False
    """Whether ``train_data_uri``'s folder was read (S3 or a local copy of it)."""

    def setup(self, fields: Fields | None = None) -> memory.Setup:
        """The plan's setup of the request's parsed settings on its instances (``fields``: the decided ones, e.g. a
        tuning run's time limit; default the input's). Needs the settings parsed (``settings.values``)."""
        chosen = self.fields if fields is None else fields
        assert self.settings.values is not None, "the settings were not parsed"
        return inputs.setup_from_values(
            self.settings.values,
            instance_type=chosen.instance_type,
            instance_count=chosen.instance_count,
            max_runtime_seconds=chosen.max_runtime_seconds,
            conversations=self.chat is not None,
        )


def read_request(raw: Mapping[str, Any], rules: RequestRules, reads: Reads | None = None) -> Request:
    """``raw`` (an execution input, a JSON object) read once under ``rules``: every field merged over the workflow's
    defaults (the input's ``hyperparameters`` over the workflow's), each field's own check, the ``init_from`` model's
    config.json (with ``reads``' S3, when the field is valid: the settings need its shape), the trainer settings,
    the ``evaluate`` and ``tune`` blocks."""
    unknown = tuple(
        f"{key}: unknown input field{suggest(str(key), INPUT_FIELDS)}; allowed: {', '.join(INPUT_FIELDS)}"
        for key in raw
        if key not in INPUT_FIELDS
    )
    defaults = rules.full_defaults()
    resolved = {name: (raw[name] if name in raw else defaults[name]) for name in INPUT_FIELDS}
    if isinstance(
        raw.get("hyperparameters", {}), Mapping
    ):  # the input's settings over the workflow's defaults
        resolved["hyperparameters"] = _merged_settings(raw, defaults["hyperparameters"])
    field_problems = tuple(
        problem for name in INPUT_FIELDS if (problem := check_field(name, resolved[name], rules)) is not None
    )
    fields = Fields(**resolved)
    folder = None if any(p.startswith("init_from:") for p in field_problems) else fields.init_from
    reads = reads or Reads()
    architecture, read_problems = reads.init_from(folder)
    data = None if any(p.startswith("train_data_uri:") for p in field_problems) else fields.train_data_uri
    train, data_problems = reads.train_data(data, folder)
    return Request(
        keys=tuple(raw),
        fields=fields,
        unknown=unknown,
        field_problems=field_problems,
        settings=read_settings(
            fields,
            field_problems,
            rules,
            architecture,
            train.token_dtype,
            left_out=set(INPUT_FIELDS) - set(raw),
        ),
        evaluate=_evaluate_block(fields.evaluate),
        tune=_tune_block(fields, field_problems),
        architecture=architecture,
        read_problems=(*read_problems, *data_problems),
        chat=train.chat,
        data_read=data is not None and reads.reads_train_data,
    )


def _merged_settings(raw: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The input's ``hyperparameters`` over the workflow's: a default ``batch_tokens`` gives way to the input's
    ``batch_size`` (top-level or among its settings), the batch being given once."""
    settings = raw.get("hyperparameters") or {}
    own = {settings_parse.normalize_name(str(key)) for key in settings}
    gives_windows = batch.WINDOWS in raw or batch.WINDOWS in own
    kept = {
        key: value
        for key, value in defaults.items()
        if not (gives_windows and settings_parse.normalize_name(str(key)) == batch.TOKENS)
    }
    return {**kept, **settings}


def read_settings(
    fields: Fields,
    field_problems: Sequence[str],
    rules: RequestRules,
    architecture: Mapping[str, Any] | None,
    data_dtype: str | None = None,
    *,
    left_out: Collection[str] = (),
) -> TrainerSettings:
    """THE one place the request's trainer settings are parsed: each setting of ``hyperparameters`` on its own
    (known, not the platform's, by the trainer's own parser: every problem at once, even when other fields have
    problems); then, when every field is valid, with the top-level settings, the ``init_from`` channel's folder and
    the data switch, all together by ``settings_parse.parse_hyperparameters`` (with ``init_from``: against
    ``architecture``, the folder's config.json; left to the trainer when it was not read) on the instance type's
    GPU, the data-parallel layout (``data_parallel_replicate``) against the job's GPUs (``inputs.replicate_setting``),
    and rendered as the ``HyperParameters`` map within SageMaker's sizes. ``data_dtype``: the dtype the data's
    ``.bin`` token files were written in (its metadata.json): it is the job's ``token_dtype``, and a contradicting
    one is refused in the trainer's words (``token_data.token_dtype_refusal``). ``left_out``: the input fields the
    input left out (the workflow's defaults): a default ``batch_size`` gives way to the input's ``batch_tokens``."""
    if field_problems and any(p.startswith("hyperparameters") for p in field_problems):
        return _settings({}, {}, None, {}, [])  # not an object of settings: its field's problem says so
    given, each, problems = _each_setting(fields.hyperparameters)
    if field_problems:  # the rest needs the other fields valid
        return _settings(given, each, None, {}, problems)
    for name in TOP_LEVEL_HYPERPARAMETERS:
        defaulted_batch = name == batch.WINDOWS and name in left_out and given.get(batch.TOKENS) is not None
        if getattr(fields, name) is not None and not defaulted_batch:
            given[name] = getattr(fields, name)
    if fields.init_from is not None:
        given["init_from"] = container.WEIGHTS_CHANNEL_DIR
        given.setdefault("init_from_source", fields.init_from)  # what the exports name as the base (peft's)
    has_data = fields.train_data_uri is not None
    dataset = str(given.get(DATA_HYPERPARAMETER, "channel" if has_data else "synthetic")).strip().lower()
    if dataset == "channel" and not has_data:
        problems.append(
            "hyperparameters.dataset: channel needs train_data_uri (the data to mount); got no train_data_uri"
        )
    if dataset == "synthetic" and has_data:
        problems.append(
            f"hyperparameters.dataset: synthetic would ignore train_data_uri {fields.train_data_uri}; "
            "leave dataset out (or channel) to train on it"
        )
    if has_data:
        given[DATA_HYPERPARAMETER] = "channel"
    if has_data and data_dtype is not None:
        where = f"{fields.train_data_uri}{container.DATA_METADATA_FILE}"
        refused = token_data.token_dtype_refusal(data_dtype, each.get("token_dtype", data_dtype), where)
        if refused is not None:
            problems.append(f"hyperparameters.{refused}")
        given.setdefault("token_dtype", data_dtype)
    if problems:
        return _settings(given, each, None, {}, problems)
    values = None
    try:
        if fields.init_from is None or architecture is not None:
            gpu = hardware.GPU_INSTANCE_TYPES.get(fields.instance_type)
            world = gpu.gpus * fields.instance_count if gpu else None
            values = settings_parse.parse_hyperparameters(
                given, architecture, sm=gpu.sm if gpu else None, world_size=world
            )
            if gpu is not None:  # the data-parallel layout against the job's GPUs, checked here once
                inputs.replicate_setting(values, fields.instance_count, fields.instance_type)
    except settings_table.ContractError as err:
        return _settings(given, each, None, {}, [f"hyperparameters.{err}"])
    rendered = {**settings_parse.to_sagemaker_hyperparameters(given), **PLATFORM_HYPERPARAMETERS}
    return _settings(given, each, values, rendered, size_problems(rendered, rules))


def _each_setting(settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Each setting of the input's ``hyperparameters`` on its own: known, not the platform's, parsed by its own
    parser (for :func:`read_settings` only). Returns the settings that parse as given and as parsed, and every
    problem."""
    problems: list[str] = []
    unknown: list[str] = []
    given: dict[str, Any] = {}
    each: dict[str, Any] = {}
    for key, value in settings.items():
        name = settings_parse.normalize_name(key)
        spec = settings_table.HYPERPARAMETERS_BY_NAME.get(name)
        where = f"hyperparameters.{key}"
        if spec is None:
            unknown.append(f"{key}{suggest(name, settings_table.HYPERPARAMETERS_BY_NAME)}")
        elif name in PLATFORM_HYPERPARAMETERS:
            problems.append(
                f"{where}: set by the platform ({PLATFORM_HYPERPARAMETERS[name]}, the path SageMaker syncs); "
                "it cannot be set from an execution"
            )
        elif name in INPUT_FIELD_HYPERPARAMETERS:
            problems.append(
                f"{where}: set by the platform from {INPUT_FIELD_HYPERPARAMETERS[name]}; set that field"
            )
        elif name in TOP_LEVEL_HYPERPARAMETERS:
            problems.append(
                f"{where}: is the top-level input field {name}; set it there, not in hyperparameters"
            )
        elif name in given:
            problems.append(f"{where}: {name} is given twice (in two spellings)")
        else:
            try:
                each[name] = spec.parse(value)
                given[name] = value
            except settings_table.ContractError as err:
                problems.append(f"hyperparameters.{err}")
    if unknown:
        settable = [
            n
            for n in settings_table.HYPERPARAMETERS_BY_NAME
            if n not in PLATFORM_HYPERPARAMETERS
            and n not in TOP_LEVEL_HYPERPARAMETERS
            and n not in INPUT_FIELD_HYPERPARAMETERS
        ]
        problems.insert(
            0,
            f"hyperparameters: unknown trainer setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"allowed: {', '.join(settable)}",
        )
    return given, each, problems


def _settings(
    given: Mapping[str, Any],
    each: Mapping[str, Any],
    values: Mapping[str, Any] | None,
    rendered: Mapping[str, str],
    problems: Sequence[str],
) -> TrainerSettings:
    """The settings, read-only."""
    return TrainerSettings(
        MappingProxyType(dict(given)),
        MappingProxyType(dict(each)),
        None if values is None else MappingProxyType(dict(values)),
        MappingProxyType(dict(rendered)),
        tuple(problems),
    )


def _evaluate_block(value: Any) -> EvaluateBlock | None:
    """The ``evaluate`` field as its block with defaults, when it is an object of the block's fields only."""
    if not isinstance(value, Mapping) or any(key not in EVALUATE_DEFAULTS for key in value):
        return None
    return EvaluateBlock(**{**EVALUATE_DEFAULTS, **value})


def _tune_block(fields: Fields, field_problems: Sequence[str]) -> TuneBlock | None:
    """The ``tune`` field parsed for the instance type and count (several instances: the default search space has
    the data-parallel layouts), when there is one and the fields are valid."""
    if fields.tune is None or field_problems:
        return None
    settings, problems = tuning.parse_tune(fields.tune, fields.instance_type, fields.instance_count)
    return TuneBlock(settings, tuple(problems))
