"""The request check's part for evaluation: the execution input's ``evaluate`` block, checked and turned into the
evaluation job's decided parts (settings, channels, per-execution request fields), before anything launches.

Two ways in, one check:

* train, then evaluate: ``evaluate`` beside the training fields; the model is the one this execution trains (its
  ``model.tar.gz`` becomes the ``model`` channel after the training job, in the state machine);
* evaluate only: ``evaluate.training_job`` names a finished training job of this workflow (``blackwell-training
  evaluate RUN`` finds it); nothing is trained.

Refused before launch: a malformed block, an unknown task (one the task folder's YAML files do not define), a task
folder outside the allowed data prefixes, and a model that cannot be evaluated: one with no Hugging Face export
(not rotary, the job not completed, not this workflow's) or no tokenizer (trained on synthetic or byte-level data:
read from the ``metadata.json`` that ``training.trainer.prepare`` wrote beside the training data, which is what
``training.trainer.export_hf`` takes the tokenizer from).

Pure Python, no aws_cdk: part of the request check's Lambda asset (``request_function``); boto3 clients are passed in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from constructs_lib.workflow.input_fields import EVALUATE_DEFAULTS
from constructs_lib.workflow.request_rules import (
    EXECUTION_TAG,
    MLFLOW_ENVIRONMENT,
    WORKFLOW_TAG,
    RequestRules,
)
from training.request.contract import (
    DEFAULT_EVALUATION_TASKS,
    EVALUATE_ENTRY_POINT,
    EVALUATION_SETTINGS_BY_NAME,
    HYPERPARAMETERS_BY_NAME,
    MAX_EVALUATION_TASKS,
    MLFLOW_EXPERIMENT_ENV,
    MLFLOW_RUN_NAME_ENV,
    MLFLOW_TRACKING_URI_ENV,
    MODEL_CHANNEL,
    PROGRAM_ENV,
    TASK_NAME,
    TASKS_CHANNEL,
    TRAIN_CHANNEL,
    evaluation_metric_definitions,
)

EVALUATED_TAG = "training-workflow-evaluates"
"""An evaluation job's tag: the run (execution) whose model it evaluates (``blackwell-training compare`` finds a
run's evaluations by it)."""
EVALUATION_ONLY_FIELDS = (
    "evaluate",
    "job_name_prefix",
    "tags",
    "environment",
    "use_spot",
    "training_plan_arn",
)
"""Top-level fields an evaluation-only input may set (they apply to the evaluation job); the others are training's."""
TASK_LINE = re.compile(r"^(?:task|group|tag):\s*['\"]?([A-Za-z0-9][A-Za-z0-9_.-]*)['\"]?\s*$", re.MULTILINE)
TASK_LIST_ITEM = re.compile(r"^tag:\s*\n((?:\s+-\s*\S+\s*\n?)+)", re.MULTILINE)
MAX_TASK_FILES = 200


def merged(value: Mapping[str, Any]) -> dict[str, Any]:
    return {**EVALUATE_DEFAULTS, **value}


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def block_problems(raw: Mapping[str, Any], value: Any, rules: RequestRules, data_uri_ok: Any) -> list[str]:
    """Every problem of the ``evaluate`` block ``value`` (an object; ``raw`` the whole input), field by field."""
    unknown = [k for k in value if k not in EVALUATE_DEFAULTS]
    if unknown:
        return [f"evaluate.{k}: unknown field; allowed: {', '.join(EVALUATE_DEFAULTS)}" for k in unknown]
    block, problems = merged(value), []
    tasks = block["tasks"]
    if (
        not isinstance(tasks, list)
        or not 1 <= len(tasks) <= MAX_EVALUATION_TASKS
        or not all(isinstance(t, str) and TASK_NAME.match(t) for t in tasks)
        or len(set(tasks)) != len(tasks)
    ):
        problems.append(
            f"evaluate.tasks: must be a list of 1 to {MAX_EVALUATION_TASKS} distinct task names (letters, digits, "
            f"_ . -), such as {json.dumps(list(DEFAULT_EVALUATION_TASKS))}; got {json.dumps(tasks, default=repr)}"
        )
    if not data_uri_ok(block["task_data_uri"], rules):
        problems.append(
            "evaluate.task_data_uri: must be the task folder, an s3:// prefix ending in '/' under one of "
            f"{', '.join(rules.data_source_uris())} (python -m training.evaluate.prepare_tasks writes one); "
            f"got {json.dumps(block['task_data_uri'])}"
        )
    for name, low, high in (("limit", 1, 10**8), ("batch_size", 1, 4096)):
        if not (block[name] is None and name == "limit") and not _int_in(block[name], low, high):
            problems.append(
                f"evaluate.{name}: must be an integer in [{low}, {high}]{', or null' if name == 'limit' else ''}; got {json.dumps(block[name])}"
            )
    if not _int_in(block["max_runtime_seconds"], 1, rules.max_runtime_seconds):
        problems.append(
            f"evaluate.max_runtime_seconds: must be an integer in [1, {rules.max_runtime_seconds}]; "
            f"got {json.dumps(block['max_runtime_seconds'])}"
        )
    if block["instance_type"] is not None and block["instance_type"] not in rules.allowed_instance_types:
        problems.append(
            f"evaluate.instance_type: must be one of {', '.join(rules.allowed_instance_types)}, or null (the "
            f"training's); got {json.dumps(block['instance_type'])}"
        )
    job = block["training_job"]
    if job is not None and not (
        isinstance(job, str) and re.fullmatch(rules.sagemaker()["TrainingJobName"]["pattern"], job)
    ):
        problems.append(
            f"evaluate.training_job: must be the name of a finished training job of this workflow, or null; got {json.dumps(job)}"
        )
    if job is not None:
        problems += [
            f"{k}: applies to training, and evaluate.training_job asks for an evaluation only; leave {k} out"
            for k in raw
            if k not in EVALUATION_ONLY_FIELDS
        ]
    return problems


def training_model_problems(config: Mapping[str, Any]) -> list[str]:
    """What makes the model this execution trains impossible to evaluate, known from the input alone."""
    hp = config["hyperparameters"]
    encoding = str(hp.get("position_encoding", HYPERPARAMETERS_BY_NAME["position_encoding"].default)).lower()
    if encoding != "rope":
        return [
            "evaluate: the run trains with position_encoding=none, and such a model has no Hugging Face export "
            "(LlamaForCausalLM always applies rotary embeddings), so there is nothing to evaluate"
        ]
    if config["train_data_uri"] is None:
        return [
            "evaluate: the run trains on synthetic tokens (no train_data_uri): its model has no tokenizer and has "
            "learnt no language; evaluate a run trained on data prepared with --tokenizer tokenizer.json"
        ]
    return []


def tokenizer_problems(s3: Any, data_uri: str, where: str) -> list[str]:
    """The model trained on ``data_uri`` gets no tokenizer files in its export: refused with the reason (read
    from the data's ``metadata.json``, written by ``training.trainer.prepare``)."""
    bucket, _, prefix = data_uri[5:].partition("/")
    try:
        meta = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}metadata.json")["Body"].read())
        tokenizer = meta.get("tokenizer") or {}
    except Exception:  # noqa: BLE001 - missing, unreadable or not JSON: the reason is the same
        return [f"evaluate: {where} was trained on {data_uri}, which has no readable metadata.json (not prepared "
                "with python -m training.trainer.prepare), so its tokenizer is unknown; evaluation needs a "
                "Hugging Face tokenizer"]  # fmt: skip
    if tokenizer.get("kind") == "byte-level UTF-8":
        return [f"evaluate: {where} was trained on byte-level tokens ({data_uri}metadata.json: tokenizer "
                "bytes), and a byte-level model has no tokenizer files for lm-eval; prepare the data with "
                "--tokenizer tokenizer.json to train a model that can be evaluated"]  # fmt: skip
    file = tokenizer.get("file")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}{file}", MaxKeys=1) if file else {}
    if tokenizer.get("kind") != "tokenizers" or not listed.get("KeyCount"):
        return [f"evaluate: {where} was trained on {data_uri}, which has no tokenizer.json beside its tokens, "
                "so its Hugging Face export has no tokenizer files; evaluation needs them"]  # fmt: skip
    return []


def defined_tasks(s3: Any, task_uri: str) -> list[str]:
    """The task, group and tag names of the YAML files under ``task_uri`` (their top-level ``task:``, ``group:``
    and ``tag:`` lines, which lm-eval indexes them by)."""
    bucket, _, prefix = task_uri[5:].partition("/")
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].endswith((".yaml", ".yml"))]
    names: list[str] = []
    for key in keys[:MAX_TASK_FILES]:
        text = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8", errors="replace")
        names += TASK_LINE.findall(text)
        for block in TASK_LIST_ITEM.findall(text):
            names += [
                item.strip().lstrip("-").strip().strip("'\"") for item in block.splitlines() if item.strip()
            ]
    return sorted(set(names))


def task_problems(s3: Any, block: Mapping[str, Any]) -> list[str]:
    known = defined_tasks(s3, block["task_data_uri"])
    unknown = [t for t in block["tasks"] if t not in known]
    if not unknown:
        return []
    found = ", ".join(known) if known else "no task YAML files at all"
    return [
        f"evaluate.tasks: {', '.join(unknown)} not defined in the task folder {block['task_data_uri']} (it "
        f"defines: {found}); write it with python -m training.evaluate.prepare_tasks, or name one of those"
    ]


def training_job_facts(sagemaker: Any, job: str, rules: RequestRules) -> tuple[dict[str, Any], list[str]]:
    """What an evaluation-only request needs of the finished training job ``job``: its run (execution), model
    archive and training data; or the reason it cannot be evaluated."""
    from botocore.exceptions import ClientError  # noqa: PLC0415 - in the Lambda runtime and the CLI

    try:
        described = sagemaker.describe_training_job(TrainingJobName=job)
    except ClientError:
        return {}, [f"evaluate.training_job: no training job {job} in this account and region"]
    runs_uri = rules.runs_uri() or ""
    checkpoints = (described.get("CheckpointConfig") or {}).get("S3Uri", "")
    run = checkpoints[len(runs_uri) :].strip("/") if checkpoints.startswith(runs_uri) and runs_uri else ""
    if not run or "/" in run:
        return {}, [f"evaluate.training_job: {job} is not a training job of this workflow (its checkpoints are not "
                    f"under {runs_uri or 'this workflow'})"]  # fmt: skip
    status = described.get("TrainingJobStatus")
    archive = (described.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if status != "Completed" or not archive:
        return {}, [
            f"evaluate.training_job: {job} ended {status}, not Completed, so it wrote no exported model"
        ]
    facts = {"run": run, "training_job": job, "model_uri": archive, "data_uri": None}
    hp = described.get("HyperParameters") or {}
    if str(hp.get("position_encoding", "rope")).lower() != "rope":
        return facts, [f"evaluate.training_job: {job} trained with position_encoding=none, which has no Hugging "
                       "Face export (LlamaForCausalLM always applies rotary embeddings)"]  # fmt: skip
    channels = {c["ChannelName"]: c for c in described.get("InputDataConfig") or []}
    if TRAIN_CHANNEL not in channels:
        return facts, [f"evaluate.training_job: {job} trained on synthetic tokens (no train channel): its model "
                       "has no tokenizer and has learnt no language"]  # fmt: skip
    facts["data_uri"] = channels[TRAIN_CHANNEL]["DataSource"]["S3DataSource"]["S3Uri"]
    return facts, []


def job_settings(block: Mapping[str, Any]) -> dict[str, str]:
    """The evaluation job's ``HyperParameters`` (the contract's evaluation settings, as text)."""
    values = {"tasks": ",".join(block["tasks"]), "batch_size": block["batch_size"], "limit": block["limit"]}
    return {k: str(EVALUATION_SETTINGS_BY_NAME[k].parse(v)) for k, v in values.items() if v is not None}


def decided(
    config: Mapping[str, Any],
    rules: RequestRules,
    execution: str,
    facts: Mapping[str, Any] | None,
    channel: Any,
) -> dict[str, Any]:
    """The evaluation's decided parts (the state machine takes them from ``$.evaluation``). ``facts``: the
    evaluated training job's (evaluation only), else None (the execution's own model, after training)."""
    block = merged(config["evaluate"])
    run = facts["run"] if facts else execution
    spot = bool(config["use_spot"])
    environment = {**config["environment"], PROGRAM_ENV: EVALUATE_ENTRY_POINT}
    if rules.mlflow_tracking_server_arn:  # the evaluated run's MLflow run gets the scores
        environment.update({MLFLOW_TRACKING_URI_ENV: rules.mlflow_tracking_server_arn,
                            MLFLOW_EXPERIMENT_ENV: rules.workflow_segment or rules.workflow_path,
                            MLFLOW_RUN_NAME_ENV: run})  # fmt: skip
    fixed = [(WORKFLOW_TAG, rules.workflow_path), (EXECUTION_TAG, execution), (EVALUATED_TAG, run)]
    tags = [*fixed, *sorted(rules.tags.items()), *sorted(config["tags"].items())]
    return {
        "only": facts is not None,
        "config": {
            "instance_type": block["instance_type"] or config["instance_type"],
            "instance_count": 1,
            "training_plan_arn": config["training_plan_arn"],
            "use_spot": spot,
            "max_runtime_seconds": block["max_runtime_seconds"],
            "max_wait_seconds": block["max_runtime_seconds"] if spot else None,
            "keep_alive_seconds": 0,
            "job_name_prefix": config["job_name_prefix"],
        },
        "hyperparameters": job_settings(block),
        "request": {
            "Tags": [{"Key": k, "Value": v} for k, v in tags],
            "Environment": environment,
            "InfraCheckConfig": {"EnableInfraCheck": False},
            "RemoteDebugConfig": {"EnableRemoteDebug": False},
            "MetricDefinitions": [m.as_sagemaker() for m in evaluation_metric_definitions(block["tasks"])],
        },
        "tasks_channel": channel(TASKS_CHANNEL, block["task_data_uri"], "File"),
        "model_channel": channel(MODEL_CHANNEL, facts["model_uri"], "File") if facts else None,
        "evaluated": {"run": run, "training_job": facts["training_job"] if facts else None},
        "tasks": list(block["tasks"]),
    }


def environment_room(rules: RequestRules) -> int:
    """Variables the evaluation job adds to the input's ``environment``: the program, and MLflow's."""
    return 1 + (len(MLFLOW_ENVIRONMENT) if rules.mlflow_tracking_server_arn else 0)
