"""The preparation's IAM: what its Processing jobs' role may touch (read the input and model prefixes, list and
write the output prefix without deleting, pull the image, write the job logs) and what its state machine may do
(run and describe processing jobs, pass that role to SageMaker only, the sync integration's events rule, check the
manifest). Each function takes the principals and resources it grants on; every cdk-nag acknowledgement names one
finding and its reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib._shared.nag import acknowledge, acknowledge_role_policy, policy_scope, rendered
from constructs_lib.identity.execution_role import SAGEMAKER_SERVICE

PROCESSING_LOG_GROUP = "/aws/sagemaker/ProcessingJobs"
SYNC_EVENTS_RULE = "StepFunctionsGetEventsForSageMakerProcessingJobsRule"
"""The EventBridge rule Step Functions manages in the account to learn when a processing job ends."""


def grant_job_role(scope: Construct, role: iam.IRole, *, bucket: s3.IBucket, read_prefixes: Sequence[str],
                   output_prefix: str, repository: ecr.IRepository | None) -> None:  # fmt: skip
    """The Processing jobs' role: list and read ``read_prefixes`` (inputs, tokenizers, model folders); list, read
    (a rerun checks complete shards) and create objects under ``output_prefix`` (no delete: shards are never
    removed or replaced; a failed multipart upload's parts may be aborted); pull from ``repository``; write the
    processing-job log group."""
    prefixes = [*read_prefixes, output_prefix]
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="ListDataPrefixes",
            actions=["s3:ListBucket"],
            resources=[bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}},
        )  # fmt: skip
    )
    reads = [bucket.arn_for_objects(f"{p}*") for p in prefixes]
    role.add_to_principal_policy(
        iam.PolicyStatement(sid="ReadData", actions=["s3:GetObject"], resources=reads)
    )
    writes = bucket.arn_for_objects(f"{output_prefix}*")
    role.add_to_principal_policy(
        # PutObject creates (conditional writes; a multipart upload's parts and completion); AbortMultipartUpload
        # only drops the parts of an upload that failed: no complete object is ever deleted or replaced
        iam.PolicyStatement(
            sid="WriteShards", actions=["s3:PutObject", "s3:AbortMultipartUpload"], resources=[writes]
        )
    )
    if bucket.encryption_key is not None:
        bucket.encryption_key.grant(role, "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")
    if repository is not None:
        repository.grant_pull(role)
    stack = Stack.of(scope)
    logs = stack.format_arn(service="logs", resource="log-group", resource_name=PROCESSING_LOG_GROUP,
                            arn_format=ArnFormat.COLON_RESOURCE_NAME)  # fmt: skip
    role.add_to_principal_policy(
        iam.PolicyStatement(sid="JobLogGroup", actions=["logs:CreateLogGroup"], resources=[logs])
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="JobLogStreams",
            actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[f"{logs}:log-stream:*"],
        )  # fmt: skip
    )
    policy = policy_scope(role)
    acknowledge_role_policy(policy)
    for prefix, arn in zip(prefixes, reads, strict=True):
        acknowledge(policy, f"IAM5[Resource::{rendered(scope, arn)}]",
                    f"Objects under the '{prefix}' prefix only: the corpus's objects, or the shards a job writes, "
                    "are named at run time.")  # fmt: skip
    acknowledge(policy, f"IAM5[Resource::{rendered(scope, logs)}:log-stream:*]",
                "Log streams are named by SageMaker after each processing job at run time; limited to SageMaker's "
                "processing-job log group.")  # fmt: skip
    if repository is not None:
        acknowledge(policy, "IAM5[Resource::*]",
                    "ecr:GetAuthorizationToken accepts only Resource '*' (repository.grant_pull adds it); the image "
                    "actions are limited to the training image repository.")  # fmt: skip


def grant_state_machine(scope: Construct, role: iam.IRole, *, job_role: iam.IRole, bucket: s3.IBucket,
                        output_prefix: str) -> None:  # fmt: skip
    """What ``createProcessingJob.sync`` needs (``CustomState`` grants nothing), and reading the manifest."""
    stack = Stack.of(scope)
    jobs = stack.format_arn(service="sagemaker", resource="processing-job", resource_name="*",
                            arn_format=ArnFormat.SLASH_RESOURCE_NAME)  # fmt: skip
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="RunProcessingJobs",
            actions=[
                "sagemaker:CreateProcessingJob",
                "sagemaker:DescribeProcessingJob",
                "sagemaker:StopProcessingJob",
                "sagemaker:AddTags",
                "sagemaker:ListTags",
            ],
            resources=[jobs],
        )  # fmt: skip
    )
    rule = stack.format_arn(service="events", resource="rule", resource_name=SYNC_EVENTS_RULE)
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="SyncIntegrationEventsRule",
            resources=[rule],
            actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
        )  # fmt: skip
    )
    iam.Grant.add_to_principal(grantee=role, actions=["iam:PassRole"], resource_arns=[job_role.role_arn],
                               conditions={"StringEquals": {"iam:PassedToService": SAGEMAKER_SERVICE}})  # fmt: skip
    manifests = bucket.arn_for_objects(f"{output_prefix}*")
    role.add_to_principal_policy(
        iam.PolicyStatement(sid="ReadManifest", actions=["s3:GetObject"], resources=[manifests])
    )
    if bucket.encryption_key is not None:
        bucket.encryption_key.grant(role, "kms:Decrypt")
    policy = policy_scope(role)
    acknowledge(policy, f"IAM5[Resource::{rendered(scope, jobs)}]",
                "Processing jobs are named at run time (prepare-<uuid>); every action is on this account's "
                "processing jobs only.")  # fmt: skip
    acknowledge_role_policy(policy)
    acknowledge(policy, "IAM5[Resource::*]",
                "Step Functions log delivery (logs:*LogDelivery, DescribeLogGroups, ...) and X-Ray (PutTraceSegments, "
                "PutTelemetryRecords, GetSampling*) accept only Resource '*'.")  # fmt: skip
    acknowledge(
        policy,
        f"IAM5[Resource::{rendered(scope, manifests)}]",
        f"The manifest of each preparation is under '{output_prefix}<name>/', the name chosen per execution.",
    )
