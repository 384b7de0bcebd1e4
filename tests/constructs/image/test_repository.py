"""TrainingImageRepository: scan on push, immutable tags (but the cache tag), lifecycle, retention, grants."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms

from constructs_lib._shared.nag import acknowledge_role_policy
from constructs_lib.image.repository import CACHE_TAG, TrainingImageRepository
from tests.cdk_helpers import as_list, statements, synth_with_nag, template_of


def _with_puller(stack: cdk.Stack, **props) -> TrainingImageRepository:
    repo = TrainingImageRepository(stack, "Images", **props)
    puller = iam.Role(stack, "Puller", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    repo.grant_pull(puller)
    acknowledge_role_policy(
        puller.node.find_child("DefaultPolicy")
    )  # the test's own role, not the construct's
    return repo


@pytest.fixture(scope="module")
def template():
    return template_of(lambda stack: _with_puller(stack))


def _repository(template):
    (repo,) = template.find_resources("AWS::ECR::Repository").values()
    return repo


def test_scan_on_push_and_immutable_tags_except_cache(template):
    props = _repository(template)["Properties"]
    assert props["ImageScanningConfiguration"] == {"ScanOnPush": True}
    assert props["ImageTagMutability"] == "IMMUTABLE_WITH_EXCLUSION"
    assert props["ImageTagMutabilityExclusionFilters"] == [
        {
            "ImageTagMutabilityExclusionFilterType": "WILDCARD",
            "ImageTagMutabilityExclusionFilterValue": CACHE_TAG,
        }
    ]


def test_lifecycle_expires_untagged_and_keeps_last_tagged(template):
    policy = json.loads(_repository(template)["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"])
    rules = sorted(policy["rules"], key=lambda r: r["rulePriority"])
    assert rules[0]["selection"] == {
        "tagStatus": "untagged",
        "countType": "sinceImagePushed",
        "countNumber": 1,
        "countUnit": "days",
    }
    assert rules[1]["selection"]["tagStatus"] == "tagged"
    assert rules[1]["selection"]["countType"] == "imageCountMoreThan"
    assert rules[1]["selection"]["countNumber"] == 30
    assert all(rule["action"] == {"type": "expire"} for rule in rules)


def test_retained_by_default(template):
    repo = _repository(template)
    assert repo["DeletionPolicy"] == "Retain"
    assert repo["UpdateReplacePolicy"] == "Retain"


def test_pull_grant_is_scoped_to_the_repository(template):
    found = statements(template)
    pull = next(s for s in found if "ecr:BatchGetImage" in as_list(s["Action"]))
    assert sorted(as_list(pull["Action"])) == [
        "ecr:BatchCheckLayerAvailability",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
    ]
    assert "Fn::GetAtt" in pull["Resource"]
    token = next(s for s in found if "ecr:GetAuthorizationToken" in as_list(s["Action"]))
    assert token["Resource"] == "*" and as_list(token["Action"]) == ["ecr:GetAuthorizationToken"]
    assert not any("ecr:PutImage" in as_list(s["Action"]) for s in found)


def test_kms_key_and_custom_lifecycle():
    def build(stack):
        key = kms.Key(stack, "Key", enable_key_rotation=True)
        _with_puller(stack, encryption_key=key, max_tagged_images=5, untagged_image_expiry_days=3)

    template = template_of(build)
    props = _repository(template)["Properties"]
    assert props["EncryptionConfiguration"]["EncryptionType"] == "KMS"
    rules = json.loads(props["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert {r["selection"]["countNumber"] for r in rules} == {3, 5}
    assert any("kms:Decrypt" in as_list(s["Action"]) for s in statements(template))


def test_existing_repository():
    def build(stack):
        existing = ecr.Repository.from_repository_name(stack, "Existing", "team/training")
        repo = _with_puller(stack, repository=existing)
        assert repo.repository is existing

    template = template_of(build)
    template.resource_count_is("AWS::ECR::Repository", 0)
    assert any("repository/team/training" in json.dumps(s["Resource"]) for s in statements(template))


KEY_ARN = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def test_existing_repository_with_its_key_grants_exactly_the_key_actions():
    def build(stack):
        existing = ecr.Repository.from_repository_name(stack, "Existing", "team/training")
        repo = TrainingImageRepository(
            stack, "Images", repository=existing, encryption_key=kms.Key.from_key_arn(stack, "Key", KEY_ARN)
        )
        principal = iam.ServicePrincipal("sagemaker.amazonaws.com")
        assert repo.grant_pull(iam.Role(stack, "Puller", assumed_by=principal)).success
        repo.grant_pull_push(iam.Role(stack, "Pusher", assumed_by=principal))

    template = template_of(build)
    by_policy = {}
    for logical_id, policy in template.find_resources("AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Resource"] == KEY_ARN:
                by_policy.setdefault(logical_id[:6], set()).update(as_list(statement["Action"]))
    assert by_policy == {"Puller": {"kms:Decrypt"}, "Pusher": {"kms:Decrypt", "kms:GenerateDataKey"}}


def test_imported_repository_and_grantee_are_nag_clean():
    def build(app):
        stack = cdk.Stack(app, "Nag", env=cdk.Environment(account="123456789012", region="us-west-2"))
        existing = ecr.Repository.from_repository_name(stack, "Existing", "team/training")
        repo = TrainingImageRepository(stack, "Images", repository=existing)
        repo.grant_pull(iam.Role.from_role_arn(stack, "Team", "arn:aws:iam::123456789012:role/team"))

    assert synth_with_nag(build).violations == ()


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"max_tagged_images": 0}, "max_tagged_images must be an integer >= 1"),
        ({"untagged_image_expiry_days": 0}, "untagged_image_expiry_days must be an integer >= 1"),
        ({"empty_on_delete": True}, "empty_on_delete=True needs removal_policy=DESTROY"),
        ({"removal_policy": cdk.RemovalPolicy.SNAPSHOT}, "removal_policy must be RETAIN or DESTROY"),
        (
            {"existing": True, "max_tagged_images": 3},
            "max_tagged_images cannot be set together with repository",
        ),
    ],
)
def test_bad_props(props, message):
    stack = cdk.Stack(cdk.App(), "Bad")
    if props.pop("existing", False):
        props["repository"] = ecr.Repository.from_repository_name(stack, "Existing", "team/training")
    with pytest.raises(ValueError, match=message):
        TrainingImageRepository(stack, "Images", **props)


def test_cdk_nag_clean_with_default_props():
    result = synth_with_nag(lambda app: _with_puller(cdk.Stack(app, "Nag")))
    assert result.violations == ()
