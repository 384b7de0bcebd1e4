"""The request check's per-field rules: each input field's check and its one-line "allowed" text, the tags and
environment maps, the cross-field rules (capacity mode, spot, warm pools, remote debugging, keys), the trainer's
settings inside ``hyperparameters`` (the contract's own parsers) and the rendered ``HyperParameters`` map's sizes.
:func:`constructs_lib.workflow.request_check.prepare_request` runs them in order.

Pure Python, no aws_cdk: part of the request check's Lambda asset (``request_function``).
"""

from __future__ import annotations

import difflib
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from constructs_lib.workflow.request_rules import (
    DATA_HYPERPARAMETER,
    DATA_INPUT_MODES,
    ENVIRONMENT_PREFIXES,
    EXECUTION_NAME,
    INSTANCE_STORAGE_TYPES,
    MAX_RUNTIME_SECONDS_LIMIT,
    MLFLOW_ENVIRONMENT,
    PLATFORM_ENVIRONMENT,
    PLATFORM_HYPERPARAMETERS,
    TOP_LEVEL_HYPERPARAMETERS,
    UUID_LENGTH,
    RequestRules,
)
from training.request.contract import (
    HYPERPARAMETERS_BY_NAME,
    PRECISIONS,
    ContractError,
    instance_types_supporting,
    normalize_name,
    parse_hyperparameters,
    to_sagemaker_hyperparameters,
)
from training.request.tuning import TUNE_KEYS


def show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= 200 else text[:197] + "..."


def suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_field(name: str, value: Any, rules: RequestRules) -> str | None:
    """The problem of one field's value, or None."""
    allowed = _field_allowed(name, rules)
    if value is None:
        return None if name in _OPTIONAL else f"{name}: must be {allowed}; got null"
    ok = _FIELD_CHECKS[name](value, rules)
    return None if ok else f"{name}: must be {allowed}; got {show(value)}"


_OPTIONAL = frozenset(  # null allowed
    {"num_layers", "training_plan_arn", "max_wait_seconds", "train_data_uri", "resume_from", "tune"}
)


def _int_between(
    low: Callable[[RequestRules], int], high: Callable[[RequestRules], int]
) -> Callable[..., bool]:
    return lambda v, r: is_int(v) and low(r) <= v <= high(r)


def _contract_int(name: str) -> Callable[..., bool]:
    spec = HYPERPARAMETERS_BY_NAME[name]
    return lambda v, r: is_int(v) and spec.minimum <= v <= spec.maximum  # type: ignore[operator]


def _job_name_prefix_ok(value: Any, rules: RequestRules) -> bool:
    limits = rules.sagemaker()["TrainingJobName"]
    if not isinstance(value, str) or not value or len(value) + 1 + UUID_LENGTH > limits["max"]:
        return False
    example = f"{value}-{'0' * 8}-{'0' * 4}-{'0' * 4}-{'0' * 4}-{'0' * 12}"
    return re.fullmatch(limits["pattern"], example) is not None


def _plan_arn_ok(value: Any, rules: RequestRules) -> bool:
    limits = rules.sagemaker()["TrainingPlanArn"]
    if not isinstance(value, str) or not limits.get("min", 0) <= len(value) <= limits["max"]:
        return False
    if re.fullmatch(limits["pattern"], value) is None:
        return False
    return rules.region is None or value.split(":")[3] == rules.region


def _data_uri_ok(value: Any, rules: RequestRules) -> bool:
    limits = rules.sagemaker()["S3Uri"]
    if not isinstance(value, str) or len(value) > limits["max"] or not re.fullmatch(limits["pattern"], value):
        return False
    if not value.startswith("s3://") or not value.endswith("/") or "//" in value[5:] or "/../" in value:
        return False
    return any(_under(value, source) for source in rules.data_source_uris())


def _under(uri: str, source: str) -> bool:
    if source.startswith("s3://*/"):
        key = uri[5:].partition("/")[2]
        return key.startswith(source[len("s3://*/") :])
    return uri.startswith(source)


def _execution_name_ok(value: Any, rules: RequestRules) -> bool:
    limits = rules.sagemaker()["ExecutionName"]
    return (
        isinstance(value, str)
        and 1 <= len(value) <= limits["max"]
        and EXECUTION_NAME.match(value) is not None
    )


def _string_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _hyperparameters_shape_ok(value: Any, rules: RequestRules) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str)
        and (isinstance(v, str | bool) or (isinstance(v, int | float) and math.isfinite(v)))
        for k, v in value.items()
    )


_FIELD_CHECKS: Mapping[str, Callable[[Any, RequestRules], bool]] = {
    "precision": lambda v, r: v in PRECISIONS,
    "num_layers": _contract_int("num_layers"),
    "batch_size": _contract_int("batch_size"),
    "seq_length": _contract_int("seq_length"),
    "activation_checkpointing": lambda v, r: isinstance(v, bool),
    "instance_type": lambda v, r: isinstance(v, str) and v in r.allowed_instance_types,
    "instance_count": _int_between(lambda r: 1, lambda r: r.max_instance_count),
    "training_plan_arn": _plan_arn_ok,
    "use_spot": lambda v, r: isinstance(v, bool),
    "max_runtime_seconds": _int_between(lambda r: 1, lambda r: r.max_runtime_seconds),
    "max_wait_seconds": _int_between(lambda r: 1, lambda r: MAX_RUNTIME_SECONDS_LIMIT),
    "hyperparameters": _hyperparameters_shape_ok,
    "job_name_prefix": _job_name_prefix_ok,
    "train_data_uri": _data_uri_ok,
    "train_data_input_mode": lambda v, r: v in DATA_INPUT_MODES and v in r.sagemaker()["TrainingInputMode"],
    "resume_from": _execution_name_ok,
    "keep_alive_seconds": _int_between(lambda r: 0, lambda r: r.max_keep_alive_seconds),
    "infra_check": lambda v, r: isinstance(v, bool),
    "tags": lambda v, r: _string_map(v),
    "remote_debug": lambda v, r: v is False or (v is True and r.remote_debug and not r.network_isolation),
    "environment": lambda v, r: _string_map(v),
    "ignore_memory_estimate": lambda v, r: isinstance(v, bool),
    "tune": lambda v, r: isinstance(v, Mapping),  # its fields: training.request.tuning.parse_tune
}


def _field_allowed(name: str, rules: RequestRules) -> str:
    """What ``name`` allows, in words (every problem line says it)."""
    if name in ("num_layers", "batch_size", "seq_length"):
        text = HYPERPARAMETERS_BY_NAME[name].allowed()
    elif name == "precision":
        text = "one of " + ", ".join(PRECISIONS)
    elif name == "instance_type":
        text = "one of " + ", ".join(rules.allowed_instance_types)
    elif name == "instance_count":
        text = f"an integer in [1, {rules.max_instance_count}]"
    elif name == "max_runtime_seconds":
        text = f"an integer in [1, {rules.max_runtime_seconds}]"
    elif name == "max_wait_seconds":
        text = f"an integer in [1, {MAX_RUNTIME_SECONDS_LIMIT}]"
    elif name in ("activation_checkpointing", "use_spot", "infra_check", "ignore_memory_estimate"):
        text = "true or false"
    elif name == "keep_alive_seconds":
        most = rules.max_keep_alive_seconds
        text = (
            f"an integer in [0, {most}] (seconds the instances stay in a warm pool after the job)"
            if most
            else "0 (this workflow is deployed without warm pools: maxKeepAliveSeconds is 0)"
        )
    elif name == "remote_debug":
        text = "true or false"
        if rules.network_isolation:
            text = "false (the jobs run with network isolation, and remote debugging needs the network)"
        elif not rules.remote_debug:
            text = "false (this workflow is deployed without remote debugging: set remoteDebug in cdk.json)"
    elif name in ("tags", "environment"):
        text = f"a JSON object of string values ({_map_allowed(name, rules)})"
    elif name == "hyperparameters":
        text = "a JSON object of trainer settings (string, number or boolean values)"
    elif name == "job_name_prefix":
        most = rules.sagemaker()["TrainingJobName"]["max"] - 1 - UUID_LENGTH
        text = f"1 to {most} characters of a-z, A-Z, 0-9 and hyphen, starting with a letter or digit"
    elif name == "training_plan_arn":
        region = rules.region or "<region>"
        text = f"a training plan ARN arn:aws:sagemaker:{region}:<12 digits>:training-plan/<name>"
    elif name == "train_data_uri":
        text = "an s3:// prefix ending in '/' under one of " + ", ".join(rules.data_source_uris())
    elif name == "train_data_input_mode":
        text = "one of " + ", ".join(DATA_INPUT_MODES)
    elif name == "tune":
        text = (
            "an object of tuning settings (" + ", ".join(TUNE_KEYS) + ", all optional; {} tunes the defaults)"
        )
    else:  # resume_from
        most = rules.sagemaker()["ExecutionName"]["max"]
        text = f"the name of an earlier execution of this workflow (1 to {most} characters of a-z, A-Z, 0-9, _ and -)"
    return f"{text}, or null" if name in _OPTIONAL else text


def _map_allowed(name: str, rules: RequestRules) -> str:
    limits = rules.sagemaker()
    if name == "tags":
        most = limits["Tags"]["max"] - len(rules.fixed_tags())
        return (
            f"at most {most} tags; keys of {limits['TagKey'].get('min', 1)} to {limits['TagKey']['max']} and values "
            f"of up to {limits['TagValue']['max']} {TAG_CHARACTERS}; keys not starting with aws: "
            f"nor one of the workflow's own: {', '.join(rules.fixed_tags())}"
        )
    return (
        f"at most {limits['Environment']['max']} variables whose names start with {', '.join(ENVIRONMENT_PREFIXES)} "
        f"(letters, digits and _, at most {limits['EnvironmentKey']['max']} characters), values of up to "
        f"{limits['EnvironmentValue']['max']} characters; not {', '.join(PLATFORM_ENVIRONMENT)}"
    )


TAG_CHARACTERS = "letters, digits, spaces and _.:/=+-@"


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
            if n not in PLATFORM_HYPERPARAMETERS and n not in TOP_LEVEL_HYPERPARAMETERS
        ]
        problems.insert(
            0,
            f"hyperparameters: unknown trainer setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"allowed: {', '.join(settable)}",
        )
    return given, problems


def hyperparameter_map(config: Mapping[str, Any], rules: RequestRules) -> tuple[dict[str, str], list[str]]:
    """The ``HyperParameters`` map: the input's trainer settings, the top-level ones, the data switch and the
    platform's paths; checked by the trainer's own parsers and cross-setting rules and SageMaker's sizes."""
    given, problems = setting_problems(config["hyperparameters"])
    for name in TOP_LEVEL_HYPERPARAMETERS:
        if config[name] is not None:
            given[name] = config[name]
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
        parse_hyperparameters(given)
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
