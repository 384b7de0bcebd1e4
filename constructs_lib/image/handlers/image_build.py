"""Custom-resource handlers that build the training image at deploy time and wait for the build.

Used by ``TrainingImageBuild`` (``constructs_lib.image.deploy_time``) through the CDK ``Provider`` framework:

* ``on_event`` starts a CodeBuild build on Create, and on Update when the image tag (the content hash of
  ``training/``) changed. An unchanged tag starts nothing, and neither does a tag already in the repository
  (so a rollback to an earlier ``training/`` never builds, and cannot fail on a build). Delete does nothing:
  images are retained.
  When a build of the same tag is already running (a previous deployment gave up waiting), it waits for that
  build instead of starting a second one.
* ``is_complete`` polls ``BatchGetBuilds``; a failed, stopped or timed-out build raises an error naming the build
  and its CloudWatch log deep link, which fails the deployment with that message.

Resource properties: ``ProjectName``, ``RepositoryName``, ``ImageTag``, ``ImageUri``. Environment of the isComplete function:
``WAIT_TIMEOUT_SECONDS`` (give up with a clear message shortly before the Provider's own total timeout).

Standard library and boto3 only; the Lambda runtime imports this file as the top-level module ``image_build``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import boto3

IMAGE_TAG_ENV = "IMAGE_TAG"
"""The build's environment variable holding the tag (also set on the project; overridden per build here)."""
RUNNING = frozenset({"IN_PROGRESS"})
SUCCEEDED = "SUCCEEDED"
RECENT_BUILDS = 20
"""How many of the project's newest builds are searched for a running build of the same tag."""
TIMEOUT_MARGIN_SECONDS = 90
"""Give up this long before ``WAIT_TIMEOUT_SECONDS`` so our message, not the Provider's, reaches CloudFormation."""


class ImageBuildError(RuntimeError):
    """The image build failed, or the deployment stopped waiting for it."""


def _codebuild(client: Any = None) -> Any:
    return client if client is not None else boto3.client("codebuild")


def image_exists(ecr: Any, repository: str, tag: str) -> bool:
    """Whether ``repository`` holds an image tagged ``tag``."""
    try:
        ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])
    except ecr.exceptions.ImageNotFoundException:
        return False
    return True


def on_event(
    event: dict[str, Any], context: Any = None, client: Any = None, ecr_client: Any = None
) -> dict[str, Any]:
    """Provider onEvent: start (or join) the build when the image tag is new."""
    request = event["RequestType"]
    props = event["ResourceProperties"]
    project, tag, uri = props["ProjectName"], props["ImageTag"], props["ImageUri"]
    result: dict[str, Any] = {"PhysicalResourceId": uri, "Data": {"ImageUri": uri, "ImageTag": tag}}
    if request == "Delete":
        print(f"Delete {event.get('PhysicalResourceId')}: nothing to do (images are retained)")
        return {"PhysicalResourceId": event.get("PhysicalResourceId", uri)}
    if request == "Update" and event.get("OldResourceProperties", {}).get("ImageTag") == tag:
        print(f"Update with unchanged image tag {tag}: no build")
        return result
    if request not in ("Create", "Update"):
        raise ImageBuildError(f"unknown RequestType {request!r}")

    ecr = ecr_client if ecr_client is not None else boto3.client("ecr")
    if image_exists(ecr, props["RepositoryName"], tag):
        print(f"{uri} already exists: no build")
        return result
    codebuild = _codebuild(client)
    build_id = running_build_for(codebuild, project, tag)
    if build_id:
        print(f"Build {build_id} of {tag} is already running: waiting for it")
    else:
        build = codebuild.start_build(
            projectName=project,
            environmentVariablesOverride=[{"name": IMAGE_TAG_ENV, "value": tag, "type": "PLAINTEXT"}],
        )["build"]
        build_id = build["id"]
        print(f"Started build {build_id} of {uri}")
    result["Data"]["BuildId"] = build_id
    result["Data"]["StartedAt"] = str(int(time.time()))
    return result


def running_build_for(codebuild: Any, project: str, tag: str) -> str | None:
    """The id of a running build of ``project`` for image ``tag``, if one of the newest builds is one."""
    ids = codebuild.list_builds_for_project(projectName=project, sortOrder="DESCENDING").get("ids", [])
    if not ids:
        return None
    for build in codebuild.batch_get_builds(ids=ids[:RECENT_BUILDS]).get("builds", []):
        if build.get("buildStatus") not in RUNNING:
            continue
        variables = build.get("environment", {}).get("environmentVariables", [])
        if any(v.get("name") == IMAGE_TAG_ENV and v.get("value") == tag for v in variables):
            return str(build["id"])
    return None


def is_complete(event: dict[str, Any], context: Any = None, client: Any = None) -> dict[str, Any]:
    """Provider isComplete: done when the build succeeded; raise when it failed (or waiting ran out)."""
    data = event.get("Data") or {}
    build_id = data.get("BuildId")
    if event["RequestType"] == "Delete" or not build_id:
        return {"IsComplete": True}
    builds = _codebuild(client).batch_get_builds(ids=[build_id]).get("builds", [])
    if not builds:
        raise ImageBuildError(f"Image build {build_id} not found")
    build = builds[0]
    status = build.get("buildStatus", "UNKNOWN")
    link = build.get("logs", {}).get("deepLink", "(no log link)")
    if status == SUCCEEDED:
        print(f"Build {build_id} succeeded: {data.get('ImageUri')}")
        return {"IsComplete": True, "Data": {"BuildId": build_id}}
    if status in RUNNING:
        _check_deadline(data, build_id, build.get("currentPhase", "?"), link)
        print(f"Build {build_id}: {status} in phase {build.get('currentPhase', '?')}")
        return {"IsComplete": False}
    raise ImageBuildError(
        f"Image build {build_id} {status}{_failed_phase(build)}. Logs: {link} "
        f"(fix training/ and deploy again; retry by hand: aws codebuild start-build "
        f"--project-name {build.get('projectName', '<project>')})"
    )


def _failed_phase(build: dict[str, Any]) -> str:
    for phase in build.get("phases", []):
        if phase.get("phaseStatus") not in (None, SUCCEEDED):
            messages = "; ".join(c.get("message", "") for c in phase.get("contexts", []) if c.get("message"))
            return f" in phase {phase.get('phaseType')}" + (f": {messages}" if messages else "")
    return ""


def _check_deadline(data: dict[str, Any], build_id: str, phase: str, link: str) -> None:
    limit = int(os.environ.get("WAIT_TIMEOUT_SECONDS", "0"))
    started = int(data.get("StartedAt", "0"))
    if limit and started and time.time() - started > limit - TIMEOUT_MARGIN_SECONDS:
        raise ImageBuildError(
            f"Stopped waiting for image build {build_id} after {limit // 60} min (still in phase {phase}); "
            f"the build goes on. Logs: {link}. Deploy again once it has finished: the image is then "
            "found and not built again (or the new deployment waits for the running build)."
        )
