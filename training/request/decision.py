"""Decide every training request before anything is launched: one plain Python function, also the workflow's Lambda.

Its one job: turn an execution input into either a complete, checked ``CreateTrainingJob`` plan (the merged
settings and the exact ``HyperParameters`` map) or the list of every problem, each one line naming the field, the
value and what is allowed. Three callers share it, so they cannot disagree:

* the ``TrainingWorkflow`` state machine calls :func:`handler` as a Lambda function before ``CreateTrainingJob``;
* the operator CLI calls :func:`validate_request` locally, with the :class:`RequestRules` of the deployment;
* the construct checks its own defaults with it at synth time.

Why a Lambda function and not JSONata states: the checks that matter are the trainer's own rules (every setting of
``training/request/contract.py``, its parsers and its cross-setting rules), and importing the contract runs exactly those
rules, so a new trainer setting is checked with no edit here. A JSONata copy of them would be a second
implementation to keep in step, could not list S3 to decide ``resume_from`` on its own, and is not evaluated by
moto 5.2.5 (the tests would need a second evaluator). The Lambda asset holds only this module, the rules
(``request_rules``), the input fields' table (``input_fields``) and the per-field checks (``request_fields``) it
runs, ``training/request/contract.py``, ``training/request/hf_config.py`` and ``training/request/plan.py``
(standard library only; ``boto3`` from the Lambda runtime is imported only to read S3).

SageMaker's request constraints (name length and pattern, hyperparameter count and sizes, S3 URI length and
pattern, input modes, training plan ARN pattern, tag and environment counts, patterns and lengths, the warm-pool
keep-alive maximum) are read from botocore's service model by :func:`sagemaker_limits` at synth time and carried in
the rules, so the Lambda needs no botocore of a particular version.

Besides the checked input, the decision carries the per-execution fields of the request (:func:`job_fields`:
``Tags``, ``Environment``, ``InfraCheckConfig``, ``RemoteDebugConfig``) and, before launch, lists S3 once for a
``train_data_uri`` (it must hold an object) and for ``resume_from``, and for ``init_from`` lists the folder and
reads its ``config.json`` (:func:`read_init_from`), so that the trainer settings are checked and the plan made
with the model's real shape; and it reads the stored tuning measurements of the workflow's image
(``request_tune.read_measurements``): the plan uses measured throughput where one stands for the request. An input
with a ``tune`` block is a tuning run, decided by ``request_tune``: its candidates, cost bound and the tuning job's
hyperparameters.

Nothing here imports ``aws_cdk``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training.request import evaluate_block, hf_config
from training.request.checks import (
    check_field,
    cross_field_problems,
    hyperparameter_map,
    map_problems,
    setting_problems,
    show,
    size_problems,
    suggest,
)
from training.request.contract import (
    CHECKPOINT_DIR_NAME,
    HYPERPARAMETERS_BY_NAME,
    MLFLOW_EXPERIMENT_ENV,
    MLFLOW_RUN_NAME_ENV,
    MLFLOW_TRACKING_URI_ENV,
    RESUME_CHANNEL,
    SET_ASIDE_SUFFIX,
    TRAIN_CHANNEL,
    WEIGHTS_CHANNEL,
    ContractError,
    export_weight_bytes,
    model_shape,
    parse_hyperparameters,
)
from training.request.fields import data_uri_ok
from training.request.plan import make_plan, refusal
from training.request.rules import (
    CHECKPOINT_MARKER,
    DECIDE_STATE,
    DEFAULT_INPUT,
    DEFAULT_MAX_KEEP_ALIVE_SECONDS,
    EXECUTION_TAG,
    INPUT_FIELDS,
    INVALID_INPUT_ERROR,
    LIMIT_NAMES,
    MAX_RUNTIME_SECONDS_LIMIT,
    PLATFORM_HYPERPARAMETERS,
    WORKFLOW_TAG,
    RequestRules,
    parse_data_sources,
    sagemaker_limits,
)
from training.request.tune_block import decide_tune, read_measurements

__all__ = [
    "CHECKPOINT_MARKER",
    "DECIDE_STATE",
    "DEFAULT_INPUT",
    "DEFAULT_MAX_KEEP_ALIVE_SECONDS",
    "INPUT_FIELDS",
    "INVALID_INPUT_ERROR",
    "LIMIT_NAMES",
    "MAX_RUNTIME_SECONDS_LIMIT",
    "PLATFORM_HYPERPARAMETERS",
    "PreparedRequest",
    "RequestRules",
    "channel",
    "data_problems",
    "decide",
    "handler",
    "job_fields",
    "newest_complete_checkpoint",
    "parse_data_sources",
    "prepare_request",
    "read_init_from",
    "resume_problems",
    "sagemaker_limits",
    "validate_request",
]
"""The rules' names are re-exported here (``request_rules``), where callers have always found them."""


# --------------------------------------------------------------------------------------------------------------
# The request
# --------------------------------------------------------------------------------------------------------------


@dataclass
class PreparedRequest:
    """The outcome of :func:`prepare_request`: ``config`` (every input field, merged and normalized),
    ``hyperparameters`` (the exact string map for ``CreateTrainingJob``), ``channels`` (its ``InputDataConfig``)
    and ``problems`` (empty when valid)."""

    config: dict[str, Any]
    hyperparameters: dict[str, str]
    problems: list[str]
    channels: list[dict[str, Any]] = field(default_factory=list)
    plan: dict[str, Any] | None = None
    """``training.request.plan``'s estimate (memory by part, time, cost; ``ignored`` when launched although it did not
    fit); None when the request has other problems, or is a tuning run (each trial has its own plan in ``tune``)."""
    tune: dict[str, Any] | None = None
    """A tuning run's decided part (``request_tune.decide_tune``): where its report and records go and its plan of
    trials and cost; None for a training run."""

    @property
    def cause(self) -> str:
        return "; ".join(self.problems)


def validate_request(raw: object, rules: RequestRules) -> list[str]:
    """Every problem of the execution input ``raw`` under ``rules``, one line each (empty: valid)."""
    return prepare_request(raw, rules).problems


def prepare_request(
    raw: object,
    rules: RequestRules,
    architecture: Mapping[str, Any] | None = None,
    *,
    measurements: Sequence[Mapping[str, Any]] = (),
    execution: str | None = None,
) -> PreparedRequest:
    """Merge ``raw`` over the defaults, check every field, the trainer settings and SageMaker's constraints.
    ``architecture``: the settings of the ``init_from`` folder's config.json (:func:`read_init_from`), which give
    the model's shape to the checks and the plan; with ``init_from`` and no architecture (no S3 read, e.g. the
    CLI offline), the shape checks and the memory plan wait for :func:`decide`. ``measurements``: stored tuning
    records (:func:`request_tune.read_measurements`) for the plan; ``execution``: this execution's name (a tuning
    run's report and records are named by it)."""
    if not isinstance(raw, Mapping):
        return PreparedRequest({}, {}, [f"input: must be a JSON object of input fields; got {show(raw)}"])
    problems: list[str] = []
    for key in raw:
        if key not in INPUT_FIELDS:
            problems.append(
                f"{key}: unknown input field{suggest(str(key), INPUT_FIELDS)}; allowed: {', '.join(INPUT_FIELDS)}"
            )
    defaults = rules.full_defaults()
    config = {name: (raw[name] if name in raw else defaults[name]) for name in INPUT_FIELDS}
    if isinstance(raw.get("hyperparameters"), Mapping):  # the input's settings over the workflow's defaults
        config["hyperparameters"] = {**defaults["hyperparameters"], **raw["hyperparameters"]}
    field_problems = [p for name in INPUT_FIELDS if (p := check_field(name, config[name], rules)) is not None]
    problems += field_problems
    if not any(p.startswith(("tags:", "environment:")) for p in field_problems):
        problems += map_problems(config, rules)
    if not field_problems:
        problems += cross_field_problems(config, rules)
    problems += _evaluate_problems(raw, config, rules, field_problems)
    if not field_problems and config["tune"] is not None and config["evaluate"] is not None:
        problems.append("tune: a tuning run trains no model to evaluate; leave out evaluate (or tune)")
    hyperparameters: dict[str, str] = {}
    if not field_problems:
        hyperparameters, hp_problems = hyperparameter_map(config, rules, architecture)
        problems += hp_problems
    elif not any(p.startswith("hyperparameters") for p in field_problems):
        problems += setting_problems(config["hyperparameters"])[1]  # the rest needs the other fields valid
    tune = None
    if not problems and config["tune"] is not None:
        decided = decide_tune(config, rules, hyperparameters, architecture, measurements=measurements,
                              execution=execution)  # fmt: skip
        problems += decided.problems
        if not decided.problems:
            problems += size_problems(decided.hyperparameters, rules)
            hyperparameters, tune = decided.hyperparameters, decided.tune
            config["max_runtime_seconds"] = decided.max_runtime_seconds  # the cost bound, kept by SageMaker
    if not problems and config["use_spot"] and config["max_wait_seconds"] is None:
        config["max_wait_seconds"] = config["max_runtime_seconds"]
    if problems:
        return PreparedRequest(config, {}, problems)
    if tune is not None:
        return PreparedRequest(config, hyperparameters, problems, _channels(config), None, tune)
    estimate, refused = None, None
    if config["init_from"] is None or architecture is not None:
        estimate, refused = _memory_plan(config, rules, architecture, measurements)
    if refused:
        return PreparedRequest(config, {}, [refused], plan=estimate)
    return PreparedRequest(config, hyperparameters, problems, _channels(config), estimate)


def _channels(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``InputDataConfig`` of a request: its data (``train_data_uri``) and its starting weights (``init_from``)."""
    channels = []
    if config["train_data_uri"] is not None:
        channels.append(channel(TRAIN_CHANNEL, config["train_data_uri"], config["train_data_input_mode"]))
    if config["init_from"] is not None:
        channels.append(channel(WEIGHTS_CHANNEL, config["init_from"], "File"))
    return channels


def _evaluate_problems(
    raw: Mapping[str, Any], config: Mapping[str, Any], rules: RequestRules, field_problems: list[str]
) -> list[str]:
    """The ``evaluate`` block's problems (``request_evaluation``), and the run's model's when it trains one."""
    block = config["evaluate"]
    if not isinstance(block, Mapping):
        return []
    problems = evaluate_block.block_problems(raw, block, rules, data_uri_ok)
    most = rules.sagemaker()["Tags"]["max"] - len(rules.fixed_tags()) - 1
    if isinstance(config["tags"], Mapping) and len(config["tags"]) > most:
        problems.append(
            f"tags: at most {most} with evaluate (its job is also tagged with the run it evaluates)"
        )
    room = rules.sagemaker()["Environment"]["max"] - len(evaluate_block.ADDED_ENVIRONMENT)
    if isinstance(config["environment"], Mapping) and len(config["environment"]) > room:
        problems.append(
            f"environment: at most {room} variables with evaluate (its job also gets SAGEMAKER_PROGRAM)"
        )
    if not problems and not field_problems:
        problems += evaluate_block.plan_problems(config)
        if block.get("training_job") is None:
            problems += evaluate_block.training_model_problems(config)
    return problems


def _memory_plan(
    config: Mapping[str, Any],
    rules: RequestRules,
    architecture: Mapping[str, Any] | None = None,
    measurements: Sequence[Mapping[str, Any]] = (),
) -> tuple[dict[str, Any], str | None]:
    """The plan of a request with no other problem (throughput measured when a stored record stands for it), and
    its refusal when its estimated per-GPU peak exceeds the GPU's memory with headroom (``training.request.plan``),
    unless ``ignore_memory_estimate`` is true."""
    estimate = make_plan(
        config,
        max_instance_count=rules.max_instance_count,
        instance_types=rules.allowed_instance_types,
        architecture=architecture,
        measurements=measurements,
        image_tag=rules.image_tag(),
    )
    ignored = bool(config["ignore_memory_estimate"]) and not estimate.memory.fits
    line = None if config["ignore_memory_estimate"] else refusal(estimate)
    return {**estimate.to_dict(), "ignored": ignored}, line


def job_fields(config: Mapping[str, Any], rules: RequestRules, execution: str) -> dict[str, Any]:
    """The request fields decided per execution (the workflow's template takes each from ``$.request``): the job's
    ``Tags`` (the workflow's path, the execution's name, the workflow's tags, then the input's ``tags``, each
    group sorted), ``Environment`` (the input's ``environment``, plus with an MLflow tracking server the
    trainer's MLflow variables: server, experiment = the workflow's segment, run = the execution),
    ``InfraCheckConfig`` and ``RemoteDebugConfig``."""
    fixed = [(WORKFLOW_TAG, rules.workflow_path), (EXECUTION_TAG, execution), *sorted(rules.tags.items())]
    environment = dict(config["environment"])
    if rules.mlflow_tracking_server_arn:
        environment.update(
            {
                MLFLOW_TRACKING_URI_ENV: rules.mlflow_tracking_server_arn,
                MLFLOW_EXPERIMENT_ENV: rules.workflow_segment or rules.workflow_path,
                MLFLOW_RUN_NAME_ENV: execution,
            }
        )
    return {
        "Tags": [{"Key": k, "Value": v} for k, v in (*fixed, *sorted(config["tags"].items()))],
        "Environment": environment,
        "InfraCheckConfig": {"EnableInfraCheck": config["infra_check"]},
        "RemoteDebugConfig": {"EnableRemoteDebug": config["remote_debug"]},
    }


def channel(name: str, uri: str, mode: str) -> dict[str, Any]:
    """One ``InputDataConfig`` entry: every object under the ``uri`` prefix, on every instance."""
    return {
        "ChannelName": name,
        "DataSource": {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": uri,
                "S3DataDistributionType": "FullyReplicated",
            }
        },
        "InputMode": mode,
    }


# --------------------------------------------------------------------------------------------------------------
# resume_from: the newest complete checkpoint of an earlier run
# --------------------------------------------------------------------------------------------------------------


def newest_complete_checkpoint(
    objects: Mapping[str, int], read: Callable[[str], bytes], run_key: str
) -> tuple[int, str] | None:
    """(step, key prefix) of the newest complete checkpoint under ``run_key`` (``.../<execution>/``), the trainer's
    rule: a ``step_XXXXXXXX`` (or ``step_XXXXXXXX-N``, a later save of that step) folder whose ``COMPLETE`` lists
    files that all exist with the listed sizes; unsealed folders and folders the trainer set aside (a
    ``step_XXXXXXXX.unusable`` object beside the folder) never count.

    ``objects`` maps every key under ``run_key`` to its size; ``read`` returns an object's bytes."""
    candidates = []
    for key in objects:
        parts = key[len(run_key) :].split("/")
        if len(parts) == 2 and parts[1] == CHECKPOINT_MARKER and (m := CHECKPOINT_DIR_NAME.match(parts[0])):
            if f"{run_key}{parts[0]}{SET_ASIDE_SUFFIX}" in objects:
                continue  # the trainer found it damaged
            candidates.append((int(m.group(1)), int(m.group(2) or 1), f"{run_key}{parts[0]}/"))
    for step, _, prefix in sorted(candidates, reverse=True):
        try:
            files = json.loads(read(prefix + CHECKPOINT_MARKER))["files"]
            if all(objects.get(prefix + name) == size for name, size in files.items()):
                return step, prefix
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def resume_problems(
    config: Mapping[str, Any], hyperparameters: Mapping[str, str], found: tuple[int, str] | None, run_uri: str
) -> list[str]:
    """Problems of continuing from ``found`` (what :func:`newest_complete_checkpoint` gave for ``run_uri``)."""
    name = config["resume_from"]
    if found is None:
        return [f"resume_from: execution {name} has no complete checkpoint under {run_uri}; got {show(name)}"]
    step = found[0]
    max_steps = int(hyperparameters.get("max_steps", HYPERPARAMETERS_BY_NAME["max_steps"].default))
    if max_steps <= step:
        return [
            f"hyperparameters.max_steps: must be greater than the step of the checkpoint resumed from ({step}, "
            f"execution {name}) to train further; got {max_steps}"
        ]
    return []


def _list_run(s3: Any, bucket: str, prefix: str) -> dict[str, int]:
    objects: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            objects[item["Key"]] = item["Size"]
    return objects


def decide(event: Mapping[str, Any], s3: Any = None, sagemaker: Any = None) -> dict[str, Any]:
    """The Lambda's work: ``event`` = ``{"input": <execution input>, "rules": <RequestRules or its JSON>,
    "execution": <this execution's name>}``. Returns ``{"valid", "cause", "config", "hyperparameters",
    "channels", "resume", "request", "plan", "evaluation", "evaluation_only", "tune"}`` (all but the first two
    null when not valid; ``request``: :func:`job_fields`; ``evaluation``: the evaluation job's decided parts, null
    without ``evaluate``; ``tune``: a tuning run's decided part, null for a training run); ``s3``: a boto3 S3 client
    to read the stored tuning measurements for the plan (without one: the published figures), and (default: one for
    the rules' region) to check ``train_data_uri`` holds data, to read the ``init_from`` folder's config.json, to
    decide ``resume_from`` and to read the evaluation's task folder and the model's tokenizer; ``sagemaker``: a
    SageMaker client for an evaluation-only request's training job."""
    rules = RequestRules.from_json(event["rules"])
    measurements = read_measurements(s3, rules) if s3 is not None else []
    s3 = s3 if s3 is not None else _S3OnFirstUse(rules)
    raw = event.get("input")
    architecture, weights_problems = init_from_architecture(raw, rules, s3)
    prepared = prepare_request(
        raw, rules, architecture, measurements=measurements, execution=event.get("execution")
    )
    prepared.problems[:0] = weights_problems
    resume = None
    if not prepared.problems and prepared.config["train_data_uri"] is not None:
        prepared.problems += data_problems(s3, prepared.config["train_data_uri"])
    if not prepared.problems and prepared.config["resume_from"] is not None:
        name = prepared.config["resume_from"]
        runs_uri = rules.runs_uri()
        if runs_uri is None:
            raise ValueError("RequestRules.bucket_name: needed to decide resume_from")
        run_uri = f"{runs_uri}{name}/"
        if name == event.get("execution"):
            prepared.problems.append(
                f"resume_from: must name an earlier execution, not this one; got {show(name)}"
            )
        else:
            bucket, _, run_key = run_uri[5:].partition("/")
            objects = _list_run(s3, bucket, run_key)
            found = newest_complete_checkpoint(
                objects, lambda key: s3.get_object(Bucket=bucket, Key=key)["Body"].read(), run_key
            )
            prepared.problems += resume_problems(prepared.config, prepared.hyperparameters, found, run_uri)
            if found is not None:
                resume = {"step": found[0], "uri": f"s3://{bucket}/{found[1]}", "execution": name}
                prepared.channels.append(channel(RESUME_CHANNEL, resume["uri"], "File"))
    evaluation = None
    if not prepared.problems and prepared.config["evaluate"] is not None:
        parameters = (prepared.plan or {}).get("parameters")
        evaluation, problems = _evaluation(
            prepared.config, rules, str(event.get("execution")), (s3, sagemaker), parameters
        )
        prepared.problems += problems
    valid = not prepared.problems
    return {
        "valid": valid,
        "cause": prepared.cause,
        "config": prepared.config if valid else None,
        "hyperparameters": prepared.hyperparameters if valid else None,
        "channels": prepared.channels if valid else None,
        "resume": resume if valid else None,
        "request": job_fields(prepared.config, rules, str(event.get("execution"))) if valid else None,
        "plan": prepared.plan if valid else None,
        "evaluation": evaluation if valid else None,
        "evaluation_only": bool(valid and evaluation and evaluation["only"]),
        "tune": prepared.tune if valid else None,
    }


def init_from_architecture(request: object, rules: Any, s3: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """The settings of ``request``'s ``init_from`` folder's config.json read with ``s3`` (:func:`read_init_from`),
    or the problem of that folder; ``(None, [])`` without ``init_from``, without ``s3`` or with an ``init_from`` the
    field check refuses (it says why)."""
    uri = request.get("init_from") if isinstance(request, Mapping) else None
    if s3 is None or uri is None or check_field("init_from", uri, rules) is not None:
        return None, []
    return read_init_from(s3, uri)


def read_init_from(s3: Any, uri: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The settings of the ``init_from`` folder's config.json (``hf_config.architecture``), or the problem of a
    folder the trainer cannot start from: nothing under the prefix, no config.json or no safetensors file
    directly in it, a config.json that cannot be read or describes an architecture the trainer cannot load. One
    listing of the prefix (the data sources' ``s3:ListBucket``) and one ``GetObject`` of its config.json."""
    bucket, _, prefix = uri[5:].partition("/")
    names = {key[len(prefix) :] for key in _list_run(s3, bucket, prefix)}
    if not names:
        return None, [
            f"init_from: must be a Hugging Face model folder, but no object is under it; got {show(uri)}"
        ]
    if hf_config.CONFIG_FILE not in names:
        return None, [
            f"init_from: holds no {hf_config.CONFIG_FILE} (a Hugging Face model folder has one); got {show(uri)}"
        ]
    if not any("/" not in name and name.endswith(".safetensors") for name in names):
        return None, [
            "init_from: holds no safetensors weights (model.safetensors, or shards with "
            f"model.safetensors.index.json); got {show(uri)}"
        ]
    try:
        body = s3.get_object(Bucket=bucket, Key=prefix + hf_config.CONFIG_FILE)["Body"].read()
        return hf_config.architecture(hf_config.parse(body, uri), uri), []
    except ContractError as err:
        return None, [str(err)]
    except (
        Exception
    ) as err:  # botocore's ClientError (AccessDenied, ...): no botocore import in the Lambda asset
        return None, [f"init_from: cannot read {uri}{hf_config.CONFIG_FILE}: {type(err).__name__}: {err}"]


def _evaluation(
    config: Mapping[str, Any],
    rules: RequestRules,
    execution: str,
    clients: tuple[Any, Any],
    parameters: int | None,
) -> tuple[dict[str, Any] | None, list[str]]:
    """The evaluation's decided parts, after what only S3 and SageMaker (``clients``) can tell: the task folder
    defines the tasks, the model has a tokenizer (and, evaluation only, the training job is a finished one of this
    workflow), and the instance type holds its weights (``parameters``: the run's model, from its plan; evaluation
    only: read from the training job)."""
    s3, sagemaker = clients
    block = evaluate_block.merged(config["evaluate"])
    problems = evaluate_block.task_problems(s3, block)
    facts: dict[str, Any] | None = None
    precision, trained_on = config["precision"], config["instance_type"]
    if block["training_job"] is not None:
        facts, job_problems = evaluate_block.training_job_facts(
            sagemaker or _client("sagemaker", rules), block["training_job"], rules
        )
        problems += job_problems
        if not job_problems:
            where = f"training job {block['training_job']}"
            problems += evaluate_block.export_tokenizer_problems(
                s3, facts["init_from"], facts["data_uri"], where
            )
            parameters = _trained_parameters(s3, facts)
            precision = facts["hyperparameters"].get(
                "precision", HYPERPARAMETERS_BY_NAME["precision"].default
            )
            trained_on = facts["instance_type"] or trained_on
    else:
        problems += evaluate_block.export_tokenizer_problems(
            s3, config["init_from"], config["train_data_uri"], "this run"
        )
    weight_bytes = export_weight_bytes(parameters, str(precision)) if parameters else None
    instance_type, type_problems = evaluate_block.evaluation_instance_type(
        block, config, rules, trained_on, weight_bytes
    )
    problems += type_problems
    if problems or instance_type is None:
        return None, problems
    return evaluate_block.decided(config, rules, execution, facts, channel, instance_type=instance_type), []


def _trained_parameters(s3: Any, facts: Mapping[str, Any]) -> int | None:
    """The parameter count of a finished training job's model: its settings (``HyperParameters``), with the shape of
    its ``init_from`` folder's config.json when it started from one; None when they no longer parse (a job of an
    older version of the workflow): its evaluation then defaults to its own instance type."""
    architecture = None
    if facts["init_from"] is not None:
        architecture, problems = read_init_from(s3, facts["init_from"])
        if problems:
            return None
    try:
        values = parse_hyperparameters(dict(facts["hyperparameters"]), architecture)
        return model_shape(values).parameter_count()
    except ContractError:
        return None


def data_problems(s3: Any, uri: str) -> list[str]:
    """The problem of a ``train_data_uri`` prefix that holds no object (one ``ListObjectsV2``, ``MaxKeys`` 1)."""
    bucket, _, prefix = uri[5:].partition("/")
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0):
        return []
    return [f"train_data_uri: must hold the training data, but no object is under it; got {show(uri)}"]


def _client(service: str, rules: RequestRules) -> Any:
    import boto3  # noqa: PLC0415 - in the Lambda runtime; the CLI passes its own clients

    return boto3.client(service, region_name=rules.region) if rules.region else boto3.client(service)


class _S3OnFirstUse:
    """The rules' S3 client, made on first use (boto3 is imported only when S3 is read)."""

    def __init__(self, rules: RequestRules) -> None:
        self._rules, self._client = rules, None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            self._client = _client("s3", self._rules)
        return getattr(self._client, name)


def handler(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Lambda entry point (see :func:`decide`): with an S3 client, so that the plan reads the stored measurements."""
    rules = RequestRules.from_json(event["rules"])
    return decide(event, _S3OnFirstUse(rules) if rules.bucket_name is not None else None)
