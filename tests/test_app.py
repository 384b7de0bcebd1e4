"""The deployable app as `make synth` builds it: resources, outputs, cdk-nag (AwsSolutions, NIST 800-53 R5,
Serverless) with zero open findings, checkov with an explicit skip list, and cdk.json errors as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from cdk_nag import HIPAASecurityChecks, NIST80053R5Checks

from app import add_stacks
from tests.cdk_helpers import names_only_this_state_machine, state_machine_references, synth_with_nag

CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"


def _app_as_configured(app: cdk.App, **overrides) -> list[cdk.Stack]:
    for key, value in {**json.loads(CDK_JSON.read_text())["context"], **overrides}.items():
        app.node.set_context(key, value)
    return add_stacks(app)


@pytest.fixture(scope="module")
def app_nag():
    """The app exactly as app.py builds it from cdk.json context, checked by the app's packs."""
    return synth_with_nag(_app_as_configured)


@pytest.fixture(scope="module")
def kms_app_nag():
    """The other corner of the settings: useKms, removalPolicy=destroy, the trigger on."""
    return synth_with_nag(
        lambda app: _app_as_configured(app, useKms=True, removalPolicy="destroy", workflowTrigger=True)
    )


def test_app_synthesizes_with_zero_unacknowledged_findings(app_nag):
    assert app_nag.violations == ()


def test_app_contains_storage_identity_and_outputs(app_nag):
    (template,) = app_nag.templates.values()
    types = [r["Type"] for r in template["Resources"].values()]
    assert types.count("AWS::S3::Bucket") == 2  # checkpoints + access logs
    assert types.count("AWS::ECR::Repository") == 1
    assert "AWS::IAM::Role" in types
    assert {"CheckpointBucketName", "ImageRepositoryUri", "ExecutionRoleArn"} <= set(template["Outputs"])
    # the dashboard is on in cdk.json; its address names the stack's region and the dashboard
    url = template["Outputs"]["DashboardUrl"]["Value"]["Fn::Join"][1]
    assert url[0] == "https://console.aws.amazon.com/cloudwatch/home?region=us-west-2#dashboards/dashboard/"
    assert types.count("AWS::CloudWatch::Dashboard") == 1 and url[1]["Ref"].startswith("WorkflowDashboard")


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


def test_app_with_customer_kms_key_is_nag_clean(kms_app_nag):
    assert kms_app_nag.violations == ()


def _of_type(template: dict, resource_type: str) -> dict[str, dict]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == resource_type}


@pytest.mark.parametrize("setting", ["default", "kms"])
def test_one_customer_key_used_by_everything_and_clean_up_follows_removal_policy(
    setting, app_nag, kms_app_nag
):
    """Exactly one KMS key whatever useKms says (no key that nothing uses), and it, the log groups, the bucket
    and the repository follow removalPolicy (cdk.json: retain; the kms corner: destroy)."""
    ((_, template),) = (app_nag if setting == "default" else kms_app_nag).templates.items()
    ((key_id, key),) = _of_type(template, "AWS::KMS::Key").items()
    assert key["Properties"]["EnableKeyRotation"] is True
    expected = "Retain" if setting == "default" else "Delete"
    for resource_type in ("AWS::KMS::Key", "AWS::Logs::LogGroup", "AWS::S3::Bucket", "AWS::ECR::Repository"):
        resources = _of_type(template, resource_type)
        assert resources and {r["DeletionPolicy"] for r in resources.values()} == {expected}, resource_type
    key_arn = {"Fn::GetAtt": [key_id, "Arn"]}
    for group in _of_type(template, "AWS::Logs::LogGroup").values():
        assert group["Properties"]["KmsKeyId"] == key_arn
    machines = _of_type(template, "AWS::StepFunctions::StateMachine")
    (machine,) = [m for k, m in machines.items() if k.startswith("WorkflowStateMachine")]
    assert machine["Properties"]["EncryptionConfiguration"]["KmsKeyId"] == key_arn
    (topic,) = _of_type(template, "AWS::SNS::Topic").values()
    assert topic["Properties"]["KmsMasterKeyId"] == key_arn
    (project,) = _of_type(template, "AWS::CodeBuild::Project").values()
    assert project["Properties"]["EncryptionKey"] == key_arn


def test_hipaa_adds_nothing_but_a_rule_that_does_not_apply():
    """HIPAA Security is left out of the app's packs: on the app it finds the NIST 800-53 R5 rules again (all
    acknowledged for NIST) plus CodeBuildProjectSourceRepoUrl, which is about GitHub/Bitbucket sources (ours
    is an S3 asset). If HIPAA ever finds a rule NIST does not have, this fails and HIPAA should be added."""
    result = synth_with_nag(_app_as_configured, packs=[NIST80053R5Checks(), HIPAASecurityChecks()])
    nist = {rule.removeprefix("NIST.800.53.R5-") for rule, _ in result.violations if rule.startswith("NIST")}
    hipaa = {
        rule.removeprefix("HIPAA.Security-") for rule, _ in result.violations if rule.startswith("HIPAA")
    }
    assert nist == set()  # the app acknowledges each of them for NIST
    assert "IAMNoInlinePolicy" in hipaa  # the same findings, raised again under HIPAA's name
    known_nist_rules = {
        "S3BucketReplicationEnabled",
        "S3BucketVersioningEnabled",
        "S3DefaultEncryptionKMS",
        "IAMNoInlinePolicy",
        "LambdaConcurrency",
        "LambdaDLQ",
        "LambdaInsideVPC",
        "CloudWatchLogGroupEncrypted",
        "CloudWatchAlarmAction",
    }
    assert hipaa - known_nist_rules == {"CodeBuildProjectSourceRepoUrl"}
    (project,) = [
        r
        for r in next(iter(result.templates.values()))["Resources"].values()
        if r["Type"] == "AWS::CodeBuild::Project"
    ]
    assert project["Properties"]["Source"]["Type"] == "S3"


# ---- checkov ---------------------------------------------------------------------------------------------------
CHECKOV = Path(sys.executable).parent.parent / "checkov" / "bin" / "checkov"
"""Installed by `make setup` into its own venv (.venv/checkov): its boto3/botocore pins conflict with the dev
extra's; the version is pinned in pyproject.toml ([project.optional-dependencies] scan)."""

_DEPLOY_FUNCTIONS = ("ImageBuildOnEvent", "ImageBuildIsComplete", "ImageBuildProviderframework")
_REQUEST_FUNCTION = "WorkflowRequestValidator"
CHECKOV_SKIPS: dict[str, tuple[tuple[str, ...], str]] = {
    # check id: (logical-id prefixes it is skipped for, why)
    "CKV_AWS_18": (
        ("CheckpointsAccessLogs",),
        "The server-access-log bucket is itself the log target; logging it would log the log deliveries.",
    ),
    "CKV_AWS_136": (
        ("ImagesRepository",),
        "Only with useKms=false, which chooses ECR's AES-256 encryption; with useKms the repository uses the key.",
    ),
    "CKV_AWS_51": (
        ("ImagesRepository",),
        "Tags are immutable except the one layer-cache tag (ImageTagMutabilityExclusionFilter 'buildcache'), "
        "which each build moves to its newest image; checkov reads IMMUTABLE_WITH_EXCLUSION as mutable.",
    ),
    "CKV_AWS_115": (
        (*_DEPLOY_FUNCTIONS, "CustomS3AutoDeleteObjects", _REQUEST_FUNCTION),
        "Deploy-time functions (image build, CDK's bucket emptying) run once per deployment, the request "
        "check once per execution; reserved concurrency would take from the account pool (10 in new accounts) "
        "and can fail the deployment.",
    ),
    "CKV_AWS_116": (
        (*_DEPLOY_FUNCTIONS, "CustomS3AutoDeleteObjects", _REQUEST_FUNCTION),
        "Deploy-time functions report every failure to CloudFormation, which fails the deployment, and Step "
        "Functions invokes the request check synchronously (its Retry/Catch handle errors); a DLQ only gets "
        "failed asynchronous invocations.",
    ),
    "CKV_AWS_117": (
        (*_DEPLOY_FUNCTIONS, "CustomS3AutoDeleteObjects", _REQUEST_FUNCTION),
        "No VPC is configured in these settings (buildInVpc puts the build functions in one). The functions "
        "call only AWS APIs and hold no data.",
    ),
    "CKV_AWS_173": (
        ("ImageBuildIsComplete", "ImageBuildProviderframework"),
        "The functions' environment holds only a timeout and the handler ARNs, no secret; Lambda encrypts it at "
        "rest with its service key.",
    ),
}


@pytest.fixture(scope="module")
def checkov_failures(app_nag, kms_app_nag) -> list[tuple[str, str]]:
    """checkov's failed checks on the two synthesized settings: (check id, logical id)."""
    assert CHECKOV.exists(), f"checkov is missing at {CHECKOV}: run `make setup`"
    folder = Path(tempfile.mkdtemp(prefix="checkov-"))
    files = []
    for name, result in (("default", app_nag), ("kms", kms_app_nag)):
        ((_, template),) = result.templates.items()
        path = folder / f"{name}.template.json"
        path.write_text(json.dumps(template))
        files += ["-f", str(path)]
    done = subprocess.run(
        [str(CHECKOV), *files, "--framework", "cloudformation", "--quiet", "--compact", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    assert reports and all(r["summary"]["parsing_errors"] == 0 for r in reports), done.stderr[-2000:]
    assert sum(r["summary"]["passed"] for r in reports) > 100  # it really looked at the templates
    return [
        (failed["check_id"], failed["resource"].split(".", 1)[1])
        for r in reports
        for failed in r["results"]["failed_checks"]
    ]


def test_checkov_finds_nothing_outside_its_explicit_skip_list(checkov_failures):
    unexplained = [
        (check, resource)
        for check, resource in checkov_failures
        if check not in CHECKOV_SKIPS or not resource.startswith(CHECKOV_SKIPS[check][0])
    ]
    assert unexplained == []


def test_every_checkov_skip_is_still_needed_and_has_a_reason(checkov_failures):
    used = {check for check, _ in checkov_failures}
    assert set(CHECKOV_SKIPS) == used  # a fixed finding must leave the list
    assert all(len(reason) > 40 for _, reason in CHECKOV_SKIPS.values())


# ---- cdk.json errors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("context", "line"),
    [
        ({"kmsKeyARN": "x"}, "error: context kmsKeyARN: unknown key; did you mean kmsKeyArn?"),
        ({"useKms": "maybe"}, "error: context useKms: must be true or false; got 'maybe'"),
    ],
)
def test_a_bad_setting_is_one_line_and_a_non_zero_exit(context, line):
    """What `cdk synth` shows: app.py run with the context the CLI passes (CDK_CONTEXT_JSON)."""
    root = CDK_JSON.parent
    done = subprocess.run(
        [sys.executable, str(root / "app.py")],
        cwd=root,
        env={**os.environ, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": tempfile.mkdtemp()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    errors = [text for text in done.stderr.splitlines() if not text.startswith("b'")]  # jsii's Node banner
    assert errors == [line], done.stderr[-2000:]


CDK_CLI = CDK_JSON.parent / "node_modules" / "aws-cdk" / "bin" / "cdk"
"""The pinned CDK CLI (package.json), what `make synth` runs (node_modules/.bin/cdk links to it)."""
CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
)


def test_a_vpc_lookup_without_credentials_is_one_line_naming_vpcid(tmp_path):
    """`cdk synth -c vpcId=...` through the real CDK CLI, without AWS credentials (none in the environment, empty
    config and credentials files, no instance metadata): the CLI sets no CDK_DEFAULT_ACCOUNT, and CDK's own
    StackAccountRegionNotSpecified traceback named neither vpcId nor what a lookup needs. What the user sees is the
    app's one line, then the CLI's own line saying the app failed."""
    root = CDK_JSON.parent
    node = Path(sys.executable).parent / "node"
    assert node.is_file() and CDK_CLI.is_file(), "run `make setup` (the venv's Node and node_modules)"
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("CDK_DEFAULT_") and key not in CREDENTIAL_VARIABLES
    }
    (tmp_path / "aws").mkdir()
    (tmp_path / "aws" / "config").write_text("")
    (tmp_path / "aws" / "credentials").write_text("")
    environment.update(
        AWS_CONFIG_FILE=str(tmp_path / "aws" / "config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "aws" / "credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        CDK_DISABLE_VERSION_CHECK="1",
        CDK_CLI_NOTICES="false",
    )
    done = subprocess.run(
        [str(node), str(CDK_CLI), "synth", "--quiet", "--no-notices", "--no-version-reporting"]
        + ["-c", "vpcId=vpc-0123456789abcdef0", "-o", str(tmp_path / "cdk.out")],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    app_command = json.loads(CDK_JSON.read_text())["app"]
    lines = [
        text for text in done.stderr.splitlines() if text.strip() and not text.startswith("b'")
    ]  # jsii's banner
    assert lines == [
        "error: context vpcId: looking up vpc-0123456789abcdef0 needs AWS credentials and an explicit account and "
        "region, and this synth has no account (CDK_DEFAULT_ACCOUNT, which the CDK CLI sets from your AWS "
        "credentials); run cdk with credentials for the VPC's account (or set CDK_DEFAULT_ACCOUNT when "
        "cdk.context.json already holds the lookup), or remove vpcId",
        f"{app_command}: Subprocess exited with error 1",
    ], done.stderr[-3000:]
    assert (
        "Traceback" not in done.stdout + done.stderr and not (tmp_path / "cdk.out" / "manifest.json").exists()
    )


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


def test_the_trigger_may_start_the_encrypted_state_machine(kms_app_nag):
    """With the trigger on, EventBridge's role gets a data key of the state machine's key for that machine only."""
    ((_, template),) = kms_app_nag.templates.items()
    ((key_id, _),) = _of_type(template, "AWS::KMS::Key").items()
    (policy,) = [p for k, p in _of_type(template, "AWS::IAM::Policy").items() if "EventsRole" in k]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (kms_statement,) = [s for s in statements if "kms:GenerateDataKey" in s["Action"]]
    assert kms_statement["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}
    condition = kms_statement["Condition"]["StringEquals"]["kms:EncryptionContext:aws:states:stateMachineArn"]
    assert condition["Ref"].startswith("WorkflowStateMachine")
    assert any(s["Action"] == "states:StartExecution" for s in statements)


IMAGE_BUILD_PROVIDER = "ImageBuildProvider"
"""CDK's custom-resource provider framework inside the image build: its waiter state machine (named by
CloudFormation), its role (CDK's trust: aws:SourceArn ``stateMachine:*``) and the role that starts it. Its
statements name that waiter, never the workflow's state machine."""


PREPARATION = "DataPreparation"
"""The data preparation's state machine (constructs_lib/preparation/): its role's trust names that machine only."""


@pytest.mark.parametrize("setting", ["default", "kms"])
def test_every_iam_reference_to_a_state_machine_names_the_workflows(setting, app_nag, kms_app_nag):
    """In the app's templates (cdk.json's settings; useKms with the trigger on), every Resource and Condition
    value of a policy statement that names a state machine names the workflow's, by reference or by the ARN of
    its physical name: the role's trust, the key's condition, EventBridge's StartExecution and its key use."""
    ((_, template),) = (app_nag if setting == "default" else kms_app_nag).templates.items()
    machines = _of_type(template, "AWS::StepFunctions::StateMachine")
    (machine,) = [k for k in machines if k.startswith("WorkflowStateMachine")]
    ours = names_only_this_state_machine(template, machine)
    references = state_machine_references(template)
    preparation = [r for r in references if r[0].startswith(PREPARATION)]
    (prepares,) = [k for k in machines if k.startswith(f"{PREPARATION}StateMachine")]
    assert preparation and all(
        names_only_this_state_machine(template, prepares)(text) for _, _, text in preparation
    )
    workflow = [r for r in references if not r[0].startswith((IMAGE_BUILD_PROVIDER, PREPARATION))]
    assert [r for r in workflow if not ours(r[2])] == []
    condition = "kms:EncryptionContext:aws:states:stateMachineArn"
    found = sorted((logical[:-8], where.rsplit("/", 1)[1]) for logical, where, _ in workflow)
    expected = [("WorkflowStateMachineRole", "aws:SourceArn")] * 2 + [
        ("WorkflowStateMachineRoleDefaultPolicy", condition)
    ]
    if setting == "kms":  # the trigger: EventBridge's role starts executions and takes data keys for them
        expected += [("WorkflowStateMachineEventsRoleDefaultPolicy", "Resource")]
        expected += [("WorkflowStateMachineEventsRoleDefaultPolicy", condition)]
    assert found == sorted(expected)
    provider = [r for r in references if r[0].startswith(IMAGE_BUILD_PROVIDER)]
    assert provider and not any(ours(text) for _, _, text in provider)


# What the clean-up table of docs/deploy.md calls each resource the stack can leave behind (by logical-id prefix).
CLEAN_UP_NAMES = {
    "CheckpointsAccessLogs": "access-log bucket",
    "CheckpointsBucket": "checkpoint bucket",
    "ImagesRepository": "ECR repository",
    "ImageBuildKey": "the KMS key",
    "ImageBuildBuildLogs": "image build",
    "ImageBuildDeployLogs": "deploy-time functions",
    "WorkflowRequestValidatorLogs": "request validator",
    "WorkflowLogs": "workflow executions",
    "DataPreparationLogs": "data preparation executions",
}


def test_the_clean_up_table_names_everything_the_default_stack_leaves(app_nag):
    """Every resource that `cdk destroy` leaves with cdk.json's settings has its row in docs/deploy.md."""
    ((_, template),) = app_nag.templates.items()
    retained = [k for k, r in template["Resources"].items() if r.get("DeletionPolicy", "Delete") != "Delete"]
    page = (CDK_JSON.parent / "docs" / "deploy.md").read_text()
    section = page.split("\n## Clean-up", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| "))
    unnamed = [k for k in retained if not any(k.startswith(prefix) for prefix in CLEAN_UP_NAMES)]
    assert retained and unnamed == []
    missing = {name for prefix, name in CLEAN_UP_NAMES.items() for k in retained if k.startswith(prefix)}
    assert [name for name in sorted(missing) if name not in table] == []
