"""The workflow's IAM: what the state machine may do (run training jobs, pass the jobs' role, the sync integration's
events rule, the keys of volumes and outputs), who may assume its role (this state machine only), and what the jobs'
role gets from the workflow (its data sources, remote debugging, MLflow). Each function takes the principals and
resources it grants on and returns nothing; ``construct`` calls them once. Every cdk-nag acknowledgement here names
one finding and its reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from constructs_lib._shared.nag import (
    acknowledge,
    acknowledge_role_policy,
    arn_evidence,
    policy_scope,
    rendered,
)
from constructs_lib.identity.execution_role import SAGEMAKER_SERVICE, SageMakerExecutionRole
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket

SYNC_EVENTS_RULE = "StepFunctionsGetEventsForSageMakerTrainingJobsRule"
"""The EventBridge rule Step Functions manages in the account to learn when a training job ends."""

TRAINING_PLAN_RESOURCE_TYPES = ("training-plan", "reserved-capacity")
"""The resource types besides training-job that CreateTrainingJob with a training plan is authorized against."""


def grant_sagemaker(
    scope: Construct,
    *,
    role: iam.IRole,
    execution_role: SageMakerExecutionRole | iam.IRole,
    job_role: iam.IRole,
    validator_function: lambda_.IFunction,
    max_keep_alive_seconds: int,
    volume_kms_key: kms.IKey | None,
    output_kms_key: kms.IKey | None,
) -> None:
    """What ``createTrainingJob.sync`` needs (CustomState grants nothing by itself), for the state machine's
    ``role``: run and tag this account's training jobs (warm pools capped at ``max_keep_alive_seconds``), launch
    on its training plans and their reserved capacity, the sync integration's events rule, pass ``execution_role``
    (whose role is ``job_role``) to SageMaker, and the keys of volumes and outputs."""
    stack = Stack.of(scope)
    # The warm-pool ceiling in IAM too (the sagemaker:KeepAlivePeriod condition key of CreateTrainingJob, in
    # SageMaker's "Use SageMaker AI managed warm pools"); IfExists: the other actions do not carry the key.
    keep_alive_cap = {"NumericLessThanEqualsIfExists": {"sagemaker:KeepAlivePeriod": max_keep_alive_seconds}}
    training_jobs = stack.format_arn(
        service="sagemaker",
        resource="training-job",
        resource_name="*",
        arn_format=ArnFormat.SLASH_RESOURCE_NAME,
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="RunTrainingJobs",
            actions=[
                "sagemaker:CreateTrainingJob",
                "sagemaker:DescribeTrainingJob",
                "sagemaker:StopTrainingJob",
                "sagemaker:AddTags",
                "sagemaker:ListTags",
            ],
            resources=[training_jobs],
            conditions=keep_alive_cap,
        )
    )
    # A request naming ResourceConfig.TrainingPlanArn is authorized against that plan and its reserved capacity
    # too, so CreateTrainingJob is granted on this account's and region's plans and reserved capacities (plans
    # are chosen per execution; the workflow has no switch that turns them off). The Service Authorization
    # Reference (list_amazonsagemaker) gives CreateTrainingJob the resource types training-job (required),
    # reserved-capacity and training-plan; the SageMaker guide "IAM for SageMaker training plans" says plan users
    # need both for training jobs, and AmazonSageMakerFullAccess (AllowUseOfTrainingPlanResources) and
    # AWSBatchServiceRolePolicyForSageMaker grant CreateTrainingJob on exactly these two (docs/security.md).
    plan_resources = [
        stack.format_arn(
            service="sagemaker",
            resource=resource_type,
            resource_name="*",
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
        for resource_type in TRAINING_PLAN_RESOURCE_TYPES
    ]
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="LaunchOnTrainingPlans",
            actions=["sagemaker:CreateTrainingJob"],
            resources=plan_resources,
            conditions=keep_alive_cap,
        )
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="SyncIntegrationEventsRule",
            actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
            resources=[stack.format_arn(service="events", resource="rule", resource_name=SYNC_EVENTS_RULE)],
        )
    )
    if isinstance(execution_role, SageMakerExecutionRole):
        execution_role.grant_pass_role(role)
    else:
        iam.Grant.add_to_principal(
            grantee=role,
            actions=["iam:PassRole"],
            resource_arns=[execution_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": SAGEMAKER_SERVICE}},
        )
    if volume_kms_key is not None:
        for grantee in (role, job_role):
            volume_kms_key.grant(grantee, "kms:DescribeKey")
            # Grants only for AWS resources (SageMaker's EBS volumes), never to a principal of the caller's choice.
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=["kms:CreateGrant"],
                resource_arns=[volume_kms_key.key_arn],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}},
            )
    if output_kms_key is not None:
        # SSE-KMS uploads of the model artifacts (named actions: no kms:ReEncrypt*/GenerateDataKey* wildcards).
        output_kms_key.grant(job_role, "kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")

    policy = policy_scope(role)
    acknowledge_role_policy(policy)
    acknowledge(
        policy,
        f"IAM5[Resource::{rendered(scope, training_jobs)}]",
        "Training job names are generated per execution (<prefix>-<UUID>), so the state machine may "
        "create, describe, stop and tag only training jobs of this account and region.",
    )
    for resource_type, resource in zip(TRAINING_PLAN_RESOURCE_TYPES, plan_resources, strict=True):
        acknowledge(
            policy,
            f"IAM5[Resource::{rendered(scope, resource)}]",
            "Each execution may name any Flexible Training Plan of this account and region (the input field "
            "training_plan_arn, checked against SageMaker's pattern and this region before launch), and "
            f"CreateTrainingJob is authorized against the plan and its reserved capacity ({resource_type}); only "
            "CreateTrainingJob is allowed on them.",
        )
    acknowledge(
        policy,
        f"IAM5[Resource::{arn_evidence(validator_function, ':*')}]",
        "Step Functions' Lambda integration invokes the workflow's own request-validation function, "
        "including its versions and aliases (<function ARN>:*); no other function.",
    )
    acknowledge(
        policy,
        "IAM5[Resource::*]",
        "Step Functions log delivery (logs:*LogDelivery, DescribeLogGroups, ...) and X-Ray "
        "(PutTraceSegments, PutTelemetryRecords, GetSampling*) accept only Resource '*'.",
    )


STATES_SERVICE = "states.amazonaws.com"


def trust_only_this_state_machine(state_machine: sfn.StateMachine, name: str) -> None:
    """Narrow the trust of ``state_machine``'s role (the one CDK creates: ``states.amazonaws.com`` with
    ``aws:SourceArn`` ``arn:...:stateMachine:*``, any state machine of the account) to this state machine, named
    ``name``: its ARN and its qualified ARNs (``<ARN>:<version or alias>``), and this account. Step Functions'
    "Prevent cross-service confused deputy issue": "The most effective way to protect against the confused deputy
    problem is to use the aws:SourceArn global condition context key with the full ARN of the resource." The ARN
    is built from the name: a reference to the state machine would be a cycle (role, state machine, role)."""
    stack = Stack.of(state_machine)
    role = state_machine.role
    trust = stack.resolve(role.assume_role_policy) if isinstance(role, iam.Role) else None
    statements = (trust or {}).get("Statement", [])
    if len(statements) != 1 or statements[0].get("Principal") != {"Service": STATES_SERVICE}:
        raise ValueError(
            f"TrainingWorkflow: the state machine's role trusts {statements!r}; expected exactly one statement "
            f"for {STATES_SERVICE} (aws-cdk-lib's StateMachine role)"
        )
    arn = stack.format_arn(
        service="states",
        resource="stateMachine",
        resource_name=name,
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )
    cfn_role = role.node.default_child
    assert isinstance(cfn_role, iam.CfnRole)
    cfn_role.add_property_override(
        "AssumeRolePolicyDocument.Statement.0.Condition",
        {
            "ArnLike": {"aws:SourceArn": [arn, f"{arn}:*"]},
            "StringEquals": {"aws:SourceAccount": stack.account},
        },
    )


def data_prefixes(scope: Construct, data_sources: Sequence[str], bucket: s3.IBucket) -> list[tuple[str, str]]:
    """``(bucket ARN, key prefix)`` of each data source (for the validator's listing); a relative source is a
    prefix of ``bucket``."""
    located = []
    for source in data_sources:
        if source.startswith("s3://"):
            name, _, prefix = source[5:].partition("/")
            arn = Stack.of(scope).format_arn(service="s3", region="", account="", resource=name)
            located.append((arn, prefix))
        else:
            located.append((bucket.bucket_arn, source))
    return located


def grant_data_sources(
    scope: Construct,
    *,
    data_sources: Sequence[str],
    bucket: s3.IBucket,
    job_role: iam.IRole,
    execution_role: SageMakerExecutionRole | iam.IRole,
    checkpoint_bucket: CheckpointBucket | None,
) -> None:
    """Let the jobs (``job_role``) read exactly the data sources: absolute ``s3://`` ones, or prefixes of
    ``bucket`` (the checkpoint bucket's ``data/`` is already granted to a ``SageMakerExecutionRole``)."""
    workflow_bucket = bucket
    for index, source in enumerate(data_sources):
        if source.startswith("s3://"):
            bucket_name, _, prefix = source[5:].partition("/")
            bucket = s3.Bucket.from_bucket_name(scope, f"DataSource{index}", bucket_name)
        elif checkpoint_bucket is not None:
            if source != checkpoint_bucket.data_prefix or not isinstance(
                execution_role, SageMakerExecutionRole
            ):
                checkpoint_bucket.grant_read(job_role, prefix=source)
            continue
        else:
            bucket, prefix = workflow_bucket, source
        objects = bucket.arn_for_objects(f"{prefix}*")
        job_role.add_to_principal_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[objects]))
        job_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}},
            )
        )
        acknowledge(
            policy_scope(job_role),
            f"IAM5[Resource::{rendered(scope, objects)}]",
            f"Training data may be read only under the data source {source} (the dataSources setting); the "
            "files below it are chosen per execution.",
        )


REMOTE_DEBUG_ACTIONS = (
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
)
"""What the job's role needs for SageMaker remote debugging (an SSM session into the training container)."""


def grant_remote_debug(scope: Construct, role: iam.IRole) -> None:
    """The four ``ssmmessages`` actions of an SSM session (they accept only Resource '*'), in a policy of their
    own so that its acknowledgement covers nothing else."""
    policy = iam.Policy(
        scope,
        "RemoteDebugPolicy",
        statements=[
            iam.PolicyStatement(
                sid="RemoteDebugSessions", actions=list(REMOTE_DEBUG_ACTIONS), resources=["*"]
            )
        ],
    )
    role.attach_inline_policy(policy)
    acknowledge_role_policy(policy)
    acknowledge(
        policy,
        "IAM5[Resource::*]",
        "SageMaker remote debugging opens SSM Session Manager channels from the training container; the "
        "ssmmessages Create/Open Control/Data Channel actions support no resource-level permissions.",
    )


MLFLOW_ACTIONS = tuple(
    f"sagemaker-mlflow:{action}"
    for action in (
        "GetExperimentByName",
        "CreateExperiment",
        "SearchRuns",
        "CreateRun",
        "GetRun",
        "UpdateRun",
        "LogBatch",
    )
)
"""Exactly the REST calls ``training.trainer.observe.mlflow_log`` makes through mlflow 3.17's ``MlflowClient`` (read in its
source: ``get_experiment_by_name``, ``create_experiment``, ``search_runs``, ``create_run``, ``update_run`` and
``set_terminated``, which read the run first (``GetRun``) and then ``UpdateRun``, and ``log_batch`` for parameters and
metrics). A call outside the list turns MLflow logging off with one warning; it never fails the run."""


def grant_mlflow(role: iam.IRole, arn: str) -> None:
    """Let ``role`` (the jobs' execution role) log to the MLflow tracking server ``arn``, and nothing else."""
    role.add_to_principal_policy(
        iam.PolicyStatement(sid="LogToMlflowTrackingServer", actions=list(MLFLOW_ACTIONS), resources=[arn])
    )


def grant_tuning_reads(
    scope: Construct, *, role: iam.IRole, bucket: s3.IBucket, report_objects: str, record_objects: str
) -> None:
    """What the states after a tuning job need beyond their own statements (``tuning_states``: read the reports'
    files, write the records): the bucket key's use when it is encrypted, and the acknowledgement of each of the
    two object patterns."""
    if bucket.encryption_key is not None:
        bucket.encryption_key.grant(role, "kms:Decrypt", "kms:GenerateDataKey")
    policy = policy_scope(role)
    acknowledge(
        policy,
        f"IAM5[Resource::{rendered(scope, report_objects)}]",
        "After a tuning job the workflow reads its report (winner.json, and measurements.json to copy it) from "
        "the run's checkpoint folder tune/; the execution folder is named at run time.",
    )
    acknowledge(
        policy,
        f"IAM5[Resource::{rendered(scope, record_objects)}]",
        "After a tuning job the workflow stores its measurement records under the tuning measurements prefix, "
        "in a folder per image tag and workflow named at run time; the request check reads them there.",
    )
