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

This module checks the props and composes the parts, each a function that takes what it uses and returns what it
builds: the network (``network``), the key and log groups (``build_logs``), the source asset and CodeBuild project
(``project``, with ``buildspec``) and the deploy-time build (``deploy_time``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aws_cdk import RemovalPolicy, Stack, Token
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk.region_info import Fact, FactName
from constructs import Construct

from constructs_lib.image.build_logs import key_and_logs
from constructs_lib.image.deploy_time import deploy_time_build
from constructs_lib.image.network import build_network
from constructs_lib.image.project import BuildSettings, source_and_project
from constructs_lib.image.repository import TrainingImageRepository

TRAINING_DIR = Path(__file__).resolve().parents[2] / "training"

DEFAULT_BASE_IMAGE_TAG = "2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker"
DEFAULT_BUILD_TIMEOUT_MINUTES = 120
DEFAULT_WAIT_TIMEOUT_MINUTES = 60
MAX_WAIT_TIMEOUT_MINUTES = 60
"""CloudFormation's limit for one custom resource operation (ServiceTimeout at most 3600 s)."""
BUILD_TIMEOUT_RANGE = (5, 2160)


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
        network = build_network(self, vpc=vpc, subnets=subnets, security_groups=security_groups)
        self.vpc: ec2.IVpc | None = network.vpc
        self.subnets: ec2.SubnetSelection | None = network.subnets
        self.security_groups: list[ec2.ISecurityGroup] = network.security_groups
        built_logs = key_and_logs(
            self,
            encryption_key=encryption_key,
            log_group=log_group,
            retention=retention,
            removal_policy=policy,
        )
        self.encryption_key: kms.IKey = built_logs.key
        self.log_group: logs.ILogGroup = built_logs.build_logs

        settings = BuildSettings(
            base_image_account=self.base_image_account,
            base_image_tag=base_tag,
            build_image=build_image,
            compute_type=compute_type,
            build_minutes=build_minutes,
        )
        built = source_and_project(
            self,
            source=source,
            image_repository=image_repository,
            settings=settings,
            encryption_key=self.encryption_key,
            log_group=self.log_group,
            network=network,
        )
        self.source_asset = built.source_asset
        self.image_tag: str = built.image_tag
        self.role: iam.Role = built.role
        """The project's role: add statements here, not through ``project`` (it takes no policy updates)."""
        self.project: codebuild.Project = built.project
        self.build_policy: iam.Policy = built.build_policy

        deploy = deploy_time_build(
            self,
            image_repository=image_repository,
            project=built,
            handler_logs=built_logs.handler_logs,
            wait_minutes=wait_minutes,
            network=network,
        )
        self.on_event_function = deploy.on_event_function
        self.is_complete_function = deploy.is_complete_function
        self.provider = deploy.provider
        self.resource = deploy.resource
        self.image_uri: str = deploy.image_uri
        """``<repository URI>:<content tag>``; resolving it makes a consumer wait for the build."""

    def grant_start_build(self, grantee: iam.IGrantable) -> iam.Grant:
        """Start and watch builds of the image project (e.g. to rebuild by hand or from a pipeline)."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["codebuild:StartBuild", "codebuild:BatchGetBuilds", "codebuild:StopBuild"],
            resource_arns=[self.project.project_arn],
        )


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
