"""The ``CreateTrainingJob`` request of the training workflow: a pure function of the workflow's settings.

No construct is built here, so the request can be tested without a state machine. A new request field is added
in ``training_job_request`` (fixed at synth), in the launch states that fill ``$.launch`` (per launch), or in the
request check's ``job_fields`` (per execution, decided before launch: taken from ``$.request``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from training.contract.container import CHECKPOINT_LOCAL_PATH, TENSORBOARD_LOCAL_PATH
from training.contract.metric_lines import metric_definitions

MLFLOW_ARN = re.compile(
    r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:[0-9]{12}:mlflow-(tracking-server|app)/[A-Za-z0-9-]+$"
)
"""A SageMaker managed MLflow tracking server or MLflow app (``MlflowConfig.MlflowResourceArn``)."""
TENSORBOARD_FOLDER = "tensorboard"
"""Under the output prefix: ``<output_prefix>tensorboard/<run segment>/<execution name>/`` holds a run's event files."""


def resource_config(*, volume_size_gb: int, volume_kms_key_arn: str | None = None) -> dict[str, Any]:
    """``ResourceConfig`` before the capacity mode adds its fields (instance type and count from the input)."""
    config: dict[str, Any] = {
        "InstanceType.$": "$.config.instance_type",
        "InstanceCount.$": "$.config.instance_count",
        "VolumeSizeInGB": volume_size_gb,
    }
    if volume_kms_key_arn is not None:
        config["VolumeKmsKeyId"] = volume_kms_key_arn
    return config


def run_checkpoint_uri(bucket_name: str, checkpoint_prefix: str) -> str:
    """The run's checkpoint prefix, ``s3://<bucket>/<checkpoint_prefix><execution name>/``, as an intrinsic of the
    execution's name: the folder backend's ``CheckpointConfig.S3Uri``, and the prefix an S3-direct trainer writes
    (``training.request.job.with_checkpoint_place`` puts the same in its ``checkpoint_dir``)."""
    return f"States.Format('s3://{bucket_name}/{checkpoint_prefix}{{}}/', $$.Execution.Name)"


def training_job_request(
    *,
    role_arn: str,
    image_uri: str,
    bucket_name: str,
    checkpoint_prefix: str,
    output_prefix: str,
    internal_retry_attempts: int,
    output_kms_key_arn: str | None = None,
    vpc_config: Mapping[str, Any] | None = None,
    network_isolation: bool = False,
    tensorboard_segment: str | None = None,
    mlflow_resource_arn: str | None = None,
    mlflow_experiment: str | None = None,
) -> dict[str, Any]:
    """The ``Parameters`` of the ``createTrainingJob.sync`` task (JSONPath; ``$.launch`` is filled per launch).

    The decided request (``request_states``) gives ``$.hyperparameters`` (the whole map) and ``$.request`` (the
    per-execution fields: ``Tags``, ``Environment``, ``InfraCheckConfig``, ``RemoteDebugConfig``, see
    ``training.request.job.job_fields``); the launch state with input data adds ``InputDataConfig`` from ``$.channels``
    (``states``).
    ``checkpoint_prefix`` is the workflow's own (``checkpoints/<segment>/``): each execution writes under
    ``<checkpoint_prefix><execution name>/``.

    :param output_kms_key_arn: key for the model artifacts. Default: the bucket's encryption.
    :param vpc_config: ``VpcConfig`` (``SecurityGroupIds``, ``Subnets``). Default: no VPC.
    :param network_isolation: ``EnableNetworkIsolation``: no network access from the training container.
        Default False (the key is left out).
    :param tensorboard_segment: the workflow's folder for ``TensorBoardOutputConfig``: SageMaker syncs the
        trainer's event files from ``LocalPath`` to ``s3://<bucket>/<output_prefix>tensorboard/<segment>/<execution
        name>/`` (every launch of an execution to the same folder). Default: no TensorBoard output.
    :param mlflow_resource_arn: a SageMaker managed MLflow tracking server (or MLflow app): ``MlflowConfig`` with
        experiment ``mlflow_experiment`` and run = the execution name (the trainer's own MLflow variables join
        ``$.request.Environment``: ``training.request.job.job_fields``). Default: no MLflow.
    """
    checkpoint_uri = run_checkpoint_uri(bucket_name, checkpoint_prefix)
    output_config: dict[str, Any] = {"S3OutputPath": f"s3://{bucket_name}/{output_prefix}"}
    if output_kms_key_arn is not None:
        output_config["KmsKeyId"] = output_kms_key_arn
    request: dict[str, Any] = {
        "TrainingJobName.$": "States.Format('{}-{}', $.config.job_name_prefix, States.UUID())",
        "RoleArn": role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": image_uri,
            "TrainingInputMode": "File",
            "MetricDefinitions": [m.as_sagemaker() for m in metric_definitions()],
            "EnableSageMakerMetricsTimeSeries": True,
        },
        "HyperParameters.$": "$.hyperparameters",
        "ResourceConfig.$": "$.launch.resource_config",
        "StoppingCondition.$": "$.launch.stopping_condition",
        "EnableManagedSpotTraining.$": "$.launch.spot",
        "EnableInterContainerTrafficEncryption.$": "$.launch.encrypt_inter_node",
        "CheckpointConfig": {"S3Uri.$": checkpoint_uri, "LocalPath": CHECKPOINT_LOCAL_PATH},
        "OutputDataConfig": output_config,
        "RetryStrategy": {"MaximumRetryAttempts": internal_retry_attempts},
        "Tags.$": "$.request.Tags",
        "Environment.$": "$.request.Environment",
        "InfraCheckConfig.$": "$.request.InfraCheckConfig",
        "RemoteDebugConfig.$": "$.request.RemoteDebugConfig",
    }
    if tensorboard_segment is not None:
        request["TensorBoardOutputConfig"] = {
            "LocalPath": TENSORBOARD_LOCAL_PATH,
            "S3OutputPath.$": (
                f"States.Format('s3://{bucket_name}/{output_prefix}{TENSORBOARD_FOLDER}/{tensorboard_segment}/{{}}/', "
                "$$.Execution.Name)"
            ),
        }
    if mlflow_resource_arn is not None:
        if not mlflow_experiment:
            raise ValueError("training_job_request: mlflow_resource_arn needs mlflow_experiment")
        request["MlflowConfig"] = {
            "MlflowResourceArn": mlflow_resource_arn,
            "MlflowExperimentName": mlflow_experiment,
            "MlflowRunName.$": "$$.Execution.Name",
        }
    if vpc_config is not None:
        request["VpcConfig"] = dict(vpc_config)
    if network_isolation:
        request["EnableNetworkIsolation"] = True
    return request


EVALUATION_JOB_OMITS = (
    "CheckpointConfig",
    "TensorBoardOutputConfig",
    "MlflowConfig",
    "EnableNetworkIsolation",
)
"""Training-only parts of the request: an evaluation job writes no checkpoints, no TensorBoard files and logs
nothing to MLflow (it has no network); its ``EnableNetworkIsolation`` is its own, always true."""


def evaluation_job_request(training_request: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Parameters`` of the evaluation job's ``createTrainingJob.sync`` task, from the training job's
    (``training_job_request``): the same image, role, outputs, VPC, retry strategy and per-launch fields, its own
    ``MetricDefinitions`` (the tasks' scores, decided per execution: ``$.request.MetricDefinitions``), no
    checkpoints, TensorBoard output nor ``MlflowConfig``, and ``EnableNetworkIsolation`` always, whatever the
    training job's: the job runs lm-eval over a task folder that may hold the user's own Python (``!function``
    helpers), and its model and tasks arrive as channels, so it needs no network. Its scores leave through the
    job's metrics and ``output.tar.gz``, which SageMaker moves (the summary, the dashboard, ``result``)."""
    request = {k: v for k, v in training_request.items() if k not in EVALUATION_JOB_OMITS}
    algorithm = {
        k: v for k, v in training_request["AlgorithmSpecification"].items() if k != "MetricDefinitions"
    }
    request["AlgorithmSpecification"] = {**algorithm, "MetricDefinitions.$": "$.request.MetricDefinitions"}
    request["EnableNetworkIsolation"] = True
    return request
