"""``RequestValidator``: the Lambda function that decides a training workflow's request before anything launches.

It runs :func:`constructs_lib.workflow.request_check.handler` (see that module for why a Lambda function). Its asset
holds exactly what the handler imports: ``constructs_lib/workflow/request_check.py`` and every module of
``constructs_lib`` and ``training`` it imports, directly or through another, found in their source at synth time
(``constructs_lib/_shared/imports.py``) and copied from the installed packages (so it works from a wheel as well as
from a checkout), with an empty ``__init__.py`` in each of their folders (a package's own only where a module
imports the package itself). Today that is what decides a request: ``training/request/`` (the decision and its checks),
``training/contract/`` (the contract between the workflow and the trainer), ``training/plan/`` (the memory, time
and cost plan, without its command line) and ``training/models/`` (the families' config.json reading); standard
library only. A module a new import brings travels by itself. Its role may write its own log group, read, under the workflow's
checkpoint prefix only, the listing and the ``COMPLETE`` markers that decide ``resume_from``, list the allowed data
prefixes (a ``train_data_uri`` must hold an object, an ``init_from`` folder its files), read there only objects
named exactly ``config.json`` (an ``init_from`` model's architecture), ``metadata.json`` (prepared data's tokenizer,
conversation data's template and lengths), ``chat_template.jinja``, ``tokenizer_config.json`` and
``tokenizer.json`` (the model's template and tokenizer that conversation data must match) and task YAML files in a
folder below them (an evaluation's tasks), use the bucket's key to decrypt, describe only the training jobs tagged
as the workflow's (an evaluation-only request's job) and the training plans of its account and region (a request's
plan), and list and read the stored tuning measurements (``<tuning prefix>measurements/``); nothing else.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

import training.request.read_limits
from constructs_lib._shared.imports import source_files
from constructs_lib._shared.log_keys import keyed_log_group
from constructs_lib._shared.nag import (
    NIST_800_53_R5,
    SERVERLESS,
    acknowledge,
    acknowledge_role_policy,
    policy_scope,
    rendered,
)
from training.contract.container import DATA_METADATA_FILE
from training.request.hf_config import CONFIG_FILE
from training.request.rules import CHECKPOINT_MARKER
from training.request.sft_data import MODEL_FILES

HANDLER = "constructs_lib.workflow.request_check.handler"
TASK_FILE_SUFFIXES = (".yaml", ".yml")
"""Endings of the task files the check may read under a data prefix (an evaluation's task names: any file name)."""
NAMED_FILES = (CONFIG_FILE, DATA_METADATA_FILE, *MODEL_FILES)
"""Exact object names the check may read in a folder under a data prefix (the folder itself or any below it): an
``init_from`` model's ``config.json``, prepared data's ``metadata.json`` (an evaluated model's tokenizer; conversation
data's template, tokenizer and lengths), and an ``init_from`` model's chat template and tokenizer files
(``chat_template.jinja``, ``tokenizer_config.json``, ``tokenizer.json``: conversation data is checked against them)."""
ASSET_PACKAGES = ("constructs_lib", "training")
"""The packages whose modules the handler's asset carries (the Lambda runtime has only the standard library and
boto3 besides)."""


def asset_files() -> dict[str, Path]:
    """``path in the asset: source file`` of the handler's module and of every module of ``ASSET_PACKAGES`` it
    imports, directly or through another (``constructs_lib/_shared/imports.py``), from the installed packages."""
    return source_files(HANDLER.rpartition(".")[0], ASSET_PACKAGES)


def build_asset() -> Path:
    """A folder with only the handler's files, each package's ``__init__.py`` empty unless the handler imports
    the package itself (content-addressed: unchanged sources give the same asset, the same folder)."""
    files = asset_files()
    digest = hashlib.sha256()
    for name, source in files.items():
        digest.update(name.encode() + b"\0" + source.read_bytes())
    folder = Path(tempfile.gettempdir()) / f"request-validator-{digest.hexdigest()[:16]}"
    if not all((folder / name).exists() for name in files):
        staging = Path(tempfile.mkdtemp(prefix="request-validator-"))
        for name, source in files.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            for package in target.relative_to(staging).parents[:-1]:  # every folder of the path: a package
                (staging / package / "__init__.py").touch()
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
    :param data_prefixes: ``(bucket ARN, key prefix)`` of each allowed data source: the function may list them
        (``s3:ListBucket`` with an ``s3:prefix`` condition), to refuse a ``train_data_uri`` with no object, and read
        exactly the ``NAMED_FILES`` under them (``config.json``, ``metadata.json``, a model's chat template and
        tokenizer files) and the task YAML files (``s3:GetObject``), to decide an ``init_from`` model, conversation
        data against it, and an evaluation. Default: none.
    :param training_job_tag: ``(key, value)`` of the tag every training job of the workflow carries: the function
        may describe (``DescribeTrainingJob``) only jobs with that tag (``aws:ResourceTag`` condition), to decide an
        evaluation-only request. Default: none, and it may describe no training job.
    :param measurements_prefix: where the workflow stores the tuning runs' measurement records
        (``tuning/measurements/``): the function may list and read them, for the plan. Default: none.
    :param log_retention: retention of the function's log group. Default six months.
    :param encryption_key: customer managed key for the function's log group. Default: CloudWatch Logs' own.
    :param removal_policy: of the log group: ``RETAIN`` (default) or ``DESTROY``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket: s3.IBucket,
        runs_prefix: str,
        data_prefixes: Sequence[tuple[str, str]] = (),
        training_job_tag: tuple[str, str] | None = None,
        measurements_prefix: str | None = None,
        log_retention: logs.RetentionDays | None = None,
        encryption_key: kms.IKey | None = None,
        removal_policy: RemovalPolicy | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if not runs_prefix.endswith("/") or runs_prefix.startswith("/") or "*" in runs_prefix:
            raise ValueError(
                f"RequestValidator: runs_prefix must be a key prefix ending in '/'; got {runs_prefix!r}"
            )
        self.log_group = keyed_log_group(
            self,
            encryption_key,
            log_retention or logs.RetentionDays.SIX_MONTHS,
            removal_policy or RemovalPolicy.RETAIN,
            "/aws/lambda/",
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Training request validation: its own logs, and the workflow's checkpoint markers (read)",
        )
        self.log_group.grant_write(self.role)
        markers = bucket.arn_for_objects(f"{runs_prefix}*/{CHECKPOINT_MARKER}")
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ReadCheckpointMarkers",
                actions=["s3:GetObject"],
                resources=[markers],
            )
        )
        self._allow_listing("ListWorkflowRuns", bucket.bucket_arn, [f"{runs_prefix}*"])
        by_bucket: dict[str, list[str]] = {}
        for bucket_arn, prefix in data_prefixes:
            by_bucket.setdefault(bucket_arn, []).append(f"{prefix}*")
        self._grant_task_files(data_prefixes)
        if training_job_tag is not None:
            self._grant_describe_jobs(*training_job_tag)
        self._grant_describe_training_plans()
        for index, (bucket_arn, patterns) in enumerate(by_bucket.items()):
            self._allow_listing(f"ListTrainingData{index}", bucket_arn, patterns)
        self._grant_named_files(data_prefixes)
        records = self._read_measurements(bucket, measurements_prefix) if measurements_prefix else None
        if bucket.encryption_key is not None:
            bucket.encryption_key.grant(self.role, "kms:Decrypt")
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_.Runtime.PYTHON_3_14,
            code=lambda_.Code.from_asset(str(build_asset())),
            handler=HANDLER,
            description="Decides a training request (contract settings, SageMaker limits, resume_from, init_from) before launch",
            timeout=Duration.seconds(30),
            memory_size=training.request.read_limits.LAMBDA_MEMORY_MB,
            role=self.role,
            log_group=self.log_group,
        )
        self.function.node.add_dependency(self.role)
        scope_ = policy_scope(self.role)
        acknowledge_role_policy(scope_)
        _acknowledge_function(self.function)
        acknowledge(
            scope_,
            f"IAM5[Resource::{rendered(self, markers)}]",
            "Reads only the COMPLETE marker files of the workflow's own checkpoint folders; the execution and "
            "step folder names in between are created at run time.",
        )
        if records is not None:
            acknowledge(
                scope_,
                f"IAM5[Resource::{rendered(self, records)}]",
                "Reads only the tuning measurement records the workflow stores (one JSON file per tuning run, "
                "under a folder per image tag and workflow, named at run time), for the plan of each request.",
            )

    def _read_measurements(self, bucket: s3.IBucket, prefix: str) -> str:
        """List and read the stored tuning measurement records (under ``prefix``); the objects' ARN pattern."""
        if not prefix.endswith("/") or prefix.startswith("/") or "*" in prefix:
            raise ValueError(
                f"RequestValidator: measurements_prefix must be a key prefix ending in '/'; got {prefix!r}"
            )
        objects = bucket.arn_for_objects(f"{prefix}*")
        self.role.add_to_principal_policy(
            iam.PolicyStatement(sid="ReadTuningMeasurements", actions=["s3:GetObject"], resources=[objects])
        )
        self._allow_listing("ListTuningMeasurements", bucket.bucket_arn, [f"{prefix}*"])
        return objects

    def _allow_listing(self, sid: str, bucket_arn: str, patterns: list[str]) -> None:
        """``s3:ListBucket`` on one bucket, only for keys matching ``patterns`` (the ``s3:prefix`` condition)."""
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid=sid,
                actions=["s3:ListBucket"],
                resources=[bucket_arn],
                conditions={"StringLike": {"s3:prefix": patterns}},
            )
        )

    def _grant_named_files(self, data_prefixes: Sequence[tuple[str, str]]) -> None:
        """Read the ``NAMED_FILES`` of a folder under a data source (the folder itself or any folder below it) and
        no other object there: an ``init_from`` model's ``config.json`` (one statement), prepared data's
        ``metadata.json`` (another), a model's chat template and tokenizer files (a third)."""
        if not data_prefixes:
            return
        statements = (
            (
                "ReadModelConfigs",
                (CONFIG_FILE,),
                "the Hugging Face model folder an execution names in init_from",
            ),
            (
                "ReadDataMetadata",
                (DATA_METADATA_FILE,),
                "the prepared training data (an evaluated run's tokenizer; conversation data's template hash)",
            ),
            (
                "ReadModelTokenizers",
                MODEL_FILES,
                "the init_from model folder, whose chat template and tokenizer conversation data must match",
            ),
        )
        for sid, names, why in statements:
            resources = [
                f"{bucket_arn}/{prefix}{pattern}"
                for bucket_arn, prefix in data_prefixes
                for name in names
                for pattern in (name, f"*/{name}")
            ]
            self.role.add_to_principal_policy(
                iam.PolicyStatement(sid=sid, actions=["s3:GetObject"], resources=resources)
            )
            for resource in resources[1::2]:
                acknowledge(
                    policy_scope(self.role),
                    f"IAM5[Resource::{rendered(self, resource)}]",
                    f"Reads only objects named exactly {resource.rsplit('/', 1)[-1]} of {why}, under an allowed "
                    "data source; the folders below the data source are chosen per execution.",
                )

    def _grant_task_files(self, data_prefixes: Sequence[tuple[str, str]]) -> None:
        """Read the task YAML files in folders below the data prefixes (an evaluation's task names), and no other
        object: a task folder is never a data prefix itself (``evaluate_block.task_folder_problems``), and the check
        reads only the files directly in it; which folder is named per execution, and IAM's ``*`` matches across
        ``/``, so the grant cannot name the depth."""
        objects = [
            f"{bucket_arn}/{prefix}*/*{suffix}"
            for bucket_arn, prefix in data_prefixes
            for suffix in TASK_FILE_SUFFIXES
        ]
        if not objects:
            return
        self.role.add_to_principal_policy(
            iam.PolicyStatement(sid="ReadTaskFiles", actions=["s3:GetObject"], resources=objects)
        )
        for resource in objects:
            acknowledge(
                policy_scope(self.role),
                f"IAM5[Resource::{rendered(self, resource)}]",
                "An evaluation's check reads only task YAML files (any name: lm-eval's task files) directly in the "
                "task folder an execution names below an allowed data prefix, to refuse a task the folder does not "
                "define; the folder is chosen per execution.",
            )

    def _grant_describe_jobs(self, key: str, value: str) -> None:
        """Describe the training jobs tagged ``key=value`` (the workflow's own), to decide an evaluation-only
        request; the Service Authorization Reference lists ``aws:ResourceTag/${TagKey}`` for the ``training-job``
        resource type that ``DescribeTrainingJob`` acts on."""
        jobs = Stack.of(self).format_arn(
            service="sagemaker",
            resource="training-job",
            resource_name="*",
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="DescribeWorkflowTrainingJobs",
                actions=["sagemaker:DescribeTrainingJob"],
                resources=[jobs],
                conditions={"StringEquals": {f"aws:ResourceTag/{key}": value}},
            )
        )
        acknowledge(
            policy_scope(self.role),
            f"IAM5[Resource::{rendered(self, jobs)}]",
            f"Describes (read-only) only training jobs tagged {key}={value} (aws:ResourceTag condition): the jobs "
            "of this workflow, whose names are made per execution; an evaluation-only request names one.",
        )

    def _grant_describe_training_plans(self) -> None:
        """Describe the training plans of the stack's account and region (``DescribeTrainingPlan`` acts on the
        ``training-plan`` resource type), to refuse a request naming a plan that does not exist, has ended, or does
        not reserve the request's instance type and count."""
        plans = Stack.of(self).format_arn(
            service="sagemaker",
            resource="training-plan",
            resource_name="*",
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="DescribeTrainingPlans", actions=["sagemaker:DescribeTrainingPlan"], resources=[plans]
            )
        )
        acknowledge(
            policy_scope(self.role),
            f"IAM5[Resource::{rendered(self, plans)}]",
            "Describes (read-only) the training plan a request names (any name: plans are bought outside the "
            "stack), in the stack's own account and region, to check it holds the job's instances before launch.",
        )

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        return self.function.grant_invoke(grantee)


def _acknowledge_function(function: lambda_.Function) -> None:
    """What does not apply to a function that Step Functions invokes synchronously, once per execution."""
    for pack in (NIST_800_53_R5, SERVERLESS):
        acknowledge(
            function,
            "LambdaDLQ",
            "Step Functions invokes the function synchronously (lambda:invoke) and handles every error in its "
            "own Retry/Catch; a dead-letter queue only receives failed asynchronous invocations.",
            pack=pack,
        )
    acknowledge(
        function,
        "LambdaConcurrency",
        "Invoked once per workflow execution (a few a day); reserving concurrency would take it from the "
        "account's pool (10 in new accounts) and can fail the deployment.",
        pack=NIST_800_53_R5,
    )
    acknowledge(
        function,
        "LambdaInsideVPC",
        "The function only calls S3 (list and read checkpoint markers) through its AWS API and holds no data; "
        "a VPC would need endpoints or NAT for no protection gained.",
        pack=NIST_800_53_R5,
    )
    acknowledge(
        function,
        "LambdaTracing",
        "Each decision is logged (input problems, outcome) and the state machine's X-Ray trace covers the "
        "Lambda task; active tracing would add a '*' X-Ray permission for no extra signal.",
        pack=SERVERLESS,
    )
