"""The decision's part for evaluation: the execution input's ``evaluate`` block (read once: ``value.EvaluateBlock``),
checked (:func:`input_problems`, from the input; :func:`decide`, with what S3 and SageMaker tell) and turned into the
evaluation job's decided parts (settings, channels, per-execution request fields), before anything launches.

Two ways in, one check:

* train, then evaluate: ``evaluate`` beside the training fields; the model is the one this execution trains (its
  ``model.tar.gz`` becomes the ``model`` channel after the training job, in the state machine);
* evaluate only: ``evaluate.training_job`` names a finished training job of this workflow (``blackwell-training
  evaluate RUN`` finds it); nothing is trained.

Refused before launch: a malformed block, an unknown task (one the task folder's YAML files do not define), a task
folder outside the allowed data prefixes, and a model that cannot be evaluated: one with no Hugging Face export
(not rotary, the job not completed, not this workflow's) or none with a tokenizer. The tokenizer is decided as
``training.trainer.checkpoint.export_hf`` decides it: a run started from ``init_from`` takes the tokenizer files of that
folder (``container.INIT_FROM_TRAVELLING_FILES``: ``tokenizer.json`` or ``tokenizer.model`` make one lm-eval can
load); any other run, or one whose ``init_from`` folder has no tokenizer file at all, takes the training data's
(read from the ``metadata.json`` that ``training.prepare`` wrote beside it: none for synthetic or
byte-level data). The evaluation job's instance type is decided here too (:func:`evaluation_instance_type`: one
GPU when the exported weights fit one, the plan's with a training plan) and refused when it cannot hold the
weights or, with a training plan, is not the training's (:func:`plan_problems`).

Pure Python, no aws_cdk: part of the request check's Lambda asset (``request_function``); boto3 clients are passed in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from training.contract.container import (
    DATA_METADATA_FILE,
    EVALUATE_ENTRY_POINT,
    INIT_FROM_TOKENIZERS,
    INIT_FROM_TRAVELLING_FILES,
    MODEL_CHANNEL,
    PROGRAM_ENV,
    TASKS_CHANNEL,
    TRAIN_CHANNEL,
    WEIGHTS_CHANNEL,
)
from training.contract.evaluation import (
    DEFAULT_EVALUATION_TASKS,
    EVALUATION_INSTANCE_TYPE,
    EVALUATION_SETTINGS_BY_NAME,
    EVALUATION_WEIGHTS_SHARE,
    MAX_EVALUATION_TASKS,
    TASK_NAME,
    evaluation_fits,
    evaluation_metric_definitions,
    export_weight_bytes,
)
from training.contract.hardware import GPU_INSTANCE_TYPES
from training.contract.settings_parse import model_shape, parse_hyperparameters
from training.contract.settings_table import HYPERPARAMETERS_BY_NAME, ContractError
from training.contract.tuning import TUNE_TRIALS
from training.request import read_limits
from training.request.fields import EVALUATE_DEFAULTS, data_uri_ok
from training.request.job import channel, job_checkpoint_uri
from training.request.reads import Reads, read_init_from
from training.request.rules import EXECUTION_TAG, WORKFLOW_TAG, RequestRules
from training.request.value import EvaluateBlock, Fields, Request

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
NAMED_TASKS = 20
"""A refusal names at most this many of the folder's own tasks (and counts the rest)."""
ADDED_ENVIRONMENT = (PROGRAM_ENV,)
"""Variables the evaluation job adds to the input's ``environment``: the program only. No MLflow variables, whatever
the workflow's ``mlflow_tracking_server_arn``: the job runs network-isolated and could not reach a tracking server."""


LIMIT_MAX = 10**8
BATCH_SIZE_MAX = 4096


@dataclass(frozen=True)
class EvaluateField:
    """One field of the ``evaluate`` block: what it allows under one deployment's rules (the words its refusal says
    after "must be") and what it does. Its default is ``fields.EVALUATE_DEFAULTS[name]``; ``required``: it
    has none. docs/reference.md is written from this table (``make docs``)."""

    name: str
    allowed: Callable[[RequestRules], str]
    description: str
    required: bool = False


EVALUATE_FIELDS: tuple[EvaluateField, ...] = (
    EvaluateField(
        "tasks",
        lambda r: (
            f"a list of 1 to {MAX_EVALUATION_TASKS} distinct task names (letters, digits, _ . -), such as "
            f"{json.dumps(list(DEFAULT_EVALUATION_TASKS))}"
        ),
        "The lm-eval tasks (or groups) to run; each must be defined by a YAML file of the task folder (a "
        "top-level task:, group: or tag:).",
    ),
    EvaluateField(
        "task_data_uri",
        lambda r: (
            "the task folder, an s3:// prefix ending in '/' under one of "
            f"{', '.join(r.data_source_uris())} (python -m training.evaluate.prepare_tasks writes one)"
        ),
        "The task folder (task YAML files and their data), mounted read-only as the evaluation job's tasks "
        "channel.",
        required=True,
    ),
    EvaluateField(
        "limit",
        lambda r: f"an integer in [1, {LIMIT_MAX}], or null",
        "Examples per task; null: all. For trying a set-up only, never for scores you compare.",
    ),
    EvaluateField(
        "batch_size",
        lambda r: f"an integer in [1, {BATCH_SIZE_MAX}]",
        "lm-eval's batch size (scores can move slightly with it: "
        "https://github.com/EleutherAI/lm-evaluation-harness/issues/1645).",
    ),
    EvaluateField(
        "instance_type",
        lambda r: f"one of {', '.join(r.allowed_instance_types)}, or null (chosen for the model)",
        "The evaluation job's instance type (one instance); null: one GPU "
        f"({EVALUATION_INSTANCE_TYPE}) when the exported weights fit it and the workflow allows it, else "
        "the instance type the run trained on; with training_plan_arn, the plan's (the training's).",
    ),
    EvaluateField(
        "max_runtime_seconds",
        lambda r: f"an integer in [1, {r.max_runtime_seconds}]",
        "The evaluation job's time limit (StoppingCondition.MaxRuntimeInSeconds).",
    ),
    EvaluateField(
        "training_job",
        lambda r: "the name of a finished training job of this workflow, or null",
        "Evaluate this finished training job of the workflow instead of training (what blackwell-training "
        "evaluate sets); the input may then set, besides evaluate, only "
        f"{', '.join(f for f in EVALUATION_ONLY_FIELDS if f != 'evaluate')}.",
    ),
)
"""The ``evaluate`` block's fields, in ``EVALUATE_DEFAULTS``' order (a test checks that each has one row)."""
EVALUATE_FIELDS_BY_NAME: Mapping[str, EvaluateField] = MappingProxyType({f.name: f for f in EVALUATE_FIELDS})


def _must(name: str, rules: RequestRules, value: Any) -> str:
    """The refusal of ``evaluate.<name>``: what the field allows, and what it got."""
    return f"evaluate.{name}: must be {EVALUATE_FIELDS_BY_NAME[name].allowed(rules)}; got {json.dumps(value, default=repr)}"


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def input_problems(request: Request, rules: RequestRules) -> list[str]:
    """Every problem of the request's ``evaluate`` block known from the input (none without one): its fields, the
    room it needs among the tags and the environment, and, when every field is valid, the instance type a training
    plan allows and whether the model the run trains can be evaluated."""
    if not isinstance(request.fields.evaluate, Mapping):
        return []
    problems = block_problems(request, rules)
    most = rules.sagemaker()["Tags"]["max"] - len(rules.fixed_tags()) - 1
    if isinstance(request.fields.tags, Mapping) and len(request.fields.tags) > most:
        problems.append(
            f"tags: at most {most} with evaluate (its job is also tagged with the run it evaluates)"
        )
    room = rules.sagemaker()["Environment"]["max"] - len(ADDED_ENVIRONMENT)
    if isinstance(request.fields.environment, Mapping) and len(request.fields.environment) > room:
        problems.append(
            f"environment: at most {room} variables with evaluate (its job also gets SAGEMAKER_PROGRAM)"
        )
    if not problems and not request.field_problems:
        problems += plan_problems(request)
        if request.evaluate is not None and request.evaluate.training_job is None:
            problems += training_model_problems(request)
            problems += trained_model_fit_problems(request, rules)
    return problems


def trained_model_fit_problems(request: Request, rules: RequestRules) -> list[str]:
    """The evaluation instance type asked for cannot hold the weights of the model this run trains: known from the
    input (its parsed settings' shape and precision), so refused offline as in the workflow; with ``init_from``
    the shape waits for the folder's config.json (``decide`` checks it then)."""
    block, values = request.evaluate, request.settings.values
    assert block is not None
    if values is None:
        return []
    fields = request.fields
    weight_bytes = export_weight_bytes(model_shape(values).parameter_count(), str(fields.precision))
    return evaluation_instance_type(block, fields, rules, fields.instance_type, weight_bytes)[1]


def block_problems(request: Request, rules: RequestRules) -> list[str]:
    """Every problem of the ``evaluate`` block (an object), field by field."""
    unknown = [k for k in request.fields.evaluate if k not in EVALUATE_DEFAULTS]
    if unknown or request.evaluate is None:
        return [f"evaluate.{k}: unknown field; allowed: {', '.join(EVALUATE_DEFAULTS)}" for k in unknown]
    block, problems = request.evaluate, []
    tasks = block.tasks
    if (
        not isinstance(tasks, list)
        or not 1 <= len(tasks) <= MAX_EVALUATION_TASKS
        or not all(isinstance(t, str) and TASK_NAME.match(t) for t in tasks)
        or len(set(tasks)) != len(tasks)
    ):
        problems.append(_must("tasks", rules, tasks))
    if not data_uri_ok(block.task_data_uri, rules):
        problems.append(_must("task_data_uri", rules, block.task_data_uri))
    else:
        problems += task_folder_problems(block.task_data_uri, rules)
    for name, high in (("limit", LIMIT_MAX), ("batch_size", BATCH_SIZE_MAX)):
        value = getattr(block, name)
        if not (value is None and name == "limit") and not _int_in(value, 1, high):
            problems.append(_must(name, rules, value))
    if not _int_in(block.max_runtime_seconds, 1, rules.max_runtime_seconds):
        problems.append(_must("max_runtime_seconds", rules, block.max_runtime_seconds))
    if block.instance_type is not None and block.instance_type not in rules.allowed_instance_types:
        problems.append(_must("instance_type", rules, block.instance_type))
    job = block.training_job
    if job is not None and not (
        isinstance(job, str) and re.fullmatch(rules.sagemaker()["TrainingJobName"]["pattern"], job)
    ):
        problems.append(_must("training_job", rules, job))
    if job is not None:
        problems += [
            f"{k}: applies to training, and evaluate.training_job asks for an evaluation only; leave {k} out"
            for k in request.keys
            if k not in EVALUATION_ONLY_FIELDS
        ]
    return problems


def training_model_problems(request: Request) -> list[str]:
    """What makes the model this execution trains impossible to evaluate, known from the input alone."""
    default = HYPERPARAMETERS_BY_NAME["position_encoding"].default
    if request.settings.each.get("position_encoding", default) != "rope":
        return [
            "evaluate: the run trains with position_encoding=none, and such a model has no Hugging Face export "
            "(every supported Hugging Face class applies rotary embeddings), so there is nothing to evaluate"
        ]
    # with init_from the export may take that folder's tokenizer: decided in S3 (export_tokenizer_problems)
    if request.fields.train_data_uri is None and request.fields.init_from is None:
        return [
            "evaluate: the run trains on synthetic tokens (no train_data_uri): its model has no tokenizer and has "
            "learnt no language; evaluate a run trained on data prepared with --tokenizer tokenizer.json"
        ]
    return []


def tokenizer_problems(s3: Any, data_uri: str, where: str) -> list[str]:
    """The model trained on ``data_uri`` gets no tokenizer files in its export: refused with the reason (read
    from the data's ``metadata.json``, written by ``training.prepare``)."""
    bucket, _, prefix = data_uri[5:].partition("/")
    try:
        raw = read_limits.read_object(s3, bucket, prefix + DATA_METADATA_FILE)
        tokenizer = read_limits.parse_json(raw, f"{data_uri}{DATA_METADATA_FILE}").get("tokenizer") or {}
    except read_limits.TooLarge as err:
        return [
            f"evaluate: {where} was trained on {data_uri}, whose metadata.json names its tokenizer, but {err}"
        ]
    except Exception:  # noqa: BLE001 - missing, unreadable or not JSON: the reason is the same
        return [f"evaluate: {where} was trained on {data_uri}, which has no readable metadata.json (not prepared "
                "with python -m training.prepare), so its tokenizer is unknown; evaluation needs a "
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


def export_tokenizer_problems(s3: Any, init_from: str | None, data_uri: str | None, where: str) -> list[str]:
    """Whether the export of a run started from ``init_from`` (or None) and trained on ``data_uri`` (None:
    synthetic tokens) has a tokenizer lm-eval can load, decided as ``export_hf.write_tokenizer`` decides it: the
    ``init_from`` folder's own tokenizer files when it has any, else the data's (:func:`tokenizer_problems`).
    One listing of the folder's top level (the data sources' ``s3:ListBucket``)."""
    if init_from is not None:
        bucket, _, prefix = init_from[5:].partition("/")
        names: set[str] = set()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            names |= {o["Key"][len(prefix) :] for o in page.get("Contents", [])}
        if names & set(INIT_FROM_TOKENIZERS):
            return []
        travelling = sorted(names & (set(INIT_FROM_TRAVELLING_FILES) - {"generation_config.json"}))
        if travelling:
            return [f"evaluate: {where} started from init_from {init_from}, whose {', '.join(travelling)} become its "
                    f"export's tokenizer files, but it has no {' or '.join(INIT_FROM_TOKENIZERS)}, so lm-eval cannot "
                    "load a tokenizer; add the model's tokenizer.json to that folder"]  # fmt: skip
        if data_uri is None:
            return [f"evaluate: {where} started from init_from {init_from}, which has no tokenizer file "
                    f"({' or '.join(INIT_FROM_TOKENIZERS)}), and trains on synthetic tokens (no train_data_uri), so "
                    "its export has no tokenizer; add the model's tokenizer.json to that folder"]  # fmt: skip
    if data_uri is None:
        return [f"evaluate: {where} trained on synthetic tokens: its model has no tokenizer and has learnt no "
                "language"]  # fmt: skip
    return tokenizer_problems(s3, data_uri, where)


def task_folder_problems(task_uri: str, rules: RequestRules) -> list[str]:
    """A task folder must be a folder below a data source, not a data source itself: the evaluation job mounts the
    whole folder, and a data source holds every team's data (known from the input)."""
    key = task_uri[5:].partition("/")[2]
    for source in rules.data_source_uris():
        same = key == source[len("s3://*/") :] if source.startswith("s3://*/") else task_uri == source
        if same:
            return [
                f"evaluate.task_data_uri: must be a task folder below the data prefix {source}, not the data prefix "
                f"itself (the evaluation job would mount all of it); e.g. {source}evaluation-tasks/ (python -m "
                f"training.evaluate.prepare_tasks writes one); got {json.dumps(task_uri)}"
            ]
    return []


def defined_tasks(s3: Any, task_uri: str) -> list[str]:
    """The task, group and tag names of the YAML files directly in the folder ``task_uri`` (their top-level
    ``task:``, ``group:`` and ``tag:`` lines, which lm-eval indexes them by): one listing of that folder's own
    objects (``Delimiter`` ``/``), never of the folders below it, so that no other folder's file is read or named."""
    bucket, _, prefix = task_uri[5:].partition("/")
    keys: list[str] = []
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/")
    for page in pages:
        keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].endswith((".yaml", ".yml"))]
    names: list[str] = []
    for key in keys[:MAX_TASK_FILES]:
        text = read_limits.read_object(s3, bucket, key).decode("utf-8", errors="replace")
        names += TASK_LINE.findall(text)
        for block in TASK_LIST_ITEM.findall(text):
            names += [
                item.strip().lstrip("-").strip().strip("'\"") for item in block.splitlines() if item.strip()
            ]
    return sorted(set(names))


def task_problems(s3: Any, block: EvaluateBlock) -> list[str]:
    """The tasks the task folder does not define (one listing, and each task file read)."""
    try:
        known = defined_tasks(s3, block.task_data_uri)
    except read_limits.TooLarge as err:
        return [f"evaluate.task_data_uri: {err}"]
    unknown = [t for t in block.tasks if t not in known]
    if not unknown:
        return []
    found = ", ".join(known[:NAMED_TASKS]) if known else "no task YAML file directly in it"
    if len(known) > NAMED_TASKS:
        found += f" and {len(known) - NAMED_TASKS} more"
    return [
        f"evaluate.tasks: {', '.join(unknown)} not defined in the task folder {block.task_data_uri} (it "
        f"defines: {found}); write it with python -m training.evaluate.prepare_tasks, or name one of those"
    ]


def training_job_facts(sagemaker: Any, job: str, rules: RequestRules) -> tuple[dict[str, Any], list[str]]:
    """What an evaluation-only request needs of the finished training job ``job``: its run (execution), model
    archive and training data; or the reason it cannot be evaluated."""
    from botocore.exceptions import ClientError  # noqa: PLC0415 - in the Lambda runtime and the CLI

    try:
        described = sagemaker.describe_training_job(TrainingJobName=job)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("AccessDenied", "AccessDeniedException"):
            # the workflow's check may describe only jobs with its tag; IAM cannot tell a missing job apart
            return {}, [f"evaluate.training_job: {job} is not a training job of this workflow, or there is none of "
                        f"that name (the check may describe only jobs tagged {WORKFLOW_TAG}="
                        f"{rules.workflow_path})"]  # fmt: skip
        return {}, [f"evaluate.training_job: no training job {job} in this account and region"]
    runs_uri = rules.runs_uri() or ""
    checkpoints = job_checkpoint_uri(described) or ""
    run = checkpoints[len(runs_uri) :].strip("/") if checkpoints.startswith(runs_uri) and runs_uri else ""
    if not run or "/" in run:
        return {}, [f"evaluate.training_job: {job} is not a training job of this workflow (its checkpoints are not "
                    f"under {runs_uri or 'this workflow'})"]  # fmt: skip
    hp = described.get("HyperParameters") or {}
    if TUNE_TRIALS in hp:
        return {}, [tuning_job_problem(job)]
    status = described.get("TrainingJobStatus")
    archive = (described.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if status != "Completed" or not archive:
        return {}, [
            f"evaluate.training_job: {job} ended {status}, not Completed, so it wrote no exported model"
        ]
    facts = {"run": run, "training_job": job, "model_uri": archive, "data_uri": None, "init_from": None,
             "instance_type": (described.get("ResourceConfig") or {}).get("InstanceType"), "hyperparameters": hp}  # fmt: skip
    if str(hp.get("position_encoding", "rope")).lower() != "rope":
        return facts, [f"evaluate.training_job: {job} trained with position_encoding=none, which has no Hugging "
                       "Face export (every supported Hugging Face class applies rotary embeddings)"]  # fmt: skip
    channels = {
        c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"]
        for c in described.get("InputDataConfig") or []
    }
    facts["data_uri"], facts["init_from"] = channels.get(TRAIN_CHANNEL), channels.get(WEIGHTS_CHANNEL)
    if facts["data_uri"] is None and facts["init_from"] is None:
        return facts, [f"evaluate.training_job: {job} trained on synthetic tokens (no train channel) from random "
                       "weights: its model has no tokenizer and has learnt no language"]  # fmt: skip
    return facts, []


def tuning_job_problem(job: str) -> str:
    """A tuning run's job (its ``HyperParameters`` hold ``tune_trials``: ``train.sh`` ran the tuning driver) trained
    short trials and exported no model: what to evaluate instead."""
    return (
        f"evaluate.training_job: {job} is a tuning run's job: it measured short trials and exported no model; write "
        "the tuning run's winning request (blackwell-training tune-apply RUN OUT.json), train it (blackwell-training "
        "submit OUT.json), and evaluate that run"
    )


def plan_problems(request: Request) -> list[str]:
    """With ``training_plan_arn``, a train-then-evaluate request may not ask for another evaluation instance type
    than the training's: SageMaker runs a job on a plan only on the plan's instance type (its ``InstanceType``
    must match the plan's), and the training's is the plan's. Known from the input alone."""
    block, fields = request.evaluate, request.fields
    assert block is not None
    chosen, trained_on = block.instance_type, fields.instance_type
    if fields.training_plan_arn is None or chosen in (None, trained_on) or block.training_job is not None:
        return []
    return [f"evaluate.instance_type: with training_plan_arn the evaluation job runs on the plan's reserved "
            f"capacity, and SageMaker runs a job on a plan only on the plan's instance type (the training's "
            f"instance_type, {trained_on}); must be {trained_on} or null; got {json.dumps(chosen)} (to evaluate "
            "on another type, leave evaluate out and evaluate the finished run later without training_plan_arn)"]  # fmt: skip


def evaluation_instance_type(
    block: EvaluateBlock,
    fields: Fields,
    rules: RequestRules,
    trained_on: str,
    weight_bytes: int | None,
) -> tuple[str | None, list[str]]:
    """The evaluation job's instance type, or the problem of the one asked for. ``trained_on``: the evaluated run's
    instance type; ``weight_bytes``: its exported weights' size (None: unknown, e.g. a job of an older workflow).

    Left out (null): with ``training_plan_arn``, ``trained_on`` (a job on a plan runs on the plan's instance type,
    :func:`plan_problems`, and the plan's capacity is paid for); else ``EVALUATION_INSTANCE_TYPE`` (one GPU) when
    the workflow allows it and the weights fit one of its GPUs; else ``trained_on`` (the weights were trained
    there). Refused: a type whose GPUs together cannot hold the weights (``evaluation.evaluation_fits``)."""
    chosen = block.instance_type
    if chosen is None:
        single = (
            fields.training_plan_arn is None
            and EVALUATION_INSTANCE_TYPE in rules.allowed_instance_types
            and weight_bytes is not None
            and evaluation_fits(EVALUATION_INSTANCE_TYPE, weight_bytes, one_gpu=True)
        )
        chosen = EVALUATION_INSTANCE_TYPE if single else trained_on
    if weight_bytes is None or chosen not in GPU_INSTANCE_TYPES or evaluation_fits(chosen, weight_bytes):
        return chosen, []
    fitting = [
        t
        for t in rules.allowed_instance_types
        if t in GPU_INSTANCE_TYPES and evaluation_fits(t, weight_bytes)
    ]
    gpu = GPU_INSTANCE_TYPES[chosen]
    return None, [f"evaluate.instance_type: {chosen}'s {gpu.gpus} x {gpu.gpu_memory_gb} GB of GPU memory cannot hold "
                  f"the model's exported weights ({weight_bytes / 1e9:.1f} GB: more than {EVALUATION_WEIGHTS_SHARE:.0%} "
                  f"of it); must be one of {', '.join(fitting) or 'none of the allowed types'}, or null"]  # fmt: skip


def job_settings(block: EvaluateBlock) -> dict[str, str]:
    """The evaluation job's ``HyperParameters`` (the contract's evaluation settings, as text)."""
    values = {"tasks": ",".join(block.tasks), "batch_size": block.batch_size, "limit": block.limit}
    return {k: str(EVALUATION_SETTINGS_BY_NAME[k].parse(v)) for k, v in values.items() if v is not None}


def decided(
    fields: Fields,
    block: EvaluateBlock,
    rules: RequestRules,
    execution: str,
    facts: Mapping[str, Any] | None,
    *,
    instance_type: str,
) -> dict[str, Any]:
    """The evaluation's decided parts (the state machine takes them from ``$.evaluation``). ``facts``: the
    evaluated training job's (evaluation only), else None (the execution's own model, after training);
    ``instance_type``: the job's (:func:`evaluation_instance_type`)."""
    run = facts["run"] if facts else execution
    spot = bool(fields.use_spot)
    environment = {**fields.environment, PROGRAM_ENV: EVALUATE_ENTRY_POINT}
    fixed = [(WORKFLOW_TAG, rules.workflow_path), (EXECUTION_TAG, execution), (EVALUATED_TAG, run)]
    tags = [*fixed, *sorted(rules.tags.items()), *sorted(fields.tags.items())]
    return {
        "only": facts is not None,
        "config": {
            "instance_type": instance_type,
            "instance_count": 1,
            "training_plan_arn": fields.training_plan_arn,
            "use_spot": spot,
            "max_runtime_seconds": block.max_runtime_seconds,
            "max_wait_seconds": block.max_runtime_seconds if spot else None,
            "keep_alive_seconds": 0,
            "job_name_prefix": fields.job_name_prefix,
        },
        "hyperparameters": job_settings(block),
        "request": {
            "Tags": [{"Key": k, "Value": v} for k, v in tags],
            "Environment": environment,
            "InfraCheckConfig": {"EnableInfraCheck": False},
            "RemoteDebugConfig": {"EnableRemoteDebug": False},
            "MetricDefinitions": [m.as_sagemaker() for m in evaluation_metric_definitions(block.tasks)],
        },
        "tasks_channel": channel(TASKS_CHANNEL, block.task_data_uri, "File"),
        "model_channel": channel(MODEL_CHANNEL, facts["model_uri"], "File") if facts else None,
        "evaluated": {"run": run, "training_job": facts["training_job"] if facts else None},
        "tasks": list(block.tasks),
    }


def decide(
    request: Request,
    fields: Fields,
    rules: RequestRules,
    reads: Reads,
    execution: str,
    parameters: int | None,
) -> tuple[dict[str, Any] | None, list[str]]:
    """The evaluation's decided parts, after what only S3 and SageMaker (``reads``) can tell: the task folder
    defines the tasks, the model has a tokenizer (and, evaluation only, the training job is a finished one of this
    workflow), and the instance type holds its weights (``parameters``: the run's model, from its plan; evaluation
    only: read from the training job). ``fields``: the request's decided fields."""
    s3, block = reads.s3, request.evaluate
    assert block is not None
    problems = task_problems(s3, block)
    facts: dict[str, Any] | None = None
    precision, trained_on = fields.precision, fields.instance_type
    if block.training_job is not None:
        facts, job_problems = training_job_facts(reads.sagemaker, block.training_job, rules)
        problems += job_problems
        if not job_problems:
            where = f"training job {block.training_job}"
            problems += export_tokenizer_problems(s3, facts["init_from"], facts["data_uri"], where)
            parameters = trained_parameters(s3, facts)
            precision = facts["hyperparameters"].get(
                "precision", HYPERPARAMETERS_BY_NAME["precision"].default
            )
            trained_on = facts["instance_type"] or trained_on
    else:
        problems += export_tokenizer_problems(s3, fields.init_from, fields.train_data_uri, "this run")
    weight_bytes = export_weight_bytes(parameters, str(precision)) if parameters else None
    instance_type, type_problems = evaluation_instance_type(block, fields, rules, trained_on, weight_bytes)
    problems += type_problems
    if problems or instance_type is None:
        return None, problems
    return decided(fields, block, rules, execution, facts, instance_type=instance_type), []


def trained_parameters(s3: Any, facts: Mapping[str, Any]) -> int | None:
    """The parameter count of a finished training job's model: its settings (``HyperParameters``, as the workflow
    rendered them for that run), with the shape of its ``init_from`` folder's config.json when it started from
    one; None when they no longer parse (a job of an older version of the workflow): its evaluation then defaults
    to its own instance type. Another job's settings, not this request's (those are read once, ``value``)."""
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
