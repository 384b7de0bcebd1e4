"""TrainingImageBuild: CodeBuild project, buildspec (run for real against fake aws/docker), deploy-time custom
resource, IAM scope, content-hash tags, validation, cdk-nag, and its wiring into the stack."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import aws_cdk as cdk
import pytest
import yaml
from aws_cdk import assertions
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs

from constructs_lib.config import StackSettings
from constructs_lib.image.build import DEFAULT_BASE_IMAGE_TAG, TRAINING_DIR, TrainingImageBuild
from constructs_lib.image.buildspec import buildspec
from constructs_lib.image.repository import CACHE_TAG, TrainingImageRepository
from tests.cdk_helpers import DEFAULT_ENV, as_list, statements, synth_with_nag, template_of

Match = assertions.Match


class Built:
    def __init__(self) -> None:
        self.build: TrainingImageBuild | None = None
        self.stack: cdk.Stack | None = None


@pytest.fixture(scope="module")
def default_synth():
    """One synthesis with cdk-nag, shared: (NagResult, Template, construct, stack)."""
    built = Built()

    def build(app: cdk.App) -> None:
        stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
        repo = TrainingImageRepository(stack, "Images")
        built.stack = stack
        built.build = TrainingImageBuild(stack, "ImageBuild", image_repository=repo)

    result = synth_with_nag(build)
    template = assertions.Template.from_json(result.templates["Test.template.json"])
    return result, template, built.build, built.stack


@pytest.fixture(scope="module")
def template(default_synth) -> assertions.Template:
    return default_synth[1]


@pytest.fixture(scope="module")
def construct(default_synth) -> TrainingImageBuild:
    return default_synth[2]


def _project(template) -> dict:
    ((_, project),) = template.find_resources("AWS::CodeBuild::Project").items()
    return project["Properties"]


def _env(template) -> dict:
    return {v["Name"]: v["Value"] for v in _project(template)["Environment"]["EnvironmentVariables"]}


def _logical_id(template, resource_type: str, predicate=lambda props: True) -> str:
    found = [
        k for k, v in template.find_resources(resource_type).items() if predicate(v.get("Properties", {}))
    ]
    assert len(found) == 1, found
    return found[0]


# ---- cdk-nag ---------------------------------------------------------------------------------------------------
def test_default_props_synthesize_with_no_unacknowledged_finding(default_synth):
    assert default_synth[0].violations == ()


# ---- the project -----------------------------------------------------------------------------------------------
def test_project_is_privileged_large_standard_and_times_out_after_two_hours(template):
    props = _project(template)
    assert props["Environment"]["PrivilegedMode"] is True
    assert props["Environment"]["ComputeType"] == "BUILD_GENERAL1_LARGE"
    assert props["Environment"]["Image"] == "aws/codebuild/standard:7.0"
    assert props["TimeoutInMinutes"] == 120
    assert props["Source"]["Type"] == "S3"


def test_environment_names_base_image_repository_and_content_tag(template, construct):
    env = _env(template)
    assert env["BASE_IMAGE_ACCOUNT"] == "763104351884"
    assert env["BASE_IMAGE_REGION"] == "us-west-2"
    assert env["BASE_IMAGE_DOMAIN"] == {"Ref": "AWS::URLSuffix"}
    assert env["BASE_IMAGE_TAG"] == DEFAULT_BASE_IMAGE_TAG
    assert env["IMAGE_TAG"] == construct.image_tag == construct.source_asset.asset_hash
    assert env["CACHE_TAG"] == CACHE_TAG
    repo = _logical_id(template, "AWS::ECR::Repository")
    assert env["REPOSITORY_NAME"] == {"Ref": repo}
    assert {"Ref": repo} in env["REPOSITORY_URI"]["Fn::Join"][1]


def test_source_is_the_training_asset(template, construct):
    location = json.dumps(_project(template)["Source"]["Location"])
    assert f"{construct.image_tag}.zip" in location


def test_logs_are_retained_and_encrypted_with_a_rotating_customer_key(template):
    key = _logical_id(template, "AWS::KMS::Key")
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    props = _project(template)
    assert props["EncryptionKey"] == {"Fn::GetAtt": [key, "Arn"]}
    log_group = props["LogsConfig"]["CloudWatchLogs"]["GroupName"]["Ref"]
    group = template.to_json()["Resources"][log_group]["Properties"]
    assert group["RetentionInDays"] == 90
    assert group["KmsKeyId"] == {"Fn::GetAtt": [key, "Arn"]}
    # Every log group (build and handlers) has a retention and the key.
    for resource in template.find_resources("AWS::Logs::LogGroup").values():
        assert resource["Properties"]["RetentionInDays"] == 90
        assert resource["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [key, "Arn"]}
    # CloudWatch Logs may use the key, for this account's log groups only.
    template.has_resource_properties(
        "AWS::KMS::Key",
        {
            "KeyPolicy": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Sid": "CloudWatchLogsInThisAccount",
                                "Principal": {
                                    "Service": {
                                        "Fn::Join": ["", ["logs.us-west-2.", {"Ref": "AWS::URLSuffix"}]]
                                    }
                                },
                                "Condition": {"ArnLike": Match.any_value()},
                            }
                        )
                    ]
                )
            }
        },
    )


# ---- the buildspec ---------------------------------------------------------------------------------------------
def test_buildspec_renders_to_yaml_equal_to_the_python_dict(template):
    rendered = yaml.safe_load(_project(template)["Source"]["BuildSpec"])
    assert rendered == buildspec()
    assert yaml.safe_load(yaml.safe_dump(buildspec())) == buildspec()
    assert all(phase["on-failure"] == "ABORT" for phase in rendered["phases"].values())


def test_buildspec_commands_run_in_order():
    commands = [
        c for phase in ("pre_build", "build", "post_build") for c in buildspec()["phases"][phase]["commands"]
    ]
    text = "\n".join(commands)

    def at(fragment: str) -> int:
        assert fragment in text, fragment
        return text.index(fragment)

    assert (
        at('docker login --username AWS --password-stdin "$BASE_IMAGE_ACCOUNT')
        < at('--password-stdin "${REPOSITORY_URI%%/*}"')
        < at("aws ecr describe-images")
        < at("docker buildx build")
        < at("--query 'imageDetails[0].imageDigest'")
    )
    build = next(c for c in commands if "buildx build" in c)
    # Docker's own BuildKit (no builder container, so no builder image from any registry), the layer cache
    # inline in the image and read back from the last one.
    assert "docker buildx create" not in text and "--builder default" in build
    assert '--cache-from "type=registry,ref=$REPOSITORY_URI:$CACHE_TAG"' in build
    assert "--cache-to type=inline" in build
    assert '--tag "$REPOSITORY_URI:$IMAGE_TAG" --tag "$REPOSITORY_URI:$CACHE_TAG" --push .' in build
    assert (
        "--provenance false" in build
    )  # a plain image manifest: SageMaker does not take attestation indexes


FAKE_AWS = """#!/bin/sh
echo "aws $*" >> "$FAKE_LOG"
case "$*" in
  "ecr get-login-password"*) echo secret-token ;;
  "ecr describe-images"*)
    if [ "$FAKE_IMAGE_EXISTS" = 1 ] || [ -f "$FAKE_STATE/pushed" ]; then echo sha256:abc; exit 0; fi
    echo "ImageNotFoundException" >&2; exit 254 ;;
esac
"""
FAKE_DOCKER = """#!/bin/sh
case "$*" in
  login*) echo "docker $* password=$(cat)" >> "$FAKE_LOG" ;;
  *) echo "docker $*" >> "$FAKE_LOG" ;;
esac
case "$*" in
  "buildx build"*)
    [ "$FAKE_BUILD_FAILS" = 1 ] && exit 1
    case "$*" in *--push*) touch "$FAKE_STATE/pushed" ;; esac ;;
esac
exit 0
"""


def _run_buildspec(tmp_path: Path, *, exists: bool, build_fails: bool = False) -> tuple[int, list[str], Path]:
    """Run the rendered pre_build, build and post_build commands with sh (one shell, like CodeBuild 0.2),
    stopping at the first failure (on-failure: ABORT), against fake aws/docker that log their arguments."""
    bin_dir, state, src = tmp_path / "bin", tmp_path / "state", tmp_path / "src"
    for folder in (bin_dir, state, src):
        folder.mkdir()
    for name, body in (("aws", FAKE_AWS), ("docker", FAKE_DOCKER)):
        path = bin_dir / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    log.touch()
    spec = buildspec()
    script = "set -e\n" + "\n".join(
        command
        for phase in ("pre_build", "build", "post_build")
        for command in spec["phases"][phase]["commands"]
    )
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "FAKE_STATE": str(state),
        "FAKE_IMAGE_EXISTS": "1" if exists else "0",
        "FAKE_BUILD_FAILS": "1" if build_fails else "0",
        "CODEBUILD_SRC_DIR": str(src),
        "BASE_IMAGE_ACCOUNT": "763104351884",
        "BASE_IMAGE_REGION": "us-west-2",
        "BASE_IMAGE_DOMAIN": "amazonaws.com",
        "BASE_IMAGE_TAG": DEFAULT_BASE_IMAGE_TAG,
        "REPOSITORY_URI": "123456789012.dkr.ecr.us-west-2.amazonaws.com/training",
        "REPOSITORY_NAME": "training",
        "IMAGE_TAG": "f" * 64,
        "CACHE_TAG": CACHE_TAG,
    }
    done = subprocess.run(["sh", "-c", script], cwd=src, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, log.read_text().splitlines(), src


def test_build_branch_logs_in_builds_with_the_registry_cache_and_pushes(tmp_path):
    code, calls, src = _run_buildspec(tmp_path, exists=False)
    assert code == 0, calls
    logins = [c for c in calls if c.startswith("docker login")]
    assert logins == [
        "docker login --username AWS --password-stdin 763104351884.dkr.ecr.us-west-2.amazonaws.com "
        "password=secret-token",
        "docker login --username AWS --password-stdin 123456789012.dkr.ecr.us-west-2.amazonaws.com "
        "password=secret-token",
    ]
    uri = "123456789012.dkr.ecr.us-west-2.amazonaws.com/training"
    build = next(c for c in calls if c.startswith("docker buildx build"))
    assert "--builder default" in build
    assert "--build-arg BASE_ACCOUNT=763104351884 --build-arg BASE_REGION=us-west-2" in build
    assert "--build-arg BASE_DOMAIN=amazonaws.com" in build
    assert f"--build-arg BASE_TAG={DEFAULT_BASE_IMAGE_TAG}" in build
    assert f"--cache-from type=registry,ref={uri}:{CACHE_TAG}" in build
    assert "--cache-to type=inline" in build
    assert build.endswith(f"--tag {uri}:{'f' * 64} --tag {uri}:{CACHE_TAG} --push .")
    assert not [c for c in calls if c.startswith("docker buildx create") or c.startswith("docker pull")]
    kinds = [c.split()[0] + " " + c.split()[1] for c in calls]
    assert kinds.index("docker buildx") < len(kinds) - 1 and calls[-1].startswith("aws ecr describe-images")
    assert not (src / ".image-exists").exists()


def test_skip_branch_builds_nothing_when_the_tag_exists(tmp_path):
    code, calls, src = _run_buildspec(tmp_path, exists=True)
    assert code == 0, calls
    assert [
        c for c in calls if c.startswith("docker buildx build") or c.startswith("docker buildx create")
    ] == []
    assert sum(c.startswith("aws ecr describe-images") for c in calls) == 2  # the check, and post_build's
    assert (src / ".image-exists").exists()


def test_a_failing_docker_build_fails_the_build_before_post_build(tmp_path):
    code, calls, _ = _run_buildspec(tmp_path, exists=False, build_fails=True)
    assert code != 0
    assert calls[-1].startswith("docker buildx build")


# ---- the deploy-time build -------------------------------------------------------------------------------------
def test_custom_resource_carries_the_content_tag_and_waits_through_the_provider(template, construct):
    ((_, resource),) = template.find_resources("Custom::TrainingImage").items()
    props = resource["Properties"]
    assert props["ImageTag"] == construct.image_tag
    assert props["ProjectName"] == {"Ref": _logical_id(template, "AWS::CodeBuild::Project")}
    assert props["RepositoryName"] == {"Ref": _logical_id(template, "AWS::ECR::Repository")}
    assert props["ImageUri"]["Fn::Join"][1][-1] == f":{construct.image_tag}"
    on_event = props["ServiceToken"]["Fn::GetAtt"][0]
    assert "frameworkonEvent" in on_event
    # The exposed URI is the custom resource's attribute, so consumers wait for the build.
    stack = cdk.Stack.of(construct)
    assert stack.resolve(construct.image_uri)["Fn::GetAtt"][1] == "ImageUri"


def test_handlers_run_on_the_latest_python_with_their_own_log_group(template):
    functions = template.find_resources("AWS::Lambda::Function", {"Properties": {"Runtime": "python3.14"}})
    handlers = sorted(f["Properties"]["Handler"] for f in functions.values())
    assert handlers == ["image_build.is_complete", "image_build.on_event"]
    for function in functions.values():
        assert "LoggingConfig" in function["Properties"]
    waiter = [f for f in functions.values() if f["Properties"]["Handler"] == "image_build.is_complete"][0]
    assert waiter["Properties"]["Environment"]["Variables"]["WAIT_TIMEOUT_SECONDS"] == "3600"


def test_no_aws_managed_policy_is_attached(template):
    for role in template.find_resources("AWS::IAM::Role").values():
        assert "ManagedPolicyArns" not in role["Properties"]


# ---- IAM -------------------------------------------------------------------------------------------------------
def _statements_with(template, action: str) -> list[dict]:
    return [s for s in statements(template) if action in as_list(s["Action"])]


def _join(*parts) -> dict:
    return {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, *parts]]}


def _project_role_policies(template) -> tuple[str, list[dict]]:
    """The project's role (logical ID) and every policy resource that attaches to it."""
    role = _project(template)["ServiceRole"]["Fn::GetAtt"][0]
    policies = [
        policy
        for policy in template.find_resources("AWS::IAM::Policy").values()
        if {"Ref": role} in policy["Properties"]["Roles"]
    ]
    return role, policies


def test_project_role_is_ours_with_exactly_the_build_permissions(template, construct):
    role, policies = _project_role_policies(template)
    stack = cdk.Stack.of(construct)
    assert role == stack.resolve(construct.role.node.default_child.logical_id)
    properties = template.to_json()["Resources"][role]["Properties"]
    # Only CodeBuild projects of this account and region may assume it (confused-deputy guard).
    assert properties["AssumeRolePolicyDocument"]["Statement"] == [
        {
            "Action": "sts:AssumeRole",
            "Effect": "Allow",
            "Principal": {"Service": "codebuild.amazonaws.com"},
            "Condition": {
                "StringEquals": {"aws:SourceAccount": "123456789012"},
                "ArnLike": {
                    "aws:SourceArn": {
                        "Fn::Join": [
                            "",
                            [
                                "arn:",
                                {"Ref": "AWS::Partition"},
                                ":codebuild:us-west-2:123456789012:project/*",
                            ],
                        ]
                    }
                },
            },
        }
    ]
    assert "Policies" not in properties and "ManagedPolicyArns" not in properties
    # One policy, ours: CDK's automatic grants (DefaultPolicy) are gone.
    (policy,) = policies
    assert policy["Properties"]["PolicyName"].startswith("ImageBuildBuildPermissions")
    repo = _logical_id(template, "AWS::ECR::Repository")
    key = _logical_id(template, "AWS::KMS::Key")
    log_group = _project(template)["LogsConfig"]["CloudWatchLogs"]["GroupName"]["Ref"]
    bucket = ":s3:::cdk-hnb659fds-assets-123456789012-us-west-2"
    by_sid = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert list(by_sid) == [
        "ReadTheSourceZip",
        "CheckTheSourceBucket",
        "WriteTheBuildLogs",
        "UseTheBuildKey",
        "LogInToTheRegistries",
        "PullTheDeepLearningContainer",
        "PullAndPushTheTrainingImage",
    ]
    expected = {
        "ReadTheSourceZip": (
            ["s3:GetObject", "s3:GetObjectVersion"],
            _join(f"{bucket}/{construct.image_tag}.zip"),
        ),
        "CheckTheSourceBucket": (["s3:GetBucketAcl", "s3:GetBucketLocation"], _join(bucket)),
        "WriteTheBuildLogs": (
            ["logs:CreateLogStream", "logs:PutLogEvents"],
            {"Fn::GetAtt": [log_group, "Arn"]},  # <group ARN>:*, i.e. its streams; the group already exists
        ),
        "UseTheBuildKey": (
            ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
            {"Fn::GetAtt": [key, "Arn"]},
        ),
        "LogInToTheRegistries": ("ecr:GetAuthorizationToken", "*"),
        "PullTheDeepLearningContainer": (
            ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            _join(":ecr:us-west-2:763104351884:repository/pytorch-training"),
        ),
        "PullAndPushTheTrainingImage": (
            [
                "ecr:BatchGetImage",
                "ecr:GetDownloadUrlForLayer",
                "ecr:BatchCheckLayerAvailability",
                "ecr:InitiateLayerUpload",
                "ecr:UploadLayerPart",
                "ecr:CompleteLayerUpload",
                "ecr:PutImage",
                "ecr:DescribeImages",
            ],
            {"Fn::GetAtt": [repo, "Arn"]},
        ),
    }
    for sid, (actions, resource) in expected.items():
        assert by_sid[sid] == {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resource}, sid


def test_no_default_log_group_no_reports_no_automatic_grants(template):
    _, policies = _project_role_policies(template)
    text = json.dumps(policies)
    assert "/aws/codebuild/" not in text  # the build logs only to its own log group
    assert "codebuild:" not in text  # no report groups
    assert "s3:List" not in text and "s3:GetObject*" not in text
    assert "ec2:" not in text  # no VPC


def test_the_build_key_policy_gains_nothing_from_the_project(template):
    ((_, key),) = template.find_resources("AWS::KMS::Key").items()
    document = key["Properties"]["KeyPolicy"]["Statement"]
    # CDK's account-root statement and the CloudWatch Logs statement; no grant to the build role lands here.
    assert [s.get("Sid") for s in document] == [None, "CloudWatchLogsInThisAccount"]
    assert document[0]["Principal"] == {"AWS": _join(":iam::123456789012:root")}
    assert document[1]["Action"] == [
        "kms:Encrypt",
        "kms:Decrypt",
        "kms:ReEncryptFrom",
        "kms:ReEncryptTo",
        "kms:GenerateDataKey",
        "kms:GenerateDataKeyWithoutPlaintext",
        "kms:DescribeKey",
    ]


def test_the_build_starts_only_after_its_permissions_exist(template):
    ((_, resource),) = template.find_resources("Custom::TrainingImage").items()
    ((policy, _),) = [
        (k, v)
        for k, v in template.find_resources("AWS::IAM::Policy").items()
        if k.startswith("ImageBuildBuildPermissions")
    ]
    assert policy in resource["DependsOn"]


def test_pull_only_from_the_dlc_repository_of_the_region(template):
    pulls = _statements_with(template, "ecr:BatchGetImage")
    assert sorted(s["Sid"] for s in pulls) == ["PullAndPushTheTrainingImage", "PullTheDeepLearningContainer"]
    (pull,) = [s for s in pulls if s["Sid"] == "PullTheDeepLearningContainer"]
    assert pull["Resource"] == _join(":ecr:us-west-2:763104351884:repository/pytorch-training")


def test_push_only_to_our_repository(template):
    repo = _logical_id(template, "AWS::ECR::Repository")
    for action in (
        "ecr:PutImage",
        "ecr:InitiateLayerUpload",
        "ecr:UploadLayerPart",
        "ecr:CompleteLayerUpload",
        "ecr:DescribeImages",
    ):
        found = _statements_with(template, action)
        assert found and all(s["Resource"] == {"Fn::GetAtt": [repo, "Arn"]} for s in found), action


def test_handlers_may_only_start_and_watch_builds_of_the_one_project(template):
    project = _logical_id(template, "AWS::CodeBuild::Project")
    (start,) = _statements_with(template, "codebuild:StartBuild")
    assert sorted(as_list(start["Action"])) == [
        "codebuild:BatchGetBuilds",
        "codebuild:ListBuildsForProject",
        "codebuild:StartBuild",
    ]
    assert start["Resource"] == {"Fn::GetAtt": [project, "Arn"]}


def test_no_action_contains_a_star_anywhere(template):
    for statement in statements(template):
        for action in as_list(statement["Action"]):
            assert "*" not in action, statement
    # Key policies too, except CDK's account-root statement (kms:* for the account, which IAM then limits).
    for key in template.find_resources("AWS::KMS::Key").values():
        for statement in key["Properties"]["KeyPolicy"]["Statement"]:
            if statement["Principal"] == {"AWS": _join(":iam::123456789012:root")}:
                continue
            assert all("*" not in action for action in as_list(statement["Action"])), statement
    # The one Resource '*': ecr:GetAuthorizationToken, alone in its statement.
    starred = [s for s in statements(template) if "*" in as_list(s["Resource"])]
    assert [as_list(s["Action"]) for s in starred] == [["ecr:GetAuthorizationToken"]]


def _role_statements(template, predicate) -> dict[str, dict]:
    (policy,) = [
        v
        for k, v in template.find_resources("AWS::IAM::Policy").items()
        if k.startswith("BuildBuildPermissions") and predicate(v)
    ]
    return {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


def test_a_repository_key_of_its_own_gets_explicit_actions():
    from aws_cdk import aws_kms as kms

    def build(stack):
        repository_key = kms.Key(stack, "RepoKey", enable_key_rotation=True)
        repo = TrainingImageRepository(stack, "Images", encryption_key=repository_key)
        TrainingImageBuild(stack, "Build", image_repository=repo)

    template = template_of(build)
    by_sid = _role_statements(template, lambda _: True)
    repository_key = _logical_id(template, "AWS::KMS::Key", lambda p: "Description" not in p)
    assert by_sid["UseTheRepositoryKey"] == {
        "Sid": "UseTheRepositoryKey",
        "Effect": "Allow",
        "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
        "Resource": {"Fn::GetAtt": [repository_key, "Arn"]},
    }
    assert by_sid["UseTheBuildKey"]["Resource"]["Fn::GetAtt"][0] != repository_key
    for statement in statements(template):
        assert all("*" not in action for action in as_list(statement["Action"])), statement


def test_one_key_for_repository_and_build_is_granted_once():
    from aws_cdk import aws_kms as kms

    def build(stack):
        key = kms.Key(stack, "DataKey", enable_key_rotation=True)
        repo = TrainingImageRepository(stack, "Images", encryption_key=key)
        TrainingImageBuild(stack, "Build", image_repository=repo, encryption_key=key)

    template = template_of(build)
    by_sid = _role_statements(template, lambda _: True)
    assert "UseTheRepositoryKey" not in by_sid
    assert by_sid["UseTheBuildKey"]["Resource"] == {
        "Fn::GetAtt": [_logical_id(template, "AWS::KMS::Key"), "Arn"]
    }


def test_imported_log_group_and_key_are_granted_by_arn():
    from aws_cdk import aws_kms as kms

    def build(stack):
        TrainingImageBuild(
            stack,
            "Build",
            image_repository=TrainingImageRepository(stack, "Images"),
            encryption_key=kms.Key.from_key_arn(
                stack, "Key", "arn:aws:kms:us-west-2:123456789012:key/11111111-2222-3333-4444-555555555555"
            ),
            log_group=logs.LogGroup.from_log_group_name(stack, "Logs", "/training/image-build"),
        )

    by_sid = _role_statements(template_of(build), lambda _: True)
    assert by_sid["UseTheBuildKey"]["Resource"] == (
        "arn:aws:kms:us-west-2:123456789012:key/11111111-2222-3333-4444-555555555555"
    )
    assert by_sid["WriteTheBuildLogs"]["Resource"] == _join(
        ":logs:us-west-2:123456789012:log-group:/training/image-build:*"
    )


# ---- content-hash tags (no synthesis needed: the asset hash is computed when the construct is built) ----------
def _tag_of(source: Path) -> str:
    stack = cdk.Stack(cdk.App(), "Tags", env=DEFAULT_ENV)
    repo = TrainingImageRepository(stack, "Images")
    return TrainingImageBuild(stack, "Build", image_repository=repo, source_directory=source).image_tag


def test_tag_follows_the_content_of_training(tmp_path):
    copy = tmp_path / "training"
    shutil.copytree(TRAINING_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    first = _tag_of(copy)
    assert _tag_of(copy) == first  # same content, same tag
    (copy / "trainer" / "__pycache__").mkdir(exist_ok=True)
    (copy / "trainer" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"cache")
    assert _tag_of(copy) == first  # caches are excluded
    bench = copy / "measure" / "benchmark.py"
    bench.write_text(bench.read_text() + "\n# changed\n")
    assert _tag_of(copy) == first  # development measurements are not in the image
    loop = copy / "trainer" / "loop.py"
    loop.write_text(loop.read_text() + "\n# changed\n")
    changed = _tag_of(copy)
    assert changed != first
    assert len(changed) == 64 and changed.isalnum()


# ---- props -----------------------------------------------------------------------------------------------------
def test_props_reach_the_template():
    def build(stack):
        repo = TrainingImageRepository(stack, "Images")
        TrainingImageBuild(
            stack,
            "Build",
            image_repository=repo,
            base_image_account="626614931356",
            base_image_tag="2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker-v1.2",
            build_image=codebuild.LinuxBuildImage.STANDARD_8_0,
            compute_type=codebuild.ComputeType.X2_LARGE,
            build_timeout_minutes=300,
            wait_timeout_minutes=45,
            log_retention=logs.RetentionDays.ONE_WEEK,
            vpc=ec2.Vpc.from_vpc_attributes(
                stack,
                "Vpc",
                vpc_id="vpc-0123456789abcdef0",
                availability_zones=["af-south-1a"],
                private_subnet_ids=["subnet-0123456789abcdef0"],
            ),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )

    template = template_of(build, env=cdk.Environment(account="123456789012", region="af-south-1"))
    props = _project(template)
    env = _env(template)
    assert props["Environment"]["ComputeType"] == "BUILD_GENERAL1_2XLARGE"
    assert props["Environment"]["Image"] == "aws/codebuild/standard:8.0"
    assert props["TimeoutInMinutes"] == 300
    assert env["BASE_IMAGE_ACCOUNT"] == "626614931356" and env["BASE_IMAGE_REGION"] == "af-south-1"
    assert env["BASE_IMAGE_TAG"].endswith("-v1.2")
    assert "BUILDKIT_IMAGE" not in env
    # In the VPC: the project and every function (ours and the Provider framework's), one security group.
    assert props["VpcConfig"]["Subnets"] == ["subnet-0123456789abcdef0"]
    functions = template.find_resources("AWS::Lambda::Function")
    assert len(functions) == 5
    assert all(
        f["Properties"]["VpcConfig"]["SubnetIds"] == ["subnet-0123456789abcdef0"] for f in functions.values()
    )
    (attach,) = [s for s in statements(template) if s.get("Sid") == "AttachTheBuildToItsSubnets"]
    assert attach["Condition"]["StringEquals"] == {"ec2:AuthorizedService": "codebuild.amazonaws.com"}
    assert "subnet/subnet-0123456789abcdef0" in json.dumps(attach["Condition"]["ArnEquals"])
    # removal_policy reaches the key and every log group.
    for resource_type in ("AWS::KMS::Key", "AWS::Logs::LogGroup"):
        assert {r["DeletionPolicy"] for r in template.find_resources(resource_type).values()} == {"Delete"}
    template.all_resources_properties("AWS::Logs::LogGroup", {"RetentionInDays": 7})
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {"Environment": {"Variables": {"WAIT_TIMEOUT_SECONDS": "2700"}}},
    )
    (pull,) = [s for s in statements(template) if s.get("Sid") == "PullTheDeepLearningContainer"]
    assert ":ecr:af-south-1:626614931356:repository/pytorch-training" in json.dumps(pull["Resource"])


def test_env_agnostic_stack_maps_the_region_to_the_dlc_account():
    def build(stack):
        TrainingImageBuild(stack, "Build", image_repository=TrainingImageRepository(stack, "Images"))

    app = cdk.App()
    stack = cdk.Stack(app, "Agnostic")
    build(stack)
    template = assertions.Template.from_stack(stack).to_json()
    account = _env(assertions.Template.from_json(template))["BASE_IMAGE_ACCOUNT"]
    assert "Fn::FindInMap" in account
    mapping = template["Mappings"][account["Fn::FindInMap"][0]]
    assert mapping["us-west-2"][account["Fn::FindInMap"][2]] == "763104351884"


def test_existing_key_and_log_group_are_used():
    from aws_cdk import aws_kms as kms

    def build(stack):
        key = kms.Key(stack, "MyKey", enable_key_rotation=True)
        group = logs.LogGroup(stack, "MyLogs", retention=logs.RetentionDays.ONE_DAY)
        TrainingImageBuild(
            stack,
            "Build",
            image_repository=TrainingImageRepository(stack, "Images"),
            encryption_key=key,
            log_group=group,
        )

    template = template_of(build)
    assert len(template.find_resources("AWS::KMS::Key")) == 1
    props = _project(template)
    assert props["EncryptionKey"]["Fn::GetAtt"][0].startswith("MyKey")
    assert props["LogsConfig"]["CloudWatchLogs"]["GroupName"]["Ref"].startswith("MyLogs")


@pytest.mark.parametrize(
    ("kwargs", "env", "message"),
    [
        ({}, "af-south-1", "base_image_account is required in region af-south-1"),
        ({}, "ca-west-1", "base_image_account is required in region ca-west-1"),
        ({"base_image_account": "76310435188"}, "us-west-2", "base_image_account must be a 12-digit"),
        (
            {"build_timeout_minutes": 4},
            "us-west-2",
            r"build_timeout_minutes must be an integer in \[5, 2160\]",
        ),
        ({"build_timeout_minutes": 2161}, "us-west-2", "build_timeout_minutes"),
        ({"build_timeout_minutes": True}, "us-west-2", "build_timeout_minutes"),
        ({"wait_timeout_minutes": 61}, "us-west-2", r"wait_timeout_minutes must be an integer in \[5, 60\]"),
        ({"wait_timeout_minutes": 120}, "us-west-2", "wait_timeout_minutes"),
        ({"base_image_tag": "bad tag"}, "us-west-2", "base_image_tag is not a valid image tag"),
        ({"source_directory": "/nonexistent"}, "us-west-2", "source_directory must hold a Dockerfile"),
    ],
)
def test_bad_props_raise_value_error_naming_the_prop(kwargs, env, message):
    stack = cdk.Stack(cdk.App(), "Bad", env=cdk.Environment(account="123456789012", region=env))
    repo = TrainingImageRepository(stack, "Images")
    with pytest.raises(ValueError, match=message):
        TrainingImageBuild(stack, "Build", image_repository=repo, **kwargs)


def test_grant_start_build_is_scoped_to_the_project(construct):
    from aws_cdk import aws_iam as iam

    stack = cdk.Stack.of(construct)
    user = iam.User(stack, "Operator")
    construct.grant_start_build(user)
    document = stack.resolve(user.node.find_child("DefaultPolicy").document.to_json())
    (statement,) = document["Statement"]
    assert sorted(statement["Action"]) == [
        "codebuild:BatchGetBuilds",
        "codebuild:StartBuild",
        "codebuild:StopBuild",
    ]
    assert statement["Resource"] == stack.resolve(construct.project.project_arn)


# ---- settings and the stack ------------------------------------------------------------------------------------
def test_context_settings_for_the_build():
    settings = StackSettings.from_context(
        cdk.App(
            context={
                "buildComputeType": "X_LARGE",
                "buildTimeoutMinutes": "240",
                "baseImageAccount": "626614931356",
            }
        ).node
    )
    assert settings.build_compute_type == codebuild.ComputeType.X_LARGE
    assert settings.build_timeout_minutes == 240 and settings.base_image_account == "626614931356"
    kwargs = settings.stack_kwargs()
    assert kwargs["build_compute_type"] == codebuild.ComputeType.X_LARGE
    for context, message in (
        ({"buildComputeType": "huge"}, "context buildComputeType: must be one of"),
        ({"buildTimeoutMinutes": "3000"}, r"context buildTimeoutMinutes: must be an integer in \[5, 2160\]"),
        ({"buildTimeoutMinutes": "soon"}, "context buildTimeoutMinutes"),
        ({"baseImageAccount": "abc"}, "context baseImageAccount: must be the 12-digit account"),
    ):
        with pytest.raises(ValueError, match=message):
            StackSettings.from_context(cdk.App(context=context).node)


def test_stack_builds_the_image_and_outputs_its_uri_and_project():
    from constructs_lib.stack import BlackwellTrainingStack

    app = cdk.App()
    stack = BlackwellTrainingStack(app, "Wired", env=DEFAULT_ENV)
    assert stack.image_build.image_repository is stack.images
    outputs = assertions.Template.from_stack(stack).find_outputs("*")
    image = outputs["ImageUri"]["Value"]["Fn::GetAtt"]
    assert image[1] == "ImageUri" and image[0].startswith("ImageBuildImage")
    assert outputs["ImageBuildProjectName"]["Value"]["Ref"].startswith("ImageBuildProject")


def test_imported_log_group_is_nag_clean():
    def build(app: cdk.App) -> None:
        stack = cdk.Stack(app, "Imported", env=DEFAULT_ENV)
        TrainingImageBuild(
            stack,
            "Build",
            image_repository=TrainingImageRepository(stack, "Images"),
            log_group=logs.LogGroup.from_log_group_name(stack, "Logs", "/training/image-build"),
        )

    assert synth_with_nag(build).violations == ()


def test_build_in_a_vpc_is_nag_clean():
    """With a VPC: no LambdaInsideVPC finding to acknowledge, and the VPC permissions are acknowledged exactly."""

    def build(app: cdk.App) -> None:
        stack = cdk.Stack(app, "Test", env=cdk.Environment(account="123456789012", region="us-west-2"))
        TrainingImageBuild(
            stack,
            "ImageBuild",
            image_repository=TrainingImageRepository(stack, "Images"),
            vpc=ec2.Vpc.from_vpc_attributes(
                stack,
                "Vpc",
                vpc_id="vpc-0123456789abcdef0",
                availability_zones=["us-west-2a"],
                private_subnet_ids=["subnet-0123456789abcdef0"],
            ),
        )

    assert synth_with_nag(build).violations == ()


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"removal_policy": cdk.RemovalPolicy.SNAPSHOT}, "removal_policy must be RETAIN or DESTROY"),
        (
            {"subnets": ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)},
            "subnets and security_groups need vpc",
        ),
    ],
)
def test_bad_network_and_removal_props_are_refused(props, message):
    stack = cdk.Stack(cdk.App(), "Bad", env=cdk.Environment(account="123456789012", region="us-west-2"))
    with pytest.raises(ValueError, match=f"TrainingImageBuild: {message}"):
        TrainingImageBuild(stack, "Build", image_repository=TrainingImageRepository(stack, "Images"), **props)
