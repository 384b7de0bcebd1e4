"""The deploy-time build handlers against moto's CodeBuild: start, join, poll, fail with build id and log link.

moto's ``BatchGetBuilds`` always reports a build as SUCCEEDED; to see a build in progress or failed, the tests
wrap that one backend method and overwrite the status (and, for the join case, the build's environment, which
moto does not keep) on moto's own build records.
"""

from __future__ import annotations

import json
import time

import boto3
import pytest
from moto import mock_aws
from moto.codebuild.models import CodeBuildBackend

from constructs_lib.image.handlers import image_build as handler

REGION = "us-west-2"
PROJECT = "TrainingImageBuild"
REPOSITORY = "training"
TAG = "a" * 64
URI = f"123456789012.dkr.ecr.{REGION}.amazonaws.com/training:{TAG}"
LOG_LINK = "https://console.aws.amazon.com/cloudwatch/home?region=us-west-2#logEvent:group=g;stream=s"


@pytest.fixture
def codebuild(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        iam = boto3.client("iam")
        role = iam.create_role(
            RoleName="build",
            AssumeRolePolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "codebuild.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
        )["Role"]["Arn"]
        boto3.client("ecr").create_repository(repositoryName=REPOSITORY)
        client = boto3.client("codebuild")
        client.create_project(
            name=PROJECT,
            source={"type": "S3", "location": "bucket/source.zip"},
            artifacts={"type": "NO_ARTIFACTS"},
            environment={
                "type": "LINUX_CONTAINER",
                "image": "aws/codebuild/standard:7.0",
                "computeType": "BUILD_GENERAL1_LARGE",
                "privilegedMode": True,
            },
            serviceRole=role,
        )
        yield client


@pytest.fixture
def build_state(monkeypatch):
    """Per-build overrides applied to moto's records on every BatchGetBuilds: {build_id: {field: value}}."""
    overrides: dict[str, dict] = {}
    original = CodeBuildBackend.batch_get_builds

    def batch_get_builds(self, ids):
        builds = original(self, ids)
        for build in builds:
            for key, value in overrides.get(build["id"], {}).items():
                build[key] = value
        return builds

    monkeypatch.setattr(CodeBuildBackend, "batch_get_builds", batch_get_builds)
    return overrides


def _event(request: str, tag: str = TAG, old_tag: str | None = None, **extra) -> dict:
    props = {
        "ProjectName": PROJECT,
        "RepositoryName": REPOSITORY,
        "ImageTag": tag,
        "ImageUri": URI.replace(TAG, tag),
    }
    event = {"RequestType": request, "ResourceProperties": props, **extra}
    if old_tag is not None:
        event["OldResourceProperties"] = {**props, "ImageTag": old_tag}
        event["PhysicalResourceId"] = URI.replace(TAG, old_tag)
    return event


def test_create_starts_a_build_and_returns_its_id(codebuild):
    result = handler.on_event(_event("Create"), client=codebuild)
    assert result["PhysicalResourceId"] == URI
    build_id = result["Data"]["BuildId"]
    assert build_id.startswith(f"{PROJECT}:")
    assert codebuild.list_builds_for_project(projectName=PROJECT)["ids"] == [build_id]
    assert result["Data"]["ImageUri"] == URI and result["Data"]["ImageTag"] == TAG


def test_update_with_a_new_tag_starts_a_build(codebuild):
    result = handler.on_event(_event("Update", tag="b" * 64, old_tag=TAG), client=codebuild)
    assert "BuildId" in result["Data"]
    assert result["PhysicalResourceId"].endswith(":" + "b" * 64)
    assert len(codebuild.list_builds_for_project(projectName=PROJECT)["ids"]) == 1


def test_update_with_the_same_tag_starts_nothing(codebuild):
    result = handler.on_event(_event("Update", old_tag=TAG), client=codebuild)
    assert "BuildId" not in result["Data"]
    assert codebuild.list_builds_for_project(projectName=PROJECT)["ids"] == []
    assert handler.is_complete({**_event("Update", old_tag=TAG), **result}, client=codebuild) == {
        "IsComplete": True
    }


def _push(tag: str) -> None:
    manifest = json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
    )
    boto3.client("ecr").put_image(repositoryName=REPOSITORY, imageManifest=manifest, imageTag=tag)


def test_a_tag_already_in_the_repository_is_not_built_again(codebuild):
    _push(TAG)
    created = handler.on_event(_event("Create"), client=codebuild)
    # A rollback to an earlier training/ is an Update back to an existing tag: no build, nothing to fail.
    rolled_back = handler.on_event(_event("Update", old_tag="b" * 64), client=codebuild)
    for result in (created, rolled_back):
        assert "BuildId" not in result["Data"] and result["PhysicalResourceId"] == URI
        assert handler.is_complete({**_event("Create"), **result}, client=codebuild) == {"IsComplete": True}
    assert codebuild.list_builds_for_project(projectName=PROJECT)["ids"] == []
    # Another tag still builds.
    assert "BuildId" in handler.on_event(_event("Create", tag="c" * 64), client=codebuild)["Data"]


def test_delete_does_nothing(codebuild):
    result = handler.on_event(_event("Delete", PhysicalResourceId=URI), client=codebuild)
    assert result == {"PhysicalResourceId": URI}
    assert codebuild.list_builds_for_project(projectName=PROJECT)["ids"] == []
    assert handler.is_complete(_event("Delete", PhysicalResourceId=URI), client=codebuild)["IsComplete"]


def test_in_progress_then_succeeded(codebuild, build_state):
    started = handler.on_event(_event("Create"), client=codebuild)
    build_id = started["Data"]["BuildId"]
    event = {**_event("Create"), **started}
    build_state[build_id] = {"buildStatus": "IN_PROGRESS", "currentPhase": "BUILD"}
    assert handler.is_complete(event, client=codebuild) == {"IsComplete": False}
    del build_state[build_id]  # moto's own answer: SUCCEEDED
    assert handler.is_complete(event, client=codebuild) == {"IsComplete": True, "Data": {"BuildId": build_id}}


@pytest.mark.parametrize("status", ["FAILED", "FAULT", "TIMED_OUT", "STOPPED"])
def test_failed_build_fails_with_build_id_and_log_link(codebuild, build_state, status):
    started = handler.on_event(_event("Create"), client=codebuild)
    build_id = started["Data"]["BuildId"]
    build_state[build_id] = {
        "buildStatus": status,
        "logs": {"deepLink": LOG_LINK},
        "phases": [
            {"phaseType": "PRE_BUILD", "phaseStatus": "SUCCEEDED"},
            {
                "phaseType": "BUILD",
                "phaseStatus": "FAILED",
                "contexts": [{"statusCode": "COMMAND_EXECUTION_ERROR", "message": "exit status 1"}],
            },
        ],
    }
    with pytest.raises(handler.ImageBuildError) as failure:
        handler.is_complete({**_event("Create"), **started}, client=codebuild)
    message = str(failure.value)
    assert build_id in message and LOG_LINK in message and status in message
    assert "in phase BUILD: exit status 1" in message
    assert f"aws codebuild start-build --project-name {PROJECT}" in message


def test_a_running_build_of_the_same_tag_is_joined_not_duplicated(codebuild, build_state):
    first = codebuild.start_build(projectName=PROJECT)["build"]["id"]
    build_state[first] = {
        "buildStatus": "IN_PROGRESS",
        "environment": {"environmentVariables": [{"name": "IMAGE_TAG", "value": TAG, "type": "PLAINTEXT"}]},
    }
    result = handler.on_event(_event("Create"), client=codebuild)
    assert result["Data"]["BuildId"] == first
    assert codebuild.list_builds_for_project(projectName=PROJECT)["ids"] == [first]
    # A running build of another tag is not joined.
    other = handler.on_event(_event("Create", tag="c" * 64), client=codebuild)
    assert other["Data"]["BuildId"] != first


def test_waiting_gives_up_with_a_clear_message_before_the_provider_does(codebuild, build_state, monkeypatch):
    started = handler.on_event(_event("Create"), client=codebuild)
    build_id = started["Data"]["BuildId"]
    build_state[build_id] = {
        "buildStatus": "IN_PROGRESS",
        "currentPhase": "BUILD",
        "logs": {"deepLink": LOG_LINK},
    }
    monkeypatch.setenv("WAIT_TIMEOUT_SECONDS", "3600")
    event = {**_event("Create"), **started}
    assert handler.is_complete(event, client=codebuild) == {"IsComplete": False}
    event["Data"]["StartedAt"] = str(int(time.time()) - 3600 + handler.TIMEOUT_MARGIN_SECONDS - 5)
    with pytest.raises(handler.ImageBuildError, match="Stopped waiting for image build") as failure:
        handler.is_complete(event, client=codebuild)
    assert build_id in str(failure.value) and LOG_LINK in str(failure.value)


def test_the_handler_module_imports_only_the_standard_library_and_boto3():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(handler.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert imported <= {"__future__", "os", "time", "typing", "boto3"}
