"""Request safety, executed through the synthesized state machines in moto: every bad input ends in InvalidInput
before any SageMaker call, refusals that retrying cannot fix end at once, per-run data, resume from an earlier run,
two workflows sharing one bucket, and a generated corpus on which the state machine and the Python function agree.
"""

from __future__ import annotations

import json
import random
import uuid

import aws_cdk as cdk
import pytest

from constructs_lib._shared.nag import logical_id
from constructs_lib.workflow.construct import TrainingWorkflow
from constructs_lib.workflow.launch_request import execution_context, launch_request
from constructs_lib.workflow.request_check import decide
from tests.cdk_helpers import synth_with_nag
from tests.workflow.harness import OUTCOMES, REGION, TRAINING_PLANS, Outcome, definitions_of, moto_workflows
from tests.workflow.stacks import build_workflow
from training.contract.container import RESUME_CHANNEL, TRAIN_CHANNEL, WEIGHTS_CHANNEL, WEIGHTS_CHANNEL_DIR
from training.contract.settings_parse import parse_hyperparameters
from training.contract.shapes import MODEL_PRESETS
from training.request import hf_config
from training.request.job import job_fields
from training.request.rules import RequestRules
from training.request.value import Fields

CORPUS_SIZE = 220


@pytest.fixture(scope="module")
def synthesized():
    holder = {}

    def build(app: cdk.App) -> None:
        first = build_workflow(
            app, capacity_retry_wait=cdk.Duration.seconds(1), launch_retry_backoff=cdk.Duration.seconds(1)
        )
        second = TrainingWorkflow(
            first,
            "Second",
            image_uri=first.image_uri,
            execution_role=first.execution_role,
            bucket=first.bucket,
            remote_debug=True,
            max_keep_alive_seconds=600,
        )
        holder["first"], holder["second"] = first, second

    result = synth_with_nag(build)
    assert result.violations == ()
    template = result.templates["Test.template.json"]
    machines = definitions_of(template)
    return {key: (wf, machines[logical_id(wf.state_machine)]) for key, wf in holder.items()} | {
        "bucket": "fake-" + logical_id(holder["first"].bucket).lower()
    }


@pytest.fixture(scope="module")
def workflows(synthesized):
    with moto_workflows({k: synthesized[k][1] for k in ("first", "second")}) as machines:
        machines["first"].s3.create_bucket(
            Bucket=synthesized["bucket"], CreateBucketConfiguration={"LocationConstraint": REGION}
        )
        machines["first"].s3.put_object(Bucket=synthesized["bucket"], Key="data/c/part-0.bin", Body=b"t")
        _model_folder(machines["first"].s3, synthesized["bucket"], "data/llama/", LLAMA_8B_CONFIG)
        yield machines


@pytest.fixture(scope="module")
def workflow(workflows):
    return workflows["first"]


@pytest.fixture(scope="module")
def rules(synthesized) -> RequestRules:
    """The rules as the deployed state machine hands them to its Lambda function (names resolved)."""
    return RequestRules.from_state_machine_definition(json.dumps(synthesized["first"][1]))


def _prefix() -> str:
    return "t" + uuid.uuid4().hex[:12]


LLAMA_8B_CONFIG = hf_config.to_config(parse_hyperparameters({"model_preset": "llama3.1-8b"}))
"""A config.json of Llama 3.1 8B's architecture, as the export writes it."""


def _model_folder(s3, bucket: str, key: str, config: dict | None) -> str:
    """A Hugging Face model folder in S3 (config.json, two safetensors shards, a tokenizer) under ``key``."""
    if config is not None:
        s3.put_object(Bucket=bucket, Key=f"{key}config.json", Body=json.dumps(config).encode())
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer.json"):
        s3.put_object(Bucket=bucket, Key=f"{key}{name}", Body=b"x")
    return f"s3://{bucket}/{key}"


def _failed(result: dict, error: str) -> str:
    assert result["status"] == "FAILED", result
    assert result["error"] == error, result
    return result["cause"]


# ---- every class of bad input ends in InvalidInput, before SageMaker ---------------------------------------------


@pytest.mark.parametrize(
    ("execution_input", "words"),
    [
        ([1, 2], "input: must be a JSON object of input fields; got [1, 2]"),
        ("train", 'input: must be a JSON object of input fields; got "train"'),
        ({"precison": "bf16"}, "precison: unknown input field (did you mean precision?)"),
        (
            {"hyperparameters": {"max_step": "5"}},
            "unknown trainer setting max_step (did you mean max_steps?)",
        ),
        (
            {"hyperparameters": {"max_steps": "-5"}},
            "hyperparameters.max_steps: must be an integer in [1, 100000000]",
        ),
        ({"hyperparameters": {"model_preset": "2b"}}, "hyperparameters.model_preset: must be one of 1b, 8b"),
        ({"hyperparameters": {"learning_rate": "fast"}}, "hyperparameters.learning_rate: must be a number"),
        (
            {"hyperparameters": {"checkpoint_dir": "/tmp"}},
            "hyperparameters.checkpoint_dir: set by the platform",
        ),
        ({"hyperparameters": {"model_dir": "/tmp"}}, "hyperparameters.model_dir: set by the platform"),
        (
            {"hyperparameters": {"num_heads": "7"}},
            "hyperparameters.num_heads: must divide hidden_size (2048)",
        ),
        ({"hyperparameters": {"quantized_model_init": "true"}}, "works only with precision fp8 or mxfp8"),
        ({"hyperparameters": {"dataset": "channel"}}, "channel needs train_data_uri"),
        ({"hyperparameters": {f"k{i}": "1" for i in range(101)}}, "unknown trainer settings k0, k1"),
        (
            {"hyperparameters": {"token_dtype": "u" * 2501}},
            "hyperparameters.token_dtype: must be one of uint16",
        ),
        ({"job_name_prefix": "a" * 27}, "job_name_prefix: must be 1 to 26 characters"),
        (
            {"train_data_uri": "s3://elsewhere/data/x/"},
            "train_data_uri: must be an s3:// prefix ending in '/' under",
        ),
        ({"resume_from": "no-such-run"}, "resume_from: execution no-such-run has no complete checkpoint"),
        (
            {"precision": "mxfp8", "instance_type": "ml.p5.48xlarge"},
            "precision: mxfp8 cannot run on the GPUs",
        ),
        ({"keep_alive_seconds": 3601}, "keep_alive_seconds: must be an integer in [0, 3600]"),
        ({"keep_alive_seconds": 60, "use_spot": True}, "warm pools cannot be used with managed spot"),
        ({"infra_check": "yes"}, "infra_check: must be true or false"),
        ({"tags": {"aws:team": "x"}}, "tags.aws:team: reserved"),
        ({"tags": {"training-workflow": "x"}}, "tags.training-workflow: reserved"),
        ({"tags": {"team": "a#b"}}, "tags.team: value must be at most 256 letters"),
        ({"tags": {f"k{i}": "v" for i in range(49)}}, "tags: at most 48"),
        ({"tags": ["team"]}, "tags: must be a JSON object of string values"),
        ({"remote_debug": True}, "remote_debug: must be false (this workflow is deployed without remote"),
        ({"environment": {"PATH": "/x"}}, "environment.PATH: name must start with one of NCCL_"),
        ({"environment": {"NVTE_FRAMEWORK": "jax"}}, "environment.NVTE_FRAMEWORK: set by the platform"),
        ({"environment": {"NCCL_DEBUG": 1}}, "environment: must be a JSON object of string values"),
        ({"environment": {"NCCL_X": "v" * 513}}, "environment.NCCL_X: value of 513 characters"),
        (
            {"train_data_uri": "s3://fake-checkpointsbucket6ba0c50d/data/empty/"},
            "train_data_uri: must hold the training data, but no object is under it",
        ),
        (  # the memory plan's two examples: activations, then weights + AdamW alone, exceed the GPU
            {"hyperparameters": {"model_preset": "8b"}, "seq_length": 8192, "batch_size": 8},
            "fits with: activation_checkpointing true",
        ),
        (
            {"hyperparameters": {"model_preset": "64b"}, "instance_type": "ml.p5.48xlarge"},
            "memory: estimated peak",
        ),
        ({"ignore_memory_estimate": "yes"}, "ignore_memory_estimate: must be true or false"),
    ],
)
def test_bad_input_ends_in_invalid_input_before_sagemaker(workflow, execution_input, words):
    before = len(workflow.sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"])
    cause = _failed(workflow.run(execution_input), "InvalidInput")
    assert words in cause
    after = len(workflow.sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"])
    assert after == before


def test_rules_are_read_back_from_the_deployed_definition(workflow, rules):
    described = workflow.sfn.describe_state_machine(stateMachineArn=workflow.arn)
    assert RequestRules.from_state_machine_definition(described["definition"]) == rules
    with pytest.raises(ValueError, match="no 'Decide request' state with rules"):
        RequestRules.from_state_machine_definition({"States": {}})


def test_every_problem_is_in_the_cause(workflow):
    cause = _failed(workflow.run({"batch_size": 0, "precision": "fp7"}), "InvalidInput")
    assert (
        cause.startswith("precision: must be one of")
        and "; batch_size: must be an integer in [1, 4096]; got 0" in cause
    )


# ---- no retry of what retrying cannot fix --------------------------------------------------------------------------


def test_validation_exception_ends_at_once_in_launch_failed(workflow):
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome(client_error="ValidationException"))
    cause = _failed(workflow.run({"job_name_prefix": prefix}), "LaunchFailed")
    assert "ValidationException (test)" in cause and "Error Code: ValidationException" in cause
    assert len(OUTCOMES.requests[prefix]) == 1


def test_access_denied_ends_at_once(workflow):
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome(client_error="AccessDeniedException"))
    assert "AccessDeniedException" in _failed(workflow.run({"job_name_prefix": prefix}), "LaunchFailed")
    assert len(OUTCOMES.requests[prefix]) == 1


def test_throttling_is_retried_with_backoff(workflow):
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome(client_error="ThrottlingException"), Outcome())
    result = workflow.run({"job_name_prefix": prefix})
    assert result["status"] == "SUCCEEDED", result
    assert len(OUTCOMES.requests[prefix]) == 2
    waits = [e for e in workflow.history(result["executionArn"]) if e["type"] == "WaitStateEntered"]
    assert [json.loads(e["stateEnteredEventDetails"]["input"])["launch_backoff"] for e in waits] == [1]


# ---- training data per run -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [None, "File"])
def test_train_data_uri_is_mounted_as_the_train_channel(workflow, synthesized, mode):
    prefix = _prefix()
    uri = f"s3://{synthesized['bucket']}/data/corpus-{prefix}/"
    workflow.s3.put_object(Bucket=synthesized["bucket"], Key=f"data/corpus-{prefix}/shard-0.bin", Body=b"t")
    execution_input = {"job_name_prefix": prefix, "train_data_uri": uri}
    if mode:
        execution_input["train_data_input_mode"] = mode
    assert workflow.run(execution_input)["status"] == "SUCCEEDED"
    (request,) = OUTCOMES.requests[prefix]
    assert request["InputDataConfig"] == [
        {
            "ChannelName": TRAIN_CHANNEL,
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": uri,
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
            "InputMode": mode or "FastFile",
        }
    ]
    assert request["HyperParameters"]["dataset"] == "channel"


def test_every_new_field_reaches_the_request(workflow):
    prefix, name = _prefix(), f"fields-{_prefix()}"
    execution_input = {
        "job_name_prefix": prefix,
        "keep_alive_seconds": 1800,
        "infra_check": True,
        "tags": {"team": "llm", "cost-center": "1234"},
        "environment": {"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
    }
    assert workflow.run(execution_input, name)["status"] == "SUCCEEDED"
    (request,) = OUTCOMES.requests[prefix]
    assert request["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800
    assert request["InfraCheckConfig"] == {"EnableInfraCheck": True}
    assert request["RemoteDebugConfig"] == {"EnableRemoteDebug": False}
    assert request["Environment"] == execution_input["environment"]
    assert request["Tags"] == [
        {"Key": "training-workflow", "Value": "Test/Workflow"},
        {"Key": "training-workflow-execution", "Value": name},
        {"Key": "cost-center", "Value": "1234"},
        {"Key": "team", "Value": "llm"},
    ]


def test_remote_debug_reaches_the_request_where_the_workflow_allows_it(workflows):
    prefix = _prefix()
    result = workflows["second"].run(
        {"job_name_prefix": prefix, "remote_debug": True, "keep_alive_seconds": 600}
    )
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    assert request["RemoteDebugConfig"] == {"EnableRemoteDebug": True}
    assert request["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 600
    refused = workflows["second"].run({"keep_alive_seconds": 601})  # this workflow's own ceiling
    assert "keep_alive_seconds: must be an integer in [0, 600]" in _failed(refused, "InvalidInput")


# ---- the memory plan: refused before launch, or launched anyway and recorded ---------------------------------------


def test_summary_carries_the_plan_and_an_ignored_estimate_is_recorded(workflow):
    headline = {"precision": "mxfp8", "batch_size": 16, "activation_checkpointing": True}
    result = workflow.run({**headline, "job_name_prefix": _prefix()})
    assert result["status"] == "SUCCEEDED", result
    summary = json.loads(result["output"])
    assert summary["plan"]["fits"] and summary["plan"]["ignored"] is False
    assert summary["plan"]["peak_gib"] > 0 and summary["memory_estimate_ignored"] is False
    assert "tokens_per_sec_per_gpu" in summary["plan"] and "final_metrics" in summary

    too_big = {"hyperparameters": {"model_preset": "8b"}, "seq_length": 8192, "batch_size": 8}
    prefix = _prefix()
    forced = workflow.run({**too_big, "ignore_memory_estimate": True, "job_name_prefix": prefix})
    assert forced["status"] == "SUCCEEDED", forced
    summary = json.loads(forced["output"])
    assert summary["memory_estimate_ignored"] is True
    assert summary["plan"]["ignored"] is True and summary["plan"]["fits"] is False
    assert len(OUTCOMES.requests[prefix]) == 1  # launched


# ---- start from open weights (init_from) ---------------------------------------------------------------------------


def test_init_from_mounts_the_model_read_only_and_the_plan_is_the_models(workflow, synthesized):
    prefix, uri = _prefix(), f"s3://{synthesized['bucket']}/data/llama/"
    result = workflow.run({"job_name_prefix": prefix, "init_from": uri, "activation_checkpointing": True})
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    assert request["InputDataConfig"] == [
        {
            "ChannelName": WEIGHTS_CHANNEL,
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": uri,
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
            "InputMode": "File",
        }
    ]
    assert request["HyperParameters"]["init_from"] == WEIGHTS_CHANNEL_DIR
    assert request["HyperParameters"]["init_from_source"] == uri  # what the exports name as the base
    plan = json.loads(result["output"])["plan"]
    assert plan["parameters"] == MODEL_PRESETS["llama3.1-8b"].parameter_count() and plan["fits"]


@pytest.mark.parametrize(
    ("folder", "settings", "cause"),
    [
        ("s3://elsewhere/models/llama/", {}, "init_from: must be an s3:// prefix ending in '/' under one of"),
        ("data/no-config/", {}, "init_from: holds no config.json (a Hugging Face model folder has one)"),
        ("data/phi3/", {}, "model_type 'phi3' is not supported; supported: llama (LlamaForCausalLM"),
        (
            "data/llama/",
            {"hyperparameters": {"num_kv_heads": "32"}},
            "hyperparameters.num_kv_heads: must be 8 or left out: the init_from model's config.json has "
            "num_kv_heads=8; got 32",
        ),
        (
            "data/llama/",
            {"hyperparameters": {"model_preset": "llama3.1-70b"}},
            "hyperparameters.model_preset: llama3.1-70b is not the init_from model",
        ),
    ],
    ids=[
        "outside the data sources",
        "no config.json",
        "unsupported architecture",
        "contradicting kv heads",
        "contradicting preset",
    ],  # fmt: skip
)
def test_init_from_is_refused_before_launch_naming_the_field(workflow, synthesized, folder, settings, cause):
    bucket = synthesized["bucket"]
    _model_folder(workflow.s3, bucket, "data/no-config/", None)
    _model_folder(workflow.s3, bucket, "data/phi3/", {**LLAMA_8B_CONFIG, "model_type": "phi3"})
    uri = folder if folder.startswith("s3://") else f"s3://{bucket}/{folder}"
    prefix = _prefix()
    result = workflow.run({"job_name_prefix": prefix, "init_from": uri, **settings})
    assert cause in _failed(result, "InvalidInput")
    assert prefix not in OUTCOMES.requests  # refused before any SageMaker call


# ---- fine-tune on prepared conversations (init_from + prepare --init-from's data) ----------------------------------


def _upload(s3, bucket: str, key: str, folder) -> str:
    for path in sorted(folder.iterdir()):
        s3.put_object(Bucket=bucket, Key=f"{key}{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/{key}"


def test_a_fine_tuning_request_is_checked_against_its_model_and_planned_for_its_packed_windows(
    workflow, synthesized, tmp_path
):
    """docs/fine-tuning.md's example as the workflow gets it: the prepared folder and the model folder in S3; the
    request check reads the data's metadata.json and the model's template and tokenizer files (not the weights),
    launches with both channels and plans the packed windows; data rendered with another template is refused
    before any SageMaker call, naming train_data_uri."""
    from tests.training.chat_models import model_folder, template
    from training.prepare import chat

    bucket = synthesized["bucket"]
    shape = parse_hyperparameters({"model_preset": "custom", "num_layers": "2", "hidden_size": "64",
                                   "num_heads": "4", "num_kv_heads": "2", "ffn_hidden_size": "128",
                                   "vocab_size": "336"})  # fmt: skip
    folders = {}
    for name, text in (("model", None), ("other", template("llama3.1").replace("Today Date", "Date"))):
        folder = model_folder(tmp_path / name, "llama3.1", template_text=text)
        (folder / "config.json").write_text(json.dumps(hf_config.to_config(shape)))
        (folder / "model.safetensors").write_bytes(b"x")  # the check reads no weights
        folders[name] = _upload(workflow.s3, bucket, f"data/sft-{name}/", folder)
    lines = [{"prompt": str(n), "completion": str(n + 1)} for n in range(200)]
    (tmp_path / "numbers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    chat.prepare_chat([tmp_path / "numbers.jsonl"], str(tmp_path / "data"), str(tmp_path / "model"),
                              validation_fraction=0.1)  # fmt: skip
    data = _upload(workflow.s3, bucket, "data/sft-chats/", tmp_path / "data")
    request = {"init_from": folders["model"], "train_data_uri": data, "seq_length": 256, "batch_size": 1,
               "hyperparameters": {"max_steps": "50"}}  # fmt: skip

    prefix = _prefix()
    result = workflow.run({**request, "job_name_prefix": prefix})
    assert result["status"] == "SUCCEEDED", result
    (launched,) = OUTCOMES.requests[prefix]
    assert {c["ChannelName"] for c in launched["InputDataConfig"]} == {TRAIN_CHANNEL, WEIGHTS_CHANNEL}
    planned = json.loads(result["output"])["plan"]["data"]
    assert planned["checked_against"] == folders["model"] and planned["windows_exact"] and planned["packing"]
    assert planned["examples"] == 180 and 0 < planned["windows"] < 180  # several examples a window

    prefix = _prefix()
    refused = workflow.run({**request, "init_from": folders["other"], "job_name_prefix": prefix})
    assert _failed(refused, "InvalidInput").startswith(
        f"train_data_uri: the chat template of {folders['other']} (tokenizer_config.json, sha256 "
    )
    prefix = _prefix()
    too_short = workflow.run({**request, "seq_length": 64, "job_name_prefix": prefix})
    assert "seq_length: must be at least " in _failed(too_short, "InvalidInput")
    assert prefix not in OUTCOMES.requests  # refused before any SageMaker call


# ---- continue an earlier run ---------------------------------------------------------------------------------------


def _seal_checkpoint(s3, bucket: str, run_key: str, step: int) -> dict[str, bytes]:
    """What the trainer leaves in S3 for one complete checkpoint (shards, then COMPLETE listing their sizes)."""
    folder = f"{run_key}step_{step:08d}/"
    files = {".metadata": b"m" * 10, "__0_0.distcp": b"w" * 100, "rank_00000.pt": b"s" * 20}
    for name, body in files.items():
        s3.put_object(Bucket=bucket, Key=folder + name, Body=body)
    marker = json.dumps(
        {"world_size": 8, "step": step, "files": {n: len(b) for n, b in files.items()}}
    ).encode()
    s3.put_object(Bucket=bucket, Key=folder + "COMPLETE", Body=marker)
    return {folder + n: b for n, b in {**files, "COMPLETE": marker}.items()}


def _objects(s3, bucket: str, prefix: str) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def test_resume_from_mounts_the_newest_complete_checkpoint_read_only(workflow, synthesized, rules):
    first, _ = synthesized["first"]
    bucket, earlier = synthesized["bucket"], f"earlier-{_prefix()}"
    run_key = f"checkpoints/{first.run_segment}/{earlier}/"
    _seal_checkpoint(workflow.s3, bucket, run_key, 100)
    _seal_checkpoint(workflow.s3, bucket, run_key, 200)
    workflow.s3.put_object(Bucket=bucket, Key=f"{run_key}step_00000300.tmp/.metadata", Body=b"partial")
    workflow.s3.delete_object(Bucket=bucket, Key=f"{run_key}step_00000200/__0_0.distcp")  # 200 is incomplete
    before = _objects(workflow.s3, bucket, run_key)

    prefix, name = _prefix(), f"later-{_prefix()}"
    execution_input = {
        "job_name_prefix": prefix,
        "resume_from": earlier,
        "hyperparameters": {"max_steps": "150"},
    }
    result = workflow.run(execution_input, name)
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    assert request["InputDataConfig"] == [
        {
            "ChannelName": RESUME_CHANNEL,
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": f"s3://{bucket}/{run_key}step_00000100/",
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
            "InputMode": "File",
        }
    ]
    assert request["CheckpointConfig"]["S3Uri"] == f"s3://{bucket}/checkpoints/{first.run_segment}/{name}/"
    decided = decide({"input": execution_input, "rules": rules.to_json(), "execution": name}, s3=workflow.s3)
    context = execution_context(name=name, execution_input=execution_input)
    rendered = launch_request(synthesized["first"][1], decided, context, job_name=request["TrainingJobName"])
    assert rendered == request
    assert json.loads(result["output"])["resumed_from"] == {
        "step": 100,
        "uri": f"s3://{bucket}/{run_key}step_00000100/",
        "execution": earlier,
        "in_place": False,
    }
    assert _objects(workflow.s3, bucket, run_key) == before

    refused = workflow.run({**execution_input, "hyperparameters": {"max_steps": "100"}})
    assert "must be greater than the step of the checkpoint resumed from (100" in _failed(
        refused, "InvalidInput"
    )


def test_resume_from_itself_or_an_unfinished_run_is_refused(workflow, synthesized):
    first, _ = synthesized["first"]
    name = f"self-{_prefix()}"  # itself: continue its own folder, which holds nothing yet
    assert f"execution {name} has no complete checkpoint" in _failed(
        workflow.run({"resume_from": name}, name), "InvalidInput"
    )
    run_key = f"checkpoints/{first.run_segment}/unfinished/"
    workflow.s3.put_object(
        Bucket=synthesized["bucket"], Key=f"{run_key}step_00000010.tmp/.metadata", Body=b"x"
    )
    assert "has no complete checkpoint" in _failed(
        workflow.run({"resume_from": "unfinished"}), "InvalidInput"
    )


# ---- two workflows, one bucket ---------------------------------------------------------------------------------------


def test_two_workflows_sharing_a_bucket_keep_their_runs_apart(workflows, synthesized):
    first, second = synthesized["first"][0], synthesized["second"][0]
    assert first.run_segment != second.run_segment
    bucket, name = synthesized["bucket"], f"shared-{_prefix()}"
    prefixes = {}
    for key in ("first", "second"):
        prefixes[key] = _prefix()
        result = workflows[key].run(
            {"job_name_prefix": prefixes[key]}, name
        )  # the same execution name in both
        assert result["status"] == "SUCCEEDED", result
    uris = {key: OUTCOMES.requests[p][0]["CheckpointConfig"]["S3Uri"] for key, p in prefixes.items()}
    assert uris == {
        "first": f"s3://{bucket}/checkpoints/{first.run_segment}/{name}/",
        "second": f"s3://{bucket}/checkpoints/{second.run_segment}/{name}/",
    }
    _seal_checkpoint(workflows["first"].s3, bucket, f"checkpoints/{first.run_segment}/{name}/", 50)
    assert workflows["first"].run({"resume_from": name})["status"] == "SUCCEEDED"
    refused = workflows["second"].run({"resume_from": name})  # the first workflow's run is not the second's
    assert "has no complete checkpoint" in _failed(refused, "InvalidInput")


# ---- the state machine and the Python function agree -----------------------------------------------------------


CANDIDATES: dict[str, list] = {
    "precision": ["bf16", "fp8", "mxfp8", "nvfp4", "fp16", "fp7", 8, None],
    "num_layers": [None, 1, 32, 512, 0, 513, 2.5, "4"],
    "batch_size": [1, 16, 4096, 0, 4097, -1, True, None],
    "seq_length": [8192, 4096, 2048, 8, 7, 8200, "8192"],
    "activation_checkpointing": [True, False, "true", 1],
    "instance_type": ["ml.p6-b200.48xlarge", "ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.m5.large", ""],
    "instance_count": [1, 2, 4, 5, 0, 1.5],
    "training_plan_arn": [
        None,
        f"arn:aws:sagemaker:{REGION}:123456789012:training-plan/b200",
        "arn:aws:sagemaker:us-east-1:123456789012:training-plan/b200",
        "arn:aws:sagemaker:us-west-2:12345:training-plan/b200",
    ],
    "use_spot": [False, True, "false"],
    "max_runtime_seconds": [3600, 86400, 0, 10**9],
    "max_wait_seconds": [None, 86400, 3600, 172800, -1],
    "hyperparameters": [
        {},
        {"max_steps": "100", "lr_warmup_steps": "10"},
        {"max-steps": 50, "learning_rate": 0.001},
        {"max_steps": "-5"},
        {"max_step": "5"},
        {"model_preset": "2b"},
        {"learning_rate": "fast"},
        {"fp8_recipe": "current", "quantized_model_init": "true"},
        {"quantized_model_init": "true"},
        {"model_preset": "8b", "num_heads": "24"},
        {"checkpoint_dir": "/tmp"},
        {"precision": "fp8"},
        {"dataset": "channel"},
        {"seed": None},
        {"max_steps": "2", "throughput_warmup_steps": "3"},
        "max_steps=5",
    ],
    "job_name_prefix": ["-bad", "a" * 27, "bad_name", ""],
    "train_data_uri": [
        None,
        "s3://{bucket}/data/c/",
        "s3://{bucket}/data/empty/",
        "s3://{bucket}/data/c",
        "s3://elsewhere/data/",
        3,
    ],
    "train_data_input_mode": ["FastFile", "File", "Pipe"],
    "resume_from": [None, "a/b", ""],
    "init_from": [None, "s3://{bucket}/data/llama/", "s3://{bucket}/data/c/", "s3://elsewhere/models/"],
    "keep_alive_seconds": [0, 60, 3600, 3601, -1, True],
    "infra_check": [True, False, "true"],
    "tags": [{}, {"team": "llm"}, {"aws:x": "1"}, {"team": 3}, {"a b": "c d"}, {"training-workflow": "x"}],
    "remote_debug": [False, True, None],
    "environment": [{}, {"NCCL_DEBUG": "INFO"}, {"PATH": "/x"}, {"CUDA_VISIBLE_DEVICES": "0"}, {"FI_X": "1"}],
    "ignore_memory_estimate": [False, True, "true"],
    "unknown_field": [1],
}


PLAN = f"arn:aws:sagemaker:{REGION}:123456789012:training-plan/b200"
TRAINING_PLANS.add(PLAN, "ml.p6-b200.48xlarge", 4)  # the request check describes the plan a request names
CAPACITY_CASES: list[dict] = [
    {"use_spot": True},
    {"use_spot": True, "instance_count": 2, "max_wait_seconds": 172800},
    {"training_plan_arn": PLAN},
    {"training_plan_arn": PLAN, "instance_count": 2, "use_spot": True},
    {"train_data_uri": "s3://{bucket}/data/c/", "train_data_input_mode": "File"},
    {"train_data_uri": "s3://{bucket}/data/c/", "use_spot": True, "instance_count": 2},
    {"train_data_uri": "s3://{bucket}/data/c/", "training_plan_arn": PLAN, "precision": "mxfp8"},
    {"init_from": "s3://{bucket}/data/llama/", "train_data_uri": "s3://{bucket}/data/c/", "use_spot": True},
]
"""Valid inputs the agreement test always has: spot, training plan and data, one and several nodes."""


def corpus(bucket: str) -> list[object]:
    rng = random.Random(20261123)
    inputs: list[object] = [{}, [], "text", 7, None]
    names = list(CANDIDATES)
    while len(inputs) < CORPUS_SIZE:
        item = {}
        for name in rng.sample(names, rng.randint(1, 3)):
            value = rng.choice(CANDIDATES[name])
            item[name] = (
                value.format(bucket=bucket) if isinstance(value, str) and "{bucket}" in value else value
            )
        inputs.append(item)
    return inputs


def _rendered(definition: dict, raw: object, decided: dict, name: str, job_name: str) -> dict:
    """The request ``launch_request`` renders from the deployed definition for ``raw`` and its decision (the SDK
    path's)."""
    context = execution_context(name=name, execution_input=raw)
    return launch_request(definition, decided, context, job_name=job_name)


def test_state_machine_and_python_function_agree_on_a_generated_corpus(workflow, rules, synthesized):
    """The moto state machine and :func:`decide` (with the same S3) agree on the verdict, the cause and every part
    of the request the decision makes (hyperparameters, channels, instance type, warm pool, tags, environment,
    infra check and remote debugging); every launched request equals, field by field, the one that
    ``launch_request`` renders from the deployed definition (the SDK path's single source), job name aside."""
    bucket = synthesized["bucket"]
    explicit = [
        {k: v.format(bucket=bucket) if k in ("train_data_uri", "init_from") else v for k, v in case.items()}
        for case in CAPACITY_CASES
    ]
    inputs = corpus(bucket) + explicit
    started = []
    for raw in inputs:
        if isinstance(raw, dict) and "job_name_prefix" not in raw:
            raw = {**raw, "job_name_prefix": _prefix()}
        name = f"agree-{_prefix()}"
        started.append((raw, name, workflow.start(raw, name)))
    outcomes = {"valid": 0, "invalid": 0, "spot": 0, "plan": 0, "data": 0}
    for raw, name, arn in started:
        result = workflow.wait(arn, timeout=120)
        expected = decide({"input": raw, "rules": rules.to_json(), "execution": name}, s3=workflow.s3)
        if not expected["valid"]:
            outcomes["invalid"] += 1
            assert _failed(result, "InvalidInput") == expected["cause"], raw
            continue
        outcomes["valid"] += 1
        assert result["status"] == "SUCCEEDED", (raw, result)
        (request,) = OUTCOMES.requests[raw["job_name_prefix"]]
        config = expected["config"]
        assert request["HyperParameters"] == expected["hyperparameters"], raw
        assert request.get("InputDataConfig", []) == expected["channels"], raw
        assert request["ResourceConfig"]["InstanceType"] == config["instance_type"]
        assert request["ResourceConfig"].get("KeepAlivePeriodInSeconds") == (
            None if config["use_spot"] else config["keep_alive_seconds"]
        ), raw
        assert expected["request"] == job_fields(Fields(**config), rules, name)
        for key, value in expected["request"].items():
            assert request[key] == value, (raw, key)
        rendered = _rendered(synthesized["first"][1], raw, expected, name, request["TrainingJobName"])
        for key in sorted(set(request) | set(rendered)):
            assert rendered.get(key) == request.get(key), (raw, key)
        outcomes["spot"] += request["EnableManagedSpotTraining"]
        outcomes["plan"] += "TrainingPlanArn" in request["ResourceConfig"]
        outcomes["data"] += "InputDataConfig" in request
    assert min(outcomes["spot"], outcomes["plan"], outcomes["data"]) >= 3, outcomes
    assert len(inputs) >= 200 and outcomes["valid"] >= 40 and outcomes["invalid"] >= 100, outcomes
