"""The request check's per-field rules: each input field's check (the table of ``input_fields``), the tags and
environment maps, the cross-field rules (capacity mode, spot, warm pools, remote debugging, keys), the trainer's
settings inside ``hyperparameters`` (the contract's own parsers) and the rendered ``HyperParameters`` map's sizes.
:func:`constructs_lib.workflow.request_check.prepare_request` runs them in order.

Pure Python, no aws_cdk: part of the request check's Lambda asset (``request_function``).
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from constructs_lib.workflow.input_fields import (
    ENVIRONMENT_PREFIXES,
    FIELDS_BY_NAME,
    PLATFORM_ENVIRONMENT,
    TAG_CHARACTERS,
)
from constructs_lib.workflow.request_rules import (
    DATA_HYPERPARAMETER,
    INPUT_FIELD_HYPERPARAMETERS,
    INSTANCE_STORAGE_TYPES,
    MLFLOW_ENVIRONMENT,
    PLATFORM_HYPERPARAMETERS,
    TOP_LEVEL_HYPERPARAMETERS,
    RequestRules,
)
from training.request.contract import (
    GPU_INSTANCE_TYPES,
    HYPERPARAMETERS_BY_NAME,
    WEIGHTS_CHANNEL_DIR,
    ContractError,
    instance_types_supporting,
    normalize_name,
    parse_hyperparameters,
    to_sagemaker_hyperparameters,
)
from training.request.plan import replicate_setting


def show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= 200 else text[:197] + "..."


def suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_field(name: str, value: Any, rules: RequestRules) -> str | None:
    """The problem of one field's value, or None (the field's row of ``input_fields.FIELDS``)."""
    spec = FIELDS_BY_NAME[name]
    if value is None:
        return None if spec.nullable else f"{name}: must be {spec.allowed_text(rules)}; got null"
    return (
        None if spec.check(value, rules) else f"{name}: must be {spec.allowed_text(rules)}; got {show(value)}"
    )


def _tag_text_ok(text: str, pattern: str, low: int, high: int) -> bool:
    """Whether ``text`` fits botocore's tag pattern ``([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)`` (Java's Unicode
    classes, which Python's ``re`` lacks: letters, separators and numbers by Unicode category)."""
    body = pattern.removeprefix("(").removesuffix(")").removeprefix("[").removesuffix("]*")
    categories = set(re.findall(r"\\p\{(\w)\}", body))
    literal = re.sub(r"\\p\{\w\}", "", body).replace("\\", "")
    return low <= len(text) <= high and all(
        unicodedata.category(c)[0] in categories or c in literal for c in text
    )


def map_problems(config: Mapping[str, Any], rules: RequestRules) -> list[str]:
    """Each entry of ``tags`` and ``environment`` on its own (their shapes already checked)."""
    limits, problems = rules.sagemaker(), []
    tags, fixed = config["tags"], rules.fixed_tags()
    most = limits["Tags"]["max"] - len(fixed)
    if len(tags) > most:
        problems.append(
            f"tags: at most {most} (SageMaker's {limits['Tags']['max']} less the workflow's {len(fixed)}); "
            f"got {len(tags)}"
        )
    for key, value in tags.items():
        key_limits, value_limits = limits["TagKey"], limits["TagValue"]
        if key.lower().startswith("aws:") or key in fixed:
            problems.append(
                f"tags.{key}: reserved (aws: prefix, or one of {', '.join(fixed)}); choose another key"
            )
        elif not _tag_text_ok(key, key_limits["pattern"], key_limits.get("min", 1), key_limits["max"]):
            problems.append(
                f"tags.{key}: key must be {key_limits.get('min', 1)} to {key_limits['max']} {TAG_CHARACTERS}; "
                f"got {show(key)}"
            )
        if not _tag_text_ok(value, value_limits["pattern"], 0, value_limits["max"]):
            problems.append(
                f"tags.{key}: value must be at most {value_limits['max']} {TAG_CHARACTERS}; got {show(value)}"
            )
    environment = config["environment"]
    room = limits["Environment"]["max"] - (len(MLFLOW_ENVIRONMENT) if rules.mlflow_tracking_server_arn else 0)
    if len(environment) > room:
        problems.append(f"environment: at most {room} variables; got {len(environment)}")
    key_limits, value_limits = limits["EnvironmentKey"], limits["EnvironmentValue"]
    for name, value in environment.items():
        if name in PLATFORM_ENVIRONMENT:
            problems.append(f"environment.{name}: set by the platform ({PLATFORM_ENVIRONMENT[name]})")
        elif (
            not name.startswith(ENVIRONMENT_PREFIXES)
            or len(name) > key_limits["max"]
            or not re.fullmatch(key_limits["pattern"], name)
        ):
            problems.append(
                f"environment.{name}: name must start with one of {', '.join(ENVIRONMENT_PREFIXES)} (letters, "
                f"digits and _, at most {key_limits['max']} characters); got {show(name)}"
            )
        if len(value) > value_limits["max"]:
            problems.append(
                f"environment.{name}: value of {len(value)} characters; SageMaker allows at most {value_limits['max']}"
            )
    return problems


def cross_field_problems(config: Mapping[str, Any], rules: RequestRules) -> list[str]:
    problems = []
    keep_alive = config["keep_alive_seconds"]
    if keep_alive and config["use_spot"]:
        problems.append(
            f"keep_alive_seconds: warm pools cannot be used with managed spot (use_spot true); set it to 0 or "
            f"use_spot to false; got {keep_alive}"
        )
    if rules.volume_kms_key and config["instance_type"] in INSTANCE_STORAGE_TYPES:
        problems.append(
            f"instance_type: {config['instance_type']} has NVMe instance storage (encrypted by the instance), and "
            "SageMaker refuses a VolumeKmsKeyId for it, which this workflow sets (volume_kms_key); deploy without "
            "volume_kms_key to use it"
        )
    precision, instance_type = config["precision"], config["instance_type"]
    if instance_type not in instance_types_supporting(precision):
        where = [t for t in instance_types_supporting(precision) if t in rules.allowed_instance_types]
        problems.append(
            f"precision: {precision} cannot run on the GPUs of instance_type {instance_type}; it needs one of "
            f"{', '.join(where) or 'no allowed instance type'}"
        )
    if config["use_spot"] and config["training_plan_arn"] is not None:
        problems.append(
            "use_spot: managed spot cannot be combined with training_plan_arn; set use_spot to false or "
            "training_plan_arn to null"
        )
    wait = config["max_wait_seconds"]
    if wait is not None and not config["use_spot"]:
        problems.append(
            f"max_wait_seconds: only allowed with use_spot true; got {wait} (set it to null for on-demand or a plan)"
        )
    elif wait is not None and wait < config["max_runtime_seconds"]:
        problems.append(
            f"max_wait_seconds: must be >= max_runtime_seconds ({config['max_runtime_seconds']}); got {wait}"
        )
    return problems


def setting_problems(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Each trainer setting of the input on its own: known, not the platform's, parsed by the trainer's rules.
    Needs no other field, so it runs even when other fields have problems (every problem is listed at once)."""
    problems: list[str] = []
    unknown: list[str] = []
    given: dict[str, Any] = {}
    for key, value in settings.items():
        name = normalize_name(key)
        spec = HYPERPARAMETERS_BY_NAME.get(name)
        where = f"hyperparameters.{key}"
        if spec is None:
            unknown.append(f"{key}{suggest(name, HYPERPARAMETERS_BY_NAME)}")
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
                spec.parse(value)
                given[name] = value
            except ContractError as err:
                problems.append(f"hyperparameters.{err}")
    if unknown:
        settable = [
            n
            for n in HYPERPARAMETERS_BY_NAME
            if n not in PLATFORM_HYPERPARAMETERS
            and n not in TOP_LEVEL_HYPERPARAMETERS
            and n not in INPUT_FIELD_HYPERPARAMETERS
        ]
        problems.insert(
            0,
            f"hyperparameters: unknown trainer setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"allowed: {', '.join(settable)}",
        )
    return given, problems


def hyperparameter_map(
    config: Mapping[str, Any], rules: RequestRules, architecture: Mapping[str, Any] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The ``HyperParameters`` map: the input's trainer settings, the top-level ones, the data switch, the
    ``init_from`` channel's folder and the platform's paths; checked by the trainer's own parsers and
    cross-setting rules (with ``init_from``: against ``architecture``, the settings of the folder's config.json;
    left to the trainer when it was not read) and SageMaker's sizes."""
    given, problems = setting_problems(config["hyperparameters"])
    for name in TOP_LEVEL_HYPERPARAMETERS:
        if config[name] is not None:
            given[name] = config[name]
    if config["init_from"] is not None:
        given["init_from"] = WEIGHTS_CHANNEL_DIR
    has_data = config["train_data_uri"] is not None
    dataset = str(given.get(DATA_HYPERPARAMETER, "channel" if has_data else "synthetic")).strip().lower()
    if dataset == "channel" and not has_data:
        problems.append(
            "hyperparameters.dataset: channel needs train_data_uri (the data to mount); got no train_data_uri"
        )
    if dataset == "synthetic" and has_data:
        problems.append(
            f"hyperparameters.dataset: synthetic would ignore train_data_uri {config['train_data_uri']}; "
            "leave dataset out (or channel) to train on it"
        )
    if has_data:
        given[DATA_HYPERPARAMETER] = "channel"
    if problems:
        return {}, problems
    try:
        if config["init_from"] is None or architecture is not None:
            gpu = GPU_INSTANCE_TYPES.get(config["instance_type"])
            values = parse_hyperparameters(given, architecture, sm=gpu.sm if gpu else None)
            if gpu is not None and isinstance(config["instance_count"], int):  # the layout fits the GPUs
                replicate_setting(values, config["instance_count"], config["instance_type"])
    except ContractError as err:
        return {}, [f"hyperparameters.{err}"]
    rendered = {**to_sagemaker_hyperparameters(given), **PLATFORM_HYPERPARAMETERS}
    return rendered, size_problems(rendered, rules)


def size_problems(rendered: Mapping[str, str], rules: RequestRules) -> list[str]:
    limits = rules.sagemaker()
    problems = []
    most = limits["HyperParameters"]["max"]
    if len(rendered) > most:
        problems.append(
            f"hyperparameters: SageMaker allows at most {most} in all; the request would have {len(rendered)}"
        )
    for key, value in rendered.items():
        if len(key) > limits["HyperParameterKey"]["max"]:
            problems.append(
                f"hyperparameters.{key}: name longer than {limits['HyperParameterKey']['max']} characters"
            )
        if len(value) > limits["HyperParameterValue"]["max"]:
            problems.append(
                f"hyperparameters.{key}: value of {len(value)} characters; SageMaker allows at most "
                f"{limits['HyperParameterValue']['max']}"
            )
    return problems
