"""The deployable app as `make synth` builds it: resources, outputs, and cdk-nag with zero open findings."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3

from app import add_stacks
from tests.cdk_helpers import synth_with_nag

CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"


def _app_as_configured(app: cdk.App, **overrides) -> list[cdk.Stack]:
    for key, value in {**json.loads(CDK_JSON.read_text())["context"], **overrides}.items():
        app.node.set_context(key, value)
    return add_stacks(app)


@pytest.fixture(scope="module")
def app_nag():
    """The app exactly as app.py builds it from cdk.json context, checked by AwsSolutions."""
    return synth_with_nag(_app_as_configured)


def test_app_synthesizes_with_zero_unacknowledged_findings(app_nag):
    assert app_nag.violations == ()


def test_app_contains_storage_identity_and_outputs(app_nag):
    (template,) = app_nag.templates.values()
    types = [r["Type"] for r in template["Resources"].values()]
    assert types.count("AWS::S3::Bucket") == 2  # checkpoints + access logs
    assert types.count("AWS::ECR::Repository") == 1
    assert "AWS::IAM::Role" in types
    assert {"CheckpointBucketName", "ImageRepositoryUri", "ExecutionRoleArn"} <= set(template["Outputs"])


def test_no_wildcard_action_anywhere(app_nag):
    (template,) = app_nag.templates.values()
    for resource in template["Resources"].values():
        if resource["Type"] not in ("AWS::IAM::Policy", "AWS::IAM::Role"):
            continue
        documents = [resource["Properties"].get("PolicyDocument")] + [
            p["PolicyDocument"] for p in resource["Properties"].get("Policies", [])
        ]
        for document in filter(None, documents):
            for statement in document["Statement"]:
                actions = (
                    statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                )
                assert all("*" not in action for action in actions), statement


def test_app_with_customer_kms_key_is_nag_clean():
    result = synth_with_nag(lambda app: _app_as_configured(app, useKms=True))
    assert result.violations == ()
    (template,) = result.templates.values()
    keys = [r for r in template["Resources"].values() if r["Type"] == "AWS::KMS::Key"]
    assert keys and all(key["Properties"]["EnableKeyRotation"] for key in keys)


def test_cdk_nag_check_is_live():
    """A deliberately insecure bucket beside the app's stack must make the check fail."""

    def build(app: cdk.App) -> None:
        (stack,) = _app_as_configured(app)
        s3.Bucket(stack, "PlainBucket")  # no SSL enforcement, no access logs

    result = synth_with_nag(build)
    rules = result.rules()
    assert any(rule.startswith("AwsSolutions-S1") for rule in rules)
    assert any(rule.startswith("AwsSolutions-S10") for rule in rules)
    assert all("PlainBucket" in path for _, path in result.violations)
