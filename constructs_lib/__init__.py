"""CDK constructs for training large transformers on SageMaker with NVIDIA Blackwell GPUs.

One package per part: ``workflow`` (the Step Functions training workflow), ``image`` (the training image's
repository and its deploy-time build), ``storage`` (the checkpoint bucket), ``identity`` (the jobs' execution
role), ``cli`` (the operator's command), helpers they share in ``_shared``; ``stack`` and ``config`` compose them
from ``cdk.json`` settings.

The constructs are imported on first use (PEP 562), so ``constructs_lib.workflow.request_check`` can be imported
by a Lambda function or the operator CLI without loading aws_cdk.
"""

from __future__ import annotations

from typing import Any

from constructs_lib._shared.lazy import lazy_attribute

_EXPORTS = {
    "BlackwellTrainingStack": ".stack",
    "CheckpointBucket": ".storage.checkpoint_bucket",
    "SageMakerExecutionRole": ".identity.execution_role",
    "TrainingImageBuild": ".image.build",
    "TrainingImageRepository": ".image.repository",
    "TrainingWorkflow": ".workflow.construct",
    "WorkflowDefaults": ".workflow.defaults",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
