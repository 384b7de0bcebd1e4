"""The parts of a training job's ``CreateTrainingJob`` request that the decision gives per execution (the workflow's
template takes each from its state): the job's ``Tags``, ``Environment``, ``InfraCheckConfig`` and
``RemoteDebugConfig`` (:func:`job_fields`), its ``InputDataConfig`` (:func:`channels`, :func:`channel`) and where its
checkpoints go (:func:`checkpoint_backend`, :func:`with_checkpoint_place`: S3 direct puts the run's prefix in the
trainer's ``checkpoint_dir``, and the workflow then leaves ``CheckpointConfig`` out of the request). Each is a
function of the request's decided fields (``value.Fields``) and the workflow's rules.

Pure Python, standard library only; part of the request check's Lambda asset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from training.contract.container import (
    CHECKPOINT_LOCAL_PATH,
    MLFLOW_EXPERIMENT_ENV,
    MLFLOW_RUN_NAME_ENV,
    MLFLOW_TRACKING_URI_ENV,
    TRAIN_CHANNEL,
    WEIGHTS_CHANNEL,
    job_checkpoint_backend,
)
from training.request.rules import EXECUTION_TAG, WORKFLOW_TAG, RequestRules

if TYPE_CHECKING:
    from training.request.value import Fields


def job_fields(fields: Fields, rules: RequestRules, execution: str) -> dict[str, Any]:
    """The request fields decided per execution: the job's ``Tags`` (the workflow's path, the execution's name, the
    workflow's tags, then the input's ``tags``, each group sorted), ``Environment`` (the input's ``environment``,
    plus with an MLflow tracking server the trainer's MLflow variables: server, experiment = the workflow's
    segment, run = the execution), ``InfraCheckConfig`` and ``RemoteDebugConfig``."""
    fixed = [(WORKFLOW_TAG, rules.workflow_path), (EXECUTION_TAG, execution), *sorted(rules.tags.items())]
    environment = dict(fields.environment)
    if rules.mlflow_tracking_server_arn:
        environment.update(
            {
                MLFLOW_TRACKING_URI_ENV: rules.mlflow_tracking_server_arn,
                MLFLOW_EXPERIMENT_ENV: rules.workflow_segment or rules.workflow_path,
                MLFLOW_RUN_NAME_ENV: execution,
            }
        )
    return {
        "Tags": [{"Key": k, "Value": v} for k, v in (*fixed, *sorted(fields.tags.items()))],
        "Environment": environment,
        "InfraCheckConfig": {"EnableInfraCheck": fields.infra_check},
        "RemoteDebugConfig": {"EnableRemoteDebug": fields.remote_debug},
    }


def channels(fields: Fields) -> list[dict[str, Any]]:
    """The ``InputDataConfig`` of a request: its data (``train_data_uri``) and its starting weights (``init_from``);
    the decision adds the checkpoint it resumes from."""
    found = []
    if fields.train_data_uri is not None:
        found.append(channel(TRAIN_CHANNEL, fields.train_data_uri, fields.train_data_input_mode))
    if fields.init_from is not None:
        found.append(channel(WEIGHTS_CHANNEL, fields.init_from, "File"))
    return found


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


def checkpoint_backend(settings: Mapping[str, Any], instance_count: int, *, tuning: bool) -> str:
    """The backend the job keeps its checkpoints with: ``checkpoint_backend`` as given in ``hyperparameters``
    (each parsed on its own: ``value.TrainerSettings.each``), ``auto`` decided by the instance count
    (``container.job_checkpoint_backend``: S3 direct on several instances, the folder on one; a tuning run's report
    is in its folder)."""
    return job_checkpoint_backend(str(settings.get("checkpoint_backend", "auto")), instance_count, tuning)


def run_checkpoint_uri(rules: RequestRules, execution: str | None) -> str:
    """The run's checkpoint prefix, ``s3://<bucket>/<checkpoint_prefix><segment>/<execution>/`` (SageMaker's
    ``CheckpointConfig.S3Uri`` for the folder backend, the trainer's ``checkpoint_dir`` for S3 direct); ``<bucket>``
    and ``<execution>`` where the decision does not know them (offline)."""
    runs = rules.runs_uri()
    if runs is None:
        segment = f"{rules.workflow_segment}/" if rules.workflow_segment else ""
        runs = f"s3://<bucket>/{rules.checkpoint_prefix}{segment}"
    return f"{runs}{execution or '<execution>'}/"


def with_checkpoint_place(
    hyperparameters: Mapping[str, str], backend: str, rules: RequestRules, execution: str | None
) -> dict[str, str]:
    """The job's ``HyperParameters`` for ``backend``: S3 direct sets ``checkpoint_backend`` and the run's prefix as
    ``checkpoint_dir`` (the workflow leaves ``CheckpointConfig`` out of such a request); the folder keeps
    ``/opt/ml/checkpoints``, which SageMaker copies to the same prefix."""
    if backend != "s3":
        return {**hyperparameters, "checkpoint_dir": CHECKPOINT_LOCAL_PATH}
    return {
        **hyperparameters,
        "checkpoint_backend": "s3",
        "checkpoint_dir": run_checkpoint_uri(rules, execution),
    }


def job_checkpoint_uri(described: Mapping[str, Any]) -> str | None:
    """Where a training job (its ``DescribeTrainingJob``) kept its checkpoints: ``CheckpointConfig.S3Uri`` (the
    folder backend), or its ``checkpoint_dir`` when that is an ``s3://`` prefix (S3 direct); None otherwise."""
    configured = (described.get("CheckpointConfig") or {}).get("S3Uri")
    if configured:
        return configured
    direct = (described.get("HyperParameters") or {}).get("checkpoint_dir", "")
    return direct if direct.startswith("s3://") else None
