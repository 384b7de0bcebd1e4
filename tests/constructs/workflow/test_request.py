"""The CreateTrainingJob request as a pure function: no stack, no state machine."""

from constructs_lib.workflow.request import resource_config, training_job_request
from training.contract.container import CHECKPOINT_LOCAL_PATH
from training.contract.metric_lines import metric_definitions
from training.request.decision import prepare_request
from training.request.job import job_fields
from training.request.rules import RequestRules

BASE = dict(
    role_arn="arn:aws:iam::123456789012:role/exec",
    image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/repo:v1",
    bucket_name="ckpt-bucket",
    checkpoint_prefix="checkpoints/",
    output_prefix="output/",
    internal_retry_attempts=2,
)


def test_minimal_request_has_fixed_fields_and_no_optional_ones() -> None:
    request = training_job_request(**BASE)
    assert request["RoleArn"] == BASE["role_arn"]
    spec = request["AlgorithmSpecification"]
    assert spec["TrainingImage"] == BASE["image_uri"]
    assert spec["MetricDefinitions"] == [m.as_sagemaker() for m in metric_definitions()]
    assert request["CheckpointConfig"] == {
        "S3Uri.$": "States.Format('s3://ckpt-bucket/checkpoints/{}/', $$.Execution.Name)",
        "LocalPath": CHECKPOINT_LOCAL_PATH,
    }
    assert request["OutputDataConfig"] == {"S3OutputPath": "s3://ckpt-bucket/output/"}
    assert request["RetryStrategy"] == {"MaximumRetryAttempts": 2}
    assert request["ResourceConfig.$"] == "$.launch.resource_config"
    for absent in ("VpcConfig", "InputDataConfig"):
        assert absent not in request


def test_optional_fields_appear_when_given() -> None:
    vpc = {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]}
    request = training_job_request(**BASE, output_kms_key_arn="arn:key", vpc_config=vpc)
    assert request["OutputDataConfig"]["KmsKeyId"] == "arn:key"
    assert request["VpcConfig"] == vpc


def test_hyperparameters_are_the_decided_map() -> None:
    """The Lambda function decided the whole map (contract names, strings, platform paths): sent as is."""
    assert training_job_request(**BASE)["HyperParameters.$"] == "$.hyperparameters"


def test_per_execution_fields_come_from_the_decided_request() -> None:
    request = training_job_request(**BASE)
    for name in ("Tags", "Environment", "InfraCheckConfig", "RemoteDebugConfig"):
        assert request[f"{name}.$"] == f"$.request.{name}"


def test_job_fields_workflow_then_execution_then_workflow_tags_then_run_tags() -> None:
    rules = RequestRules(workflow_path="Stack/Workflow", tags={"b": "2", "a": "1"}, remote_debug=True)
    raw = {"tags": {"z": "9", "c": "3"}, "environment": {"NCCL_DEBUG": "INFO"}, "infra_check": True}
    prepared = prepare_request({**raw, "remote_debug": True}, rules)
    assert prepared.problems == []
    assert job_fields(prepared.fields, rules, "run-1") == {
        "Tags": [
            {"Key": "training-workflow", "Value": "Stack/Workflow"},
            {"Key": "training-workflow-execution", "Value": "run-1"},
            {"Key": "a", "Value": "1"},
            {"Key": "b", "Value": "2"},
            {"Key": "c", "Value": "3"},
            {"Key": "z", "Value": "9"},
        ],
        "Environment": {"NCCL_DEBUG": "INFO"},
        "InfraCheckConfig": {"EnableInfraCheck": True},
        "RemoteDebugConfig": {"EnableRemoteDebug": True},
    }
    defaults = job_fields(prepare_request({}, rules).fields, rules, "run-2")
    assert defaults["Environment"] == {} and defaults["InfraCheckConfig"] == {"EnableInfraCheck": False}
    assert defaults["RemoteDebugConfig"] == {"EnableRemoteDebug": False}


def test_resource_config_volume_key_only_when_given() -> None:
    assert resource_config(volume_size_gb=512) == {
        "InstanceType.$": "$.config.instance_type",
        "InstanceCount.$": "$.config.instance_count",
        "VolumeSizeInGB": 512,
    }
    assert resource_config(volume_size_gb=10, volume_kms_key_arn="arn:k")["VolumeKmsKeyId"] == "arn:k"


def _create_training_job_member(name: str):
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model("CreateTrainingJob").input_shape.members[name]


def test_tensorboard_output_goes_under_the_output_prefix_per_execution_and_fits_the_api() -> None:
    import re

    from training.contract.container import TENSORBOARD_LOCAL_PATH

    assert "TensorBoardOutputConfig" not in training_job_request(**BASE)
    config = training_job_request(**BASE, tensorboard_segment="Stack-Workflow")["TensorBoardOutputConfig"]
    assert config == {
        "LocalPath": TENSORBOARD_LOCAL_PATH,
        "S3OutputPath.$": "States.Format('s3://ckpt-bucket/output/tensorboard/Stack-Workflow/{}/', $$.Execution.Name)",
    }
    shape = _create_training_job_member("TensorBoardOutputConfig")
    assert set(shape.members) >= {"LocalPath", "S3OutputPath"} and shape.required_members == ["S3OutputPath"]
    for member, value in (
        ("LocalPath", config["LocalPath"]),
        ("S3OutputPath", "s3://ckpt-bucket/output/tensorboard/Stack-Workflow/run-1/"),
    ):
        limits = shape.members[member].metadata
        assert re.fullmatch(limits["pattern"], value) and len(value) <= limits["max"], member


def test_mlflow_config_names_the_server_workflow_and_execution_and_leaves_the_environment_to_the_request() -> (
    None
):
    import re

    assert "MlflowConfig" not in training_job_request(**BASE)
    arn = "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/team"
    request = training_job_request(**BASE, mlflow_resource_arn=arn, mlflow_experiment="Stack-Workflow")
    assert request["MlflowConfig"] == {
        "MlflowResourceArn": arn,
        "MlflowExperimentName": "Stack-Workflow",
        "MlflowRunName.$": "$$.Execution.Name",
    }
    # the trainer's MLflow variables travel in the decided request's Environment (training.request.job.job_fields)
    assert request["Environment.$"] == "$.request.Environment" and "Environment" not in request
    shape = _create_training_job_member("MlflowConfig")
    assert {"MlflowResourceArn", "MlflowExperimentName", "MlflowRunName"} <= set(shape.members)
    assert re.fullmatch(shape.members["MlflowResourceArn"].metadata["pattern"], arn)
