"""Evaluation through the synthesized state machine in moto: train-then-evaluate from one input, evaluation only of a
finished run, and every refusal before anything is launched (unknown task, task folder outside the data prefixes,
a model with no export or no tokenizer)."""

from __future__ import annotations

import json
import uuid

import aws_cdk as cdk
import pytest

from tests.cdk_helpers import synth_with_nag
from tests.workflow.harness import OUTCOMES, REGION, TRAINING_PLANS, Outcome, definition_of, moto_workflow
from tests.workflow.stacks import build_workflow
from training.contract import container, settings_parse
from training.contract.container import EVALUATE_ENTRY_POINT, MODEL_CHANNEL, TASKS_CHANNEL, TRAIN_CHANNEL
from training.contract.evaluation import evaluation_metric_definitions
from training.request import hf_config

PLAN = f"arn:aws:sagemaker:{REGION}:012345678901:training-plan/b200-week"
TRAINING_PLANS.add(PLAN, "ml.p6-b200.48xlarge", 2)  # the request check describes the plan a request names
SMALL_LLAMA = hf_config.to_config(settings_parse.parse_hyperparameters({"model_preset": "llama3.2-1b"}))
SCORES = (("eval:piqa:acc", 0.61), ("eval:piqa:acc_stderr", 0.011), ("eval:piqa:acc_norm", 0.62),
          ("eval:piqa:acc_norm_stderr", 0.011), ("eval:hellaswag:acc", 0.29))  # fmt: skip


@pytest.fixture(scope="module")
def deployed():
    result = synth_with_nag(lambda app: build_workflow(app, capacity_retry_wait=cdk.Duration.seconds(1)))
    assert result.violations == ()
    definition = definition_of(result.templates["Test.template.json"])
    rules = json.loads(definition["States"]["Decide request"]["Parameters"]["Payload"]["rules"])
    bucket = rules["bucket_name"]
    with moto_workflow(definition) as workflow:
        s3 = workflow.s3
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        for folder, kind in (("words", "tokenizers"), ("bytes", "byte-level UTF-8"), ("lost", "tokenizers")):
            meta = {"tokenizer": {"kind": kind, "file": "tokenizer.json"}, "vocab_size": 300}
            s3.put_object(Bucket=bucket, Key=f"data/{folder}/metadata.json", Body=json.dumps(meta))
            s3.put_object(Bucket=bucket, Key=f"data/{folder}/train.bin", Body=b"tokens")
        s3.put_object(Bucket=bucket, Key="data/words/tokenizer.json", Body=b"{}")  # "lost" has none
        for folder in (
            "llama",
            "llama-bare",
        ):  # open weights to start from: with and without a tokenizer.json
            s3.put_object(Bucket=bucket, Key=f"data/{folder}/config.json", Body=json.dumps(SMALL_LLAMA))
            s3.put_object(Bucket=bucket, Key=f"data/{folder}/model.safetensors", Body=b"weights")
        s3.put_object(Bucket=bucket, Key="data/llama/tokenizer.json", Body=b"{}")
        for task in ("hellaswag", "piqa"):
            s3.put_object(
                Bucket=bucket, Key=f"data/tasks/{task}.yaml", Body=f"task: {task}\ndataset_path: json\n"
            )
            s3.put_object(Bucket=bucket, Key=f"data/tasks/{task}.validation.jsonl", Body=b"{}")
        yield workflow, f"s3://{bucket}/"


def _prefix() -> str:
    return "e" + uuid.uuid4().hex[:12]


def _evaluate(base: str, **fields) -> dict:
    return {"tasks": ["piqa", "hellaswag"], "task_data_uri": f"{base}data/tasks/", **fields}


def _run(workflow, execution_input: dict, name: str) -> dict:
    result = workflow.run(execution_input, name)
    result["summary"] = json.loads(result["output"]) if result.get("output") else None
    return result


def test_train_then_evaluate_from_one_input(deployed):
    workflow, base = deployed
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome(), Outcome(final_metrics=SCORES))
    name = f"run-{prefix}"
    execution_input = {"job_name_prefix": prefix, "train_data_uri": f"{base}data/words/",
                       "evaluate": _evaluate(base, limit=100)}  # fmt: skip
    result = _run(workflow, execution_input, name)
    assert result["status"] == "SUCCEEDED", result
    train, evaluation = OUTCOMES.requests[prefix]
    assert train["CheckpointConfig"] and "EnableNetworkIsolation" not in train
    assert [c["ChannelName"] for c in train["InputDataConfig"]] == [TRAIN_CHANNEL]
    model = f"{base}output/{train['TrainingJobName']}/output/model.tar.gz"
    # the evaluation job: same image, its own program, no network, the tasks and the trained model as channels
    assert (
        evaluation["AlgorithmSpecification"]["TrainingImage"]
        == train["AlgorithmSpecification"]["TrainingImage"]
    )
    assert evaluation["Environment"] == {"SAGEMAKER_PROGRAM": EVALUATE_ENTRY_POINT}
    assert evaluation["EnableNetworkIsolation"] is True
    assert {c["ChannelName"]: (c["DataSource"]["S3DataSource"]["S3Uri"], c["InputMode"])
            for c in evaluation["InputDataConfig"]} == {
        TASKS_CHANNEL: (f"{base}data/tasks/", "File"), MODEL_CHANNEL: (model, "File")}  # fmt: skip
    assert evaluation["HyperParameters"] == {"tasks": "piqa,hellaswag", "batch_size": "32", "limit": "100"}
    assert evaluation["AlgorithmSpecification"]["MetricDefinitions"] == [
        m.as_sagemaker() for m in evaluation_metric_definitions(["piqa", "hellaswag"])
    ]
    assert "CheckpointConfig" not in evaluation and "TensorBoardOutputConfig" not in evaluation
    assert {t["Key"]: t["Value"] for t in evaluation["Tags"]}["training-workflow-evaluates"] == name
    assert evaluation["ResourceConfig"]["InstanceCount"] == 1
    # one H100 for a 1B model's 1.9 GB of bf16 weights, not the training's eight B200s
    assert (train["ResourceConfig"]["InstanceType"], evaluation["ResourceConfig"]["InstanceType"]) == (
        "ml.p6-b200.48xlarge",
        "ml.p5.4xlarge",
    )
    assert evaluation["StoppingCondition"] == {"MaxRuntimeInSeconds": 4 * 3600}
    summary = result["summary"]
    assert summary["job_name"] == train["TrainingJobName"] and summary["model_artifacts"] == model
    scores = summary["evaluation"]
    assert scores["job_name"] == evaluation["TrainingJobName"] and scores["status"] == "Completed"
    assert scores["tasks"] == ["piqa", "hellaswag"] and scores["evaluated"] == {
        "run": name,
        "training_job": None,
    }
    assert {m["MetricName"]: m["Value"] for m in scores["scores"]} == dict(SCORES)
    assert scores["results"] == f"{base}output/{evaluation['TrainingJobName']}/output/output.tar.gz"


def test_a_failed_evaluation_fails_the_execution_naming_its_job(deployed):
    workflow, base = deployed
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome(), Outcome("Failed", "AlgorithmError: error: model: no tokenizer files"))
    execution_input = {
        "job_name_prefix": prefix,
        "train_data_uri": f"{base}data/words/",
        "evaluate": _evaluate(base),
    }
    result = _run(workflow, execution_input, f"run-{prefix}")
    _, evaluation = OUTCOMES.requests[prefix]
    assert (result["status"], result["error"]) == ("FAILED", "EvaluationJobFailed")
    assert result["cause"] == (
        f"Evaluation job {evaluation['TrainingJobName']} ended Failed: AlgorithmError: error: model: no tokenizer files"
    )


def test_evaluate_only_a_finished_run(deployed):
    workflow, base = deployed
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome())
    trained = _run(
        workflow, {"job_name_prefix": prefix, "train_data_uri": f"{base}data/words/"}, f"run-{prefix}"
    )
    job = trained["summary"]["job_name"]
    OUTCOMES.plan(prefix, Outcome(final_metrics=SCORES))
    only = {
        "job_name_prefix": prefix,
        "evaluate": _evaluate(base, training_job=job, instance_type="ml.p5.4xlarge"),
    }
    result = _run(workflow, only, f"eval-{prefix}")
    assert result["status"] == "SUCCEEDED", result
    (_, evaluation) = OUTCOMES.requests[prefix]  # nothing trained: the second request is the evaluation's
    assert evaluation["ResourceConfig"]["InstanceType"] == "ml.p5.4xlarge"
    channels = {
        c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in evaluation["InputDataConfig"]
    }
    assert channels[MODEL_CHANNEL] == trained["summary"]["model_artifacts"]
    assert {t["Key"]: t["Value"] for t in evaluation["Tags"]}[
        "training-workflow-evaluates"
    ] == f"run-{prefix}"
    assert list(result["summary"]) == ["evaluation"]
    assert result["summary"]["evaluation"]["evaluated"] == {"run": f"run-{prefix}", "training_job": job}


def test_a_run_started_from_open_weights_is_evaluated_with_their_tokenizer(deployed):
    """init_from: the export takes the folder's tokenizer.json, so the run is evaluated after training even on
    byte-level data, and again later as an evaluation only (its weights channel names the folder)."""
    workflow, base = deployed
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome(), Outcome(final_metrics=SCORES))
    name = f"run-{prefix}"
    execution_input = {"job_name_prefix": prefix, "init_from": f"{base}data/llama/",
                       "train_data_uri": f"{base}data/bytes/", "evaluate": _evaluate(base)}  # fmt: skip
    result = _run(workflow, execution_input, name)
    assert result["status"] == "SUCCEEDED", result
    train, evaluation = OUTCOMES.requests[prefix]
    assert {c["ChannelName"] for c in train["InputDataConfig"]} == {TRAIN_CHANNEL, container.WEIGHTS_CHANNEL}
    assert {t["Key"]: t["Value"] for t in evaluation["Tags"]}["training-workflow-evaluates"] == name
    OUTCOMES.plan(prefix, Outcome(final_metrics=SCORES))
    only = {"job_name_prefix": prefix, "evaluate": _evaluate(base, training_job=train["TrainingJobName"])}
    later = _run(workflow, only, f"eval-{prefix}")
    assert later["status"] == "SUCCEEDED", later
    assert later["summary"]["evaluation"]["evaluated"] == {
        "run": name,
        "training_job": train["TrainingJobName"],
    }
    # without a tokenizer file in the folder and on synthetic tokens, nothing has one: refused before launch
    bare = {"job_name_prefix": prefix, "init_from": f"{base}data/llama-bare/", "evaluate": _evaluate(base)}
    refused = _run(workflow, bare, f"bad-{prefix}")
    assert (refused["status"], refused["error"]) == ("FAILED", "InvalidInput"), refused
    assert "started from init_from" in refused["cause"] and "has no tokenizer file" in refused["cause"]
    assert len(workflow.jobs(prefix)) == 3  # the training, its evaluation and the later one: nothing more


def test_on_a_training_plan_the_evaluation_runs_on_the_plans_instance_type(deployed):
    workflow, base = deployed
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome(), Outcome(final_metrics=SCORES))
    execution_input = {"job_name_prefix": prefix, "train_data_uri": f"{base}data/words/", "training_plan_arn": PLAN,
                       "evaluate": _evaluate(base)}  # fmt: skip
    result = _run(workflow, execution_input, f"run-{prefix}")
    assert result["status"] == "SUCCEEDED", result
    train, evaluation = OUTCOMES.requests[prefix]
    for job in (train, evaluation):
        assert job["ResourceConfig"]["TrainingPlanArn"] == PLAN
        assert job["ResourceConfig"]["InstanceType"] == "ml.p6-b200.48xlarge"


def test_a_model_too_big_for_one_gpu_is_evaluated_later_on_its_own_instance_type(deployed):
    """Evaluation only: the size comes from the finished job's settings (32b: 68 GB of bf16 weights, more than 80%
    of one H100), so the default is the instance type it trained on; one GPU is refused by name."""
    workflow, base = deployed
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome())
    big = {"job_name_prefix": prefix, "train_data_uri": f"{base}data/words/", "instance_type": "ml.p5.48xlarge",
           "hyperparameters": {"model_preset": "32b"}, "ignore_memory_estimate": True}  # fmt: skip
    trained = _run(workflow, big, f"run-{prefix}")
    assert trained["status"] == "SUCCEEDED", trained
    job = trained["summary"]["job_name"]
    OUTCOMES.plan(prefix, Outcome(final_metrics=SCORES))
    only = {"job_name_prefix": prefix, "evaluate": _evaluate(base, training_job=job)}
    result = _run(workflow, only, f"eval-{prefix}")
    assert result["status"] == "SUCCEEDED", result
    (_, evaluation) = OUTCOMES.requests[prefix]
    assert evaluation["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge"
    one_gpu = {**only, "evaluate": _evaluate(base, training_job=job, instance_type="ml.p5.4xlarge")}
    refused = _run(workflow, one_gpu, f"bad-{prefix}")
    assert (refused["status"], refused["error"]) == ("FAILED", "InvalidInput")
    assert refused["cause"].startswith(
        "evaluate.instance_type: ml.p5.4xlarge's 1 x 80 GB of GPU memory cannot hold"
    )
    assert len(workflow.jobs(prefix)) == 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"evaluate": {"tasks": ["mmlu"]}}, "evaluate.tasks: mmlu not defined in the task folder"),
        (
            {"evaluate": {"task_data_uri": "s3://elsewhere/tasks/"}},
            "evaluate.task_data_uri: must be the task folder",
        ),
        ({"evaluate": {"task_data_uri": None}}, "evaluate.task_data_uri: must be the task folder"),
        ({"evaluate": {"tasks": []}}, "evaluate.tasks: must be a list of 1 to 10 distinct task names"),
        ({"evaluate": {"limit": 0}}, "evaluate.limit: must be an integer in [1, 100000000], or null"),
        ({"evaluate": {"shots": 5}}, "evaluate.shots: unknown field"),
        ({"train_data_uri": "{base}data/bytes/"}, "was trained on byte-level tokens"),
        ({"train_data_uri": "{base}data/lost/"}, "which has no tokenizer.json beside its tokens"),
        ({"train_data_uri": None}, "the run trains on synthetic tokens (no train_data_uri)"),
        (
            {"hyperparameters": {"position_encoding": "none"}},
            "position_encoding=none, and such a model has no",
        ),
        ({"evaluate": {"training_job": "no-such-job"}}, "evaluate.training_job: no training job no-such-job"),
        ({"evaluate": {"training_job": "j"}, "precision": "fp8"}, "precision: applies to training"),
        (
            {"training_plan_arn": PLAN, "evaluate": {"instance_type": "ml.p5.4xlarge"}},
            "evaluate.instance_type: with training_plan_arn the evaluation job runs on the plan's reserved capacity",
        ),
    ],
)
def test_each_refusal_ends_in_invalid_input_before_anything_launches(deployed, change, words):
    workflow, base = deployed
    prefix = _prefix()
    execution_input = {
        "job_name_prefix": prefix,
        "train_data_uri": f"{base}data/words/",
        "evaluate": _evaluate(base),
    }
    for key, value in change.items():
        if key == "evaluate":
            execution_input["evaluate"] = {**execution_input["evaluate"], **value}
        else:
            execution_input[key] = value.format(base=base) if isinstance(value, str) else value
    if "training_job" in execution_input["evaluate"]:
        execution_input.pop("train_data_uri")
    result = _run(workflow, execution_input, f"bad-{prefix}")
    assert (result["status"], result["error"]) == ("FAILED", "InvalidInput"), result
    assert words in result["cause"]
    assert workflow.jobs(prefix) == []


def test_evaluating_a_job_that_did_not_complete_or_is_not_this_workflows_is_refused(deployed):
    workflow, base = deployed
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome("Failed", "AlgorithmError: boom"))
    failed = _run(
        workflow, {"job_name_prefix": prefix, "train_data_uri": f"{base}data/words/"}, f"run-{prefix}"
    )
    (job,) = workflow.jobs(prefix)
    assert failed["status"] == "FAILED"
    foreign = f"{prefix}-foreign"
    workflow.sagemaker.create_training_job(
        TrainingJobName=foreign,
        AlgorithmSpecification={"TrainingImage": "x", "TrainingInputMode": "File"},
        RoleArn="arn:aws:iam::123456789012:role/x",
        OutputDataConfig={"S3OutputPath": f"{base}output/"},
        ResourceConfig={"InstanceType": "ml.p5.4xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 60},
        CheckpointConfig={"S3Uri": "s3://another-bucket/checkpoints/x/"},
    )
    for name, words in (
        (job, f"{job} ended Failed, not Completed"),
        (foreign, "is not a training job of this workflow"),
    ):
        result = _run(
            workflow,
            {"job_name_prefix": prefix, "evaluate": _evaluate(base, training_job=name)},
            f"x-{uuid.uuid4().hex[:8]}",
        )
        assert (result["status"], result["error"]) == ("FAILED", "InvalidInput")
        assert words in result["cause"], result["cause"]


def _upload_folder(s3, base: str, key: str, folder) -> str:
    bucket = base[5:].rstrip("/")
    for path in sorted(folder.iterdir()):
        s3.put_object(Bucket=bucket, Key=f"{key}{path.name}", Body=path.read_bytes())
    return f"{base}{key}"


def test_a_preference_tuning_run_names_its_objective_and_is_evaluated_as_a_fine_tuning_run(
    deployed, tmp_path
):
    """docs/preference-tuning.md's execution input (``hyperparameters.objective`` dpo on prepared pairs, from a model
    folder) with an evaluation: the request check reads the pairs' metadata.json against the model, the training
    job runs the objective the input names and is planned as a DPO run, and its model.tar.gz is evaluated as any
    run's is (the refusals of an objective that does not fit the data: tests/request/test_preference_request.py)."""
    from tests.training.chat_models import model_folder
    from training.prepare import pairs as prepare_pairs

    workflow, base = deployed
    shape = settings_parse.parse_hyperparameters({"model_preset": "custom", "num_layers": "2", "hidden_size": "64",
                                                  "num_heads": "4", "num_kv_heads": "2", "ffn_hidden_size": "128",
                                                  "vocab_size": "336"})  # fmt: skip
    folder = model_folder(tmp_path / "model", "llama3.1")
    (folder / "config.json").write_text(json.dumps(hf_config.to_config(shape)))
    (folder / "model.safetensors").write_bytes(b"x")  # the check reads no weights
    model = _upload_folder(workflow.s3, base, "data/dpo-model/", folder)
    pairs = [{"prompt": f"name a number after {n}", "chosen": f"The next number is {n + 1}.", "rejected": str(n + 1)}
             for n in range(100)]  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    prepare_pairs.prepare_pairs(
        [tmp_path / "pairs.jsonl"], str(tmp_path / "pairs"), str(folder), validation_fraction=0.1
    )
    data = _upload_folder(workflow.s3, base, "data/dpo-pairs/", tmp_path / "pairs")
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome(), Outcome(final_metrics=SCORES))
    hyperparameters = {"objective": "dpo", "dpo_beta": "0.1", "max_steps": "100", "learning_rate": "5e-7"}
    execution_input = {"job_name_prefix": prefix, "init_from": model, "train_data_uri": data, "seq_length": 512,
                       "batch_size": 1, "hyperparameters": hyperparameters, "evaluate": _evaluate(base)}  # fmt: skip
    result = _run(workflow, execution_input, f"run-{prefix}")
    assert result["status"] == "SUCCEEDED", result
    train, evaluation = OUTCOMES.requests[prefix]
    assert train["HyperParameters"]["objective"] == "dpo" and train["HyperParameters"]["dpo_beta"] == "0.1"
    assert {c["ChannelName"] for c in train["InputDataConfig"]} == {TRAIN_CHANNEL, container.WEIGHTS_CHANNEL}
    plan = result["summary"]["plan"]
    assert plan["data"]["kind"] == "preference" and plan["preference"]["reference"] == "precomputed"
    model_tar = f"{base}output/{train['TrainingJobName']}/output/model.tar.gz"
    assert {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in evaluation["InputDataConfig"]} == {
        TASKS_CHANNEL: f"{base}data/tasks/", MODEL_CHANNEL: model_tar}  # fmt: skip
    assert evaluation["HyperParameters"] == {"tasks": "piqa,hellaswag", "batch_size": "32"}
    assert {m["MetricName"]: m["Value"] for m in result["summary"]["evaluation"]["scores"]} == dict(SCORES)
    assert len(workflow.jobs(prefix)) == 2  # the training and its evaluation: nothing more
