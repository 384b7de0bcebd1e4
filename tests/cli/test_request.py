"""Reading a request, ``--set``, run names and the project's settings (no AWS)."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime

import pytest

from constructs_lib.cli.errors import InvalidRequest, OperatorError
from constructs_lib.cli.request import (
    DEFAULT_STACK_NAME,
    EXECUTION_NAME,
    Project,
    apply_settings,
    load_request,
    new_run_name,
    plan_request,
)


def test_load_request_from_file_stdin_or_nothing(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"precision": "mxfp8"}')
    assert load_request(str(path)) == {"precision": "mxfp8"}
    assert load_request("-", io.StringIO('{"batch_size": 4}')) == {"batch_size": 4}
    assert load_request(None) == {}


@pytest.mark.parametrize(
    "text, message",
    [("{precision: 1}", "not valid JSON"), ("[1, 2]", "must be a JSON object of input fields; got list")],
)
def test_load_request_refuses_what_is_not_a_json_object(text, message):
    with pytest.raises(InvalidRequest, match=message):
        load_request("-", io.StringIO(text))


def test_load_request_missing_file_is_one_line(tmp_path):
    with pytest.raises(OperatorError, match=r"cannot read .*nope.json: No such file or directory"):
        load_request(str(tmp_path / "nope.json"))


def test_set_reads_json_values_and_text_and_hyperparameters():
    request = {"precision": "bf16", "hyperparameters": {"seed": "1"}}
    merged = apply_settings(
        request,
        [
            "batch_size=16",
            "use_spot=true",
            "num_layers=null",
            "precision=mxfp8",
            "training_plan_arn=arn:aws:sagemaker:us-west-2:111122223333:training-plan/x",
            "hyperparameters.max_steps=2000",
            "job_name_prefix=a=b",
        ],
    )
    assert merged == {
        "precision": "mxfp8",
        "batch_size": 16,
        "use_spot": True,
        "num_layers": None,
        "training_plan_arn": "arn:aws:sagemaker:us-west-2:111122223333:training-plan/x",
        "hyperparameters": {"seed": "1", "max_steps": "2000"},
        "job_name_prefix": "a=b",
    }
    assert request == {"precision": "bf16", "hyperparameters": {"seed": "1"}}  # not changed in place


@pytest.mark.parametrize("setting", ["batch_size", "=3", "hyperparameters.=1"])
def test_set_refuses_malformed_settings(setting):
    with pytest.raises(InvalidRequest, match="--set"):
        apply_settings({}, [setting])


def test_set_of_a_hyperparameter_when_hyperparameters_is_not_an_object():
    with pytest.raises(InvalidRequest, match="hyperparameters must be an object"):
        apply_settings({"hyperparameters": "x"}, ["hyperparameters.seed=1"])


def test_run_names_are_valid_execution_names():
    now = datetime(2026, 11, 23, 9, 30, 5, tzinfo=UTC)
    name = new_run_name({"job_name_prefix": "llama-8b"}, now)
    assert re.fullmatch(r"llama-8b-20261123-093005-[0-9a-f]{4}", name)
    assert new_run_name({"job_name_prefix": "bad prefix!"}, now).startswith("run-20261123-093005-")
    assert EXECUTION_NAME.match(new_run_name({"job_name_prefix": "a" * 80}, now))
    assert new_run_name({}, now) != new_run_name({}, now)


def test_project_reads_the_nearest_cdk_json(tmp_path):
    (tmp_path / "cdk.json").write_text(json.dumps({"context": {"stackName": "Mine", "region": "eu-west-1"}}))
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    project = Project.find(nested)
    assert (project.stack_name, project.region, project.path) == ("Mine", "eu-west-1", tmp_path / "cdk.json")


def test_project_without_cdk_json_uses_the_defaults(tmp_path):
    project = Project.find(tmp_path)
    assert (project.stack_name, project.region, project.path) == (DEFAULT_STACK_NAME, None, None)


def test_unreadable_cdk_json_is_one_line(tmp_path):
    (tmp_path / "cdk.json").write_text("{")
    with pytest.raises(OperatorError, match="cdk.json: not readable as JSON"):
        Project.find(tmp_path)


def test_a_plan_of_an_init_from_request_reads_the_models_config_or_says_why_it_cannot(tmp_path):
    import boto3
    from moto import mock_aws

    from training.contract import shapes
    from training.request.rules import RequestRules

    rules = RequestRules(region="us-west-2", bucket_name="model-bucket").with_limits()
    request = {"init_from": "s3://model-bucket/data/llama/", "activation_checkpointing": True}
    with pytest.raises(InvalidRequest, match="init_from: the plan needs the model folder's config.json"):
        plan_request(request, rules)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket="model-bucket", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        config = {"model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                  "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 128256,
                  "tie_word_embeddings": True, "rope_theta": 500000.0}  # fmt: skip
        s3.put_object(Bucket="model-bucket", Key="data/llama/config.json", Body=json.dumps(config).encode())
        s3.put_object(Bucket="model-bucket", Key="data/llama/model.safetensors", Body=b"w")
        planned = plan_request(request, rules, s3=s3)
        assert planned["parameters"] == shapes.MODEL_PRESETS["llama3.2-3b"].parameter_count()
        with pytest.raises(InvalidRequest, match="init_from: holds no config.json"):
            plan_request({"init_from": "s3://model-bucket/data/"}, rules, s3=s3)


def test_an_offline_plan_of_a_workflow_default_init_from_says_why_it_cannot():
    """The decided ``init_from`` (here the workflow's default, not the input's) is what needs S3: the plan read
    the input's own field and, offline, ended in an ``InvalidRequest`` with no problem at all."""
    from training.request.rules import RequestRules

    rules = RequestRules(
        region="us-west-2", bucket_name="b", defaults={"init_from": "s3://b/data/llama/"}
    ).with_limits()
    with pytest.raises(InvalidRequest) as refused:
        plan_request({}, rules)
    assert refused.value.problems == [
        "init_from: the plan needs the model folder's config.json from S3 (its shape): plan with --deployed or "
        "--stack, or offline with a local copy of the folder (--init-from DIR)"
    ]
