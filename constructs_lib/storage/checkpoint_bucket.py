"""``CheckpointBucket``: the S3 bucket for training checkpoints, job output and training data.

Checkpoints are the most expensive bytes a team owns (days of B200 time), so the bucket is built to never lose
them: versioned (SageMaker's checkpoint sync deletes in S3 what the trainer rotates out locally; versions keep a
way back), retained on stack deletion by default, encrypted, TLS-only, private, and access-logged.

Layout (one prefix per use, each granted separately):

* ``checkpoints/`` - ``CheckpointConfig.S3Uri`` of each job, one sub-prefix per workflow execution;
* ``output/``      - ``OutputDataConfig.S3OutputPath`` (model artifacts, ``output.tar.gz``);
* ``data/``        - pre-tokenized training data read by the ``train`` channel;
* ``tuning/``      - the tuning runs' measurement records (``tuning/measurements/<image tag>/...``), which the
  training workflow stores after each tuning job and its request check reads for the plan (a tuning job's own
  report stays in its checkpoint folder, ``checkpoints/.../<execution>/tune/``).
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib._shared.nag import (
    NIST_800_53_R5,
    acknowledge,
    acknowledge_role_policy,
    grant_scope,
    rendered_or_none,
)

CHECKPOINT_PREFIX = "checkpoints/"
OUTPUT_PREFIX = "output/"
DATA_PREFIX = "data/"
TUNING_PREFIX = "tuning/"


class CheckpointBucket(Construct):
    """An S3 bucket for checkpoints, job output and data, safe against loss.

    All props are keyword-only.

    :param bucket: an existing bucket to use instead of creating one. Default: create one. The creation props
        (encryption, bucket_name, server_access_logs_bucket, lifecycle days, removal policy) then must be left
        unset: their settings are the existing bucket's business. Its objects are used under the same prefixes.
    :param encryption: ``s3.BucketEncryption.S3_MANAGED`` (default) or ``s3.BucketEncryption.KMS`` (customer
        managed key: ``encryption_key``, or one created with rotation).
    :param encryption_key: customer managed KMS key; implies ``KMS`` encryption. Default: none. With ``bucket``
        it declares the key the existing bucket's objects are encrypted with (SSE-KMS), so that every grant
        also allows exactly the key actions its object actions need; it may be left unset when the bucket was
        imported with ``Bucket.from_bucket_attributes(..., encryption_key=...)``, and must not differ from that.
    :param noncurrent_version_expiration_days: days a replaced or deleted object version is kept. Default 30.
    :param abort_incomplete_multipart_upload_days: days before an unfinished upload is cleaned up. Default 7.
    :param server_access_logs_bucket: bucket for S3 server access logs. Default: a log bucket is created.
    :param access_logs_expiration_days: days access logs are kept in the created log bucket. Default 365.
    :param removal_policy: ``RETAIN`` (default) or ``DESTROY``. Checkpoints are precious: only ``DESTROY``
        with ``auto_delete_objects=True`` removes their data when the stack goes.
    :param auto_delete_objects: empty the bucket(s) on stack deletion. Default False; needs ``DESTROY``.
    :param bucket_name: physical name. Default: generated.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket: s3.IBucket | None = None,
        encryption: s3.BucketEncryption | None = None,
        encryption_key: kms.IKey | None = None,
        noncurrent_version_expiration_days: int | None = None,
        abort_incomplete_multipart_upload_days: int | None = None,
        server_access_logs_bucket: s3.IBucket | None = None,
        access_logs_expiration_days: int | None = None,
        removal_policy: RemovalPolicy | None = None,
        auto_delete_objects: bool = False,
        bucket_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.checkpoint_prefix = CHECKPOINT_PREFIX
        self.output_prefix = OUTPUT_PREFIX
        self.data_prefix = DATA_PREFIX
        self.tuning_prefix = TUNING_PREFIX

        if bucket is not None:
            given = {
                "encryption": encryption,
                "server_access_logs_bucket": server_access_logs_bucket,
                "bucket_name": bucket_name,
                "noncurrent_version_expiration_days": noncurrent_version_expiration_days,
                "abort_incomplete_multipart_upload_days": abort_incomplete_multipart_upload_days,
                "access_logs_expiration_days": access_logs_expiration_days,
                "removal_policy": removal_policy,
                "auto_delete_objects": auto_delete_objects or None,
            }
            clash = sorted(name for name, value in given.items() if value is not None)
            if clash:
                raise ValueError(
                    f"CheckpointBucket: {', '.join(clash)} cannot be set together with bucket "
                    "(an existing bucket keeps its own settings); pass either bucket or creation props"
                )
            self.bucket: s3.IBucket = bucket
            self.encryption_key: kms.IKey | None = _declared_key(self, bucket.encryption_key, encryption_key)
            self.access_logs_bucket: s3.IBucket | None = None
            return

        noncurrent_days = _positive(
            "noncurrent_version_expiration_days", noncurrent_version_expiration_days, 30
        )
        abort_days = _positive(
            "abort_incomplete_multipart_upload_days", abort_incomplete_multipart_upload_days, 7
        )
        logs_days = _positive("access_logs_expiration_days", access_logs_expiration_days, 365)
        allowed_encryptions = (s3.BucketEncryption.S3_MANAGED, s3.BucketEncryption.KMS)
        if encryption is not None and encryption not in allowed_encryptions:
            raise ValueError(f"CheckpointBucket: encryption must be S3_MANAGED or KMS; got {encryption}")
        if encryption_key is not None and encryption == s3.BucketEncryption.S3_MANAGED:
            raise ValueError(
                "CheckpointBucket: encryption_key was given together with encryption=S3_MANAGED; "
                "use encryption=KMS (or leave encryption unset) with a key"
            )
        policy = removal_policy or RemovalPolicy.RETAIN
        if policy not in (RemovalPolicy.RETAIN, RemovalPolicy.DESTROY):
            raise ValueError(f"CheckpointBucket: removal_policy must be RETAIN or DESTROY; got {policy}")
        if auto_delete_objects and policy != RemovalPolicy.DESTROY:
            raise ValueError(
                "CheckpointBucket: auto_delete_objects=True needs removal_policy=DESTROY "
                "(with RETAIN the bucket outlives the stack and must keep its data)"
            )
        if encryption_key is None and encryption == s3.BucketEncryption.KMS:
            encryption_key = kms.Key(
                self,
                "Key",
                description="Encrypts training checkpoints and job output",
                enable_key_rotation=True,
                removal_policy=RemovalPolicy.RETAIN,
            )
        self.encryption_key = encryption_key

        if server_access_logs_bucket is None:
            log_bucket = s3.Bucket(
                self,
                "AccessLogs",
                # S3 log delivery writes only to SSE-S3 buckets.
                encryption=s3.BucketEncryption.S3_MANAGED,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                enforce_ssl=True,
                # Versioned, so that a deleted or overwritten log record can be recovered for a day.
                versioned=True,
                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
                lifecycle_rules=[
                    s3.LifecycleRule(
                        id="ExpireAccessLogs",
                        expiration=Duration.days(logs_days),
                        noncurrent_version_expiration=Duration.days(1),
                        abort_incomplete_multipart_upload_after=Duration.days(abort_days),
                    )
                ],
                removal_policy=policy,
                auto_delete_objects=auto_delete_objects,
            )
            server_access_logs_bucket = log_bucket
            self.access_logs_bucket = log_bucket
            acknowledge(
                log_bucket,
                "S3DefaultEncryptionKMS",
                "S3 server access log delivery writes only to buckets with SSE-S3 default encryption.",
                pack=NIST_800_53_R5,
            )
            _acknowledge_replication(log_bucket, "access logs")
        else:
            self.access_logs_bucket = server_access_logs_bucket

        self.bucket = s3.Bucket(
            self,
            "Bucket",
            bucket_name=bucket_name,
            encryption=s3.BucketEncryption.KMS if encryption_key else s3.BucketEncryption.S3_MANAGED,
            encryption_key=encryption_key,
            bucket_key_enabled=bool(encryption_key),
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=server_access_logs_bucket,
            server_access_logs_prefix="checkpoint-bucket/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="AbortIncompleteMultipartUploads",
                    abort_incomplete_multipart_upload_after=Duration.days(abort_days),
                ),
                s3.LifecycleRule(
                    id="ExpireNoncurrentVersions",
                    noncurrent_version_expiration=Duration.days(noncurrent_days),
                ),
            ],
            removal_policy=policy,
            auto_delete_objects=auto_delete_objects,
        )
        _acknowledge_replication(self.bucket, "checkpoints")
        if encryption_key is None:
            acknowledge(
                self.bucket,
                "S3DefaultEncryptionKMS",
                "SSE-S3 was chosen (no encryption_key, encryption not KMS; in the app: useKms=false); pass "
                "encryption=KMS or a key (useKms=true, kmsKeyArn) for a customer managed key.",
                pack=NIST_800_53_R5,
            )

    # ----------------------------------------------------------------------------------------------------------
    def s3_uri(self, prefix: str = "") -> str:
        """``s3://<bucket>/<prefix>`` (a token until deploy time)."""
        return f"s3://{self.bucket.bucket_name}/{prefix}"

    def grant_read_write(self, grantee: iam.IGrantable, *, prefix: str) -> iam.Grant:
        """Read, write, delete and list objects under ``prefix`` only (plus KMS use when encrypted).

        Delete is included because SageMaker's checkpoint sync mirrors local deletions (rotation of old
        checkpoints); bucket versioning keeps the deleted versions for ``noncurrent_version_expiration_days``.
        """
        return self._grant(grantee, prefix, write=True)

    def grant_read(self, grantee: iam.IGrantable, *, prefix: str) -> iam.Grant:
        """Read and list objects under ``prefix`` only (plus KMS decrypt when encrypted)."""
        return self._grant(grantee, prefix, write=False)

    def _grant(self, grantee: iam.IGrantable, prefix: str, *, write: bool) -> iam.Grant:
        if not prefix or prefix.startswith("/") or "*" in prefix:
            raise ValueError(
                f"CheckpointBucket: prefix must be a relative key prefix such as 'checkpoints/'; "
                f"got {prefix!r}"
            )
        object_actions = ["s3:GetObject"]
        if write:
            object_actions += ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
        objects = self.bucket.arn_for_objects(f"{prefix}*")
        grant = iam.Grant.add_to_principal(grantee=grantee, actions=object_actions, resource_arns=[objects])
        scope = grant_scope(grantee)
        if scope is not None:
            acknowledge_role_policy(scope)
        evidence = rendered_or_none(scope, objects) if scope is not None else None
        if scope is not None and evidence is not None:
            # The evidence is the ARN as rendered: <Bucket.Arn>/prefix/* for a bucket created here,
            # arn:<AWS::Partition>:s3:::name/prefix/* for an imported one.
            acknowledge(
                scope,
                f"IAM5[Resource::{evidence}]",
                f"Object access is limited to the '{prefix}' prefix of the checkpoint bucket; object keys "
                "below it are created at run time (one sub-prefix per job), so they cannot be listed here.",
            )
        grant = grant.combine(
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=["s3:ListBucket"],
                resource_arns=[self.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}},
            )
        )
        grant = grant.combine(
            iam.Grant.add_to_principal(
                grantee=grantee, actions=["s3:GetBucketLocation"], resource_arns=[self.bucket.bucket_arn]
            )
        )
        if self.encryption_key is not None:
            # SSE-KMS: GetObject decrypts; PutObject generates a data key (and multipart parts decrypt it).
            actions = ["kms:Decrypt", "kms:GenerateDataKey"] if write else ["kms:Decrypt"]
            grant = grant.combine(self.encryption_key.grant(grantee, *actions))
        return grant


def _declared_key(scope: Construct, imported: kms.IKey | None, declared: kms.IKey | None) -> kms.IKey | None:
    """The key of an existing bucket: the one it was imported with, or the one declared for it (not both,
    unless they are the same key)."""
    if imported is not None and declared is not None:
        stack = Stack.of(scope)
        if stack.resolve(imported.key_arn) != stack.resolve(declared.key_arn):
            raise ValueError(
                "CheckpointBucket: encryption_key differs from the encryption_key the existing bucket was "
                "imported with; give the bucket's one key in one place"
            )
    return declared or imported


def _acknowledge_replication(bucket: s3.Bucket, what: str) -> None:
    acknowledge(
        bucket,
        "S3BucketReplicationEnabled",
        f"Cross-region replication of the {what} needs a bucket in a second region, which this construct does "
        "not own; the bucket is versioned and retained by default. Add a replication rule to the bucket "
        "(bucket.node.default_child) where a second copy is required.",
        pack=NIST_800_53_R5,
    )


def _positive(name: str, value: int | None, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"CheckpointBucket: {name} must be an integer >= 1 (days); got {value!r}")
    return value
