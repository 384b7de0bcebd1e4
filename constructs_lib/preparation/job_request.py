"""The ``CreateProcessingJob`` request of one preparation (JSONPath, filled from the decided execution input).

The job runs the training image's ``python -m training.prepare.job`` on ``instance_count`` instances: the input
prefix is shared out by object (``ShardedByS3Key``: each instance downloads about 1/n of the objects to
``/opt/ml/processing/input/data``), the tokenizer or model folder goes to every instance (``FullyReplicated``, to
``/opt/ml/processing/input/model``); the script writes the shards and the manifest to the output prefix itself
(conditional writes, so no ``ProcessingOutputConfig``: SageMaker's own upload could overwrite).
"""

from __future__ import annotations

from typing import Any

DATA_PATH = "/opt/ml/processing/input/data"
MODEL_PATH = "/opt/ml/processing/input/model"
EXIT_MESSAGE = "/opt/ml/output/message"
"""Where the script writes its error line: SageMaker returns it as the job's ``ExitMessage``
(``training.prepare.job.EXIT_MESSAGE``; a test keeps the two equal)."""
SCRATCH = "/opt/ml/processing/scratch"
"""Where the workers write shards before upload: the job's volume (``VolumeSizeInGB``), not the root file system
(``training.prepare.job.PROCESSING_SCRATCH``; a test keeps the two equal)."""
ENTRY_POINT = ["python3", "-m", "training.prepare.job"]
"""What the container runs (its working folder and PYTHONPATH are the image's /opt/ml/code)."""


def processing_job_request(*, role_arn: str, image_uri: str, volume_size_gb: int, max_runtime_seconds: int,
                           tags: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """``sagemaker:createProcessingJob.sync`` parameters; the state's input is ``{"request": ..., "job": ...}``
    (the decided execution input, and ``job``'s name, output URI and text arguments)."""
    arguments = (
        "States.Array('--input', $.request.input_uri, '--output', $.job.output_uri, '--local-input', "
        f"'{DATA_PATH}', '--model', '{MODEL_PATH}', '--kind', $.request.kind, '--text-field', $.request.text_field, "
        "'--validation-fraction', $.job.validation_fraction, '--max-tokens', $.job.max_tokens, '--too-long', "
        "$.request.too_long, '--template-seconds', $.job.template_seconds, "
        f"'--exit-message', '{EXIT_MESSAGE}', '--scratch', '{SCRATCH}')"
    )
    return {
        "ProcessingJobName.$": "$.job.name",
        "RoleArn": role_arn,
        "AppSpecification": {
            "ImageUri": image_uri,
            "ContainerEntrypoint": ENTRY_POINT,
            "ContainerArguments.$": arguments,
        },
        "Environment": {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
        "ProcessingInputs": [
            _input("data", "$.request.input_uri", DATA_PATH, "ShardedByS3Key"),
            _input("model", "$.request.model_uri", MODEL_PATH, "FullyReplicated"),
        ],
        "ProcessingResources": {
            "ClusterConfig": {
                "InstanceCount.$": "$.request.instance_count",
                "InstanceType.$": "$.request.instance_type",
                "VolumeSizeInGB": volume_size_gb,
            }
        },  # fmt: skip
        "StoppingCondition": {"MaxRuntimeInSeconds": max_runtime_seconds},
        "Tags": [{"Key": key, "Value": value} for key, value in sorted(tags.items())],
    }


def _input(name: str, uri: str, path: str, distribution: str) -> dict[str, Any]:
    return {"InputName": name, "S3Input": {"S3Uri.$": uri, "LocalPath": path, "S3DataType": "S3Prefix",
                                           "S3InputMode": "File", "S3DataDistributionType": distribution}}  # fmt: skip
