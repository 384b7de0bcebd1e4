"""cdk.json context settings: defaults, parsing, and a clear error per bad key."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest

from constructs_lib.config import ConfigError, StackSettings


def _settings(**context) -> StackSettings:
    return StackSettings.from_context(cdk.App(context=context).node)


def test_defaults():
    settings = _settings()
    assert settings.stack_name == "BlackwellTraining"
    assert settings.removal_policy == cdk.RemovalPolicy.RETAIN
    assert settings.use_kms is False and settings.kms_key_arn is None and settings.vpc_id is None


def test_values_are_parsed():
    arn = "arn:aws:kms:us-west-2:123456789012:key/12345678-1234-1234-1234-123456789012"
    settings = _settings(
        removalPolicy="DESTROY", kmsKeyArn=arn, vpcId="vpc-0123456789abcdef0", region="us-west-2"
    )
    assert settings.removal_policy == cdk.RemovalPolicy.DESTROY
    assert settings.use_kms is True and settings.kms_key_arn == arn
    assert settings.vpc_id == "vpc-0123456789abcdef0" and settings.region == "us-west-2"
    assert _settings(useKms="true").use_kms is True  # -c useKms=true arrives as a string


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"removalPolicy": "snapshot"}, "context removalPolicy: must be retain or destroy"),
        ({"useKms": "yes"}, "context useKms: must be true or false"),
        ({"kmsKeyArn": "alias/mine"}, "context kmsKeyArn: must be a KMS key ARN"),
        ({"vpcId": "my-vpc"}, "context vpcId: must look like vpc-"),
        ({"region": "mars-1"}, "context region: must be an AWS region name"),
        ({"stackName": "1bad name"}, "context stackName: must match"),
    ],
)
def test_bad_context_names_the_key(context, message):
    with pytest.raises(ValueError, match=message):
        _settings(**context)


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"kmsKeyARN": "x"}, "context kmsKeyARN: unknown key; did you mean kmsKeyArn\\?"),
        ({"usekms": True}, "context usekms: unknown key; did you mean useKms\\?"),
        ({"removalpolicy": "destroy"}, "context removalpolicy: unknown key; did you mean removalPolicy\\?"),
        ({"notificatons": False}, "context notificatons: unknown key; did you mean notifications\\?"),
        ({"colour": "red"}, "context colour: unknown key; known keys: stackName, region, "),
    ],
)
def test_unknown_key_is_refused_with_the_closest_known_key(context, message):
    with pytest.raises(ConfigError, match=message):
        _settings(**context)


def test_cdk_own_context_keys_are_not_refused():
    settings = _settings(
        **{
            "@aws-cdk/aws-iam:minimizePolicies": True,
            "aws:cdk:enable-path-metadata": True,
            "vpc-provider:account=123456789012:filter.vpc-id=vpc-1:region=us-west-2": {"vpcId": "vpc-1"},
        }
    )
    assert settings.stack_name == "BlackwellTraining"


_ARN = "arn:aws:kms:us-west-2:123456789012:key/12345678-1234-1234-1234-123456789012"


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"useKms": False, "kmsKeyArn": _ARN}, "context kmsKeyArn: given with useKms=false"),
        ({"useKms": "false", "kmsKeyArn": _ARN}, "context kmsKeyArn: given with useKms=false"),
        (
            {"region": "eu-west-1", "kmsKeyArn": _ARN},
            "context kmsKeyArn: the key is in us-west-2 but the stack",
        ),
        ({"eventBusName": "ops"}, "context eventBusName: only used by the trigger rule, which is off"),
        ({"triggerSource": "mine"}, "context triggerSource: only used by the trigger rule, which is off"),
    ],
)
def test_contradictory_keys_are_refused(context, message):
    with pytest.raises(ConfigError, match=message):
        _settings(**context)


def test_key_region_is_checked_against_the_cli_region_when_region_is_unset():
    with pytest.raises(ConfigError, match="the key is in us-west-2 but the stack deploys to eu-west-1"):
        StackSettings.from_context(cdk.App(context={"kmsKeyArn": _ARN}).node, default_region="eu-west-1")
    ok = StackSettings.from_context(cdk.App(context={"kmsKeyArn": _ARN}).node, default_region="us-west-2")
    assert ok.use_kms and ok.kms_key_arn == _ARN


def test_null_means_the_documented_default():
    """README: notifications default on; a key set to null (or "") takes its default."""
    settings = _settings(notifications=None, useKms=None, removalPolicy="", workflowTrigger=None)
    assert settings.workflow.notifications is True and settings.workflow.trigger is False
    assert settings.use_kms is False and settings.removal_policy == cdk.RemovalPolicy.RETAIN


def test_trigger_settings_are_accepted_with_the_trigger_on():
    settings = _settings(workflowTrigger=True, eventBusName="ops", triggerSource="mine")
    assert settings.workflow.event_bus_name == "ops" and settings.workflow.trigger_source == "mine"


def test_build_in_vpc_needs_a_vpc_and_network_isolation_is_parsed():
    with pytest.raises(ConfigError, match="context buildInVpc: needs vpcId"):
        _settings(buildInVpc=True)
    settings = _settings(buildInVpc="true", vpcId="vpc-0123456789abcdef0", networkIsolation=True)
    assert settings.build_in_vpc is True and settings.workflow.network_isolation is True
    assert settings.stack_kwargs()["build_in_vpc"] is True
    assert _settings().workflow.network_isolation is False


def test_stack_builds_in_the_vpc_and_isolates_the_jobs_when_asked():
    from aws_cdk.assertions import Template

    from constructs_lib.config import WorkflowSettings
    from constructs_lib.stack import BlackwellTrainingStack

    app = cdk.App()
    stack = BlackwellTrainingStack(
        app,
        "S",
        env=cdk.Environment(account="123456789012", region="us-west-2"),
        vpc_id="vpc-0123456789abcdef0",
        build_in_vpc=True,
        workflow=WorkflowSettings(network_isolation=True),
    )
    template = Template.from_stack(stack).to_json()
    (project,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::CodeBuild::Project"]
    assert project["Properties"]["VpcConfig"]["Subnets"]
    machines = [
        r
        for k, r in template["Resources"].items()
        if r["Type"] == "AWS::StepFunctions::StateMachine" and k.startswith("WorkflowStateMachine")
    ]
    assert "EnableNetworkIsolation" in json.dumps(machines[0]["Properties"]["DefinitionString"])
    with pytest.raises(ValueError, match="build_in_vpc needs vpc_id"):
        BlackwellTrainingStack(cdk.App(), "T", build_in_vpc=True)


def test_a_vpc_lookup_without_an_account_or_region_is_refused_naming_what_is_missing():
    from constructs_lib.stack import BlackwellTrainingStack

    with pytest.raises(ValueError) as refused:  # CDK itself: StackAccountRegionNotSpecified, deep in jsii
        BlackwellTrainingStack(
            cdk.App(), "T", vpc_id="vpc-0123456789abcdef0", env=cdk.Environment(region="us-west-2")
        )
    assert str(refused.value).startswith(
        "BlackwellTrainingStack: vpc_id vpc-0123456789abcdef0 is looked up at synth time (ec2.Vpc.from_lookup), "
        "which needs the stack's account and region: pass env=cdk.Environment(account=..., region=...)"
    )
    from constructs_lib.config import check_vpc_lookup

    with pytest.raises(
        ConfigError,
        match=r"^context vpcId: looking up vpc-1 needs AWS credentials and an explicit "
        r"account and region, and this synth has no region \(context region or CDK_DEFAULT_REGION\);",
    ):
        check_vpc_lookup("vpc-1", "123456789012", None)
    check_vpc_lookup("vpc-1", "123456789012", "us-west-2")
    check_vpc_lookup(None, None, None)


def test_data_sources():
    assert _settings().workflow.data_sources == ("data/",)
    sources = ["data/", "s3://corpora/tokens/"]
    assert _settings(dataSources=sources).workflow.data_sources == tuple(sources)
    assert _settings(dataSources='["s3://corpora/tokens/"]').workflow.data_sources == (
        "s3://corpora/tokens/",
    )
    with pytest.raises(ValueError, match="context dataSources: must be a list of S3 prefixes ending in '/'"):
        _settings(dataSources=["s3://corpora/tokens"])


def test_default_job_name_prefix_the_dashboard_searches_by():
    assert _settings().workflow.default_job_name_prefix == "blackwell-training"
    assert _settings(defaultJobNamePrefix="team-a").workflow.default_job_name_prefix == "team-a"
    assert _settings(defaultJobNamePrefix="x" * 26).workflow.default_job_name_prefix == "x" * 26
    for bad in ("team-a-", "-a", "a_b", "x" * 27, "a" + "-" * 25 + "b"):
        with pytest.raises(ConfigError, match="^context defaultJobNamePrefix: must be 1 to 26 of a-z"):
            _settings(defaultJobNamePrefix=bad)


def test_dashboard_job_name_prefixes():
    assert _settings().workflow.dashboard_job_name_prefixes == ()
    assert _settings(dashboardJobNamePrefixes=["nightly", "a-b"]).workflow.dashboard_job_name_prefixes == (
        "nightly",
        "a-b",
    )
    assert _settings(dashboardJobNamePrefixes="nightly,a-b").workflow.dashboard_job_name_prefixes == (
        "nightly",
        "a-b",
    )
    with pytest.raises(ConfigError, match="^context dashboardJobNamePrefixes: must be 1 to 26 of a-z.*'a_b'"):
        _settings(dashboardJobNamePrefixes=["a_b"])
    with pytest.raises(ConfigError, match="^context dashboardJobNamePrefixes: must be a list of at most 9"):
        _settings(dashboardJobNamePrefixes=[f"p{i}" for i in range(10)])
    with pytest.raises(ConfigError, match="^context dashboardJobNamePrefixes: only used by the dashboard"):
        _settings(dashboardJobNamePrefixes=["nightly"], dashboard="false")


def test_dashboard_and_mlflow_settings():
    assert _settings().workflow.dashboard is True and _settings().workflow.mlflow_tracking_server_arn is None
    assert _settings(dashboard="false").workflow.dashboard is False
    arn = "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/team"
    assert _settings(mlflowTrackingServerArn=arn).workflow.mlflow_tracking_server_arn == arn
    assert _settings(mlflowTrackingServerArn="").workflow.mlflow_tracking_server_arn is None
    with pytest.raises(
        ConfigError, match="^context mlflowTrackingServerArn: must be a SageMaker MLflow tracking"
    ):
        _settings(mlflowTrackingServerArn="arn:aws:sagemaker:us-west-2:123456789012:training-job/x")
    with pytest.raises(ConfigError, match="^context mlflowTrackingServerArn: the jobs cannot reach MLflow"):
        _settings(mlflowTrackingServerArn=arn, networkIsolation=True)
    with pytest.raises(ConfigError, match="^context dashboard: must be true or false"):
        _settings(dashboard="maybe")


def test_warm_pool_ceiling_and_remote_debugging():
    settings = _settings()
    assert settings.workflow.max_keep_alive_seconds == 3600 and settings.workflow.remote_debug is False
    settings = _settings(maxKeepAliveSeconds="0", remoteDebug="true")
    assert settings.workflow.max_keep_alive_seconds == 0 and settings.workflow.remote_debug is True
    with pytest.raises(ConfigError, match=r"context maxKeepAliveSeconds: must be an integer in \[0, 21600\]"):
        _settings(maxKeepAliveSeconds=21601)  # SageMaker's own ceiling, read from botocore
    with pytest.raises(ConfigError, match="context remoteDebug: must be true or false; got 'on'"):
        _settings(remoteDebug="on")
    with pytest.raises(ConfigError, match="context remoteDebug: needs the network"):
        _settings(remoteDebug=True, networkIsolation=True)


def test_the_cli_reads_the_same_warm_pool_and_remote_debugging_rules():
    from training.request.decision import validate_request
    from training.request.rules import RequestRules

    rules = RequestRules.from_cdk_context({"maxKeepAliveSeconds": 600, "remoteDebug": True})
    assert (rules.max_keep_alive_seconds, rules.remote_debug) == (600, True)
    assert validate_request({"keep_alive_seconds": 600, "remote_debug": True}, rules) == []
    (problem,) = validate_request({"remote_debug": True}, RequestRules.from_cdk_context({}))
    assert problem.startswith(
        "remote_debug: must be false (this workflow is deployed without remote debugging"
    )
