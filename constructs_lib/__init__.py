"""CDK constructs for training large transformers on SageMaker with NVIDIA Blackwell GPUs."""

from constructs_lib.checkpoint_bucket import CheckpointBucket
from constructs_lib.execution_role import SageMakerExecutionRole
from constructs_lib.image_repository import TrainingImageRepository

__all__ = ["CheckpointBucket", "SageMakerExecutionRole", "TrainingImageRepository"]
