"""CDK constructs for training large transformers on SageMaker with NVIDIA Blackwell GPUs."""

from constructs_lib.checkpoint_bucket import CheckpointBucket
from constructs_lib.execution_role import SageMakerExecutionRole
from constructs_lib.image_build import TrainingImageBuild
from constructs_lib.image_repository import TrainingImageRepository
from constructs_lib.stack import BlackwellTrainingStack
from constructs_lib.training_workflow import TrainingWorkflow, WorkflowDefaults

__all__ = [
    "BlackwellTrainingStack",
    "CheckpointBucket",
    "SageMakerExecutionRole",
    "TrainingImageBuild",
    "TrainingImageRepository",
    "TrainingWorkflow",
    "WorkflowDefaults",
]
