"""``BlackwellTrainingStack``: the deployable app's one stack, composing the constructs."""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Stack, Token
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib.config import WorkflowSettings
from constructs_lib.identity.execution_role import SageMakerExecutionRole
from constructs_lib.image.build import TrainingImageBuild
from constructs_lib.image.repository import TrainingImageRepository
from constructs_lib.preparation.construct import DataPreparation
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket
from constructs_lib.workflow.construct import TrainingWorkflow
from constructs_lib.workflow.defaults import WorkflowDefaults


class BlackwellTrainingStack(Stack):
    """Storage, identity, image build and the training workflow for one account and region.

    Settings (all keyword-only; ``app.py`` reads them from ``cdk.json`` context):

    :param removal_policy: for the bucket and repository, and for the KMS key and log groups: ``RETAIN`` (default)
        or ``DESTROY`` (which also empties bucket and repository on stack deletion: meant for throw-away test
        accounts). docs/deploy.md "Clean-up" lists what each leaves behind.
    :param kms_key_arn: a customer managed key for the bucket and repository. Default: a key is created only when
        ``use_kms`` is true; otherwise S3-managed / ECR-managed encryption.
    :param use_kms: create a customer managed key (with rotation) for bucket and repository. Default False.
        Either way the stack has exactly one customer managed key (this one, the given one, or, without either,
        the image build's), which also encrypts the build, the workflow's logs, state machine and topic. This data
        key (created or given) also encrypts the jobs' model artifacts (``OutputDataConfig.KmsKeyId``); the jobs'
        storage is the instances' NVMe, encrypted by the instance (SageMaker refuses ``VolumeKmsKeyId`` there).
    :param vpc_id: run training jobs in this VPC (looked up at synth time; needs account and region). Default none.
    :param build_in_vpc: run the image build and its deploy-time functions in ``vpc_id``'s private subnets too
        (they need a route to ECR, S3, CloudWatch Logs and CodeBuild). Default False.
    :param build_compute_type: CodeBuild compute type of the image build. Default ``LARGE``.
    :param build_timeout_minutes: CodeBuild timeout of the image build (5 to 2160). Default 120.
    :param base_image_account: account of the region's AWS Deep Learning Containers registry. Default: CDK's
        regional fact (required in regions where CDK has none, e.g. af-south-1, ca-west-1).
    :param workflow: settings of the training workflow (limits, defaults, notifications, EventBridge trigger).
        Default: ``WorkflowSettings()``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        kms_key_arn: str | None = None,
        use_kms: bool = False,
        vpc_id: str | None = None,
        build_in_vpc: bool = False,
        build_compute_type: codebuild.ComputeType | None = None,
        build_timeout_minutes: int | None = None,
        base_image_account: str | None = None,
        workflow: WorkflowSettings | None = None,
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        destroy = removal_policy == RemovalPolicy.DESTROY
        if build_in_vpc and not vpc_id:
            raise ValueError("BlackwellTrainingStack: build_in_vpc needs vpc_id (the VPC to build in)")
        if vpc_id and (Token.is_unresolved(self.account) or Token.is_unresolved(self.region)):
            raise ValueError(
                f"BlackwellTrainingStack: vpc_id {vpc_id} is looked up at synth time (ec2.Vpc.from_lookup), which "
                "needs the stack's account and region: pass env=cdk.Environment(account=..., region=...) and run "
                "cdk with AWS credentials for that account"
            )

        key: kms.IKey | None = None
        if kms_key_arn:
            key = kms.Key.from_key_arn(self, "DataKey", kms_key_arn)
        elif use_kms:
            key = kms.Key(
                self,
                "DataKey",
                description="Encrypts checkpoints, job output and training images",
                enable_key_rotation=True,
                removal_policy=removal_policy,
            )

        self.vpc: ec2.IVpc | None = ec2.Vpc.from_lookup(self, "Vpc", vpc_id=vpc_id) if vpc_id else None

        self.checkpoints = CheckpointBucket(
            self,
            "Checkpoints",
            encryption=s3.BucketEncryption.KMS if key else s3.BucketEncryption.S3_MANAGED,
            encryption_key=key,
            removal_policy=removal_policy,
            auto_delete_objects=destroy,
        )
        self.images = TrainingImageRepository(
            self,
            "Images",
            encryption_key=key,
            removal_policy=removal_policy,
            empty_on_delete=destroy,
        )
        self.image_build = TrainingImageBuild(
            self,
            "ImageBuild",
            image_repository=self.images,
            compute_type=build_compute_type,
            build_timeout_minutes=build_timeout_minutes,
            base_image_account=base_image_account,
            encryption_key=key,
            removal_policy=removal_policy,
            vpc=self.vpc if build_in_vpc else None,
        )
        # The one customer managed key of the stack: the data key, or else the one the image build created.
        self.encryption_key: kms.IKey = key or self.image_build.encryption_key
        self.execution_role = SageMakerExecutionRole(
            self,
            "ExecutionRole",
            checkpoint_bucket=self.checkpoints,
            image_repository=self.images,
            vpc=self.vpc,
        )
        wf = workflow or WorkflowSettings()
        self.workflow = TrainingWorkflow(
            self,
            "Workflow",
            image_uri=self.image_build.image_uri,
            execution_role=self.execution_role,
            checkpoint_bucket=self.checkpoints,
            defaults=WorkflowDefaults(
                instance_type=wf.default_instance_type,
                precision=wf.default_precision,
                job_name_prefix=wf.default_job_name_prefix,
            ),
            max_instance_count=wf.max_instance_count,
            max_capacity_retries=wf.max_capacity_retries,
            data_sources=wf.data_sources,
            capacity_retry_wait=Duration.minutes(wf.capacity_retry_wait_minutes),
            state_machine_timeout=Duration.hours(wf.timeout_hours),
            vpc=self.vpc,
            notifications=wf.notifications,
            network_isolation=wf.network_isolation,
            dashboard=wf.dashboard,
            dashboard_job_name_prefixes=wf.dashboard_job_name_prefixes,
            mlflow_tracking_server_arn=wf.mlflow_tracking_server_arn,
            max_keep_alive_seconds=wf.max_keep_alive_seconds,
            remote_debug=wf.remote_debug,
            output_kms_key=key,
            encryption_key=self.encryption_key,
            removal_policy=removal_policy,
            event_pattern=(
                events.EventPattern(source=[wf.trigger_source], detail_type=[wf.trigger_detail_type])
                if wf.trigger
                else None
            ),
            event_bus=(
                events.EventBus.from_event_bus_name(self, "TriggerBus", wf.event_bus_name)
                if wf.trigger and wf.event_bus_name
                else None
            ),
        )
        self.preparation = DataPreparation(
            self,
            "DataPreparation",
            image_uri=self.image_build.image_uri,
            checkpoint_bucket=self.checkpoints,
            image_repository=self.images,
            encryption_key=self.encryption_key,
            removal_policy=removal_policy,
        )
        self._outputs()

    def _outputs(self) -> None:
        """The stack outputs: names and addresses the operator CLI and a person need."""
        CfnOutput(
            self,
            "CheckpointBucketName",
            value=self.checkpoints.bucket.bucket_name,
            description="S3 bucket for checkpoints (checkpoints/), job output (output/) and data (data/)",
        )
        CfnOutput(
            self,
            "ImageRepositoryUri",
            value=self.images.repository_uri,
            description="ECR repository of the training images",
        )
        CfnOutput(
            self,
            "ImageUri",
            value=self.image_build.image_uri,
            description="Training image built from training/ at deploy time (tag: content hash of training/)",
        )
        CfnOutput(
            self,
            "ImageBuildProjectName",
            value=self.image_build.project.project_name,
            description="CodeBuild project that builds the training image (aws codebuild start-build to rebuild)",
        )
        CfnOutput(
            self,
            "ExecutionRoleArn",
            value=self.execution_role.role_arn,
            description="IAM role the SageMaker training jobs run as",
        )
        CfnOutput(
            self,
            "StateMachineArn",
            value=self.workflow.state_machine_arn,
            description="Training workflow: aws stepfunctions start-execution --state-machine-arn <this> --input '{}'",
        )
        CfnOutput(
            self,
            "DataPreparationStateMachineArn",
            value=self.preparation.state_machine_arn,
            description="Data preparation as a Processing job (docs/data.md): blackwell-training prepare NAME "
            "--state-machine <this> ...",
        )
        if self.workflow.dashboard_url is not None:
            CfnOutput(
                self,
                "DashboardUrl",
                value=self.workflow.dashboard_url,
                description="CloudWatch dashboard of the workflow: loss, tokens/s, MFU, memory, GPUs, executions",
            )
        if self.workflow.notification_topic is not None:
            CfnOutput(
                self,
                "NotificationTopicArn",
                value=self.workflow.notification_topic.topic_arn,
                description="SNS topic told when a training workflow execution ends (subscribe to it)",
            )
