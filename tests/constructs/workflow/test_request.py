"""The CreateTrainingJob request as a pure function: no stack, no state machine."""

from constructs_lib.workflow.request import job_tags, resource_config, training_job_request
from training.contract import CHECKPOINT_LOCAL_PATH, metric_definitions

BASE = dict(
    role_arn="arn:aws:iam::123456789012:role/exec",
    image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/repo:v1",
    bucket_name="ckpt-bucket",
    checkpoint_prefix="checkpoints/",
    output_prefix="output/",
    internal_retry_attempts=2,
    tags=[],
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


def test_job_tags_workflow_then_execution_then_sorted_user_tags() -> None:
    tags = job_tags("Stack/Workflow", {"b": "2", "a": "1"})
    assert tags == [
        {"Key": "training-workflow", "Value": "Stack/Workflow"},
        {"Key": "training-workflow-execution", "Value.$": "$$.Execution.Name"},
        {"Key": "a", "Value": "1"},
        {"Key": "b", "Value": "2"},
    ]
    assert training_job_request(**{**BASE, "tags": tags})["Tags"] == tags


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

    from training.contract import TENSORBOARD_LOCAL_PATH

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


def test_mlflow_config_and_the_trainers_environment_name_the_server_workflow_and_execution() -> None:
    import re

    from training import contract

    assert "MlflowConfig" not in training_job_request(**BASE) and "Environment" not in training_job_request(
        **BASE
    )
    arn = "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/team"
    request = training_job_request(**BASE, mlflow_resource_arn=arn, mlflow_experiment="Stack-Workflow")
    assert request["MlflowConfig"] == {
        "MlflowResourceArn": arn,
        "MlflowExperimentName": "Stack-Workflow",
        "MlflowRunName.$": "$$.Execution.Name",
    }
    assert request["Environment"] == {
        contract.MLFLOW_TRACKING_URI_ENV: arn,
        contract.MLFLOW_EXPERIMENT_ENV: "Stack-Workflow",
        f"{contract.MLFLOW_RUN_NAME_ENV}.$": "$$.Execution.Name",
    }
    shape = _create_training_job_member("MlflowConfig")
    assert {"MlflowResourceArn", "MlflowExperimentName", "MlflowRunName"} <= set(shape.members)
    assert re.fullmatch(shape.members["MlflowResourceArn"].metadata["pattern"], arn)
    environment = _create_training_job_member("Environment")
    for key in request["Environment"]:
        assert re.fullmatch(environment.key.metadata["pattern"], key.removesuffix(".$")), key
