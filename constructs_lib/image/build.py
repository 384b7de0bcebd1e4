"""``TrainingImageBuild``: builds the training image in the account with CodeBuild, during ``cdk deploy``.

No local Docker anywhere. The ``training/`` folder (Dockerfile, ``train.sh``, the trainer package) is uploaded as
an S3 asset; a privileged CodeBuild project builds it with the BuildKit built into CodeBuild's own Docker (no
builder image is pulled from anywhere) on top of the AWS PyTorch DLC and pushes it to our ECR repository, tagged with the asset hash (the content hash of ``training/``). A custom resource starts the
build and waits for it, so the deployment finishes only once the image exists, and downstream resources that use
``image_uri`` are created after it.

* An unchanged ``training/`` means an unchanged tag: no resource update, no build.
* A build whose tag already exists in the repository skips the docker build (``aws ecr describe-images``).
* Layers are cached in the repository itself: each image carries BuildKit's inline cache and is also pushed as
  ``CACHE_TAG`` (mutable by exemption), which the next build uses as ``--cache-from``; the Dockerfile has one
  stage, so every layer is in the image and the inline cache covers them all. A trainer-only change rebuilds only
  the last layers; the first build compiles Transformer Engine.
* A failed build fails the deployment with the build id and the CloudWatch log deep link.
* Least privilege, no wildcard action: the project runs as ``role`` (given to CodeBuild without policy updates, so
  CDK's automatic grants are dropped), whose one policy ``build_policy`` spells out each action: read the source
  zip, write the build's log group, use the build key, pull the DLC repository, pull/push/describe our repository
  (and use its key, when it has another one). Add anything more to ``role``, not through ``project``.

CloudFormation waits at most one hour for a custom resource (``ServiceTimeout`` 1..3600 s), so the deploy-time wait
is capped at 60 minutes even though the build itself may run longer (``build_timeout_minutes``). When the wait runs
out, the build goes on; the next deployment joins the running build, or finds the finished image and skips it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aws_cdk import ArnFormat, Aws, CustomResource, Duration, RemovalPolicy, Stack, Token
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import custom_resources as cr
from aws_cdk.region_info import Fact, FactName
from constructs import Construct

from constructs_lib._shared.log_keys import allow_logs_to_use_key
from constructs_lib._shared.nag import (
    NIST_800_53_R5,
    SERVERLESS,
    acknowledge,
    acknowledge_role_policy,
    arn_evidence,
    policy_scope,
    rendered,
)
from constructs_lib._shared.subnets import subnet_selection_kwargs
from constructs_lib.image.repository import TrainingImageRepository

TRAINING_DIR = Path(__file__).resolve().parents[2] / "training"
HANDLERS_DIR = Path(__file__).resolve().parent / "handlers"

DLC_REPOSITORY = "pytorch-training"
DEFAULT_BASE_IMAGE_TAG = "2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker"
DEFAULT_BUILD_TIMEOUT_MINUTES = 120
DEFAULT_WAIT_TIMEOUT_MINUTES = 60
MAX_WAIT_TIMEOUT_MINUTES = 60
"""CloudFormation's limit for one custom resource operation (ServiceTimeout at most 3600 s)."""
BUILD_TIMEOUT_RANGE = (5, 2160)
QUERY_INTERVAL = Duration.seconds(30)
SKIP_MARKER = '"${CODEBUILD_SRC_DIR:-.}/.image-exists"'
"""File the pre_build phase creates when the tag is already in the repository (the build phase then skips)."""

SOURCE_EXCLUDES = [
    "**/__pycache__",
    "**/*.pyc",
    "**/*.pyo",
    "**/.pytest_cache",
    "**/.mypy_cache",
    "**/.ruff_cache",
    "**/*.egg-info",
    "**/.ipynb_checkpoints",
    "**/.DS_Store",
    ".image-exists",
]
"""Left out of the source asset, so local caches neither enter the image nor change its tag."""


class TrainingImageBuild(Construct):
    """Build the training image from ``training/`` in CodeBuild at deploy time, and wait for it.

    All props are keyword-only.

    :param image_repository: the repository the image (and the BuildKit layer cache) is pushed to.
    :param source_directory: the build context, holding the ``Dockerfile``. Default: the repository's
        ``training/`` folder.
    :param base_image_account: account of the AWS Deep Learning Containers registry to pull the PyTorch DLC from.
        Default: CDK's regional fact ``DLC_REPOSITORY_ACCOUNT`` for the stack's region. That fact is incomplete
        (none for af-south-1, ca-west-1, mx-central-1, ap-southeast-5, ...): in such a region this prop is
        required. In an environment-agnostic stack (region unknown at synth) the fact becomes a CloudFormation
        mapping over the regions CDK knows, and deploying to another region fails unless this prop is set.
    :param base_image_tag: tag of the ``pytorch-training`` DLC. Default ``2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker``.
    :param build_image: the CodeBuild image that runs Docker. Default ``LinuxBuildImage.STANDARD_7_0`` (Ubuntu
        22.04 with Docker and buildx); any standard x86_64 Linux image with Docker and buildx works.
    :param compute_type: CodeBuild compute type. Default ``LARGE`` (8 vCPU, 15 GB, 128 GB disk); Transformer
        Engine compiles from source, more cores shorten the first build.
    :param build_timeout_minutes: CodeBuild build timeout, 5 to 2160. Default 120.
    :param wait_timeout_minutes: how long the deployment waits for the build, 5 to 60 (CloudFormation's limit for
        a custom resource). Default 60. The build itself goes on after that.
    :param log_retention: retention of the build logs and of the deploy-time handlers' logs. Default three months.
    :param log_group: an existing log group for the build logs. Default: one is created (``log_retention``,
        encrypted with the key). ``log_retention`` still applies to the handlers' log group.
    :param encryption_key: customer managed KMS key for the build's artifacts and for every log group here.
        Default: a key is created with rotation. A key of this app gets a key-policy statement that lets
        CloudWatch Logs use it for this account's log groups; an imported key's policy must already allow that.
    :param removal_policy: of the created key and log groups: ``RETAIN`` (default) or ``DESTROY``.
    :param vpc: run the build and the deploy-time functions in this VPC (it needs a route to ECR, S3, CloudWatch
        Logs and CodeBuild: a NAT gateway or VPC endpoints). Default: no VPC.
    :param subnets: subnets in ``vpc``. Default: its private subnets with egress.
    :param security_groups: security groups of the build and the functions. Default: one created, outbound only.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        image_repository: TrainingImageRepository,
        source_directory: str | Path | None = None,
        base_image_account: str | None = None,
        base_image_tag: str | None = None,
        build_image: codebuild.IBuildImage | None = None,
        compute_type: codebuild.ComputeType | None = None,
        build_timeout_minutes: int | None = None,
        wait_timeout_minutes: int | None = None,
        log_retention: logs.RetentionDays | None = None,
        log_group: logs.ILogGroup | None = None,
        encryption_key: kms.IKey | None = None,
        vpc: ec2.IVpc | None = None,
        subnets: ec2.SubnetSelection | None = None,
        security_groups: Sequence[ec2.ISecurityGroup] | None = None,
        removal_policy: RemovalPolicy | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        source = Path(source_directory) if source_directory is not None else TRAINING_DIR
        if not (source / "Dockerfile").is_file():
            raise ValueError(
                f"TrainingImageBuild: source_directory must hold a Dockerfile; got {str(source)!r}"
            )
        build_minutes = _in_range(
            "build_timeout_minutes",
            build_timeout_minutes,
            DEFAULT_BUILD_TIMEOUT_MINUTES,
            *BUILD_TIMEOUT_RANGE,
        )
        wait_minutes = _in_range(
            "wait_timeout_minutes",
            wait_timeout_minutes,
            DEFAULT_WAIT_TIMEOUT_MINUTES,
            5,
            MAX_WAIT_TIMEOUT_MINUTES,
        )
        base_tag = base_image_tag or DEFAULT_BASE_IMAGE_TAG
        if not _valid_tag(base_tag):
            raise ValueError(f"TrainingImageBuild: base_image_tag is not a valid image tag; got {base_tag!r}")
        if base_image_account is not None and not (
            isinstance(base_image_account, str)
            and len(base_image_account) == 12
            and base_image_account.isdigit()
        ):
            raise ValueError(
                f"TrainingImageBuild: base_image_account must be a 12-digit AWS account id; got {base_image_account!r}"
            )
        self.base_image_account = _dlc_account(stack, base_image_account)
        self.base_image_tag = base_tag
        self.image_repository = image_repository
        retention = log_retention or logs.RetentionDays.THREE_MONTHS
        policy = removal_policy or RemovalPolicy.RETAIN
        if policy not in (RemovalPolicy.RETAIN, RemovalPolicy.DESTROY):
            raise ValueError(f"TrainingImageBuild: removal_policy must be RETAIN or DESTROY; got {policy}")
        if vpc is None and (subnets is not None or security_groups is not None):
            raise ValueError("TrainingImageBuild: subnets and security_groups need vpc")
        self.vpc = vpc
        self.subnets = subnets or (
            ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS) if vpc is not None else None
        )
        self.security_groups: list[ec2.ISecurityGroup] = list(security_groups or [])
        if vpc is not None and not self.security_groups:
            self.security_groups = [
                ec2.SecurityGroup(
                    self,
                    "SecurityGroup",
                    vpc=vpc,
                    description="Training-image build and its deploy-time functions: outbound to AWS APIs only",
                    allow_all_outbound=True,
                )
            ]
        handler_logs = self._key_and_logs(stack, encryption_key, log_group, retention, policy)
        self._source_and_project(
            stack,
            source,
            image_repository,
            base_tag,
            build_image,
            compute_type,
            build_minutes,
        )
        self._deploy_time_build(image_repository, handler_logs, wait_minutes)

    def _key_and_logs(
        self,
        stack: Stack,
        encryption_key: kms.IKey | None,
        log_group: logs.ILogGroup | None,
        retention: logs.RetentionDays,
        policy: RemovalPolicy,
    ) -> logs.LogGroup:
        """The key, the build's log group and the deploy-time handlers' log group (returned)."""
        if encryption_key is None:
            encryption_key = kms.Key(
                self,
                "Key",
                description="Encrypts the training-image build's artifacts and logs",
                enable_key_rotation=True,
                removal_policy=policy,
            )
        # Let CloudWatch Logs use the key for this account's log groups.
        allow_logs_to_use_key(encryption_key, stack, sid="CloudWatchLogsInThisAccount", log_group_name="*")
        self.encryption_key: kms.IKey = encryption_key
        self.log_group: logs.ILogGroup = log_group or logs.LogGroup(
            self,
            "BuildLogs",
            retention=retention,
            encryption_key=encryption_key,
            removal_policy=policy,
        )
        handler_logs = logs.LogGroup(
            self,
            "DeployLogs",
            retention=retention,
            encryption_key=encryption_key,
            removal_policy=policy,
        )
        return handler_logs

    def _source_and_project(
        self,
        stack: Stack,
        source: Path,
        image_repository: TrainingImageRepository,
        base_tag: str,
        build_image: codebuild.IBuildImage | None,
        compute_type: codebuild.ComputeType | None,
        build_minutes: int,
    ) -> None:
        """The source asset, the CodeBuild project with its buildspec, and its role's one policy."""
        encryption_key = self.encryption_key
        self.source_asset = s3_assets.Asset(self, "Source", path=str(source), exclude=SOURCE_EXCLUDES)
        self.image_tag: str = self.source_asset.asset_hash
        repository = image_repository.repository
        environment = {
            "BASE_IMAGE_ACCOUNT": self.base_image_account,
            "BASE_IMAGE_REGION": stack.region,
            "BASE_IMAGE_DOMAIN": Aws.URL_SUFFIX,
            "BASE_IMAGE_TAG": base_tag,
            "REPOSITORY_URI": repository.repository_uri,
            "REPOSITORY_NAME": repository.repository_name,
            "IMAGE_TAG": self.image_tag,
            "CACHE_TAG": image_repository.cache_tag,
        }
        # The project gets its role without policy updates: CDK's automatic grants (S3 source read with
        # ``s3:GetObject*``/``s3:GetBucket*``/``s3:List*``, the key's ``kms:ReEncrypt*``/``kms:GenerateDataKey*``,
        # the default ``/aws/codebuild/<project>`` log group) are dropped, and ``BuildPermissions`` below spells
        # out every action the build uses. Grants made through ``project`` (``project.add_to_role_policy``,
        # ``grant_principal``) are dropped too: add statements to ``self.role`` instead.
        self.role = iam.Role(
            self,
            "ProjectRole",
            # Only CodeBuild projects of this account and region may assume it (confused-deputy guard).
            assumed_by=iam.ServicePrincipal(
                "codebuild.amazonaws.com",
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {
                        "aws:SourceArn": stack.format_arn(
                            service="codebuild", resource="project", resource_name="*"
                        )
                    },
                },
            ),
            description="Training-image build: read its source, pull the DLC, push to its repository, log",
        )
        self.project = codebuild.Project(
            self,
            "Project",
            description="Builds the training image from training/ (AWS PyTorch DLC + Transformer Engine 2.11)",
            source=codebuild.Source.s3(bucket=self.source_asset.bucket, path=self.source_asset.s3_object_key),
            build_spec=codebuild.BuildSpec.from_object(buildspec()),
            environment=codebuild.BuildEnvironment(
                build_image=build_image or codebuild.LinuxBuildImage.STANDARD_7_0,
                compute_type=compute_type or codebuild.ComputeType.LARGE,
                privileged=True,
            ),
            environment_variables={
                name: codebuild.BuildEnvironmentVariable(value=value) for name, value in environment.items()
            },
            encryption_key=encryption_key,
            timeout=Duration.minutes(build_minutes),
            logging=codebuild.LoggingOptions(
                cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=self.log_group)
            ),
            grant_report_group_permissions=False,
            role=self.role.without_policy_updates(),
            vpc=self.vpc,
            subnet_selection=self.subnets,
            security_groups=self.security_groups or None,
        )
        self.build_policy = iam.Policy(
            self,
            "BuildPermissions",
            roles=[self.role],
            statements=self._build_statements(stack, encryption_key, image_repository)
            + self._vpc_statements(stack),
        )
        acknowledge_role_policy(self.build_policy)
        if self.vpc is not None:
            self._acknowledge_vpc(stack)
        acknowledge(
            self.build_policy,
            "IAM5[Resource::*]",
            "ecr:GetAuthorizationToken (alone in its statement) is an account-level call that IAM only accepts "
            "on Resource '*'; image access itself is limited to the DLC repository and our repository.",
        )
        log_streams = rendered(self, self.log_group.log_group_arn)
        if "*" in log_streams:  # an imported log group's ARN is <group ARN>:* (a created one's is a GetAtt)
            acknowledge(
                self.build_policy,
                f"IAM5[Resource::{log_streams}]",
                "CodeBuild names the build's log streams at run time; CreateLogStream and PutLogEvents are "
                "limited to the streams of the one given log group.",
            )

    def _deploy_time_build(
        self, image_repository: TrainingImageRepository, handler_logs: logs.LogGroup, wait_minutes: int
    ) -> None:
        """The deploy-time build: Provider with onEvent / isComplete, and the custom resource that waits."""
        repository = image_repository.repository
        handler_role = self._lambda_role("HandlerRole", handler_logs)
        repository.grant(handler_role, "ecr:DescribeImages")
        handler_role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="StartAndWatchTheImageBuild",
                actions=[
                    "codebuild:StartBuild",
                    "codebuild:BatchGetBuilds",
                    "codebuild:ListBuildsForProject",
                ],
                resources=[self.project.project_arn],
            )
        )
        code = lambda_.Code.from_asset(str(HANDLERS_DIR), exclude=["__pycache__", "*.pyc"])

        def handler_function(
            construct_id: str, handler: str, description: str, **env: str
        ) -> lambda_.Function:
            return lambda_.Function(
                self,
                construct_id,
                runtime=lambda_.Runtime.PYTHON_3_14,
                code=code,
                handler=handler,
                description=description,
                environment=env or None,
                timeout=Duration.minutes(1),
                memory_size=256,
                role=handler_role,
                log_group=handler_logs,
                vpc=self.vpc,
                vpc_subnets=self.subnets,
                security_groups=self.security_groups or None,
            )

        self.on_event_function = handler_function(
            "OnEvent", "image_build.on_event", "Starts the training-image build when training/ changed"
        )
        self.is_complete_function = handler_function(
            "IsComplete",
            "image_build.is_complete",
            "Waits for the training-image build",
            WAIT_TIMEOUT_SECONDS=str(wait_minutes * 60),
        )
        on_event_role = self._lambda_role("ProviderOnEventRole", handler_logs)
        waiter_role = self._lambda_role("ProviderWaiterRole", handler_logs)
        for role in (handler_role, on_event_role, waiter_role):
            acknowledge_role_policy(policy_scope(role))
        self.provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=self.on_event_function,
            is_complete_handler=self.is_complete_function,
            query_interval=QUERY_INTERVAL,
            total_timeout=Duration.minutes(wait_minutes),
            framework_on_event_role=on_event_role,
            framework_complete_and_timeout_role=waiter_role,
            log_group=handler_logs,
            vpc=self.vpc,
            vpc_subnets=self.subnets,
            security_groups=self.security_groups or None,
        )
        self._acknowledge_provider(on_event_role, waiter_role)

        self.resource = CustomResource(
            self,
            "Image",
            service_token=self.provider.service_token,
            resource_type="Custom::TrainingImage",
            properties={
                "ProjectName": self.project.project_name,
                "RepositoryName": repository.repository_name,
                "ImageTag": self.image_tag,
                "ImageUri": image_repository.image_uri(self.image_tag),
            },
        )
        # The build starts only once its role has its permissions.
        self.resource.node.add_dependency(self.build_policy)
        self.image_uri: str = self.resource.get_att_string("ImageUri")
        """``<repository URI>:<content tag>``; resolving it makes a consumer wait for the build."""

    # ----------------------------------------------------------------------------------------------------------
    def grant_start_build(self, grantee: iam.IGrantable) -> iam.Grant:
        """Start and watch builds of the image project (e.g. to rebuild by hand or from a pipeline)."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["codebuild:StartBuild", "codebuild:BatchGetBuilds", "codebuild:StopBuild"],
            resource_arns=[self.project.project_arn],
        )

    def _lambda_role(self, construct_id: str, log_group: logs.ILogGroup) -> iam.Role:
        role = iam.Role(
            self,
            construct_id,
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Deploy-time training-image build (logs to its own log group only)",
        )
        log_group.grant_write(role)
        if self.vpc is not None:
            # What AWSLambdaVPCAccessExecutionRole would give, without an AWS managed policy.
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    sid="NetworkInterfacesInTheVpc",
                    actions=[
                        "ec2:CreateNetworkInterface",
                        "ec2:DescribeNetworkInterfaces",
                        "ec2:DescribeSubnets",
                        "ec2:DeleteNetworkInterface",
                        "ec2:AssignPrivateIpAddresses",
                        "ec2:UnassignPrivateIpAddresses",
                    ],
                    resources=["*"],
                )
            )
            acknowledge(
                policy_scope(role),
                "IAM5[Resource::*]",
                "Lambda creates and deletes the functions' network interfaces in the given VPC at run time; "
                "these EC2 actions take only Resource '*' (the same as AWSLambdaVPCAccessExecutionRole).",
            )
        return role

    def _acknowledge_vpc(self, stack: Stack) -> None:
        acknowledge(
            self.build_policy,
            "IAM5[Resource::*]",
            "The EC2 describe calls and network-interface create/delete that CodeBuild makes to attach the build "
            "to the VPC take only Resource '*'.",
        )
        acknowledge(
            self.build_policy,
            f"IAM5[Resource::{rendered(self, stack.format_arn(service='ec2', resource='network-interface', resource_name='*'))}]",
            "ec2:CreateNetworkInterfacePermission: the interface is created at run time; the permission is "
            "limited to CodeBuild (ec2:AuthorizedService) and to the build's subnets (ec2:Subnet).",
        )
        # With a VPC, codebuild.Project makes a policy of the same EC2 statements for its role; the role takes no
        # policy updates (see _source_and_project), so that policy is attached to nothing and not synthesized.
        cdk_policy = self.project.node.try_find_child("PolicyDocument")
        if cdk_policy is not None:
            reason = (
                "codebuild.Project's own VPC policy is attached to no role (the project role takes no policy "
                "updates) and is not synthesized; BuildPermissions holds the same statements."
            )
            acknowledge(cdk_policy, "IAM5[Resource::*]", reason)
            acknowledge(cdk_policy, "IAMNoInlinePolicy", reason, pack=NIST_800_53_R5)

    def _vpc_statements(self, stack: Stack) -> list[iam.PolicyStatement]:
        """What CodeBuild needs to run the build in ``vpc`` (none without one)."""
        if self.vpc is None:
            return []
        return [
            iam.PolicyStatement(
                sid="DescribeTheBuildNetwork",
                actions=[
                    "ec2:CreateNetworkInterface",
                    "ec2:DescribeDhcpOptions",
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DeleteNetworkInterface",
                    "ec2:DescribeSubnets",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeVpcs",
                ],
                resources=["*"],
            ),
            iam.PolicyStatement(
                sid="AttachTheBuildToItsSubnets",
                actions=["ec2:CreateNetworkInterfacePermission"],
                resources=[stack.format_arn(service="ec2", resource="network-interface", resource_name="*")],
                conditions={
                    "StringEquals": {"ec2:AuthorizedService": "codebuild.amazonaws.com"},
                    "ArnEquals": {
                        "ec2:Subnet": [
                            stack.format_arn(service="ec2", resource="subnet", resource_name=subnet_id)
                            for subnet_id in self.vpc.select_subnets(
                                **subnet_selection_kwargs(self.subnets)
                            ).subnet_ids
                        ]
                    },
                },
            ),
        ]

    def _build_statements(
        self, stack: Stack, encryption_key: kms.IKey, image_repository: TrainingImageRepository
    ) -> list[iam.PolicyStatement]:
        """Everything the build does, action by action: read its source zip, write its log group, use its key,
        log in to ECR, pull the DLC, pull/push/describe our repository (image and BuildKit cache)."""
        asset = self.source_asset
        repository = image_repository.repository
        found = [
            iam.PolicyStatement(
                sid="ReadTheSourceZip",
                actions=["s3:GetObject", "s3:GetObjectVersion"],
                resources=[asset.bucket.arn_for_objects(asset.s3_object_key)],
            ),
            # CodeBuild checks the source bucket's identity (region, owner) before downloading the object
            # (the "S3BucketIdentity" statement of CodeBuild's minimum service-role policy).
            iam.PolicyStatement(
                sid="CheckTheSourceBucket",
                actions=["s3:GetBucketAcl", "s3:GetBucketLocation"],
                resources=[asset.bucket.bucket_arn],
            ),
            # The log group exists (created here or given), so no logs:CreateLogGroup; its ARN ends in ":*",
            # which covers its log streams.
            iam.PolicyStatement(
                sid="WriteTheBuildLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[self.log_group.log_group_arn],
            ),
            iam.PolicyStatement(
                sid="UseTheBuildKey",
                actions=["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
                resources=[encryption_key.key_arn],
            ),
            iam.PolicyStatement(
                sid="LogInToTheRegistries",
                actions=["ecr:GetAuthorizationToken"],
                resources=["*"],
            ),
            iam.PolicyStatement(
                sid="PullTheDeepLearningContainer",
                actions=[
                    "ecr:BatchGetImage",
                    "ecr:GetDownloadUrlForLayer",
                    "ecr:BatchCheckLayerAvailability",
                ],
                resources=[
                    stack.format_arn(
                        service="ecr",
                        account=self.base_image_account,
                        resource="repository",
                        resource_name=DLC_REPOSITORY,
                    )
                ],
            ),
            # docker buildx --push and the registry cache (--cache-from/--cache-to), and the buildspec's
            # `aws ecr describe-images` (skip check and post_build check).
            iam.PolicyStatement(
                sid="PullAndPushTheTrainingImage",
                actions=[
                    "ecr:BatchGetImage",
                    "ecr:GetDownloadUrlForLayer",
                    "ecr:BatchCheckLayerAvailability",
                    "ecr:InitiateLayerUpload",
                    "ecr:UploadLayerPart",
                    "ecr:CompleteLayerUpload",
                    "ecr:PutImage",
                    "ecr:DescribeImages",
                ],
                resources=[repository.repository_arn],
            ),
        ]
        repository_key = image_repository.encryption_key
        if repository_key is not None and stack.resolve(repository_key.key_arn) != stack.resolve(
            encryption_key.key_arn
        ):
            found.append(
                iam.PolicyStatement(
                    sid="UseTheRepositoryKey",
                    actions=["kms:Decrypt", "kms:GenerateDataKey"],
                    resources=[repository_key.key_arn],
                )
            )
        return found

    def _acknowledge_provider(self, on_event_role: iam.Role, waiter_role: iam.Role) -> None:
        for role, functions in (
            (on_event_role, (self.on_event_function, self.is_complete_function)),
            (waiter_role, (self.on_event_function, self.is_complete_function)),
        ):
            for function in functions:
                acknowledge(
                    policy_scope(role),
                    f"IAM5[Resource::{arn_evidence(function, ':*')}]",
                    "The CDK Provider framework invokes the handler function by ARN including its versions "
                    "and aliases (<function ARN>:*); no other function.",
                )
        framework = self.provider.node
        waiter = framework.try_find_child("waiter-state-machine")
        if waiter is not None:
            for name in ("framework-isComplete", "framework-onTimeout"):
                acknowledge(
                    policy_scope(waiter.node.find_child("Role")),
                    f"IAM5[Resource::{arn_evidence(framework.find_child(name), ':*')}]",
                    "The Provider's waiter state machine invokes its own isComplete/onTimeout framework "
                    "functions, including versions and aliases; no other function.",
                )
            acknowledge(
                waiter,
                "SF1",
                "The Provider's waiter only polls isComplete every 30 s; each poll and its outcome is logged by "
                "the handler functions into their own log group with retention.",
            )
            acknowledge(
                waiter,
                "SF2",
                "The CDK Provider's waiter state machine offers no X-Ray tracing option; it runs one "
                "Lambda poll loop during deployment, traced in the handlers' logs.",
            )
            acknowledge(
                waiter,
                "StepFunctionStateMachineXray",
                "The CDK Provider's waiter state machine offers no X-Ray tracing option; it runs one "
                "Lambda poll loop during deployment, traced in the handlers' logs.",
                pack=SERVERLESS,
            )
            waiter_role_scope = waiter.node.find_child("Role")
            acknowledge_role_policy(policy_scope(waiter_role_scope))
            # Only Step Functions state machines of this account and region may assume the waiter's role.
            stack = Stack.of(self)
            waiter_cfn_role = waiter_role_scope.node.default_child
            assert isinstance(waiter_cfn_role, iam.CfnRole)
            waiter_cfn_role.add_property_override(
                "AssumeRolePolicyDocument.Statement.0.Condition",
                {
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {
                        "aws:SourceArn": stack.format_arn(
                            service="states",
                            resource="stateMachine",
                            resource_name="*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    },
                },
            )
        self._acknowledge_functions(framework)

    def _acknowledge_functions(self, framework: Any) -> None:
        """The deploy-time functions (ours and the Provider framework's): what does not apply to them."""
        ours = [self.on_event_function, self.is_complete_function]
        theirs = [
            framework.find_child(name)
            for name in ("framework-onEvent", "framework-isComplete", "framework-onTimeout")
            if framework.try_find_child(name) is not None
        ]
        for function in ours + theirs:
            for pack in (NIST_800_53_R5, SERVERLESS):
                acknowledge(
                    function,
                    "LambdaDLQ",
                    "CloudFormation and the Provider framework invoke these deploy-time functions and report "
                    "every failure back to CloudFormation, which fails the deployment; a dead-letter queue "
                    "would hold events that no one acts on.",
                    pack=pack,
                )
            acknowledge(
                function,
                "LambdaConcurrency",
                "Deploy-time functions run once per deployment (and every 30 s while waiting); reserving "
                "concurrency would take it from the account's pool (10 in new accounts) and can fail the deploy.",
                pack=NIST_800_53_R5,
            )
            acknowledge(
                function,
                "LambdaTracing",
                "Deploy-time functions of the image build: each call and its outcome is logged to their own "
                "log group; X-Ray would add cost and a '*' permission for no extra signal.",
                pack=SERVERLESS,
            )
            if self.vpc is None:
                acknowledge(
                    function,
                    "LambdaInsideVPC",
                    "No vpc was given: the functions call only AWS APIs (CodeBuild, ECR, Step Functions, Lambda) "
                    "and hold no data; pass vpc to run them (and the build) inside one.",
                    pack=NIST_800_53_R5,
                )
        for function in theirs:
            acknowledge(
                function,
                "LambdaDefaultMemorySize",
                "The memory of the CDK Provider framework's own functions is not configurable; they only relay "
                "calls to our handlers (256 MB).",
                pack=SERVERLESS,
            )


def buildspec() -> dict:
    """The build's buildspec (everything variable comes from the project's environment variables).

    pre_build logs in to the DLC registry and to our registry, then looks the tag up in our repository and
    marks the build to skip when it is there. build runs the BuildKit built into CodeBuild's Docker (``docker``
    driver: no builder image to pull), takes the layer cache from the last image (``CACHE_TAG``), writes the
    inline cache into the new image and pushes it under its tag and ``CACHE_TAG``. post_build checks that the
    tag is in the repository.
    """
    base_registry = '"$BASE_IMAGE_ACCOUNT.dkr.ecr.$BASE_IMAGE_REGION.$BASE_IMAGE_DOMAIN"'
    cache_ref = "type=registry,ref=$REPOSITORY_URI:$CACHE_TAG"  # the last image built, with its inline cache
    describe = (
        'aws ecr describe-images --region "$BASE_IMAGE_REGION" --repository-name "$REPOSITORY_NAME" '
        '--image-ids imageTag="$IMAGE_TAG"'
    )
    skip = f"if [ -f {SKIP_MARKER} ]; then echo 'Image exists: nothing to build'; else "
    build = (
        "docker buildx build --builder default --progress plain --platform linux/amd64 "
        "--provenance false --sbom false "
        '--build-arg BASE_ACCOUNT="$BASE_IMAGE_ACCOUNT" --build-arg BASE_REGION="$BASE_IMAGE_REGION" '
        '--build-arg BASE_DOMAIN="$BASE_IMAGE_DOMAIN" --build-arg BASE_TAG="$BASE_IMAGE_TAG" '
        f'--cache-from "{cache_ref}" '
        "--cache-to type=inline "
        '--tag "$REPOSITORY_URI:$IMAGE_TAG" --tag "$REPOSITORY_URI:$CACHE_TAG" --push .'
    )
    return {
        "version": "0.2",
        "phases": {
            "pre_build": {
                "on-failure": "ABORT",
                "commands": [
                    "docker buildx version",
                    'aws ecr get-login-password --region "$BASE_IMAGE_REGION" '
                    f"| docker login --username AWS --password-stdin {base_registry}",
                    'aws ecr get-login-password --region "$BASE_IMAGE_REGION" '
                    '| docker login --username AWS --password-stdin "${REPOSITORY_URI%%/*}"',
                    f"if {describe} > /dev/null 2>&1; then "
                    'echo "$REPOSITORY_URI:$IMAGE_TAG already exists: not building it again"; '
                    f"touch {SKIP_MARKER}; "
                    'else echo "Building $REPOSITORY_URI:$IMAGE_TAG"; fi',
                ],
            },
            "build": {
                "on-failure": "ABORT",
                "commands": [skip + build + "; fi"],
            },
            "post_build": {
                "on-failure": "ABORT",
                "commands": [
                    f"{describe} --query 'imageDetails[0].imageDigest' --output text",
                    'echo "Image: $REPOSITORY_URI:$IMAGE_TAG"',
                ],
            },
        },
    }


def _dlc_account(stack: Stack, given: str | None) -> str:
    if given is not None:
        return given
    region = stack.region
    if Token.is_unresolved(region):
        return stack.regional_fact(FactName.DLC_REPOSITORY_ACCOUNT)
    account = Fact.find(region, FactName.DLC_REPOSITORY_ACCOUNT)
    if account is None:
        raise ValueError(
            f"TrainingImageBuild: base_image_account is required in region {region}: CDK knows no AWS Deep "
            "Learning Containers account there (see the DLC 'available images' list for the region's account)"
        )
    return account


def _valid_tag(tag: object) -> bool:
    return (
        isinstance(tag, str)
        and 0 < len(tag) <= 128
        and all(c.isalnum() or c in "._-" for c in tag)
        and tag[0] not in ".-"
    )


def _in_range(name: str, value: int | None, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"TrainingImageBuild: {name} must be an integer in [{low}, {high}]; got {value!r}")
    return value
