"""A corpus of execution inputs, good and bad, and what the request's decision made of each (recorded once).

Every input is run through the decision's entry points: the workflow's Lambda (``request_check.decide``, with S3 in
moto holding the data, the ``init_from`` model folders, earlier runs' checkpoints, evaluation task folders and stored
tuning measurements, and a stub of SageMaker for an evaluation-only request's training job and the training plans),
and the CLI offline (``validate`` and ``plan`` under cdk.json's rules, and ``tune``'s plan for the inputs with a
``tune`` block). What each returned (the whole decision, every problem line, the plan) is kept in
``request_corpus.json``;
``tests/test_request_corpus.py`` runs the corpus again and compares every decision and message with that record.

The record was written by the code before the request was read into one typed value (issue "a request read once"),
so the test shows the new path decides exactly as the old one did. Write it again only on purpose (a deliberate
change of a decision or a message), and say so in the commit::

    PYTHONPATH=$PWD python -m tests.request_corpus --write
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("request_corpus.json")
REGION = "us-west-2"
BUCKET = "corpus-bucket"
OTHER_BUCKET = "corpora-bucket"
"""A second data source of the ``narrow`` deployment (``s3://corpora-bucket/tokens/``)."""
SEGMENT = "Corpus-Workflow"
IMAGE_TAG = "abc123"
IMAGE_URI = f"123456789012.dkr.ecr.{REGION}.amazonaws.com/blackwell-training:{IMAGE_TAG}"
EXECUTION = "run-1"
PLAN_ARN = f"arn:aws:sagemaker:{REGION}:123456789012:training-plan/b200-week"
MLFLOW_ARN = f"arn:aws:sagemaker:{REGION}:123456789012:mlflow-tracking-server/team"
RUNS = f"checkpoints/{SEGMENT}/"
DATA = f"s3://{BUCKET}/data/"
CDK_CONTEXT = {
    "stackName": "BlackwellTraining",
    "region": REGION,
    "maxInstanceCount": 4,
    "maxCapacityRetries": 3,
    "workflowTimeoutHours": 168,
    "defaultInstanceType": "ml.p6-b200.48xlarge",
    "defaultPrecision": "bf16",
    "dataSources": ["data/"],
    "maxKeepAliveSeconds": 3600,
    "remoteDebug": False,
}
"""cdk.json's settings when the corpus was recorded (the CLI's offline rules), fixed here so that a later edit of
cdk.json does not move the record."""


# ----------------------------------------------------------------------------------------------------------------
# The rules: the deployed workflow's (several deployments), and cdk.json's for the CLI offline
# ----------------------------------------------------------------------------------------------------------------


def rules_variants() -> dict[str, Any]:
    from training.request.rules import RequestRules

    base = RequestRules(
        region=REGION,
        bucket_name=BUCKET,
        workflow_segment=SEGMENT,
        image_uri=IMAGE_URI,
        workflow_path="Corpus/W",
    ).with_limits()
    return {
        "base": base,
        "debug": replace(
            base,
            remote_debug=True,
            mlflow_tracking_server_arn=MLFLOW_ARN,
            tags={"team": "ml", "cost-center": "42"},
            max_keep_alive_seconds=600,
        ),
        "kms": replace(base, volume_kms_key=True),
        "narrow": replace(
            base,
            network_isolation=True,
            max_keep_alive_seconds=0,
            allowed_instance_types=("ml.p6-b200.48xlarge", "ml.p5.48xlarge"),
            max_instance_count=2,
            max_runtime_seconds=7 * 24 * 3600,
            defaults={
                "hyperparameters": {"max_steps": "50", "seed": "5"},
                "precision": "mxfp8",
                "job_name_prefix": "team-a",
            },
            data_sources=("data/", "s3://corpora-bucket/tokens/"),
        ),  # fmt: skip
        "untagged": replace(base, image_uri=None, workflow_segment=None),
    }


# ----------------------------------------------------------------------------------------------------------------
# The world the Lambda reads: S3 (moto) and SageMaker (a stub)
# ----------------------------------------------------------------------------------------------------------------

LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "attention_bias": False, "mlp_bias": False,
}  # fmt: skip
"""A config.json of Llama 3.2 1B's architecture."""
FAMILY_CONFIGS = {
    name: json.loads((Path(__file__).parent / "models" / "published" / f"{name}.json").read_text())
    for name in ("qwen2.5-7b", "qwen3-8b", "mistral-7b-v0.3", "gemma3-12b")
}
"""A published config.json of each family besides Llama (``tests/models/published``)."""
LLAMA_8B = {**LLAMA_1B, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "head_dim": 128,
            "rope_scaling": {**LLAMA_1B["rope_scaling"], "factor": 8.0}, "tie_word_embeddings": False}  # fmt: skip


def _record(
    settings: Mapping[str, Any], tps: float, at: str, allocated: float | None, status: str = "ok"
) -> dict:
    """A stored tuning measurement of the base rules' image (its key's settings parsed as the tuning job does)."""
    from training.contract import settings_parse
    from training.plan import measured

    values = settings_parse.parse_hyperparameters(dict(settings))
    key = measured.make_key(values, instance_type="ml.p6-b200.48xlarge", instance_count=1, image_tag=IMAGE_TAG,
                            torch_version="2.9.0", te_version="2.11.0")  # fmt: skip
    figures = {"status": status, "tokens_per_sec_per_gpu": tps, "max_allocated_gb": allocated,
               "step_seconds": {"steps": 20, "median": 1.0, "p10": 0.98, "p90": 1.03}}  # fmt: skip
    where = {"device": "cuda", "gpu": "B200", "world_size": 8, "job": "tune-job-1", "measured_at": at}
    return measured.make_record(key, figures, where)


def world_objects() -> dict[str, bytes]:
    """Every object of the corpus bucket, by key."""
    objects: dict[str, bytes] = {
        "data/tokens/train.bin": b"t" * 64,
        "data/words/train.bin": b"t" * 64,
        "data/words/tokenizer.json": b"{}",
        "data/words/metadata.json": json.dumps(
            {"tokenizer": {"kind": "tokenizers", "file": "tokenizer.json"}}
        ).encode(),
        "data/bytes/train.bin": b"t",
        "data/bytes/metadata.json": json.dumps({"tokenizer": {"kind": "byte-level UTF-8"}}).encode(),
        "data/tasks/piqa.yaml": b"task: piqa\ndataset_path: json\n",
        "data/tasks/group.yaml": b"group: mine\ntask:\n  - piqa\ntag:\n  - reasoning\n  - easy\n",
        "data/empty-tasks/readme.txt": b"no tasks",
        "data/tasks/team-b/secret.yaml": b"task: team_b_secret\n",  # below the task folder: never read nor named
    }
    for name, config in (("llama-1b", LLAMA_1B), ("llama-8b", LLAMA_8B)):
        objects[f"data/{name}/config.json"] = json.dumps(config).encode()
        objects[f"data/{name}/model.safetensors"] = b"w"
        objects[f"data/{name}/tokenizer.json"] = b"{}"
    folders = {
        "no-weights": (LLAMA_1B, False),
        "mistral": ({**LLAMA_1B, "model_type": "mistral"}, True),
        "biased": ({**LLAMA_1B, "attention_bias": True}, True),
        "yarn": ({**LLAMA_1B, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, True),
        "bare": (LLAMA_1B, True),
        **{name: (config, True) for name, config in FAMILY_CONFIGS.items()},
    }
    for name, (config, weights) in folders.items():
        objects[f"data/{name}/config.json"] = json.dumps(config).encode()
        if weights:
            objects[f"data/{name}/model-00001-of-00002.safetensors"] = b"w"
    objects["data/half/config.json"] = json.dumps(LLAMA_1B).encode()
    objects["data/half/model.safetensors"] = b"w"
    objects["data/half/tokenizer_config.json"] = b"{}"
    objects["data/no-config/model.safetensors"] = b"w"
    objects["data/bad-json/config.json"] = b"{not json"
    objects["data/bad-json/model.safetensors"] = b"w"
    for run, steps in (("earlier", (100, 200)), ("sealed-once", (50,)), ("damaged", (300,))):
        for step in steps:
            folder = f"{RUNS}{run}/step_{step:08d}/"
            objects[f"{folder}shard-0.pt"] = b"x" * 10
            objects[f"{folder}COMPLETE"] = json.dumps({"files": {"shard-0.pt": 10}}).encode()
    objects[f"{RUNS}damaged/step_00000300.unusable"] = b"{}"
    objects[f"{RUNS}unsealed/step_00000400/shard-0.pt"] = b"x"
    records = [
        _record({"precision": "bf16", "batch_size": 4, "seq_length": 8192, "activation_checkpointing": "full"},
                31_000.0, "2026-11-20T10:00:00+00:00", 60.0),
        _record({"precision": "bf16", "batch_size": 2, "seq_length": 8192, "activation_checkpointing": "none"},
                24_000.0, "2026-11-20T10:05:00+00:00", 45.0),
        _record({"precision": "mxfp8", "batch_size": 16, "seq_length": 8192, "activation_checkpointing": "full"},
                52_000.0, "2026-11-20T10:10:00+00:00", 120.0),
        _record({"precision": "bf16", "batch_size": 32, "seq_length": 8192, "activation_checkpointing": "none"},
                0.0, "2026-11-20T10:15:00+00:00", None, status="oom"),
    ]  # fmt: skip
    objects[f"tuning/measurements/{IMAGE_TAG}/{SEGMENT}/tune-1.json"] = json.dumps(
        {"records": records}
    ).encode()
    objects[f"tuning/measurements/{IMAGE_TAG}/{SEGMENT}/not-records.json"] = b"[1, 2]"
    return objects


def _job(name: str, **changes: Any) -> dict[str, Any]:
    job = {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{name}",
        "TrainingJobStatus": "Completed",
        "CheckpointConfig": {"S3Uri": f"s3://{BUCKET}/{RUNS}{name}-run/"},
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://{BUCKET}/output/{name}/output/model.tar.gz"},
        "ResourceConfig": {"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 1},
        "HyperParameters": {"precision": "bf16", "batch_size": "4", "dataset": "channel", "max_steps": "100",
                            "checkpoint_dir": "/opt/ml/checkpoints", "model_dir": "/opt/ml/model"},
        "InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {"S3Uri": f"{DATA}words/"}}}],
    }  # fmt: skip
    job.update(changes)
    return job


TRAINING_JOBS = {
    "done-job": _job("done-job"),
    "big-job": _job(
        "big-job", HyperParameters={"model_preset": "32b", "precision": "bf16", "dataset": "channel"}
    ),
    "old-job": _job("old-job", HyperParameters={"model_preset": "1b", "no_such_setting": "1"}),
    "failed-job": _job("failed-job", TrainingJobStatus="Failed"),
    "nope-job": _job("nope-job", HyperParameters={"position_encoding": "none"}),
    "synthetic-job": _job("synthetic-job", InputDataConfig=[]),
    "foreign-job": _job("foreign-job", CheckpointConfig={"S3Uri": "s3://elsewhere/checkpoints/x/"}),
    "tune-job": _job(
        "tune-job", HyperParameters={"precision": "bf16", "tune_trials": "batch_size=1;batch_size=2"}
    ),
    "init-job": _job(
        "init-job",
        HyperParameters={"precision": "bf16", "init_from": "/opt/ml/input/data/weights"},
        InputDataConfig=[
            {"ChannelName": "weights", "DataSource": {"S3DataSource": {"S3Uri": f"{DATA}llama-8b/"}}}
        ],
    ),
}
"""The finished training jobs an evaluation-only request may name (``DescribeTrainingJob``'s answers)."""


def _plan(arn: str, instance_type: str, count: int, status: str = "Active", **changes: Any) -> dict[str, Any]:
    capacity = {"ReservedCapacityArn": arn.replace("training-plan/", "reserved-capacity/"),
                "InstanceType": instance_type, "TotalInstanceCount": count, "Status": status}  # fmt: skip
    return {"TrainingPlanArn": arn, "TrainingPlanName": arn.rsplit("/", 1)[-1], "Status": status,
            "TotalInstanceCount": count, "TargetResources": ["training-job"],
            "ReservedCapacitySummaries": [capacity], **changes}  # fmt: skip


TWO_NODE_PLAN = PLAN_ARN.replace("b200-week", "b200-two")
TRAINING_PLANS = {
    PLAN_ARN: _plan(PLAN_ARN, "ml.p6-b200.48xlarge", 4),
    TWO_NODE_PLAN: _plan(TWO_NODE_PLAN, "ml.p6-b200.48xlarge", 2, "Scheduled"),
    PLAN_ARN.replace("b200-week", "h100-week"): _plan(
        PLAN_ARN.replace("b200-week", "h100-week"), "ml.p5.48xlarge", 4
    ),
    PLAN_ARN.replace("b200-week", "ended"): _plan(
        PLAN_ARN.replace("b200-week", "ended"), "ml.p6-b200.48xlarge", 4, "Expired"
    ),
    PLAN_ARN.replace("b200-week", "hyperpod"): _plan(
        PLAN_ARN.replace("b200-week", "hyperpod"),
        "ml.p6-b200.48xlarge",
        4,
        TargetResources=["hyperpod-cluster"],
    ),
}
"""The account's training plans (``DescribeTrainingPlan``'s answers; the corpus's recorded inputs name the first)."""


class SageMakerStub:
    """``describe_training_job`` over :data:`TRAINING_JOBS` and ``describe_training_plan`` over
    :data:`TRAINING_PLANS` (SageMaker's ValidationException, and ResourceNotFound, for any other)."""

    def describe_training_plan(self, TrainingPlanName: str) -> dict[str, Any]:  # noqa: N803 - boto3's name
        from botocore.exceptions import ClientError

        if TrainingPlanName not in TRAINING_PLANS:
            error = {"Error": {"Code": "ResourceNotFound", "Message": "Training plan not found."}}
            raise ClientError(error, "DescribeTrainingPlan")  # type: ignore[arg-type]
        return json.loads(json.dumps(TRAINING_PLANS[TrainingPlanName]))

    def describe_training_job(self, TrainingJobName: str) -> dict[str, Any]:  # noqa: N803 - boto3's name
        from botocore.exceptions import ClientError

        if TrainingJobName not in TRAINING_JOBS:
            error = {"Error": {"Code": "ValidationException", "Message": "Requested resource not found."}}
            raise ClientError(error, "DescribeTrainingJob")  # type: ignore[arg-type]
        return json.loads(json.dumps(TRAINING_JOBS[TrainingJobName]))


@contextmanager
def world() -> Iterator[Any]:
    """moto's S3 with the corpus bucket and its objects; yields the client."""
    from moto import mock_aws

    with mock_aws():
        import boto3

        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        for key, body in world_objects().items():
            s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        s3.create_bucket(Bucket=OTHER_BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        s3.put_object(Bucket=OTHER_BUCKET, Key="tokens/web/train.bin", Body=b"t")
        yield s3


# ----------------------------------------------------------------------------------------------------------------
# The inputs
# ----------------------------------------------------------------------------------------------------------------

SEED = {"precision": "mxfp8", "batch_size": 16, "activation_checkpointing": True, "max_runtime_seconds": 14400,
        "job_name_prefix": "llama-1b-mxfp8", "hyperparameters": {"max_steps": "2000"}}  # fmt: skip
EIGHT_B = {"hyperparameters": {"model_preset": "8b"}, "batch_size": 8, "seq_length": 8192}
TASKS = {"task_data_uri": f"{DATA}tasks/", "tasks": ["piqa"]}
WORDS = f"{DATA}words/"


def _cases() -> list[tuple[str, Any, dict[str, Any]]]:
    """(name, execution input, options): ``rules`` (a key of :func:`rules_variants`, default ``base``);
    ``deployed``: also through the CLI's plan (and tune plan) with the deployed rules and S3; ``execution``: the
    execution's name (default ``EXECUTION``)."""
    c: list[tuple[str, Any, dict[str, Any]]] = []

    def add(name: str, raw: Any, **options: Any) -> None:
        c.append((name, raw, options))

    # -- the input as a whole; unknown fields --------------------------------------------------------------------
    for name, raw in (("list", []), ("text", "text"), ("number", 3), ("null", None), ("bool", True)):
        add(f"input-{name}", raw)
    add("empty", {})
    add("unknown-close", {"instance_typ": "ml.p5.48xlarge"})
    add("unknown-far", {"nope": 1, "precison": "bf16"})
    add("every-problem-at-once", {"batch_size": 0, "precision": "x", "nope": 1})
    # -- each field's own check ------------------------------------------------------------------------------------
    for field, values in {
        "precision": ["x", 16, "MXFP8"],
        "num_layers": [0, "4", 2.5, 100_000],
        "batch_size": [0, -1, "1", True, 4097],
        "seq_length": [0, "8192", 1.0],
        "activation_checkpointing": ["sometimes", 1, "selective", False],
        "instance_type": ["ml.g5.xlarge", 5, "ml.p5.4xlarge"],
        "instance_count": [0, 5, "2", 2],
        "training_plan_arn": ["plan", "arn:aws:sagemaker:eu-west-1:123456789012:training-plan/x", PLAN_ARN],
        "use_spot": ["yes", 1],
        "max_runtime_seconds": [0, 28 * 24 * 3600 + 1, "3600"],
        "max_wait_seconds": [0, "x"],
        "hyperparameters": ["max_steps=5", [], {"max_steps": [5]}, {"learning_rate": math.inf}, {"seed": None}],
        "job_name_prefix": ["", "-lead", "has space", "a" * 27, "a" * 26],
        "train_data_uri": ["s3://other/data/x/", f"s3://{BUCKET}/checkpoints/x/", f"{DATA}x", "https://x/data/y/",
                           f"{DATA}/x/", f"{DATA}../checkpoints/", 5],
        "train_data_input_mode": ["Pipe", "file", "File"],
        "resume_from": ["has space", "", "a" * 81],
        "init_from": ["s3://elsewhere/models/llama/", f"{DATA}model"],
        "keep_alive_seconds": [-1, 3601, "60"],
        "infra_check": ["true", None],
        "tags": ["team=ml", {"team": 5}, {"aws:x": "1"}, {"training-workflow": "x"}, {"bad key!": "v"},
                 {"k": "v" * 300}, {f"k{i}": "v" for i in range(48)}],
        "remote_debug": ["yes", True],
        "environment": ["NCCL_DEBUG=INFO", {"NCCL_DEBUG": 1}, {"FOO": "1"}, {"NVTE_FRAMEWORK": "jax"},
                        {"CUDA_VISIBLE_DEVICES": "0"}, {"NCCL_X": "v" * 600}, {f"NCCL_X{i}": "1" for i in range(101)},
                        {"nccl_debug": "INFO"}, {"CUDA_INJECTION64_PATH": "/opt/ml/input/data/train/x.so"},
                        {"NCCL_NET_PLUGIN": "/opt/ml/input/data/train/x.so", "FI_PROVIDER_PATH": "/opt/ml/input/data"},
                        {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "NCCL_NEW_PLUGIN": "x", "NCCL_DEBUG": "INFO"}],
        "ignore_memory_estimate": [1, "true"],
        "evaluate": ["yes", 5],
        "tune": ["yes", []],
    }.items():  # fmt: skip
        for index, value in enumerate(values):
            add(f"field-{field}-{index}", {field: value})
    # -- cross-field rules ----------------------------------------------------------------------------------------
    add("cross-warm-pool-and-spot", {"keep_alive_seconds": 60, "use_spot": True})
    add("cross-kms-and-instance-storage", {"instance_type": "ml.p5.48xlarge"}, rules="kms")
    add("cross-kms-b200", {}, rules="kms")
    add("cross-kms-p4d", {"instance_type": "ml.p4d.24xlarge"}, rules="kms")
    add("cross-precision-on-hopper", {"precision": "mxfp8", "instance_type": "ml.p5.48xlarge"})
    add("cross-nvfp4-on-a100", {"precision": "nvfp4", "instance_type": "ml.p4d.24xlarge"})
    add("cross-spot-and-plan", {"use_spot": True, "training_plan_arn": PLAN_ARN})
    add("cross-wait-without-spot", {"max_wait_seconds": 7200})
    add("cross-wait-below-runtime", {"use_spot": True, "max_wait_seconds": 60, "max_runtime_seconds": 3600})
    add("cross-spot-wait-default", {"use_spot": True, "max_runtime_seconds": 7200})
    add("cross-spot-wait-given", {"use_spot": True, "max_wait_seconds": 9000, "max_runtime_seconds": 7200})
    add("cross-and-field", {"use_spot": True, "training_plan_arn": PLAN_ARN, "batch_size": 0})
    # -- the trainer's settings -----------------------------------------------------------------------------------
    hp = {
        "unknown": {"max_step": "5"},
        "unknown-two": {"max_step": "5", "lerning_rate": "1"},
        "issue-examples": {"max_step": "5", "max_steps": "-5", "model_preset": "2b", "learning_rate": "fast"},
        "platform": {"checkpoint_dir": "/x", "model_dir": "/y"},
        "input-field": {"init_from": "/opt/x"},
        "top-level": {"precision": "bf16", "batch-size": "4"},
        "twice": {"max_steps": "5", "max-steps": "6"},
        "spellings": {"learning-rate": 0.001, "SEED": 7, "--max_steps": "10"},
        "numbers-and-bools": {"learning_rate": 3e-4, "seed": 7, "compile": False, "master_weights": True},
        "num-heads-divide": {"num_heads": "7"},
        "head-dim": {"num_heads": "512"},
        "quantized-init": {"quantized_model_init": "true"},
        "custom-needs-dims": {"model_preset": "custom"},
        "custom-dims": {"model_preset": "custom", "num_layers_": "2"},
        "custom-complete": {"model_preset": "custom", "hidden_size": "512", "num_heads": "8",
                            "ffn_hidden_size": "1024", "vocab_size": "32000", "max_steps": "100"},
        "accum-zero": {"grad_accum_steps": 0},
        "ac-interval": {"activation_checkpointing_interval": 17},
        "compile-bad": {"compile": "always"},
        "kv-heads": {"num_kv_heads": "3"},
        "rope-scaling-none-param": {"rope_scaling_factor": "8"},
        "rope-llama3-missing": {"rope_scaling": "llama3"},
        "rope-nope": {"rope_scaling": "llama3", "position_encoding": "none"},
        "llama-preset": {"model_preset": "llama3.2-1b"},
        "long-value": {"run_name": "x" * 3000},
        "dataset-channel-no-data": {"dataset": "channel"},
        "lr-schedule": {"lr_schedule": "cosine", "lr_warmup_steps": "10", "max_steps": "100"},
        "loss-chunk-off": {"loss_chunk_tokens": "0"},
        "levers": {"grad_accum_steps": "4", "adamw_impl": "foreach", "attention_backend": "flash"},
    }  # fmt: skip
    for name, settings in hp.items():
        add(f"hp-{name}", {"hyperparameters": settings})
    add("hp-with-bad-fields", {"precision": "x", "hyperparameters": {"max_step": "5", "learning_rate": "fast",
                                                                     "checkpoint_dir": "/x"}})  # fmt: skip
    add("hp-bad-shape-and-settings", {"hyperparameters": {"max_steps": [1]}, "batch_size": 0})
    add(
        "hp-compile-fp8",
        {"precision": "fp8", "instance_type": "ml.p5.48xlarge", "hyperparameters": {"compile": "true"}},
    )
    add("hp-selective-mxfp8", {"precision": "mxfp8", "activation_checkpointing": "selective"})
    add(
        "hp-masters",
        {"precision": "mxfp8", "hyperparameters": {"quantized_model_init": True, "master_weights": False}},
    )
    add("hp-quantized-ok", {"precision": "mxfp8", "activation_checkpointing": True,
                            "hyperparameters": {"quantized_model_init": True}})  # fmt: skip
    add("hp-fp8-dims-blackwell", {"precision": "fp8", "seq_length": 4112, "batch_size": 1})
    add(
        "hp-fp8-dims-hopper",
        {"precision": "fp8", "seq_length": 4112, "batch_size": 1, "instance_type": "ml.p5.48xlarge"},
    )
    add(
        "hp-nvfp4-blocks",
        {"precision": "nvfp4", "num_layers": 2, "hyperparameters": {"nvfp4_bf16_blocks": "1"}},
    )
    add(
        "hp-synthetic-with-data",
        {"train_data_uri": f"{DATA}tokens/", "hyperparameters": {"dataset": "synthetic"}},
    )
    add("hp-defaults-merge", {"hyperparameters": {"seed": "6"}}, rules="narrow")
    add("hp-defaults-bad", {"hyperparameters": {"max_steps": "0"}}, rules="narrow")
    add("hp-too-many", {"hyperparameters": {f"x{i}": "1" for i in range(101)}})
    # -- the memory plan ------------------------------------------------------------------------------------------
    add("plan-seed", SEED, deployed=True)
    add("plan-8b-no-ac", EIGHT_B, deployed=True)
    add("plan-8b-ignored", {**EIGHT_B, "ignore_memory_estimate": True})
    add("plan-64b-hopper", {"hyperparameters": {"model_preset": "64b"}, "instance_type": "ml.p5.48xlarge"})
    add(
        "plan-64b-two",
        {"hyperparameters": {"model_preset": "64b"}, "instance_count": 2, "activation_checkpointing": True},
    )
    add(
        "plan-runtime-warning",
        {**SEED, "max_runtime_seconds": 60, "hyperparameters": {"max_steps": "100000"}},
    )
    add("plan-fp32", {"precision": "fp32", "batch_size": 2})
    add("plan-nvfp4", {"precision": "nvfp4", "batch_size": 4, "activation_checkpointing": "full"})
    add("plan-selective", {"batch_size": 4, "activation_checkpointing": "selective"})
    add("plan-levers", {"batch_size": 2, "hyperparameters": {"grad_accum_steps": "8", "activation_checkpointing_interval": "2",
                                                             "adamw_impl": "foreach", "loss_chunk_tokens": "0"},
                        "activation_checkpointing": "full"})  # fmt: skip
    add("plan-a100", {"instance_type": "ml.p4d.24xlarge", "batch_size": 2})
    add("plan-b300", {"instance_type": "ml.p6-b300.48xlarge", "precision": "mxfp8", "batch_size": 8})
    add("plan-gb200", {"instance_type": "ml.p6e-gb200.36xlarge", "batch_size": 2})
    add("plan-nope", {"hyperparameters": {"position_encoding": "none"}})
    add(
        "plan-measured",
        {"precision": "bf16", "batch_size": 4, "seq_length": 8192, "activation_checkpointing": True},
        deployed=True,
    )
    add(
        "plan-measured-untagged",
        {"precision": "bf16", "batch_size": 4, "activation_checkpointing": True},
        rules="untagged",
        deployed=True,
    )
    add(
        "plan-measured-mxfp8",
        {"precision": "mxfp8", "batch_size": 16, "activation_checkpointing": True},
        deployed=True,
    )
    add("plan-narrow-defaults", {}, rules="narrow")
    add("plan-math-attention", {"batch_size": 4, "hyperparameters": {"attention_backend": "math"}})
    add("plan-math-attention-ac", {"batch_size": 4, "activation_checkpointing": True,
                                   "hyperparameters": {"attention_backend": "math"}})  # fmt: skip
    add("plan-one-step-too-long", {"hyperparameters": {"grad_accum_steps": "65536"}})
    add(
        "plan-one-step-fits",
        {"hyperparameters": {"grad_accum_steps": "65536"}, "max_runtime_seconds": 26 * 3600},
    )
    add("hp-fp8-mxfp8-recipe-hopper", {"precision": "fp8", "instance_type": "ml.p5.48xlarge",
                                       "hyperparameters": {"fp8_recipe": "mxfp8"}})  # fmt: skip
    add("hp-fp8-mxfp8-recipe-blackwell", {"precision": "fp8", "hyperparameters": {"fp8_recipe": "mxfp8"}})
    add(
        "plan-narrow-count",
        {"instance_count": 3, "hyperparameters": {"model_preset": "64b"}},
        rules="narrow",
        deployed=True,
    )
    # -- data, warm pools, tags, environment, remote debugging, plans --------------------------------------------
    add("data-holds-tokens", {"train_data_uri": f"{DATA}tokens/"})
    add("data-empty", {"train_data_uri": f"{DATA}nothing/"}, deployed=True)
    add("data-file-mode", {"train_data_uri": f"{DATA}tokens/", "train_data_input_mode": "File"})
    add("data-other-source", {"train_data_uri": "s3://corpora-bucket/tokens/web/"}, rules="narrow")
    add("warm-pool", {"keep_alive_seconds": 600, "infra_check": True})
    add("warm-pool-off", {"keep_alive_seconds": 60}, rules="narrow")
    add(
        "tags-and-env",
        {"tags": {"team": "ml", "project": "b200 tests"}, "environment": {"NCCL_DEBUG": "INFO"}},
    )
    add("tags-reserved-by-rules", {"tags": {"team": "x"}}, rules="debug")
    add("mlflow-environment", {"environment": {"NCCL_DEBUG": "INFO", "TORCH_LOGS": "+dynamo"}}, rules="debug")
    add("mlflow-environment-room", {"environment": {f"NCCL_X{i}": "1" for i in range(98)}}, rules="debug")
    add("remote-debug-allowed", {"remote_debug": True}, rules="debug")
    add("remote-debug-isolated", {"remote_debug": True}, rules="narrow")
    add("training-plan", {"training_plan_arn": PLAN_ARN, "max_runtime_seconds": 3600})
    # the plan as DescribeTrainingPlan describes it, before launch (added with the multi-node request check)
    add("training-plan-two-nodes", {"training_plan_arn": TWO_NODE_PLAN, "instance_count": 2})
    add("training-plan-too-few", {"training_plan_arn": TWO_NODE_PLAN, "instance_count": 4})
    add("training-plan-other-type", {"training_plan_arn": PLAN_ARN.replace("b200-week", "h100-week")})
    add("training-plan-expired", {"training_plan_arn": PLAN_ARN.replace("b200-week", "ended")})
    add("training-plan-hyperpod", {"training_plan_arn": PLAN_ARN.replace("b200-week", "hyperpod")})
    add("training-plan-unknown", {"training_plan_arn": PLAN_ARN.replace("b200-week", "nowhere")})
    add("training-plan-eval-only", {"evaluate": {**TASKS, "training_job": "done-job"},
                                    "training_plan_arn": PLAN_ARN.replace("b200-week", "h100-week")})  # fmt: skip
    add("job-name-prefix", {"job_name_prefix": "llama-8b-test"})
    add("narrow-instance", {"instance_type": "ml.p5e.48xlarge"}, rules="narrow")
    # -- resume_from ------------------------------------------------------------------------------------------------
    add("resume-none", {"resume_from": "no-such-run"}, deployed=True)
    add("resume-too-few-steps", {"resume_from": "earlier", "hyperparameters": {"max_steps": "200"}})
    add("resume-ok", {"resume_from": "earlier", "hyperparameters": {"max_steps": "300"}})
    add("resume-default-steps", {"resume_from": "sealed-once"})
    add("resume-set-aside", {"resume_from": "damaged", "hyperparameters": {"max_steps": "1000"}})
    add("resume-unsealed", {"resume_from": "unsealed"})
    add("resume-self", {"resume_from": EXECUTION})
    add("resume-and-bad-field", {"resume_from": "earlier", "batch_size": 0})
    # -- the run's name: its checkpoint folder -------------------------------------------------------------------------
    add("name-reused", {"hyperparameters": {"max_steps": "300"}}, execution="earlier")
    add("name-reused-continued", {"resume_from": "earlier", "hyperparameters": {"max_steps": "300"}},
        execution="earlier")  # fmt: skip
    add("name-reused-tuning", {"batch_size": 8, "tune": {"max_trials": 1}}, execution="earlier")
    add(
        "name-reused-evaluation-only",
        {"evaluate": {**TASKS, "training_job": "done-job"}},
        execution="earlier",
    )
    add("name-dot-dot", {}, execution="..")
    add("name-with-dot", {}, execution="run.1")
    # -- init_from --------------------------------------------------------------------------------------------------
    add("init-1b", {"init_from": f"{DATA}llama-1b/", "activation_checkpointing": True}, deployed=True)
    add(
        "init-8b",
        {"init_from": f"{DATA}llama-8b/", "activation_checkpointing": True, "batch_size": 2},
        deployed=True,
    )
    add("init-8b-too-big", {"init_from": f"{DATA}llama-8b/", "batch_size": 8}, deployed=True)
    add("init-contradicts", {"init_from": f"{DATA}llama-1b/", "num_layers": 4}, deployed=True)
    add("init-contradicts-kv", {"init_from": f"{DATA}llama-1b/", "hyperparameters": {"num_kv_heads": "32"}})
    add(
        "init-preset-matches",
        {"init_from": f"{DATA}llama-1b/", "hyperparameters": {"model_preset": "llama3.2-1b"}},
    )
    add("init-preset-differs", {"init_from": f"{DATA}llama-1b/", "hyperparameters": {"model_preset": "8b"}})
    for name in ("nothing", "no-config", "no-weights", "bad-json", "mistral", "biased", "yarn"):
        add(f"init-{name}", {"init_from": f"{DATA}{name}/"}, deployed=True)
    add("init-bad-folder-and-field", {"init_from": f"{DATA}mistral/", "batch_size": 0})
    add("init-with-data", {"init_from": f"{DATA}llama-1b/", "train_data_uri": WORDS})
    add("init-fp8-dims", {"init_from": f"{DATA}llama-1b/", "precision": "mxfp8", "seq_length": 4112})
    # each family's folder: planned with its own shape; the TE precisions refused where TE cannot be its block
    for name in FAMILY_CONFIGS:
        add(f"init-{name}", {"init_from": f"{DATA}{name}/", "activation_checkpointing": True}, deployed=True)
    add("init-qwen2.5-7b-mxfp8", {"init_from": f"{DATA}qwen2.5-7b/", "precision": "mxfp8"}, deployed=True)
    add("init-gemma3-12b-fp8", {"init_from": f"{DATA}gemma3-12b/", "precision": "fp8"}, deployed=True)
    add("init-qwen3-8b-mxfp8", {"init_from": f"{DATA}qwen3-8b/", "precision": "mxfp8",
                                "activation_checkpointing": True})  # fmt: skip
    add(
        "preset-qwen2.5-72b-nvfp4", {"precision": "nvfp4", "hyperparameters": {"model_preset": "qwen2.5-72b"}}
    )
    add("preset-gemma3-27b-bf16", {"activation_checkpointing": True, "instance_count": 2,
                                   "hyperparameters": {"model_preset": "gemma3-27b"}})  # fmt: skip
    add("preset-mistral-mxfp8", {"precision": "mxfp8", "activation_checkpointing": True,
                                 "hyperparameters": {"model_preset": "mistral-7b-v0.3"}})  # fmt: skip
    # -- evaluate ---------------------------------------------------------------------------------------------------
    add("eval-ok", {"train_data_uri": WORDS, "evaluate": TASKS})
    add("eval-defaults-offline", {"train_data_uri": WORDS, "evaluate": {"task_data_uri": f"{DATA}tasks/"}})
    add(
        "eval-group-tag",
        {"train_data_uri": WORDS, "evaluate": {**TASKS, "tasks": ["mine", "reasoning", "easy"]}},
    )
    add("eval-group", {"train_data_uri": WORDS, "evaluate": {**TASKS, "tasks": ["mine", "reasoning"]}})
    add("eval-unknown-task", {"train_data_uri": WORDS, "evaluate": {**TASKS, "tasks": ["piqa", "mmlu"]}})
    add(
        "eval-empty-folder",
        {"train_data_uri": WORDS, "evaluate": {**TASKS, "task_data_uri": f"{DATA}empty-tasks/"}},
    )
    add("eval-unknown-field", {"train_data_uri": WORDS, "evaluate": {**TASKS, "shots": 5, "seed": 1}})
    add("eval-bad-fields", {"train_data_uri": WORDS, "evaluate": {"tasks": ["a b"], "task_data_uri": "s3://x/y/",
                                                                  "limit": 0, "batch_size": 5000,
                                                                  "max_runtime_seconds": 0,
                                                                  "instance_type": "ml.g5.xlarge",
                                                                  "training_job": "bad name!"}})  # fmt: skip
    add(
        "eval-task-folder-is-the-data-prefix",
        {"train_data_uri": WORDS, "evaluate": {**TASKS, "task_data_uri": DATA}},
    )
    add("eval-tasks-duplicate", {"train_data_uri": WORDS, "evaluate": {**TASKS, "tasks": ["piqa", "piqa"]}})
    add("eval-limit", {"train_data_uri": WORDS, "evaluate": {**TASKS, "limit": 100, "batch_size": 32}})
    add("eval-synthetic", {"evaluate": TASKS})
    add("eval-bytes", {"train_data_uri": f"{DATA}bytes/", "evaluate": TASKS})
    add("eval-no-metadata", {"train_data_uri": f"{DATA}tokens/", "evaluate": TASKS})
    add(
        "eval-nope",
        {"train_data_uri": WORDS, "evaluate": TASKS, "hyperparameters": {"position_encoding": "none"}},
    )
    add("eval-plan-other-type", {"train_data_uri": WORDS, "training_plan_arn": PLAN_ARN,
                                 "evaluate": {**TASKS, "instance_type": "ml.p5.4xlarge"}})  # fmt: skip
    add("eval-plan-same-type", {"train_data_uri": WORDS, "training_plan_arn": PLAN_ARN,
                                "evaluate": {**TASKS, "instance_type": "ml.p6-b200.48xlarge"}})  # fmt: skip
    add("eval-32b", {"train_data_uri": WORDS, "evaluate": TASKS, "ignore_memory_estimate": True,
                     "hyperparameters": {"model_preset": "32b"}})  # fmt: skip
    add("eval-70b-one-gpu", {"train_data_uri": WORDS, "ignore_memory_estimate": True,
                             "hyperparameters": {"model_preset": "llama3.1-70b"},
                             "evaluate": {**TASKS, "instance_type": "ml.p5.4xlarge"}})  # fmt: skip
    add("eval-narrow", {"train_data_uri": WORDS, "evaluate": TASKS}, rules="narrow")
    add(
        "eval-tags-room",
        {"train_data_uri": WORDS, "evaluate": TASKS, "tags": {f"k{i}": "x" for i in range(48)}},
    )
    add("eval-env-room", {"train_data_uri": WORDS, "evaluate": TASKS,
                          "environment": {f"NCCL_{i}": "x" for i in range(100)}})  # fmt: skip
    add("eval-debug-env", {"train_data_uri": WORDS, "evaluate": TASKS, "environment": {"NCCL_DEBUG": "INFO"},
                           "tags": {"run": "a"}}, rules="debug")  # fmt: skip
    for init in ("llama-1b", "bare", "half"):
        for data in (None, "bytes", "words"):
            raw: dict[str, Any] = {"init_from": f"{DATA}{init}/", "evaluate": TASKS}
            if data:
                raw["train_data_uri"] = f"{DATA}{data}/"
            add(f"eval-init-{init}-{data or 'synthetic'}", raw)
    for job in (*TRAINING_JOBS, "missing-job"):
        add(f"eval-only-{job}", {"evaluate": {**TASKS, "training_job": job}})
    add("eval-only-with-training-fields", {"evaluate": {**TASKS, "training_job": "done-job"}, "batch_size": 4,
                                           "hyperparameters": {}})  # fmt: skip
    add("eval-only-with-its-fields", {"evaluate": {**TASKS, "training_job": "done-job"}, "job_name_prefix": "ev",
                                      "tags": {"a": "b"}, "use_spot": True})  # fmt: skip
    add("eval-only-plan", {"evaluate": {**TASKS, "training_job": "done-job"}, "training_plan_arn": PLAN_ARN})
    add(
        "eval-only-instance",
        {"evaluate": {**TASKS, "training_job": "big-job", "instance_type": "ml.p5.4xlarge"}},
    )
    # -- tune -------------------------------------------------------------------------------------------------------
    base = {
        "precision": "bf16",
        "seq_length": 8192,
        "batch_size": 64,
        "hyperparameters": {"max_steps": "1000"},
    }
    tunes = {
        "defaults": {},
        "small": {"search_space": {"batch_size": [1, 2, 4], "activation_checkpointing": ["full"]}, "max_trials": 3},
        "precisions": {"search_space": {"precision": ["bf16", "mxfp8", "nvfp4"], "batch_size": [8, 16]}},
        "levers": {"search_space": {"batch_size": [4, 8], "compile": ["true", "false"], "attention_backend": ["auto", "flash"],
                                    "loss_chunk_tokens": [0, 2048]}},
        "fp8-recipes": {"search_space": {"precision": ["fp8"], "fp8_recipe": ["auto", "current", "mxfp8"],
                                         "quantized_model_init": [True, False]}},
        "seq": {"search_space": {"seq_length": [4096, 8192, 4112], "batch_size": [8]}},
        "not-dividing": {"search_space": {"batch_size": [3, 5]}},
        "no-probe": {"probe_memory_edge": False, "max_trials": 2},
        "cost-bounded": {"max_cost_usd": 300},
        "cost-too-small": {"max_cost_usd": 1},
        "convergence": {"max_trials": 4, "convergence": {"precisions": ["mxfp8"], "steps": 50}},
        "convergence-bad": {"convergence": {"precisions": ["bf16"], "reference": "fp64", "steps": 5}},
        "convergence-shape": {"convergence": "yes"},
        "empty-space": {"search_space": {}},
        "unknown-setting": {"search_space": {"learning_rate": [1e-4]}},
        "empty-values": {"search_space": {"batch_size": []}},
        "bad-values": {"search_space": {"batch_size": [0]}},
        "unknown-field": {"trials": 3},
        "bad-fields": {"max_trials": 0, "cv_target": -1, "max_cost_usd": 0, "probe_memory_edge": "yes",
                       "warmup_steps": 1.5},
        "window": {"window_steps": 20, "max_measured_steps": 10},
        "long-trials": {"max_trials": 32, "search_space": {"batch_size": [1, 2, 4, 8, 16, 32, 64],
                                                           "activation_checkpointing": ["none", "full", "selective"],
                                                           "attention_backend": ["auto", "flash", "cudnn", "math"]}},
    }  # fmt: skip
    for name, block in tunes.items():
        add(
            f"tune-{name}",
            {**base, "tune": block},
            deployed=name in ("defaults", "cost-bounded", "convergence"),
        )
    add("tune-hopper-precision", {**base, "instance_type": "ml.p5.48xlarge",
                                  "tune": {"search_space": {"precision": ["mxfp8"]}}})  # fmt: skip
    add("tune-hopper-defaults", {**base, "instance_type": "ml.p5.48xlarge", "tune": {"max_trials": 4}})
    add("tune-64b-nothing-fits", {**base, "batch_size": 128, "hyperparameters": {"model_preset": "64b"},
                                  "tune": {"search_space": {"batch_size": [64, 128], "activation_checkpointing": ["none"]}}})  # fmt: skip
    add("tune-accum-base", {**base, "batch_size": 8, "hyperparameters": {"grad_accum_steps": "4"},
                            "tune": {"search_space": {"batch_size": [1, 2, 32]}}})  # fmt: skip
    add("tune-measured", {"precision": "bf16", "batch_size": 4, "seq_length": 8192, "activation_checkpointing": True,
                          "tune": {"search_space": {"batch_size": [2, 4], "activation_checkpointing": ["none", "full"]}}},
        deployed=True)  # fmt: skip
    add("tune-b300-cost", {**base, "instance_type": "ml.p6-b300.48xlarge", "tune": {"max_cost_usd": 100}})
    add("tune-and-evaluate", {**base, "train_data_uri": WORDS, "tune": {}, "evaluate": TASKS})
    add("tune-and-resume", {**base, "resume_from": "earlier", "tune": {}}, deployed=True)
    add("tune-init-from", {**base, "batch_size": 2, "init_from": f"{DATA}llama-1b/",
                           "tune": {"search_space": {"batch_size": [1, 2]}}}, deployed=True)  # fmt: skip
    add("tune-and-bad-field", {**base, "batch_size": 0, "tune": {"max_trials": 0}})
    add("tune-narrow", {"tune": {"max_trials": 2}}, rules="narrow")
    add("tune-spot", {**base, "use_spot": True, "tune": {"max_trials": 2}})
    add("tune-untagged", {**base, "tune": {"max_trials": 2}}, rules="untagged")
    add("tune-fp8-recipe-hopper", {**base, "precision": "fp8", "instance_type": "ml.p5.48xlarge",
                                   "tune": {"search_space": {"fp8_recipe": ["current", "mxfp8"]}}})  # fmt: skip
    add("tune-issue-block", {"batch_size": 32, "tune": {"search_space": {
        "batch_size": [1, 2, 4, 8, 16, 32], "activation_checkpointing": ["none", "full", "selective"],
        "precision": ["bf16", "fp8", "mxfp8", "nvfp4"], "loss_chunk_tokens": [0, 1024, 2048, 4096],
        "compile": ["auto", "true", "false"], "attention_backend": ["auto", "flash"]}}})  # fmt: skip
    add("tune-space-too-large", {**base, "tune": {"search_space": {"batch_size": list(range(1, 1025)),
                                                                   "activation_checkpointing": ["none", "full", "selective"]}}})  # fmt: skip
    add("tune-nothing-fits-more-instances", {**base, "batch_size": 8, "hyperparameters": {"model_preset": "64b"},
                                             "tune": {"search_space": {"batch_size": [1, 2, 4, 8],
                                                                       "activation_checkpointing": ["none", "full", "selective"]}}})  # fmt: skip
    return c


CASES: list[tuple[str, Any, dict[str, Any]]] = _cases()


# ----------------------------------------------------------------------------------------------------------------
# Running one input through every entry point
# ----------------------------------------------------------------------------------------------------------------


def _refusal(call: Callable[[], Any]) -> dict[str, Any]:
    """What an entry point gave: its result, the problems of its ``InvalidRequest``, or the error it raised."""
    from constructs_lib.cli.errors import InvalidRequest

    try:
        return {"result": call()}
    except InvalidRequest as error:
        return {"problems": list(error.problems)}
    except Exception as error:  # noqa: BLE001 - recorded: an entry point's failure is behaviour too
        return {"error": f"{type(error).__name__}: {error}"}


def run_case(raw: Any, options: Mapping[str, Any], rules: Mapping[str, Any], s3: Any) -> dict[str, Any]:
    """Every entry point's answer for one input: the Lambda's decision, and the CLI's offline validate, plan (and
    tune plan, for an input with a ``tune`` block)."""
    from constructs_lib.cli.request import Project, plan_request, validate
    from constructs_lib.cli.tuning import tune_plan
    from constructs_lib.workflow.request_check import decide
    from training.request.reads import read_measurements

    deployed = rules[options.get("rules", "base")]
    event = {"input": raw, "rules": deployed.to_json(), "execution": options.get("execution", EXECUTION)}
    offline = Project(context=dict(CDK_CONTEXT)).rules()
    out: dict[str, Any] = {
        "decide": _refusal(lambda: decide(_copy(event), s3=s3, sagemaker=SageMakerStub())),
        "validate": _refusal(lambda: validate(_copy(raw), offline)),
        "plan": _refusal(lambda: plan_request(_copy(raw), offline)),
    }
    if isinstance(raw, dict) and "tune" in raw:
        out["tune_plan"] = _refusal(lambda: tune_plan(_copy(raw), offline))
    # the CLI with --deployed: the deployed rules, S3 read (init_from, measurements)
    if options.get("deployed"):
        out["plan_deployed"] = _refusal(lambda: plan_request(_copy(raw), deployed, s3=s3))
        if isinstance(raw, dict) and "tune" in raw:
            records = read_measurements(s3, deployed)
            out["tune_plan_deployed"] = _refusal(lambda: tune_plan(_copy(raw), deployed, records, s3))
    return out


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


def run_all(cases: list[tuple[str, Any, dict[str, Any]]] = CASES) -> dict[str, dict[str, Any]]:
    """Every case's answers, by name (one moto world for all)."""
    rules = rules_variants()
    with world() as s3:
        return {name: run_case(raw, options, rules, s3) for name, raw, options in cases}


def canonical(value: Any) -> Any:
    """``value`` as the record stores it (JSON: tuples become lists; every mapping in its own order)."""
    return json.loads(json.dumps(value))


def dump(record: Mapping[str, Any]) -> str:
    """The record as text: one line per case and per case's answers (a changed decision is a one-line diff)."""

    def line(value: Any) -> str:  # every mapping in its own order: an input's order is its problems'
        return json.dumps(value, separators=(",", ":"))

    cases = ",\n".join(line(case) for case in record["cases"])
    answers = ",\n".join(f"{line(name)}:{line(a)}" for name, a in record["answers"].items())
    return f'{{"cases": [\n{cases}\n],\n"answers": {{\n{answers}\n}}}}\n'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.request_corpus", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", action="store_true", help=f"write {RECORD.name} (the recorded decisions)")
    args = parser.parse_args(argv)
    names = [name for name, _, _ in CASES]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SystemExit(f"duplicate case names: {duplicates}")
    answers = run_all()
    record = {
        "cases": [{"name": name, "input": raw, "options": options} for name, raw, options in CASES],
        "answers": canonical(answers),
    }
    valid = sum(1 for a in answers.values() if a["decide"].get("result", {}).get("valid"))
    print(f"{len(CASES)} inputs: {valid} valid, {len(CASES) - valid} refused by the workflow's decision")
    if args.write:
        RECORD.write_text(dump(record))
        print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
