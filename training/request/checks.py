"""The checks of a request read once (``value.Request``) that no single field's own check can make: each entry of
``tags`` and ``environment``, the cross-field rules (capacity mode, spot, warm pools, keys, the precision on the
instance type's GPUs) and a tuning run that would evaluate. Each field's own check is its row of the fields' table
(``fields.check_field``); the trainer settings' are made where they are parsed (``value.read_settings``).
``decision.decide_request`` runs them in order.

Pure Python, no aws_cdk: part of the request check's Lambda asset (``request_function``).
"""

from __future__ import annotations

import re
import unicodedata

from training.contract.hardware import instance_types_supporting
from training.contract.metric_lines import format_duration
from training.plan import estimate as plan_estimate
from training.request import hf_config
from training.request.fields import (
    ENVIRONMENT_PREFIXES,
    TAG_CHARACTERS,
    environment_name_refusal,
    execution_name_ok,
    show,
)
from training.request.rules import INSTANCE_STORAGE_TYPES, MLFLOW_ENVIRONMENT, RequestRules
from training.request.value import Request


def _tag_text_ok(text: str, pattern: str, low: int, high: int) -> bool:
    """Whether ``text`` fits botocore's tag pattern ``([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)`` (Java's Unicode
    classes, which Python's ``re`` lacks: letters, separators and numbers by Unicode category)."""
    body = pattern.removeprefix("(").removesuffix(")").removeprefix("[").removesuffix("]*")
    categories = set(re.findall(r"\\p\{(\w)\}", body))
    literal = re.sub(r"\\p\{\w\}", "", body).replace("\\", "")
    return low <= len(text) <= high and all(
        unicodedata.category(c)[0] in categories or c in literal for c in text
    )


def map_problems(request: Request, rules: RequestRules) -> list[str]:
    """Each entry of ``tags`` and ``environment`` on its own (when both fields' own checks pass)."""
    if any(p.startswith(("tags:", "environment:")) for p in request.field_problems):
        return []
    limits, problems = rules.sagemaker(), []
    tags, fixed = request.fields.tags, rules.fixed_tags()
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
    environment = request.fields.environment
    room = limits["Environment"]["max"] - (len(MLFLOW_ENVIRONMENT) if rules.mlflow_tracking_server_arn else 0)
    if len(environment) > room:
        problems.append(f"environment: at most {room} variables; got {len(environment)}")
    key_limits, value_limits = limits["EnvironmentKey"], limits["EnvironmentValue"]
    for name, value in environment.items():
        refusal = environment_name_refusal(name) if name.startswith(ENVIRONMENT_PREFIXES) else None
        if refusal is not None:
            problems.append(f"environment.{name}: {refusal}")
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


def cross_field_problems(request: Request, rules: RequestRules) -> list[str]:
    """The rules between fields (when every field's own check passes)."""
    if request.field_problems:
        return []
    config, problems = request.fields, []
    keep_alive = config.keep_alive_seconds
    if keep_alive and config.use_spot:
        problems.append(
            f"keep_alive_seconds: warm pools cannot be used with managed spot (use_spot true); set it to 0 or "
            f"use_spot to false; got {keep_alive}"
        )
    if rules.volume_kms_key and config.instance_type in INSTANCE_STORAGE_TYPES:
        problems.append(
            f"instance_type: {config.instance_type} has NVMe instance storage (encrypted by the instance), and "
            "SageMaker refuses a VolumeKmsKeyId for it, which this workflow sets (volume_kms_key); deploy without "
            "volume_kms_key to use it"
        )
    precision, instance_type = config.precision, config.instance_type
    if instance_type not in instance_types_supporting(precision):
        where = [t for t in instance_types_supporting(precision) if t in rules.allowed_instance_types]
        problems.append(
            f"precision: {precision} cannot run on the GPUs of instance_type {instance_type}; it needs one of "
            f"{', '.join(where) or 'no allowed instance type'}"
        )
    if config.use_spot and config.training_plan_arn is not None:
        problems.append(
            "use_spot: managed spot cannot be combined with training_plan_arn; set use_spot to false or "
            "training_plan_arn to null"
        )
    wait = config.max_wait_seconds
    if wait is not None and not config.use_spot:
        problems.append(
            f"max_wait_seconds: only allowed with use_spot true; got {wait} (set it to null for on-demand or a plan)"
        )
    elif wait is not None and wait < config.max_runtime_seconds:
        problems.append(
            f"max_wait_seconds: must be >= max_runtime_seconds ({config.max_runtime_seconds}); got {wait}"
        )
    return problems


def tune_with_evaluate(request: Request) -> list[str]:
    """A tuning run trains no model, so it has nothing to evaluate."""
    if request.field_problems or request.fields.tune is None or request.fields.evaluate is None:
        return []
    return ["tune: a tuning run trains no model to evaluate; leave out evaluate (or tune)"]


def one_step_problems(estimate: plan_estimate.Plan, rules: RequestRules) -> list[str]:
    """A training run whose own plan says one optimizer step outlasts its ``max_runtime_seconds``: SageMaker would
    stop it before its first step ends (nothing trained, nothing saved, the instances paid)."""
    timing, s = estimate.timing, estimate.setup
    if s.max_runtime_seconds is None or timing.step_seconds <= s.max_runtime_seconds:
        return []
    return [
        f"max_runtime_seconds: the plan expects one optimizer step to take {format_duration(timing.step_seconds)} "
        f"({s.tokens * s.grad_accum_steps:,} tokens per GPU: grad_accum_steps {s.grad_accum_steps} x batch_size "
        f"{s.batch_size} x seq_length {s.seq_length}, at about {timing.tokens_per_sec_per_gpu:,.0f} tokens/s per GPU, "
        f"{timing.basis}), more than the run's limit of {format_duration(s.max_runtime_seconds)}: it would be stopped "
        f"before its first step; raise max_runtime_seconds (at most {rules.max_runtime_seconds}) or lower "
        f"grad_accum_steps; got {s.max_runtime_seconds}"
    ]


def notes(request: Request) -> list[str]:
    """What a request is told without being refused, one line each: a ``seq_length`` above the ``init_from``
    model's ``max_position_embeddings`` (its config.json)."""
    values, limit = request.settings.values, hf_config.max_positions(request.architecture)
    if values is None or limit is None or values["seq_length"] <= limit:
        return []
    return [
        f"seq_length: {values['seq_length']} is above the init_from model's max_position_embeddings {limit} (its "
        f"config.json): the model was not trained on positions past {limit}, and its Hugging Face export keeps "
        f"max_position_embeddings {limit}; a seq_length of at most {limit} stays within what it was built for"
    ]


def execution_name_problems(execution: str | None, rules: RequestRules) -> list[str]:
    """This execution's name (known to the workflow and ``submit``, not to ``validate``) names the run's checkpoint
    folder: ``.``, ``..`` and other path-like names (Step Functions accepts them) are refused."""
    if execution is None or execution_name_ok(execution, rules):
        return []
    most = rules.sagemaker()["ExecutionName"]["max"]
    return [
        f"execution name: must be 1 to {most} characters of a-z, A-Z, 0-9, _ and - (it names the run's checkpoint "
        f"folder, and resume_from names runs by it); got {show(execution)}"
    ]


def checkpoint_backend_problems(request: Request) -> list[str]:
    """``checkpoint_backend=s3`` for a tuning run: its report and its trials' checkpoints stay in its folder
    (``/opt/ml/checkpoints``, which SageMaker copies to the run's prefix)."""
    if request.tune is None or request.settings.each.get("checkpoint_backend") != "s3":
        return []
    return [
        "hyperparameters.checkpoint_backend: a tuning run keeps its report and its trials' checkpoints in its folder "
        "(/opt/ml/checkpoints, copied to S3 by SageMaker); s3 is for training runs; leave it auto (or folder); "
        "got 's3'"
    ]
