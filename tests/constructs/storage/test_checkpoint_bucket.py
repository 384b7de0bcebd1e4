"""CheckpointBucket: encryption, privacy, TLS, versioning, lifecycle, logging, retention, grants, bad props."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Match

from constructs_lib._shared.nag import acknowledge_role_policy
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket
from tests.cdk_helpers import as_list, statements, synth_with_nag, template_of


def _with_role(stack: cdk.Stack, **props) -> CheckpointBucket:
    bucket = CheckpointBucket(stack, "Ckpt", **props)
    role = iam.Role(stack, "Trainer", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    bucket.grant_read_write(role, prefix=bucket.checkpoint_prefix)
    bucket.grant_read(role, prefix=bucket.data_prefix)
    acknowledge_role_policy(role.node.find_child("DefaultPolicy"))  # the test's own role, not the construct's
    return bucket


@pytest.fixture(scope="module")
def default_template():
    return template_of(lambda stack: _with_role(stack))


@pytest.fixture(scope="module")
def kms_template():
    return template_of(lambda stack: _with_role(stack, encryption=s3.BucketEncryption.KMS))


def _main_bucket(template):
    buckets = template.find_resources(
        "AWS::S3::Bucket", {"Properties": {"LoggingConfiguration": Match.any_value()}}
    )
    assert len(buckets) == 1
    return next(iter(buckets.items()))


def test_bucket_is_encrypted_private_versioned_and_retained(default_template):
    logical_id, bucket = _main_bucket(default_template)
    props = bucket["Properties"]
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"
    ] == {"SSEAlgorithm": "AES256"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert bucket["DeletionPolicy"] == "Retain"
    assert bucket["UpdateReplacePolicy"] == "Retain"
    assert (
        "LoggingConfiguration" in props
        and props["LoggingConfiguration"]["LogFilePrefix"] == "checkpoint-bucket/"
    )
    # No auto-delete custom resource by default: nothing can empty the bucket.
    assert default_template.find_resources("Custom::S3AutoDeleteObjects") == {}


def test_lifecycle_aborts_uploads_and_expires_noncurrent_versions(default_template):
    _, bucket = _main_bucket(default_template)
    rules = {rule["Id"]: rule for rule in bucket["Properties"]["LifecycleConfiguration"]["Rules"]}
    assert rules["AbortIncompleteMultipartUploads"]["AbortIncompleteMultipartUpload"] == {
        "DaysAfterInitiation": 7
    }
    assert rules["ExpireNoncurrentVersions"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30}
    # Current versions never expire: a checkpoint stays until someone deletes it.
    assert all("ExpirationInDays" not in rule for rule in rules.values())


def test_bucket_policy_denies_plain_http(default_template):
    policies = default_template.find_resources("AWS::S3::BucketPolicy")
    assert len(policies) == 2  # checkpoint bucket and its access-log bucket
    for policy in policies.values():
        deny = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
        assert deny and deny[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        assert deny[0]["Action"] == "s3:*" and deny[0]["Principal"] == {"AWS": "*"}


def test_access_log_bucket_is_created_private_and_expiring(default_template):
    buckets = default_template.find_resources("AWS::S3::Bucket")
    assert len(buckets) == 2
    log_bucket = next(b for b in buckets.values() if "LoggingConfiguration" not in b["Properties"])
    assert log_bucket["DeletionPolicy"] == "Retain"
    rules = log_bucket["Properties"]["LifecycleConfiguration"]["Rules"]
    assert rules[0]["ExpirationInDays"] == 365
    # Versioned (NIST 800-53 R5 S3BucketVersioningEnabled), old versions of a log object kept one day.
    assert log_bucket["Properties"]["VersioningConfiguration"] == {"Status": "Enabled"}
    assert rules[0]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
    assert log_bucket["Properties"]["PublicAccessBlockConfiguration"]["BlockPublicAcls"] is True


def test_grants_are_scoped_to_prefixes(default_template):
    found = statements(default_template)
    object_statements = [s for s in found if "s3:GetObject" in as_list(s["Action"])]
    resources = sorted(str(r) for s in object_statements for r in as_list(s["Resource"]))
    assert any("/checkpoints/*" in r for r in resources)
    assert any("/data/*" in r for r in resources)
    write = [s for s in object_statements if "s3:PutObject" in as_list(s["Action"])]
    assert write and all("/checkpoints/*" in str(s["Resource"]) for s in write), (
        "only checkpoints/ is writable"
    )
    listing = [s for s in found if "s3:ListBucket" in as_list(s["Action"])]
    prefixes = sorted(p for s in listing for p in s["Condition"]["StringLike"]["s3:prefix"])
    assert prefixes == ["checkpoints/", "checkpoints/*", "data/", "data/*"]
    for statement in found:
        assert all("*" not in action for action in as_list(statement["Action"])), statement


def test_kms_encryption_creates_rotating_key_and_grants_it(kms_template):
    _, bucket = _main_bucket(kms_template)
    sse = bucket["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert sse["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert sse["BucketKeyEnabled"] is True
    kms_template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    kms_actions = {a for s in statements(kms_template) for a in as_list(s["Action"]) if a.startswith("kms:")}
    assert kms_actions == {"kms:Decrypt", "kms:GenerateDataKey"}  # explicit, no wildcard actions


def test_given_key_is_used():
    def build(stack):
        key = kms.Key(stack, "MyKey", enable_key_rotation=True)
        CheckpointBucket(stack, "Ckpt", encryption_key=key)

    template = template_of(build)
    template.resource_count_is("AWS::KMS::Key", 1)
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [
                    Match.object_like(
                        {"ServerSideEncryptionByDefault": Match.object_like({"SSEAlgorithm": "aws:kms"})}
                    )
                ]
            }
        },
    )


def test_destroy_with_auto_delete_when_asked():
    template = template_of(
        lambda stack: CheckpointBucket(
            stack, "Ckpt", removal_policy=cdk.RemovalPolicy.DESTROY, auto_delete_objects=True
        )
    )
    assert len(template.find_resources("Custom::S3AutoDeleteObjects")) == 2
    for bucket in template.find_resources("AWS::S3::Bucket").values():
        assert bucket["DeletionPolicy"] == "Delete"


def test_existing_bucket_is_used_and_granted():
    def build(stack):
        existing = s3.Bucket.from_bucket_name(stack, "Existing", "my-team-checkpoints")
        ckpt = CheckpointBucket(stack, "Ckpt", bucket=existing)
        assert ckpt.bucket is existing
        assert ckpt.access_logs_bucket is None
        role = iam.Role(stack, "Trainer", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
        ckpt.grant_read_write(role, prefix="checkpoints/")

    template = template_of(build)
    template.resource_count_is("AWS::S3::Bucket", 0)
    resources = [r for s in statements(template) for r in as_list(s["Resource"])]
    assert any("my-team-checkpoints/checkpoints/*" in str(r) for r in resources)


KEY_ARN = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def _key_statements(template) -> dict[str, set[str]]:
    """The key actions each grantee policy holds on KEY_ARN: {policy logical id: actions}."""
    found: dict[str, set[str]] = {}
    for logical_id, policy in template.find_resources("AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Resource"] == KEY_ARN:
                found.setdefault(logical_id, set()).update(as_list(statement["Action"]))
    return found


@pytest.mark.parametrize("imported_with_key", [False, True], ids=["declared", "from_bucket_attributes"])
def test_existing_bucket_with_its_key_grants_exactly_the_key_actions(imported_with_key):
    def build(stack):
        key = kms.Key.from_key_arn(stack, "TeamKey", KEY_ARN)
        if imported_with_key:
            existing = s3.Bucket.from_bucket_attributes(
                stack, "Existing", bucket_name="team-ckpt", encryption_key=key
            )
            ckpt = CheckpointBucket(stack, "Ckpt", bucket=existing)
        else:
            existing = s3.Bucket.from_bucket_name(stack, "Existing", "team-ckpt")
            ckpt = CheckpointBucket(stack, "Ckpt", bucket=existing, encryption_key=key)
        assert ckpt.encryption_key is not None and ckpt.encryption_key.key_arn == KEY_ARN
        writer = iam.Role(stack, "Writer", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
        reader = iam.Role(stack, "Reader", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
        assert ckpt.grant_read_write(writer, prefix="checkpoints/").success
        ckpt.grant_read(reader, prefix="output/")

    found = _key_statements(template_of(build))
    assert {k[: len("Writer")]: v for k, v in found.items()} == {
        "Writer": {"kms:Decrypt", "kms:GenerateDataKey"},
        "Reader": {"kms:Decrypt"},
    }


def test_existing_bucket_without_a_key_grants_no_key_actions():
    def build(stack):
        ckpt = CheckpointBucket(stack, "Ckpt", bucket=s3.Bucket.from_bucket_name(stack, "E", "team-ckpt"))
        assert ckpt.encryption_key is None
        ckpt.grant_read_write(
            iam.Role(stack, "Writer", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com")),
            prefix="checkpoints/",
        )

    actions = {a for s in statements(template_of(build)) for a in as_list(s["Action"])}
    assert not any(a.startswith("kms:") for a in actions)


def test_declared_key_must_match_the_key_the_bucket_was_imported_with():
    stack = cdk.Stack(cdk.App(), "Bad")
    key = kms.Key.from_key_arn(stack, "Key", KEY_ARN)
    other = kms.Key.from_key_arn(stack, "Other", KEY_ARN.replace("1234abcd", "9999abcd"))
    existing = s3.Bucket.from_bucket_attributes(stack, "E", bucket_name="team-ckpt", encryption_key=key)
    with pytest.raises(
        ValueError, match="encryption_key differs from the encryption_key the existing bucket"
    ):
        CheckpointBucket(stack, "Ckpt", bucket=existing, encryption_key=other)
    same = CheckpointBucket(stack, "Same", bucket=existing, encryption_key=key)
    assert same.encryption_key is key


def test_existing_bucket_is_nag_clean_for_created_and_imported_grantees():
    """The prefix acknowledgements are made for an imported bucket too (its ARN as cdk-nag renders it), on
    the grantee's own policy, for a created role and for an imported one."""

    def build(app):
        stack = cdk.Stack(app, "Nag", env=cdk.Environment(account="123456789012", region="us-west-2"))
        existing = s3.Bucket.from_bucket_name(stack, "Existing", "team-ckpt")
        ckpt = CheckpointBucket(
            stack, "Ckpt", bucket=existing, encryption_key=kms.Key.from_key_arn(stack, "K", KEY_ARN)
        )
        created = iam.Role(stack, "Trainer", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
        imported = iam.Role.from_role_arn(stack, "Team", "arn:aws:iam::123456789012:role/team")
        for grantee in (created, imported):
            ckpt.grant_read_write(grantee, prefix=ckpt.checkpoint_prefix)
            ckpt.grant_read(grantee, prefix=ckpt.data_prefix)
        # A bare principal has no policy of its own: nothing to acknowledge, nothing found.
        ckpt.grant_read(iam.AccountRootPrincipal(), prefix=ckpt.output_prefix)

    result = synth_with_nag(build)
    assert result.violations == ()
    (template,) = result.templates.values()
    roles = [
        p["Properties"]["Roles"] for p in template["Resources"].values() if p["Type"] == "AWS::IAM::Policy"
    ]
    assert sorted(json.dumps(r) for r in roles) == [
        '["team"]',
        '[{"Ref": "Trainer' + _suffix(template) + '"}]',
    ]


def _suffix(template) -> str:
    (logical_id,) = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::IAM::Role"]
    return logical_id[len("Trainer") :]


@pytest.mark.parametrize(
    ("props", "message"),
    [
        (
            {"noncurrent_version_expiration_days": 0},
            "noncurrent_version_expiration_days must be an integer >= 1",
        ),
        ({"abort_incomplete_multipart_upload_days": -2}, "abort_incomplete_multipart_upload_days must be"),
        ({"access_logs_expiration_days": 0}, "access_logs_expiration_days must be"),
        (
            {"encryption": s3.BucketEncryption.S3_MANAGED, "encryption_key": "KEY"},
            "encryption_key was given together with encryption=S3_MANAGED",
        ),
        ({"encryption": s3.BucketEncryption.UNENCRYPTED}, "encryption must be S3_MANAGED or KMS"),
        ({"auto_delete_objects": True}, "auto_delete_objects=True needs removal_policy=DESTROY"),
        ({"removal_policy": cdk.RemovalPolicy.SNAPSHOT}, "removal_policy must be RETAIN or DESTROY"),
        (
            {"bucket": "EXISTING", "noncurrent_version_expiration_days": 3},
            "noncurrent_version_expiration_days cannot",
        ),
    ],
)
def test_bad_props_raise_value_error_naming_the_prop(props, message):
    app = cdk.App()
    stack = cdk.Stack(app, "Bad")
    if props.get("encryption_key") == "KEY":
        props["encryption_key"] = kms.Key(stack, "Key")
    if props.get("bucket") == "EXISTING":
        props["bucket"] = s3.Bucket.from_bucket_name(stack, "Existing", "existing-bucket")
    with pytest.raises(ValueError, match=message):
        CheckpointBucket(stack, "Ckpt", **props)


def test_bad_grant_prefix_is_rejected():
    app = cdk.App()
    stack = cdk.Stack(app, "Bad")
    bucket = CheckpointBucket(stack, "Ckpt")
    role = iam.Role(stack, "R", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    for prefix in ("", "/abs/", "checkpoints/*"):
        with pytest.raises(ValueError, match="prefix must be a relative key prefix"):
            bucket.grant_read_write(role, prefix=prefix)


def test_cdk_nag_clean_with_default_props():
    result = synth_with_nag(lambda app: _with_role(cdk.Stack(app, "Nag")))
    assert result.violations == ()
