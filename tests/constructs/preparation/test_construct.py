"""DataPreparation: cdk-nag at zero unacknowledged, IAM scoped to the prefixes, refusals at synth."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam

from constructs_lib.image.repository import TrainingImageRepository
from constructs_lib.preparation.construct import CREATE_PROCESSING_JOB_SYNC, DataPreparation
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket
from tests.cdk_helpers import DEFAULT_ENV, synth_with_nag


def build(app: cdk.App, **props) -> DataPreparation:
    stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
    bucket = CheckpointBucket(stack, "Checkpoints")
    images = TrainingImageRepository(stack, "Images")
    props.setdefault("image_repository", images)
    return DataPreparation(
        stack, "Prepare", image_uri=images.image_uri("v1"), checkpoint_bucket=bucket, **props
    )


@pytest.fixture(scope="module")
def nagged():
    return synth_with_nag(lambda app: build(app, read_prefixes=("data/", "corpora/")))


def test_cdk_nag_finds_nothing_unacknowledged(nagged):
    assert nagged.violations == ()


def policy_statements(template: dict, role_fragment: str) -> list[dict]:
    found = []
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::IAM::Policy" and any(
            role_fragment in r["Ref"] for r in resource["Properties"]["Roles"]
        ):
            found += resource["Properties"]["PolicyDocument"]["Statement"]
    return found


def test_the_jobs_role_reads_the_prefixes_and_only_creates_shards(nagged):
    (template,) = nagged.templates.values()
    statements = {s.get("Sid"): s for s in policy_statements(template, "PrepareJobRole")}
    assert statements["ListDataPrefixes"]["Condition"] == {
        "StringLike": {"s3:prefix": ["data/*", "corpora/*", "data/prepared/*"]}
    }
    assert statements["WriteShards"]["Action"] == ["s3:PutObject", "s3:AbortMultipartUpload"]
    assert "data/prepared/*" in str(statements["WriteShards"]["Resource"])
    actions = {
        a
        for s in statements.values()
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert not {a for a in actions if "Delete" in a or a.endswith("*")}


def test_the_state_machine_runs_processing_jobs_and_passes_only_that_role(nagged):
    (template,) = nagged.templates.values()
    statements = policy_statements(template, "PrepareStateMachineRole")
    run = next(s for s in statements if s.get("Sid") == "RunProcessingJobs")
    assert "sagemaker:CreateProcessingJob" in run["Action"] and "processing-job/*" in str(run["Resource"])
    passing = next(s for s in statements if s["Action"] == "iam:PassRole")
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    assert "PrepareJobRole" in str(passing["Resource"])
    definition = str(
        next(r for r in template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine")
    )
    assert CREATE_PROCESSING_JOB_SYNC in definition and "ShardedByS3Key" in definition


@pytest.mark.parametrize(
    ("props", "said"),
    [
        ({"read_prefixes": ("data/prepared/raw/",)}, "lie inside output_prefix"),
        ({"read_prefixes": ("data",)}, "read_prefixes must be a key prefix ending in /"),
        (
            {"instance_types": ("ml.c5.18xlarge",), "default_instance_type": "ml.c7i.48xlarge"},
            "hold default_instance_type",
        ),
        ({"max_instance_count": 0}, "max_instance_count must be in [1, 100]"),
        ({"image_repository": None}, "give image_repository"),
        ({"max_runtime": cdk.Duration.days(6)}, "max_runtime must be 1 hour to 5 days"),
    ],
)
def test_impossible_combinations_are_refused_at_synth(props, said):
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("]", r"\]")):
        build(cdk.App(), **props)


def test_an_existing_role_is_accepted_and_grants_are_exposed():
    app = cdk.App()
    stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
    role = iam.Role(stack, "Mine", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    images = TrainingImageRepository(stack, "Images")
    prepare = DataPreparation(stack, "Prepare", image_uri=images.image_uri("v1"), bucket=CheckpointBucket(stack, "B").bucket,
                              role=role)  # fmt: skip
    assert prepare.role is role
    user = iam.Role(stack, "Operator", assumed_by=iam.AccountRootPrincipal())
    prepare.grant_start_execution(user)
    prepare.grant_read_prepared(user)
    text = str(cdk.assertions.Template.from_stack(stack).to_json())
    assert "states:StartExecution" in text and "data/prepared/*" in text


def test_the_default_template_bound_is_local_prepares():
    from constructs_lib.preparation import construct
    from training.prepare import chat_data

    assert construct.TEMPLATE_SECONDS == chat_data.TEMPLATE_SECONDS
