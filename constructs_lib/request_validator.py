"""``RequestValidator``: the Lambda function that decides a training workflow's request before anything launches.

It runs :func:`constructs_lib.request_validation.handler` (see that module for why a Lambda function). Its asset
holds exactly what the handler imports, copied from the installed packages at synth time (so it works from a
wheel as well as from a checkout): ``constructs_lib/request_validation.py``, ``training/contract.py`` and two
empty ``__init__.py`` files (the real ``constructs_lib/__init__.py`` would pull in aws_cdk). Its role may write its
own log group and read, under the workflow's checkpoint prefix only, the listing and the ``COMPLETE`` markers that
decide ``resume_from``; nothing else.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

import training.contract
from constructs_lib import request_validation
from constructs_lib._nag import acknowledge, policy_scope, rendered

HANDLER = "constructs_lib.request_validation.handler"
ASSET_FILES = {
    "constructs_lib/request_validation.py": Path(request_validation.__file__),
    "training/contract.py": Path(training.contract.__file__),
}


def build_asset() -> Path:
    """A folder with only the handler's files (content-addressed, so unchanged sources give the same asset)."""
    digest = hashlib.sha256()
    for name, source in sorted(ASSET_FILES.items()):
        digest.update(name.encode() + b"\0" + source.read_bytes())
    folder = Path(tempfile.gettempdir()) / f"request-validator-{digest.hexdigest()[:16]}"
    if not (folder / "constructs_lib" / "request_validation.py").exists():
        staging = Path(tempfile.mkdtemp(prefix="request-validator-"))
        for name, source in ASSET_FILES.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            (target.parent / "__init__.py").touch()
        try:
            staging.rename(folder)
        except OSError:  # another synth built the same folder first
            shutil.rmtree(staging, ignore_errors=True)
    return folder


class RequestValidator(Construct):
    """The request-deciding Lambda function of one training workflow.

    All props are keyword-only.

    :param bucket: the bucket holding the workflow's checkpoints.
    :param runs_prefix: the workflow's own checkpoint prefix (``checkpoints/<segment>/``): one folder per
        execution, each with ``step_XXXXXXXX/COMPLETE`` markers. The function may list it and read the markers.
    :param log_retention: retention of the function's log group. Default six months.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket: s3.IBucket,
        runs_prefix: str,
        log_retention: logs.RetentionDays | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if not runs_prefix.endswith("/") or runs_prefix.startswith("/") or "*" in runs_prefix:
            raise ValueError(
                f"RequestValidator: runs_prefix must be a key prefix ending in '/'; got {runs_prefix!r}"
            )
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=log_retention or logs.RetentionDays.SIX_MONTHS,
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Training request validation: its own logs, and the workflow's checkpoint markers (read)",
        )
        self.log_group.grant_write(self.role)
        markers = bucket.arn_for_objects(f"{runs_prefix}*/{request_validation.CHECKPOINT_MARKER}")
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ReadCheckpointMarkers",
                actions=["s3:GetObject"],
                resources=[markers],
            )
        )
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ListWorkflowRuns",
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{runs_prefix}*"]}},
            )
        )
        if bucket.encryption_key is not None:
            bucket.encryption_key.grant(self.role, "kms:Decrypt")
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_.Runtime.PYTHON_3_14,
            code=lambda_.Code.from_asset(str(build_asset())),
            handler=HANDLER,
            description="Decides a training request (contract settings, SageMaker limits, resume_from) before launch",
            timeout=Duration.seconds(30),
            memory_size=256,
            role=self.role,
            log_group=self.log_group,
        )
        self.function.node.add_dependency(self.role)
        scope_ = policy_scope(self.role)
        acknowledge(
            scope_,
            f"IAM5[Resource::{rendered(self, markers)}]",
            "Reads only the COMPLETE marker files of the workflow's own checkpoint folders; the execution and "
            "step folder names in between are created at run time.",
        )

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        return self.function.grant_invoke(grantee)
