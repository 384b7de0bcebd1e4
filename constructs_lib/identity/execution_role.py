"""``SageMakerExecutionRole``: the IAM role a SageMaker training job runs as, with least privilege.

Inline policies only (no AWS-managed policy): pull from the training image repository, read/write only the
checkpoint and output prefixes, read the data prefix, write the job's own CloudWatch logs and metrics, create
network interfaces only in the given VPC, and use only the given KMS keys.
"""

from __future__ import annotations

from aws_cdk import Annotations, ArnFormat, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from constructs_lib._shared.nag import acknowledge, acknowledge_role_policy, policy_scope, rendered
from constructs_lib.image.repository import TrainingImageRepository
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket

SAGEMAKER_SERVICE = "sagemaker.amazonaws.com"
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TRAINING_METRICS_NAMESPACES = ("/aws/sagemaker/TrainingJobs", "aws/sagemaker/TrainingJobs")
IMMUTABLE_ROLE_WARNING = "blackwell-training:immutableExecutionRole"
"""Id of the synthesis warning for an immutable ``role`` (acknowledge it with ``Annotations.acknowledge_warning``)."""


class SageMakerExecutionRole(Construct):
    """The execution role of the training jobs.

    All props are keyword-only.

    :param checkpoint_bucket: the bucket whose ``checkpoints/`` and ``output/`` prefixes the jobs read and write,
        and whose ``data/`` prefix they read.
    :param image_repository: the repository the jobs pull their image from.
    :param role: an existing role to use instead of creating one. Default: create one. The statements are still
        added to it. An immutable role (``Role.from_role_arn(..., mutable=False)``, a role of another account,
        ``role.without_policy_updates()``) silently drops them all: it is accepted, for a role that a security
        team keeps with these permissions already, but synthesis warns (``IMMUTABLE_ROLE_WARNING``) and names
        what the role must allow.
    :param role_name: physical name of the created role. Default: generated.
    :param vpc: when jobs run in a VPC, the permissions to create their network interfaces there. Default: none.
    :param kms_keys: further customer managed keys the jobs may use (e.g. for a data bucket or volumes).
        The bucket's and repository's own keys are added automatically. Default: none.
    :param max_session_duration_hours: session length of the role (1 to 12). Default 12: SageMaker refreshes
        credentials for long jobs itself, but a long session avoids failures in user code that caches them.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        checkpoint_bucket: CheckpointBucket,
        image_repository: TrainingImageRepository,
        role: iam.IRole | None = None,
        role_name: str | None = None,
        vpc: ec2.IVpc | None = None,
        kms_keys: list[kms.IKey] | None = None,
        max_session_duration_hours: int | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if role is not None and (role_name is not None or max_session_duration_hours is not None):
            raise ValueError(
                "SageMakerExecutionRole: role_name and max_session_duration_hours cannot be set together with "
                "role (an existing role keeps its own name and session length)"
            )
        hours = 12 if max_session_duration_hours is None else max_session_duration_hours
        if isinstance(hours, bool) or not isinstance(hours, int) or not 1 <= hours <= 12:
            raise ValueError(
                f"SageMakerExecutionRole: max_session_duration_hours must be an integer in [1, 12]; got {hours!r}"
            )
        self.checkpoint_bucket = checkpoint_bucket
        self.role: iam.IRole = role or iam.Role(
            self,
            "Role",
            role_name=role_name,
            description="Execution role of the Blackwell training jobs (least privilege)",
            max_session_duration=Duration.hours(hours),
            assumed_by=iam.ServicePrincipal(
                SAGEMAKER_SERVICE,
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            ),
        )

        image_repository.grant_pull(self.role)
        checkpoint_bucket.grant_read_write(self.role, prefix=checkpoint_bucket.checkpoint_prefix)
        checkpoint_bucket.grant_read_write(self.role, prefix=checkpoint_bucket.output_prefix)
        checkpoint_bucket.grant_read(self.role, prefix=checkpoint_bucket.data_prefix)
        for key in kms_keys or []:
            # Explicit actions (CDK's grant_encrypt_decrypt adds kms:ReEncrypt* and kms:GenerateDataKey*).
            key.grant(self.role, "kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")
        acknowledge_role_policy(policy_scope(self.role))

        stack = Stack.of(self)
        log_group_arn = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=TRAINING_LOG_GROUP,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        observability = iam.Policy(
            self,
            "Observability",
            statements=[
                iam.PolicyStatement(
                    sid="TrainingJobLogGroup",
                    actions=["logs:CreateLogGroup"],
                    resources=[log_group_arn],
                ),
                iam.PolicyStatement(
                    sid="TrainingJobLogStreams",
                    actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                    resources=[f"{log_group_arn}:log-stream:*"],
                ),
                iam.PolicyStatement(
                    sid="TrainingJobMetrics",
                    actions=["cloudwatch:PutMetricData"],
                    resources=["*"],
                    conditions={"StringEquals": {"cloudwatch:namespace": list(TRAINING_METRICS_NAMESPACES)}},
                ),
            ],
        )
        self.role.attach_inline_policy(observability)
        acknowledge_role_policy(observability)
        if not _attached(observability):
            Annotations.of(self).add_warning_v2(
                IMMUTABLE_ROLE_WARNING,
                f"SageMakerExecutionRole: the role {self.role.node.path} is immutable (imported with "
                "mutable=False, from another account, or without_policy_updates()), so none of the statements "
                "this construct grants are added to it. The training jobs fail unless the role already allows: "
                + _needs(vpc is not None, kms_keys, checkpoint_bucket, image_repository),
            )
        acknowledge(
            observability,
            "IAM5[Resource::*]",
            "cloudwatch:PutMetricData supports no resource-level permissions; it is limited by condition to "
            "SageMaker's training-job metric namespaces.",
        )
        acknowledge(
            observability,
            f"IAM5[Resource::{rendered(self, log_group_arn)}:log-stream:*]",
            "Log streams are named by SageMaker after each job at run time (<job>/algo-N-...); access is "
            "limited to SageMaker's training-job log group.",
        )

        if vpc is not None:
            network = iam.Policy(
                self,
                "Network",
                statements=[
                    iam.PolicyStatement(
                        sid="DescribeNetwork",
                        actions=[
                            "ec2:DescribeNetworkInterfaces",
                            "ec2:DescribeVpcs",
                            "ec2:DescribeDhcpOptions",
                            "ec2:DescribeSubnets",
                            "ec2:DescribeSecurityGroups",
                        ],
                        resources=["*"],
                    ),
                    iam.PolicyStatement(
                        sid="NetworkInterfacesInTrainingVpc",
                        actions=[
                            "ec2:CreateNetworkInterface",
                            "ec2:CreateNetworkInterfacePermission",
                            "ec2:DeleteNetworkInterface",
                            "ec2:DeleteNetworkInterfacePermission",
                        ],
                        resources=["*"],
                        conditions={
                            "ArnEquals": {
                                "ec2:Vpc": stack.format_arn(
                                    service="ec2", resource="vpc", resource_name=vpc.vpc_id
                                )
                            }
                        },
                    ),
                ],
            )
            self.role.attach_inline_policy(network)
            acknowledge_role_policy(network)
            acknowledge(
                network,
                "IAM5[Resource::*]",
                "ec2:Describe* accept only Resource '*'; network-interface create/delete are limited by the "
                "ec2:Vpc condition to the training VPC (their subnet and interface ARNs are chosen at run time).",
            )

    @property
    def role_arn(self) -> str:
        return self.role.role_arn

    def grant_pass_role(self, grantee: iam.IGrantable) -> None:
        """Allow ``grantee`` to pass this role, to SageMaker only (``iam:PassedToService``)."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["iam:PassRole"],
            resource_arns=[self.role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": SAGEMAKER_SERVICE}},
        )


def _attached(policy: iam.Policy) -> bool:
    """Whether ``policy`` went onto a role: an immutable role ignores ``attach_inline_policy`` (and every
    grant, while reporting it as added), so the policy's role list stays empty."""
    cfn = policy.node.default_child
    return bool(Stack.of(policy).resolve(cfn.roles))  # type: ignore[union-attr]


def _needs(
    vpc: bool,
    kms_keys: list[kms.IKey] | None,
    bucket: CheckpointBucket,
    repository: TrainingImageRepository,
) -> str:
    """What an execution role needs, in words (for the immutable-role warning)."""
    needs = [
        "ecr:GetAuthorizationToken, and ecr:BatchGetImage/GetDownloadUrlForLayer/BatchCheckLayerAvailability "
        "on the training image repository",
        f"s3:GetObject/PutObject/DeleteObject/AbortMultipartUpload on {bucket.checkpoint_prefix}* and "
        f"{bucket.output_prefix}*, s3:GetObject on {bucket.data_prefix}*, s3:ListBucket on those prefixes and "
        "s3:GetBucketLocation, in the checkpoint bucket",
        f"logs:CreateLogGroup/CreateLogStream/PutLogEvents/DescribeLogStreams on {TRAINING_LOG_GROUP}, and "
        "cloudwatch:PutMetricData",
    ]
    if bucket.encryption_key is not None or repository.encryption_key is not None:
        needs.append("kms:Decrypt/GenerateDataKey on the bucket's and the repository's keys")
    if vpc:
        needs.append("the EC2 network-interface actions (create, delete, describe) in the VPC")
    if kms_keys:
        needs.append(f"kms:Encrypt/Decrypt/GenerateDataKey/DescribeKey on the {len(kms_keys)} kms_keys")
    return "; ".join(needs) + "."
