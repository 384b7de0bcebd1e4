"""A small stack around ``TrainingWorkflow`` for the workflow tests (bucket, repository, role, workflow)."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk

from constructs_lib.identity.execution_role import SageMakerExecutionRole
from constructs_lib.image.repository import TrainingImageRepository
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket
from constructs_lib.workflow.construct import TrainingWorkflow
from tests.cdk_helpers import DEFAULT_ENV

IMAGE_TAG = "v1"


def build_workflow(app: cdk.App, **props: Any) -> TrainingWorkflow:
    """``Test`` stack in 123456789012/us-west-2 (created unless the app has it) with the workflow ``Workflow``
    wired to fresh resources."""
    stack = app.node.try_find_child("Test") or cdk.Stack(app, "Test", env=DEFAULT_ENV)
    bucket = CheckpointBucket(stack, "Checkpoints")
    images = TrainingImageRepository(stack, "Images")
    role = SageMakerExecutionRole(stack, "ExecutionRole", checkpoint_bucket=bucket, image_repository=images)
    props.setdefault("image_uri", images.image_uri(IMAGE_TAG))
    props.setdefault("execution_role", role)
    props.setdefault("checkpoint_bucket", bucket)
    return TrainingWorkflow(stack, "Workflow", **props)
