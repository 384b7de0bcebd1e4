"""``TrainingImageRepository``: the ECR repository that holds the training images.

Images are tagged by the content hash of ``training/`` and tags are immutable, so a tag always means one exact
build. The one exception is the BuildKit registry-cache tag (``CACHE_TAG``), which each build overwrites.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from constructs_lib._shared.nag import acknowledge, acknowledge_role_policy, grant_scope

CACHE_TAG = "buildcache"
"""Tag of the BuildKit registry cache manifest (mutable: every build refreshes it)."""


class TrainingImageRepository(Construct):
    """An ECR repository for training images: scan on push, immutable tags, lifecycle, retained by default.

    All props are keyword-only.

    :param repository: an existing repository to use instead of creating one. Default: create one. The creation
        props (all but ``encryption_key``) must then be left unset.
    :param repository_name: physical name. Default: generated.
    :param encryption_key: customer managed KMS key for the images. Default: AES-256 (ECR managed). With
        ``repository`` it declares the key the existing repository is encrypted with, so that pull and push
        grants also allow exactly the key actions they need.
    :param untagged_image_expiry_days: days before untagged images (superseded cache layers, failed pushes) are
        expired. Default 1.
    :param max_tagged_images: how many tagged images to keep (the newest). Default 30.
    :param removal_policy: ``RETAIN`` (default) or ``DESTROY``.
    :param empty_on_delete: delete the images when the stack deletes the repository. Default False; needs
        ``DESTROY``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        repository: ecr.IRepository | None = None,
        repository_name: str | None = None,
        encryption_key: kms.IKey | None = None,
        untagged_image_expiry_days: int | None = None,
        max_tagged_images: int | None = None,
        removal_policy: RemovalPolicy | None = None,
        empty_on_delete: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        self.cache_tag = CACHE_TAG
        if repository is not None:
            given = {
                "repository_name": repository_name,
                "untagged_image_expiry_days": untagged_image_expiry_days,
                "max_tagged_images": max_tagged_images,
                "removal_policy": removal_policy,
                "empty_on_delete": empty_on_delete or None,
            }
            clash = sorted(name for name, value in given.items() if value is not None)
            if clash:
                raise ValueError(
                    f"TrainingImageRepository: {', '.join(clash)} cannot be set together with repository "
                    "(an existing repository keeps its own settings; only its encryption_key may be declared)"
                )
            self.repository: ecr.IRepository = repository
            self.encryption_key: kms.IKey | None = encryption_key
            return

        untagged_days = _at_least("untagged_image_expiry_days", untagged_image_expiry_days, 1, 1)
        keep = _at_least("max_tagged_images", max_tagged_images, 30, 1)
        policy = removal_policy or RemovalPolicy.RETAIN
        if policy not in (RemovalPolicy.RETAIN, RemovalPolicy.DESTROY):
            raise ValueError(
                f"TrainingImageRepository: removal_policy must be RETAIN or DESTROY; got {policy}"
            )
        if empty_on_delete and policy != RemovalPolicy.DESTROY:
            raise ValueError("TrainingImageRepository: empty_on_delete=True needs removal_policy=DESTROY")
        self.encryption_key = encryption_key
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=repository_name,
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE_WITH_EXCLUSION,
            image_tag_mutability_exclusion_filters=[
                ecr.ImageTagMutabilityExclusionFilter.wildcard(CACHE_TAG)
            ],
            encryption=ecr.RepositoryEncryption.KMS if encryption_key else ecr.RepositoryEncryption.AES_256,
            encryption_key=encryption_key,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    rule_priority=1,
                    description="Expire untagged images",
                    tag_status=ecr.TagStatus.UNTAGGED,
                    max_image_age=Duration.days(untagged_days),
                ),
                ecr.LifecycleRule(
                    rule_priority=2,
                    description=f"Keep the newest {keep} tagged images",
                    tag_status=ecr.TagStatus.TAGGED,
                    tag_pattern_list=["*"],
                    max_image_count=keep,
                ),
            ],
            removal_policy=policy,
            empty_on_delete=empty_on_delete,
        )

    @property
    def repository_uri(self) -> str:
        return self.repository.repository_uri

    def image_uri(self, tag: str) -> str:
        """``<account>.dkr.ecr.<region>.amazonaws.com/<name>:<tag>``."""
        return self.repository.repository_uri_for_tag(tag)

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        """Pull images (and decrypt them when the repository has a customer key)."""
        grant = self.repository.grant_pull(grantee)
        self._acknowledge_auth_token(grantee)
        if self.encryption_key is not None:
            grant = grant.combine(self.encryption_key.grant(grantee, "kms:Decrypt"))
        return grant

    def grant_pull_push(self, grantee: iam.IGrantable) -> iam.Grant:
        """Pull and push images (for the image build)."""
        grant = self.repository.grant_pull_push(grantee)
        self._acknowledge_auth_token(grantee)
        if self.encryption_key is not None:
            grant = grant.combine(self.encryption_key.grant(grantee, "kms:Decrypt", "kms:GenerateDataKey"))
        return grant

    @staticmethod
    def _acknowledge_auth_token(grantee: iam.IGrantable) -> None:
        scope = grant_scope(grantee)
        if scope is not None:
            acknowledge_role_policy(scope)
            acknowledge(
                scope,
                "IAM5[Resource::*]",
                "ecr:GetAuthorizationToken is an account-level call that IAM only accepts on Resource '*'; "
                "image access itself is scoped to the one repository.",
            )


def _at_least(name: str, value: int | None, default: int, minimum: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"TrainingImageRepository: {name} must be an integer >= {minimum}; got {value!r}")
    return value
