"""CDK constructs for training large transformers on SageMaker with NVIDIA Blackwell GPUs.

The constructs are imported on first use (PEP 562), so ``constructs_lib.request_validation`` can be imported by a
Lambda function or the operator CLI without loading aws_cdk.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BlackwellTrainingStack": "constructs_lib.stack",
    "CheckpointBucket": "constructs_lib.checkpoint_bucket",
    "SageMakerExecutionRole": "constructs_lib.execution_role",
    "TrainingImageBuild": "constructs_lib.image_build",
    "TrainingImageRepository": "constructs_lib.image_repository",
    "TrainingWorkflow": "constructs_lib.training_workflow",
    "WorkflowDefaults": "constructs_lib.training_workflow",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'constructs_lib' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
