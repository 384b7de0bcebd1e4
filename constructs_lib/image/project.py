"""The training-image build's CodeBuild project: the source asset (``training/`` less what its ``.dockerignore``
leaves out of the image; its content hash is the image tag), the project with its buildspec, and its role with one
policy that spells out each action the build uses.

The project gets its role without policy updates: CDK's automatic grants (S3 source read with
``s3:GetObject*``/``s3:GetBucket*``/``s3:List*``, the key's ``kms:ReEncrypt*``/``kms:GenerateDataKey*``, the default
``/aws/codebuild/<project>`` log group) are dropped, and ``BuildPermissions`` spells out every action the build
uses. Grants made through ``project`` (``project.add_to_role_policy``, ``grant_principal``) are dropped too: add
statements to ``role`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Aws, Duration, IgnoreMode, Stack
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from constructs_lib._shared.nag import NIST_800_53_R5, acknowledge, acknowledge_role_policy, rendered
from constructs_lib._shared.subnets import subnet_selection_kwargs
from constructs_lib.image.buildspec import buildspec
from constructs_lib.image.network import BuildNetwork
from constructs_lib.image.repository import TrainingImageRepository

DLC_REPOSITORY = "pytorch-training"
BUILD_FILES = ("Dockerfile", ".dockerignore")
"""Files the build reads itself: in the source asset even where ``.dockerignore`` leaves them out of the context."""


def source_excludes(source: Path) -> list[str]:
    """What the source asset leaves out: exactly what ``source/.dockerignore`` leaves out of the Docker build context
    (the one list; read with Docker's rules, ``IgnoreMode.DOCKER``), except the build's own files, as CDK's
    ``DockerImageAsset`` does. So a file that is not in the image neither travels with the source nor changes the
    image tag (the asset's hash). No ``.dockerignore``: nothing is left out."""
    ignore = source / ".dockerignore"
    if not ignore.is_file():
        return []
    patterns = [line.strip() for line in ignore.read_text().splitlines()]
    return [p for p in patterns if p and not p.startswith("#")] + [f"!{name}" for name in BUILD_FILES]


@dataclass(frozen=True)
class BuildProject:
    """What :func:`source_and_project` built."""

    source_asset: s3_assets.Asset
    """The zipped build context in the assets bucket."""
    image_tag: str
    """The source asset's hash: the content hash of the build context, the image's tag."""
    role: iam.Role
    """The project's role (takes no policy updates through ``project``; add statements here)."""
    project: codebuild.Project
    build_policy: iam.Policy
    """The role's one policy (``BuildPermissions``)."""


@dataclass(frozen=True)
class BuildSettings:
    """The build's own settings: where it pulls the base image from, and how CodeBuild runs it."""

    base_image_account: str
    base_image_tag: str
    build_image: codebuild.IBuildImage | None
    compute_type: codebuild.ComputeType | None
    build_minutes: int


def source_and_project(
    scope: Construct,
    *,
    source: Path,
    image_repository: TrainingImageRepository,
    settings: BuildSettings,
    encryption_key: kms.IKey,
    log_group: logs.ILogGroup,
    network: BuildNetwork,
) -> BuildProject:
    """The source asset ``Source``, the project role ``ProjectRole``, the ``Project`` with its buildspec, and the
    role's one policy ``BuildPermissions``, in ``scope``; the build logs to ``log_group`` and encrypts with
    ``encryption_key``."""
    stack = Stack.of(scope)
    source_asset = s3_assets.Asset(
        scope, "Source", path=str(source), exclude=source_excludes(source), ignore_mode=IgnoreMode.DOCKER
    )
    image_tag: str = source_asset.asset_hash
    repository = image_repository.repository
    environment = {
        "BASE_IMAGE_ACCOUNT": settings.base_image_account,
        "BASE_IMAGE_REGION": stack.region,
        "BASE_IMAGE_DOMAIN": Aws.URL_SUFFIX,
        "BASE_IMAGE_TAG": settings.base_image_tag,
        "REPOSITORY_URI": repository.repository_uri,
        "REPOSITORY_NAME": repository.repository_name,
        "IMAGE_TAG": image_tag,
        "CACHE_TAG": image_repository.cache_tag,
    }
    role = iam.Role(
        scope,
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
    project = codebuild.Project(
        scope,
        "Project",
        description="Builds the training image from training/ (AWS PyTorch DLC + Transformer Engine 2.11)",
        source=codebuild.Source.s3(bucket=source_asset.bucket, path=source_asset.s3_object_key),
        build_spec=codebuild.BuildSpec.from_object(buildspec()),
        environment=codebuild.BuildEnvironment(
            build_image=settings.build_image or codebuild.LinuxBuildImage.STANDARD_7_0,
            compute_type=settings.compute_type or codebuild.ComputeType.LARGE,
            privileged=True,
        ),
        environment_variables={
            name: codebuild.BuildEnvironmentVariable(value=value) for name, value in environment.items()
        },
        encryption_key=encryption_key,
        timeout=Duration.minutes(settings.build_minutes),
        logging=codebuild.LoggingOptions(cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=log_group)),
        grant_report_group_permissions=False,
        role=role.without_policy_updates(),
        vpc=network.vpc,
        subnet_selection=network.subnets,
        security_groups=network.security_groups or None,
    )
    build_policy = iam.Policy(
        scope,
        "BuildPermissions",
        roles=[role],
        statements=_build_statements(
            stack,
            source_asset=source_asset,
            log_group=log_group,
            encryption_key=encryption_key,
            base_image_account=settings.base_image_account,
            image_repository=image_repository,
        )
        + _vpc_statements(stack, network),
    )
    acknowledge_role_policy(build_policy)
    if network.vpc is not None:
        _acknowledge_vpc(scope, build_policy, project)
    acknowledge(
        build_policy,
        "IAM5[Resource::*]",
        "ecr:GetAuthorizationToken (alone in its statement) is an account-level call that IAM only accepts "
        "on Resource '*'; image access itself is limited to the DLC repository and our repository.",
    )
    log_streams = rendered(scope, log_group.log_group_arn)
    if "*" in log_streams:  # an imported log group's ARN is <group ARN>:* (a created one's is a GetAtt)
        acknowledge(
            build_policy,
            f"IAM5[Resource::{log_streams}]",
            "CodeBuild names the build's log streams at run time; CreateLogStream and PutLogEvents are "
            "limited to the streams of the one given log group.",
        )
    return BuildProject(
        source_asset=source_asset,
        image_tag=image_tag,
        role=role,
        project=project,
        build_policy=build_policy,
    )


def _vpc_statements(stack: Stack, network: BuildNetwork) -> list[iam.PolicyStatement]:
    """What CodeBuild needs to run the build in ``vpc`` (none without one)."""
    if network.vpc is None:
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
                        for subnet_id in network.vpc.select_subnets(
                            **subnet_selection_kwargs(network.subnets)
                        ).subnet_ids
                    ]
                },
            },
        ),
    ]


def _build_statements(
    stack: Stack,
    *,
    source_asset: s3_assets.Asset,
    log_group: logs.ILogGroup,
    encryption_key: kms.IKey,
    base_image_account: str,
    image_repository: TrainingImageRepository,
) -> list[iam.PolicyStatement]:
    """Everything the build does, action by action: read its source zip, write its log group, use its key,
    log in to ECR, pull the DLC, pull/push/describe our repository (image and BuildKit cache)."""
    asset = source_asset
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
            resources=[log_group.log_group_arn],
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
                    account=base_image_account,
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


def _acknowledge_vpc(scope: Construct, build_policy: iam.Policy, project: codebuild.Project) -> None:
    """What does not apply to the VPC statements of the build policy (and to codebuild.Project's own VPC policy)."""
    stack = Stack.of(scope)
    acknowledge(
        build_policy,
        "IAM5[Resource::*]",
        "The EC2 describe calls and network-interface create/delete that CodeBuild makes to attach the build "
        "to the VPC take only Resource '*'.",
    )
    acknowledge(
        build_policy,
        f"IAM5[Resource::{rendered(scope, stack.format_arn(service='ec2', resource='network-interface', resource_name='*'))}]",
        "ec2:CreateNetworkInterfacePermission: the interface is created at run time; the permission is "
        "limited to CodeBuild (ec2:AuthorizedService) and to the build's subnets (ec2:Subnet).",
    )
    # With a VPC, codebuild.Project makes a policy of the same EC2 statements for its role; the role takes no
    # policy updates (see this module's docstring), so that policy is attached to nothing and not synthesized.
    cdk_policy = project.node.try_find_child("PolicyDocument")
    if cdk_policy is not None:
        reason = (
            "codebuild.Project's own VPC policy is attached to no role (the project role takes no policy "
            "updates) and is not synthesized; BuildPermissions holds the same statements."
        )
        acknowledge(cdk_policy, "IAM5[Resource::*]", reason)
        acknowledge(cdk_policy, "IAMNoInlinePolicy", reason, pack=NIST_800_53_R5)
