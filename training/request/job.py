"""The parts of a training job's ``CreateTrainingJob`` request that the decision gives per execution (the workflow's
template takes each from its state): the job's ``Tags``, ``Environment``, ``InfraCheckConfig`` and
``RemoteDebugConfig`` (:func:`job_fields`), and its ``InputDataConfig`` (:func:`channels`, :func:`channel`). Each is
a function of the request's decided fields (``value.Fields``) and the workflow's rules.

Pure Python, standard library only; part of the request check's Lambda asset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from training.contract.container import (
    MLFLOW_EXPERIMENT_ENV,
    MLFLOW_RUN_NAME_ENV,
    MLFLOW_TRACKING_URI_ENV,
    TRAIN_CHANNEL,
    WEIGHTS_CHANNEL,
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
