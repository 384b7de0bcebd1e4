"""SageMakerExecutionRole: trust, inline least-privilege statements, VPC and KMS only when given."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Annotations, Match

from constructs_lib.identity.execution_role import IMMUTABLE_ROLE_WARNING, SageMakerExecutionRole
from constructs_lib.image.repository import TrainingImageRepository
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket
from tests.cdk_helpers import as_list, statements, synth_with_nag, template_of
from training.contract.container import S3_CHECKPOINT_ACTIONS


def _build(stack: cdk.Stack, **props) -> SageMakerExecutionRole:
    return SageMakerExecutionRole(
        stack,
        "ExecRole",
        checkpoint_bucket=CheckpointBucket(stack, "Ckpt"),
        image_repository=TrainingImageRepository(stack, "Images"),
        **props,
    )


@pytest.fixture(scope="module")
def template():
    return template_of(lambda stack: _build(stack))


@pytest.fixture(scope="module")
def vpc_template():
    def build(stack):
        vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0)
        _build(stack, vpc=vpc, kms_keys=[kms.Key(stack, "Extra", enable_key_rotation=True)])

    return template_of(build)


def _actions(found):
    return {a for s in found for a in as_list(s["Action"])}


def test_trusted_by_sagemaker_in_this_account_only(template):
    (role,) = template.find_resources("AWS::IAM::Role").values()
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}
    assert "ManagedPolicyArns" not in role["Properties"]
    assert role["Properties"]["MaxSessionDuration"] == 43200


def test_statements_action_by_action(template):
    found = statements(template)
    assert _actions(found) == {
        "ecr:BatchCheckLayerAvailability",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
        "ecr:GetAuthorizationToken",
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "s3:ListBucket",
        "s3:GetBucketLocation",
        "logs:CreateLogGroup",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "logs:DescribeLogStreams",
        "cloudwatch:PutMetricData",
    }
    for statement in found:
        assert statement["Effect"] == "Allow"
        assert all("*" not in action for action in as_list(statement["Action"])), statement


def test_wildcard_resources_are_only_the_unavoidable_ones(template):
    star = [s for s in statements(template) if "*" in as_list(s["Resource"])]
    assert {a for s in star for a in as_list(s["Action"])} == {
        "ecr:GetAuthorizationToken",
        "cloudwatch:PutMetricData",
    }
    metrics = next(s for s in star if "cloudwatch:PutMetricData" in as_list(s["Action"]))
    assert metrics["Condition"]["StringEquals"]["cloudwatch:namespace"] == [
        "/aws/sagemaker/TrainingJobs",
        "aws/sagemaker/TrainingJobs",
    ]


def test_s3_access_by_prefix(template):
    found = statements(template)
    writes = [s for s in found if "s3:PutObject" in as_list(s["Action"])]
    written = sorted(json.dumps(s["Resource"]) for s in writes)
    assert (
        len(written) == 2
        and "/checkpoints/*" in written[0] + written[1]
        and "/output/*" in written[0] + written[1]
    )
    reads = [s for s in found if as_list(s["Action"]) == ["s3:GetObject"]]
    assert any("/data/*" in json.dumps(s["Resource"]) for s in reads)


def test_s3_direct_checkpoints_need_no_more_than_the_checkpoint_prefix_grant(template):
    """Every action an S3-direct run calls on its prefix is granted on the checkpoint prefix's objects (listing:
    on the bucket, only for that prefix); none of them on the bucket's other keys beyond the output prefix."""
    found = statements(template)
    on_checkpoints = [s for s in found if "/checkpoints/*" in json.dumps(s["Resource"])]
    object_actions = {a for s in on_checkpoints for a in as_list(s["Action"])}
    assert set(S3_CHECKPOINT_ACTIONS) - {"s3:ListBucket"} == object_actions
    (listing,) = [s for s in found if "s3:ListBucket" in as_list(s["Action"])
                  and "checkpoints/" in json.dumps(s.get("Condition", {}))]  # fmt: skip
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["checkpoints/", "checkpoints/*"]}}
    for statement in found:
        resources = json.dumps(statement["Resource"])
        if set(as_list(statement["Action"])) & (
            set(S3_CHECKPOINT_ACTIONS) - {"s3:GetObject", "s3:ListBucket"}
        ):
            assert "/checkpoints/*" in resources or "/output/*" in resources, (
                statement
            )  # writes: those two only


def test_logs_limited_to_training_job_log_group(template):
    logs = [s for s in statements(template) if any(a.startswith("logs:") for a in as_list(s["Action"]))]
    assert all("log-group:/aws/sagemaker/TrainingJobs" in json.dumps(s["Resource"]) for s in logs)


def test_no_vpc_or_kms_permissions_without_vpc_or_keys(template):
    assert not any(a.startswith(("ec2:", "kms:")) for a in _actions(statements(template)))


def test_vpc_and_kms_permissions_when_given(vpc_template):
    found = statements(vpc_template)
    create = next(s for s in found if "ec2:CreateNetworkInterface" in as_list(s["Action"]))
    assert "ec2:Vpc" in create["Condition"]["ArnEquals"]
    assert {"kms:Decrypt", "kms:Encrypt"} <= _actions(found)


def test_pass_role_only_to_sagemaker():
    def build(stack):
        role = _build(stack)
        role.grant_pass_role(
            iam.Role(stack, "Launcher", assumed_by=iam.ServicePrincipal("states.amazonaws.com"))
        )

    found = statements(template_of(build))
    (passing,) = [s for s in found if "iam:PassRole" in as_list(s["Action"])]
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    assert "Fn::GetAtt" in passing["Resource"]


def test_existing_role_gets_the_statements():
    def build(stack):
        existing = iam.Role.from_role_arn(stack, "Existing", "arn:aws:iam::123456789012:role/team-training")
        assert _build(stack, role=existing).role is existing

    template = template_of(build)
    template.resource_count_is("AWS::IAM::Role", 0)
    policies = template.find_resources("AWS::IAM::Policy")
    assert policies and all(p["Properties"]["Roles"] == ["team-training"] for p in policies.values())


def _immutable(stack: cdk.Stack, kind: str) -> iam.IRole:
    if kind == "mutable=False":
        return iam.Role.from_role_arn(stack, "Team", "arn:aws:iam::123456789012:role/team", mutable=False)
    if kind == "another account":
        return iam.Role.from_role_arn(stack, "Team", "arn:aws:iam::999999999999:role/team")
    role = iam.Role(stack, "Team", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    return role.without_policy_updates()


@pytest.mark.parametrize("kind", ["mutable=False", "another account", "without_policy_updates"])
def test_immutable_role_is_accepted_with_a_warning_naming_what_it_must_allow(kind):
    stack = cdk.Stack(cdk.App(), "Test", env=cdk.Environment(account="123456789012", region="us-west-2"))
    _build(stack, role=_immutable(stack, kind), vpc=ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0))
    warnings = Annotations.from_stack(stack).find_warning("/Test/ExecRole", Match.any_value())
    assert len(warnings) == 1, warnings
    text = warnings[0].entry.data
    assert f"[ack: {IMMUTABLE_ROLE_WARNING}]" in text
    assert "is immutable" in text and "none of the statements" in text
    for needed in ("ecr:BatchGetImage", "checkpoints/*", "output/*", "data/*", "/aws/sagemaker/TrainingJobs"):
        assert needed in text
    assert "network-interface" in text


def test_mutable_imported_role_gives_no_warning():
    stack = cdk.Stack(cdk.App(), "Test", env=cdk.Environment(account="123456789012", region="us-west-2"))
    _build(stack, role=iam.Role.from_role_name(stack, "Team", "team"))
    assert Annotations.from_stack(stack).find_warning("*", Match.any_value()) == []


def test_existing_bucket_and_role_are_nag_clean():
    """A team's own bucket (with its key) and role: the acknowledgements follow the imported ARNs."""

    def build(app):
        stack = cdk.Stack(app, "Nag", env=cdk.Environment(account="123456789012", region="us-west-2"))
        key = kms.Key.from_key_arn(stack, "Key", "arn:aws:kms:us-west-2:123456789012:key/abcd")
        bucket = s3.Bucket.from_bucket_attributes(
            stack, "Bucket", bucket_name="team-ckpt", encryption_key=key
        )
        SageMakerExecutionRole(
            stack,
            "ExecRole",
            checkpoint_bucket=CheckpointBucket(stack, "Ckpt", bucket=bucket),
            image_repository=TrainingImageRepository(
                stack,
                "Images",
                repository=ecr.Repository.from_repository_name(stack, "Repo", "team/training"),
            ),
            role=iam.Role.from_role_name(stack, "Team", "team"),
            vpc=ec2.Vpc.from_vpc_attributes(
                stack, "Vpc", vpc_id="vpc-0123456789abcdef0", availability_zones=["us-west-2a"]
            ),
        )

    result = synth_with_nag(build)
    assert result.violations == ()
    (template,) = result.templates.values()
    kms_actions = {
        a
        for s in _all_statements(template)
        if s["Resource"] == "arn:aws:kms:us-west-2:123456789012:key/abcd"
        for a in as_list(s["Action"])
    }
    assert kms_actions == {"kms:Decrypt", "kms:GenerateDataKey"}


def _all_statements(template: dict) -> list[dict]:
    return [
        statement
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::IAM::Policy"
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
    ]


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"max_session_duration_hours": 13}, r"max_session_duration_hours must be an integer in \[1, 12\]"),
        (
            {"existing": True, "role_name": "x"},
            "role_name and max_session_duration_hours cannot be set together",
        ),
    ],
)
def test_bad_props(props, message):
    stack = cdk.Stack(cdk.App(), "Bad")
    if props.pop("existing", False):
        props["role"] = iam.Role.from_role_arn(stack, "Existing", "arn:aws:iam::123456789012:role/r")
    with pytest.raises(ValueError, match=message):
        _build(stack, **props)


def test_cdk_nag_clean_with_default_props():
    result = synth_with_nag(lambda app: _build(cdk.Stack(app, "Nag")))
    assert result.violations == ()
