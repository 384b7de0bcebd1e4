"""TrainingWorkflow: IAM exactly as createTrainingJob.sync needs, logging/tracing/alarm, notifications, trigger,
options (VPC, keys, existing bucket/role), prop validation, cdk-nag, and the stack wiring."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Capture, Match, Template

from app import add_stacks
from constructs_lib._shared.nag import logical_id
from constructs_lib.identity.execution_role import SageMakerExecutionRole
from constructs_lib.image.repository import TrainingImageRepository
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket
from constructs_lib.workflow.construct import TrainingWorkflow
from constructs_lib.workflow.defaults import WorkflowDefaults
from constructs_lib.workflow.states import CREATE_TRAINING_JOB_SYNC
from tests.cdk_helpers import DEFAULT_ENV, as_list, synth_with_nag
from tests.workflow.harness import definition_of, definitions_of
from tests.workflow.stacks import build_workflow
from training.request.decision import validate_request
from training.request.rules import RequestRules

PARTITION = {"Ref": "AWS::Partition"}


def _template(**props) -> tuple[TrainingWorkflow, Template]:
    app = cdk.App()
    workflow = build_workflow(app, **props)
    return workflow, Template.from_stack(cdk.Stack.of(workflow))


@pytest.fixture(scope="module")
def plain():
    return _template()


def _sm_statements(template: Template) -> list[dict]:
    policies = template.find_resources("AWS::IAM::Policy")
    (sm_policy,) = [
        p for lid, p in policies.items() if lid.startswith("WorkflowStateMachineRoleDefaultPolicy")
    ]
    return sm_policy["Properties"]["PolicyDocument"]["Statement"]


# ---- IAM --------------------------------------------------------------------------------------------------------


def test_state_machine_role_has_exactly_the_sync_permissions(plain):
    workflow, template = plain
    found = _sm_statements(template)
    by_sid = {s.get("Sid"): s for s in found if s.get("Sid")}
    assert as_list(by_sid["RunTrainingJobs"]["Action"]) == [
        "sagemaker:CreateTrainingJob",
        "sagemaker:DescribeTrainingJob",
        "sagemaker:StopTrainingJob",
        "sagemaker:AddTags",
        "sagemaker:ListTags",
    ]
    assert by_sid["RunTrainingJobs"]["Resource"] == {
        "Fn::Join": ["", ["arn:", PARTITION, ":sagemaker:us-west-2:123456789012:training-job/*"]]
    }
    for sid in ("RunTrainingJobs", "LaunchOnTrainingPlans"):  # the warm-pool ceiling, in IAM too
        assert by_sid[sid]["Condition"] == {
            "NumericLessThanEqualsIfExists": {"sagemaker:KeepAlivePeriod": 3600}
        }
    assert as_list(by_sid["SyncIntegrationEventsRule"]["Action"]) == [
        "events:PutTargets",
        "events:PutRule",
        "events:DescribeRule",
    ]
    assert by_sid["SyncIntegrationEventsRule"]["Resource"] == {
        "Fn::Join": [
            "",
            [
                "arn:",
                PARTITION,
                ":events:us-west-2:123456789012:rule/StepFunctionsGetEventsForSageMakerTrainingJobsRule",
            ],
        ]
    }
    (pass_role,) = [s for s in found if "iam:PassRole" in as_list(s["Action"])]
    assert as_list(pass_role["Action"]) == ["iam:PassRole"]
    assert pass_role["Resource"] == {"Fn::GetAtt": [logical_id(workflow.execution_role), "Arn"]}
    assert pass_role["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    (invoke,) = [s for s in found if "lambda:InvokeFunction" in as_list(s["Action"])]
    function_arn = {"Fn::GetAtt": [logical_id(workflow.validator.function), "Arn"]}
    assert as_list(invoke["Action"]) == ["lambda:InvokeFunction"]
    assert invoke["Resource"] == [function_arn, {"Fn::Join": ["", [function_arn, ":*"]]}]
    # After a tuning job: read its report in the runs' tune/ folders, store its records under tuning/measurements/
    bucket_arn = {"Fn::GetAtt": [logical_id(workflow.bucket), "Arn"]}
    reports = {"Fn::Join": ["", [bucket_arn, f"/{workflow.runs_prefix}*/tune/*"]]}
    records = {"Fn::Join": ["", [bucket_arn, "/tuning/measurements/*"]]}
    tuning = [s for s in found if any(a.lower().startswith("s3:") for a in as_list(s["Action"]))]
    assert sorted(
        (tuple(as_list(s["Action"])), json.dumps(s["Resource"], sort_keys=True)) for s in tuning
    ) == sorted(
        [
            (("s3:GetObject",), json.dumps(reports, sort_keys=True)),  # the winner, and the copy's source
            (("s3:PutObject",), json.dumps(records, sort_keys=True)),
        ]
    )
    # Everything else is CDK's log delivery and X-Ray, the only statements on Resource '*'.
    named = (by_sid["RunTrainingJobs"], by_sid["LaunchOnTrainingPlans"], by_sid["SyncIntegrationEventsRule"])
    rest = [s for s in found if s not in (*named, pass_role, invoke, *tuning)]
    actions = {a for s in rest for a in as_list(s["Action"])}
    assert all(s["Resource"] == "*" for s in rest)
    assert {a.split(":")[0] for a in actions} == {"logs", "xray"}
    assert all(s["Effect"] == "Allow" for s in found)


def test_training_plan_launch_permission_is_scoped_to_the_stacks_plans_and_reserved_capacity(plain):
    """Service Authorization Reference: CreateTrainingJob also names the resource types training-plan and
    reserved-capacity, and the SageMaker guide "IAM for SageMaker training plans" says a training job on a plan
    needs both. Only CreateTrainingJob, only this account's plans and reserved capacities in this region, with
    the warm-pool ceiling."""
    _, template = plain
    by_sid = {s.get("Sid"): s for s in _sm_statements(template) if s.get("Sid")}
    statement = by_sid["LaunchOnTrainingPlans"]
    assert statement["Action"] == "sagemaker:CreateTrainingJob"
    assert sorted(json.dumps(r, sort_keys=True) for r in statement["Resource"]) == sorted(
        json.dumps(
            {"Fn::Join": ["", ["arn:", PARTITION, f":sagemaker:us-west-2:123456789012:{resource}/*"]]},
            sort_keys=True,
        )
        for resource in ("training-plan", "reserved-capacity")
    )
    assert statement["Condition"] == {"NumericLessThanEqualsIfExists": {"sagemaker:KeepAlivePeriod": 3600}}
    plan_actions = [
        a
        for s in _sm_statements(template)
        for a in as_list(s["Action"])
        if "training-plan" in str(s["Resource"]) or "reserved-capacity" in str(s["Resource"])
    ]
    assert plan_actions == ["sagemaker:CreateTrainingJob"]


def _policy_statements(template: Template, prefix: str) -> list[dict]:
    return [
        s
        for lid, p in template.find_resources("AWS::IAM::Policy").items()
        if lid.startswith(prefix)
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_execution_role_reads_exactly_the_data_sources():
    workflow, template = _template(data_sources=["data/", "s3://corpora/tokens/"])
    statements = _policy_statements(template, "ExecutionRole")
    other = [s for s in statements if "corpora" in json.dumps(s["Resource"])]
    assert sorted((as_list(s["Action"])[0], json.dumps(s["Resource"])) for s in other) == [
        ("s3:GetObject", json.dumps({"Fn::Join": ["", ["arn:", PARTITION, ":s3:::corpora/tokens/*"]]})),
        ("s3:ListBucket", json.dumps({"Fn::Join": ["", ["arn:", PARTITION, ":s3:::corpora"]]})),
    ]
    (listing,) = [s for s in other if s["Action"] == "s3:ListBucket"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["tokens/", "tokens/*"]}}
    assert workflow.request_rules.data_sources == ("data/", "s3://corpora/tokens/")


def test_two_workflows_sharing_a_bucket_get_their_own_run_segments():
    app = cdk.App()
    first = build_workflow(app)
    second = TrainingWorkflow(
        first, "Nightly", image_uri=first.image_uri, execution_role=first.execution_role, bucket=first.bucket
    )
    assert (first.run_segment, second.run_segment) == ("Test-Workflow", "Test-Workflow-Nightly")
    assert second.runs_prefix == "checkpoints/Test-Workflow-Nightly/"
    with pytest.raises(ValueError, match="run_segment must be 1 to 128 of letters"):
        TrainingWorkflow(
            first,
            "Bad",
            image_uri="x",
            execution_role=first.execution_role,
            bucket=first.bucket,
            run_segment="a/b",
        )


def test_no_star_actions_and_no_managed_policies(plain):
    _, template = plain
    for resource in template.find_resources("AWS::IAM::Policy").values():
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            assert "*" not in as_list(statement["Action"])
    for role in template.find_resources("AWS::IAM::Role").values():
        assert "ManagedPolicyArns" not in role["Properties"]


# ---- logging, tracing, timeout, alarm ----------------------------------------------------------------------------


def test_logging_all_tracing_and_timeout(plain):
    workflow, template = plain
    group = Capture()
    template.has_resource_properties(
        "AWS::StepFunctions::StateMachine",
        {
            "LoggingConfiguration": {
                "Level": "ALL",
                "IncludeExecutionData": True,
                "Destinations": [{"CloudWatchLogsLogGroup": {"LogGroupArn": {"Fn::GetAtt": [group, "Arn"]}}}],
            },
            "TracingConfiguration": {"Enabled": True},
        },
    )
    assert group.as_string() == logical_id(workflow.log_group)
    template.has_resource(
        "AWS::Logs::LogGroup", {"Properties": {"RetentionInDays": 180}, "DeletionPolicy": "Retain"}
    )


def test_alarm_on_failed_timed_out_and_aborted_executions(plain):
    _, template = plain
    (alarm,) = template.find_resources("AWS::CloudWatch::Alarm").values()
    props = alarm["Properties"]
    assert props["Threshold"] == 1
    assert props["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert props["TreatMissingData"] == "notBreaching"
    metrics = {m["Id"]: m for m in props["Metrics"]}
    assert metrics["expr_1"]["Expression"] == "failed + timedOut + aborted"
    assert {metrics[i]["MetricStat"]["Metric"]["MetricName"] for i in ("failed", "timedOut", "aborted")} == {
        "ExecutionsFailed",
        "ExecutionsTimedOut",
        "ExecutionsAborted",
    }
    assert "AlarmActions" not in props


def test_no_topic_and_no_rules_unless_asked(plain):
    _, template = plain
    template.resource_count_is("AWS::SNS::Topic", 0)
    template.resource_count_is("AWS::Events::Rule", 0)


# ---- notifications and trigger -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def notified():
    return _template(
        notifications=True,
        event_pattern=events.EventPattern(source=["my.scheduler"], detail_type=["Train"]),
    )


def test_encrypted_topic_told_of_every_end_state(notified):
    workflow, template = notified
    template.has_resource_properties(
        "AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [logical_id(workflow.notification_key), "Arn"]}}
    )
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    template.has_resource_properties(
        "AWS::SNS::TopicPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
                        )
                    ]
                )
            }
        },
    )
    rule = template.find_resources(
        "AWS::Events::Rule", {"Properties": {"Description": Match.string_like_regexp("ends")}}
    )
    ((_, status_rule),) = rule.items()
    pattern = status_rule["Properties"]["EventPattern"]
    assert pattern["source"] == ["aws.states"]
    assert pattern["detail"]["status"] == ["SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"]
    assert pattern["detail"]["stateMachineArn"] == [{"Ref": logical_id(workflow.state_machine)}]
    (target,) = status_rule["Properties"]["Targets"]
    assert target["Arn"] == {"Ref": logical_id(workflow.notification_topic)}
    assert "InputTransformer" in target
    (alarm,) = template.find_resources("AWS::CloudWatch::Alarm").values()
    assert alarm["Properties"]["AlarmActions"] == [{"Ref": logical_id(workflow.notification_topic)}]


def _arn(service: str, resource: str) -> dict:
    return {
        "Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":{service}:us-west-2:123456789012{resource}"]]
    }


def test_only_this_rule_and_this_alarm_may_publish_to_the_topic_and_use_its_key(notified):
    """Topic policy and key policy: events.amazonaws.com only from the execution-ended rule, and
    cloudwatch.amazonaws.com only from the alarm (aws:SourceArn + aws:SourceAccount); nothing else allowed."""
    workflow, template = notified
    (rule,) = template.find_resources(
        "AWS::Events::Rule", {"Properties": {"Description": Match.string_like_regexp("ends")}}
    ).values()
    (alarm,) = template.find_resources("AWS::CloudWatch::Alarm").values()
    rule_arn = _arn("events", f":rule/{rule['Properties']['Name']}")
    alarm_arn = _arn("cloudwatch", f":alarm:{alarm['Properties']['AlarmName']}")
    expected_source = {
        "events.amazonaws.com": rule_arn,
        "cloudwatch.amazonaws.com": alarm_arn,
    }

    def condition(service: str) -> dict:
        return {
            "ArnEquals": {"aws:SourceArn": expected_source[service]},
            "StringEquals": {"aws:SourceAccount": "123456789012"},
        }

    (topic_policy,) = template.find_resources("AWS::SNS::TopicPolicy").values()
    allows = [s for s in topic_policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    assert sorted(s["Principal"]["Service"] for s in allows) == sorted(expected_source)
    for statement in allows:
        assert statement["Action"] == "sns:Publish"
        assert statement["Resource"] == {"Ref": logical_id(workflow.notification_topic)}
        assert statement["Condition"] == condition(statement["Principal"]["Service"])

    key = template.find_resources("AWS::KMS::Key")[logical_id(workflow.notification_key)]
    services = [s for s in key["Properties"]["KeyPolicy"]["Statement"] if "Service" in s.get("Principal", {})]
    assert sorted(s["Principal"]["Service"] for s in services) == sorted(expected_source)
    for statement in services:
        assert statement["Action"] == ["kms:Decrypt", "kms:GenerateDataKey*"]
        assert statement["Condition"] == condition(statement["Principal"]["Service"])
    # The alarm can publish: its action is the topic the cloudwatch statement names.
    assert alarm["Properties"]["AlarmActions"] == [{"Ref": logical_id(workflow.notification_topic)}]


def test_customer_key_encrypts_logs_state_machine_and_topic_and_the_removal_policy_applies():
    app = cdk.App()
    stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    workflow = build_workflow(
        app,
        notifications=True,
        encryption_key=key,
        removal_policy=cdk.RemovalPolicy.DESTROY,
        network_isolation=True,
    )
    template = Template.from_stack(stack)
    key_arn = {"Fn::GetAtt": [logical_id(key), "Arn"]}
    assert list(template.find_resources("AWS::KMS::Key")) == [logical_id(key)]  # no key of its own
    assert workflow.notification_key is key
    groups = list(template.find_resources("AWS::Logs::LogGroup").values())  # executions, request check
    assert len(groups) == 2
    assert all(g["Properties"]["KmsKeyId"] == key_arn and g["DeletionPolicy"] == "Delete" for g in groups)
    (machine,) = template.find_resources("AWS::StepFunctions::StateMachine").values()
    assert machine["Properties"]["EncryptionConfiguration"]["Type"] == "CUSTOMER_MANAGED_KMS_KEY"
    assert machine["Properties"]["EncryptionConfiguration"]["KmsKeyId"] == key_arn
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": key_arn})
    statements = template.find_resources("AWS::KMS::Key")[logical_id(key)]["Properties"]["KeyPolicy"][
        "Statement"
    ]
    logs_statements = [
        s for s in statements if "logs.us-west-2." in str(s.get("Principal", {}).get("Service"))
    ]
    # CloudWatch Logs may use the key for exactly these log groups, one statement each.
    contexts = sorted(
        s["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"]["Fn::Join"][1][-1].split(
            ":log-group:"
        )[1]
        for s in logs_statements
    )
    assert contexts == sorted(g["Properties"]["LogGroupName"] for g in groups)
    request = definition_of(template.to_json())["States"]
    launches = [state for state in request.values() if state.get("Resource") == CREATE_TRAINING_JOB_SYNC]
    assert launches and all(launch["Parameters"]["EnableNetworkIsolation"] is True for launch in launches)


def test_network_isolation_is_off_by_default_for_training_and_always_on_for_evaluation(plain):
    """A tuning job is launched as the training run it tunes: isolated only where the stack isolates training."""
    _, template = plain
    request = definition_of(template.to_json())["States"]
    launches = {name: s for name, s in request.items() if s.get("Resource") == CREATE_TRAINING_JOB_SYNC}
    training = [
        f"Run {kind} job{variant}" for kind in ("training", "tuning") for variant in ("", " (no input data)")
    ]
    training += ["Run training job (S3 checkpoints)", "Run training job (S3 checkpoints, no input data)"]
    for name in training:
        assert "EnableNetworkIsolation" not in launches[name]["Parameters"]
    for name in ("Run evaluation job", "Run evaluation job (no input data)"):
        assert launches[name]["Parameters"]["EnableNetworkIsolation"] is True
    assert len(launches) == 8


def test_the_evaluation_job_gets_the_task_channel_and_the_trained_model_read_only(plain):
    _, template = plain
    states = definition_of(template.to_json())["States"]
    prepare = states["Prepare evaluation"]["Parameters"]
    assert prepare["channels.$"] == "States.Array($.evaluation.tasks_channel, $.evaluation.model_channel)"
    model = states["Model channel"]
    assert model["ResultPath"] == "$.evaluation.model_channel"
    assert model["Parameters"] == {
        "ChannelName": "model",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri.$": "$.model_artifacts",
                                        "S3DataDistributionType": "FullyReplicated"}},
        "InputMode": "File",
    }  # fmt: skip
    launch = states["Run evaluation job"]["Parameters"]
    assert launch["InputDataConfig.$"] == "$.channels" and launch["EnableNetworkIsolation"] is True
    assert launch["AlgorithmSpecification"]["MetricDefinitions.$"] == "$.request.MetricDefinitions"
    assert (
        launch["Environment.$"] == "$.request.Environment"
    )  # SAGEMAKER_PROGRAM=evaluate.sh, decided per run
    assert not {"CheckpointConfig", "TensorBoardOutputConfig", "MlflowConfig"} & set(launch)


def test_trigger_rule_passes_the_event_detail(notified):
    workflow, template = notified
    (rule,) = template.find_resources(
        "AWS::Events::Rule", {"Properties": {"EventPattern": {"source": ["my.scheduler"]}}}
    ).values()
    assert rule["Properties"]["EventPattern"] == {"source": ["my.scheduler"], "detail-type": ["Train"]}
    (target,) = rule["Properties"]["Targets"]
    assert target["Arn"] == {"Ref": logical_id(workflow.state_machine)}
    assert target["InputPath"] == "$.detail"
    assert "EventBusName" not in rule["Properties"]  # the default bus


def test_trigger_on_a_custom_bus_and_existing_topic():
    def build(app):
        stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
        bus = events.EventBus(stack, "Bus", event_bus_name="training")
        topic = sns.Topic(
            stack,
            "Existing",
            master_key=kms.Key(stack, "TopicKey", enable_key_rotation=True),
            enforce_ssl=True,
        )
        bucket = CheckpointBucket(stack, "Checkpoints")
        images = TrainingImageRepository(stack, "Images")
        role = SageMakerExecutionRole(
            stack, "ExecutionRole", checkpoint_bucket=bucket, image_repository=images
        )
        TrainingWorkflow(
            stack,
            "Workflow",
            image_uri=images.image_uri("v1"),
            execution_role=role,
            checkpoint_bucket=bucket,
            notification_topic=topic,
            event_pattern=events.EventPattern(source=["a"]),
            event_bus=bus,
        )

    result = synth_with_nag(build)
    assert result.violations == ()
    template = Template.from_json(result.templates["Test.template.json"])
    template.has_resource_properties(
        "AWS::Events::Rule",
        {"EventBusName": {"Ref": Match.string_like_regexp("^Bus")}, "EventPattern": {"source": ["a"]}},
    )
    template.resource_count_is("AWS::SNS::Topic", 1)


# ---- options -----------------------------------------------------------------------------------------------------


def test_vpc_keys_data_channel_and_tags_reach_the_request():
    def build(app):
        build_workflow(
            app,
            vpc=ec2.Vpc.from_vpc_attributes(
                _stack_of(app),
                "Vpc",
                vpc_id="vpc-0123456789abcdef0",
                availability_zones=["us-west-2a"],
                private_subnet_ids=["subnet-0123456789abcdef0"],
            ),
            output_kms_key=kms.Key(_stack_of(app), "OutKey", enable_key_rotation=True),
            train_data_prefix="data/tokens/",
            tags={"team": "llm"},
        )

    result = synth_with_nag(build)
    assert result.violations == ()
    template = result.templates["Test.template.json"]
    definition = definition_of(template)
    params = definition["States"]["Run training job"]["Parameters"]
    assert params["VpcConfig"]["Subnets"] == ["subnet-0123456789abcdef0"]
    assert len(params["VpcConfig"]["SecurityGroupIds"]) == 1
    assert params["OutputDataConfig"]["KmsKeyId"].startswith("arn:aws:kms:")
    assert params["InputDataConfig.$"] == "$.channels"
    rules = RequestRules.from_json(definition["States"]["Decide request"]["Parameters"]["Payload"]["rules"])
    assert rules.defaults["train_data_uri"].endswith("/data/tokens/")  # the train channel when none is given
    assert rules.data_sources == ("data/", "data/tokens/")
    assert params["Tags.$"] == "$.request.Tags"  # decided per execution, with the workflow's own tags
    assert rules.tags == {"team": "llm"} and rules.workflow_path == "Test/Workflow"
    for name in ("On-demand capacity", "Managed spot capacity", "Training plan capacity"):
        assert "VolumeKmsKeyId" not in definition["States"][name]["Parameters"]["resource_config"]


def test_a_volume_key_with_instance_types_that_have_nvme_storage_is_refused_at_synth():
    """SageMaker refuses VolumeKmsKeyId for instance types with local NVMe storage (every GPU type here)."""
    app = cdk.App()
    key = kms.Key(_stack_of(app), "VolKey", enable_key_rotation=True)
    with pytest.raises(ValueError, match=r"instance_type: ml\.p6-b200\.48xlarge has NVMe instance storage"):
        build_workflow(app, volume_kms_key=key)


def _stack_of(app: cdk.App) -> cdk.Stack:
    found = app.node.try_find_child("Test")
    return found if found is not None else cdk.Stack(app, "Test", env=DEFAULT_ENV)


def test_existing_bucket_and_plain_role():
    def build(app):
        stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
        role = iam.Role.from_role_arn(stack, "Role", "arn:aws:iam::123456789012:role/existing", mutable=False)
        bucket = s3.Bucket.from_bucket_name(stack, "Bucket", "existing-bucket")
        TrainingWorkflow(
            stack,
            "Workflow",
            image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/train:v1",
            execution_role=role,
            bucket=bucket,
            checkpoint_prefix="team/ckpt/",
            output_prefix="team/out/",
        )

    result = synth_with_nag(build)
    assert result.violations == ()
    definition = definition_of(result.templates["Test.template.json"])
    params = definition["States"]["Run training job"]["Parameters"]
    assert params["RoleArn"] == "arn:aws:iam::123456789012:role/existing"
    assert params["OutputDataConfig"] == {"S3OutputPath": "s3://existing-bucket/team/out/"}
    assert params["CheckpointConfig"]["S3Uri.$"] == (
        "States.Format('s3://existing-bucket/team/ckpt/Test-Workflow/{}/', $$.Execution.Name)"
    )
    statements = [
        s
        for p in Template.from_json(result.templates["Test.template.json"])
        .find_resources("AWS::IAM::Policy")
        .values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    (pass_role,) = [s for s in statements if s["Action"] == "iam:PassRole"]
    assert pass_role["Resource"] == "arn:aws:iam::123456789012:role/existing"
    assert pass_role["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}


def test_defaults_reach_the_rules():
    workflow, template = _template(
        defaults=WorkflowDefaults(
            precision="mxfp8", num_layers=32, instance_count=2, job_name_prefix="llama-8b"
        ),
        max_instance_count=8,
    )
    definition = definition_of(template.to_json())
    rules = RequestRules.from_json(definition["States"]["Decide request"]["Parameters"]["Payload"]["rules"])
    defaults = rules.defaults
    assert (
        defaults["precision"] == "mxfp8" and defaults["num_layers"] == 32 and defaults["instance_count"] == 2
    )
    assert defaults["training_plan_arn"] is None and defaults["hyperparameters"] == {}
    assert rules.max_instance_count == 8 and rules.region == "us-west-2"
    assert validate_request({"instance_count": 9}, rules) == [
        "instance_count: must be an integer in [1, 8]; got 9"
    ]


# ---- prop validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "props, message",
    [
        ({"image_uri": ""}, "image_uri"),
        ({"bucket": "both"}, "exactly one of checkpoint_bucket or bucket"),
        ({"checkpoint_prefix": "x/"}, "checkpoint_prefix, output_prefix and tuning_prefix go with bucket"),
        ({"execution_role": "arn:aws:iam::1:role/x"}, "execution_role"),
        ({"allowed_instance_types": ["ml.p3.2xlarge"]}, "allowed_instance_types"),
        ({"allowed_instance_types": []}, "allowed_instance_types"),
        ({"max_instance_count": 0}, "max_instance_count"),
        ({"max_capacity_retries": 21}, "max_capacity_retries"),
        ({"capacity_retry_wait": cdk.Duration.seconds(0)}, "capacity_retry_wait"),
        ({"max_pending_time": cdk.Duration.hours(1)}, "max_pending_time"),
        ({"state_machine_timeout": cdk.Duration.minutes(5)}, "state_machine_timeout"),
        ({"volume_size_gb": 0}, "volume_size_gb"),
        ({"internal_retry_attempts": 31}, "internal_retry_attempts"),
        ({"subnets": ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)}, "need vpc"),
        ({"event_bus": "bus"}, "event_bus"),
        ({"train_data_prefix": "/abs"}, "train_data_prefix"),
        ({"defaults": WorkflowDefaults(precision="fp4")}, "defaults.precision"),
        ({"defaults": WorkflowDefaults(num_layers=0)}, "defaults.num_layers"),
        ({"defaults": WorkflowDefaults(job_name_prefix="x" * 27)}, "defaults.job_name_prefix"),
        ({"defaults": WorkflowDefaults(job_name_prefix="bad_name")}, "defaults.job_name_prefix"),
        (
            {"defaults": WorkflowDefaults(precision="mxfp8", instance_type="ml.p5.48xlarge")},
            "defaults.precision",
        ),
        ({"defaults": WorkflowDefaults(instance_count=5)}, "defaults.instance_count"),
        ({"defaults": WorkflowDefaults(max_wait_seconds=99999)}, "defaults.max_wait_seconds"),
        (
            {
                "defaults": WorkflowDefaults(
                    use_spot=True,
                    training_plan_arn="arn:aws:sagemaker:us-west-2:012345678901:training-plan/p",
                )
            },
            "defaults.use_spot",
        ),
        (
            {
                "defaults": WorkflowDefaults(
                    training_plan_arn="arn:aws:sagemaker:eu-west-1:012345678901:training-plan/p"
                )
            },
            "defaults.training_plan_arn",
        ),
        (
            {"defaults": WorkflowDefaults(hyperparameters={"max_steps": 0})},
            "defaults.hyperparameters.max_steps",
        ),
        (
            {"defaults": WorkflowDefaults(hyperparameters={"checkpoint_dir": "/x"})},
            "defaults.hyperparameters",
        ),
        ({"defaults": WorkflowDefaults(train_data_uri="s3://elsewhere/x/")}, "defaults.train_data_uri"),
        ({"data_sources": ["s3://corpora/tokens"]}, "data_sources: must be a list of S3 prefixes"),
        ({"run_segment": ""}, "run_segment"),
        ({"launch_retry_backoff": cdk.Duration.minutes(6)}, "launch_retry_backoff"),
        ({"state_machine_name": "has space"}, "state_machine_name"),
        ({"state_machine_name": "x" * 81}, "state_machine_name"),
        ({"state_machine_name": "team.workflow"}, "logs its executions to CloudWatch Logs"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_props_name_the_prop(props, message):
    app = cdk.App()
    stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
    if props.get("bucket") == "both":
        props["bucket"] = s3.Bucket.from_bucket_name(stack, "B", "existing-bucket")
    if props.get("event_bus") == "bus":
        props["event_bus"] = events.EventBus.from_event_bus_name(stack, "Bus", "x")
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        build_workflow_in(stack, **props)


def build_workflow_in(stack: cdk.Stack, **props):
    bucket = CheckpointBucket(stack, "Checkpoints")
    images = TrainingImageRepository(stack, "Images")
    props.setdefault("image_uri", images.image_uri("v1"))
    props.setdefault(
        "execution_role",
        SageMakerExecutionRole(stack, "Role", checkpoint_bucket=bucket, image_repository=images),
    )
    props.setdefault("checkpoint_bucket", bucket)
    return TrainingWorkflow(stack, "Workflow", **props)


# ---- cdk-nag and the app ------------------------------------------------------------------------------------------


def test_no_unacknowledged_findings_with_every_option():
    result = synth_with_nag(
        lambda app: build_workflow(
            app,
            notifications=True,
            event_pattern=events.EventPattern(source=["x"]),
            remote_debug=True,
            output_kms_key=kms.Key(_stack_of(app), "OutKey", enable_key_rotation=True),
        )
    )
    assert result.violations == ()


def _app_template(context: dict) -> tuple[cdk.Stack, Template]:
    holder: dict = {}

    def build(app: cdk.App) -> None:
        for key, value in context.items():
            app.node.set_context(key, value)
        (holder["stack"],) = add_stacks(app)

    result = synth_with_nag(build)
    assert result.violations == ()
    stack = holder["stack"]
    return stack, Template.from_json(result.templates[f"{stack.stack_name}.template.json"])


def test_app_stack_wires_the_workflow_and_outputs():
    stack, template = _app_template({"notifications": True, "workflowTrigger": True, "maxInstanceCount": 8})
    outputs = template.find_outputs("*")
    assert outputs["StateMachineArn"]["Value"] == {"Ref": logical_id(stack.workflow.state_machine)}
    assert outputs["NotificationTopicArn"]["Value"] == {"Ref": logical_id(stack.workflow.notification_topic)}
    assert stack.workflow.max_instance_count == 8
    assert stack.workflow.image_uri == stack.image_build.image_uri
    rules = template.find_resources(
        "AWS::Events::Rule", {"Properties": {"EventPattern": {"source": ["blackwell-training"]}}}
    )
    assert len(rules) == 1


def test_app_data_sources_reach_the_rules_and_the_execution_role():
    stack, template = _app_template({"dataSources": ["data/", "s3://corpora/tokens/"]})
    assert stack.workflow.request_rules.data_sources == ("data/", "s3://corpora/tokens/")
    assert "corpora/tokens/*" in json.dumps(_policy_statements(template, "ExecutionRole"))


def test_app_without_notifications_has_no_topic_output():
    _, template = _app_template({"notifications": False})
    assert "NotificationTopicArn" not in template.find_outputs("*")
    template.resource_count_is("AWS::SNS::Topic", 0)


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"removal_policy": cdk.RemovalPolicy.SNAPSHOT}, "removal_policy must be RETAIN or DESTROY"),
        ({"network_isolation": "yes"}, "network_isolation must be True or False"),
    ],
)
def test_bad_compliance_props_are_refused(props, message):
    with pytest.raises(ValueError, match=f"TrainingWorkflow: {message}"):
        build_workflow(cdk.App(), **props)


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"remote_debug": True, "network_isolation": True}, "remote_debug needs the network"),
        ({"remote_debug": "yes"}, "remote_debug must be True or False"),
        ({"max_keep_alive_seconds": 21601}, r"max_keep_alive_seconds must be an integer in \[0, 21600\]"),
        ({"max_keep_alive_seconds": -1}, r"max_keep_alive_seconds must be an integer in \[0, 21600\]"),
    ],
)
def test_bad_warm_pool_and_remote_debug_props_are_refused(props, message):
    with pytest.raises(ValueError, match=f"TrainingWorkflow: {message}"):
        build_workflow(cdk.App(), **props)


def _remote_debug_statements(template: Template) -> list[dict]:
    return [
        s
        for p in template.find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if "ssmmessages" in json.dumps(s["Action"])
    ]


def test_remote_debug_grants_exactly_the_four_ssmmessages_actions_and_nothing_when_off(plain):
    assert _remote_debug_statements(plain[1]) == []
    result = synth_with_nag(lambda app: build_workflow(app, remote_debug=True))
    assert result.violations == ()
    template = Template.from_json(result.templates["Test.template.json"])
    (statement,) = _remote_debug_statements(template)
    assert sorted(statement["Action"]) == [
        "ssmmessages:CreateControlChannel",
        "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel",
    ]
    (policy,) = [
        p
        for p in template.find_resources("AWS::IAM::Policy").values()
        if "ssmmessages" in json.dumps(p["Properties"]["PolicyDocument"])
    ]
    assert json.dumps(policy["Properties"]["Roles"]).count("ExecutionRole") == 1  # the jobs' role only
    rules = RequestRules.from_json(
        definition_of(result.templates["Test.template.json"])["States"]["Decide request"]["Parameters"][
            "Payload"
        ]["rules"]
    )
    assert rules.remote_debug is True and rules.max_keep_alive_seconds == 3600


def _workflow_definition(stack, template: Template) -> dict:
    return definitions_of(template.to_json())[logical_id(stack.workflow.state_machine)]


def test_app_data_key_encrypts_the_job_output_and_settings_reach_the_rules():
    stack, template = _app_template({"useKms": True, "maxKeepAliveSeconds": 900, "remoteDebug": True})
    definition = _workflow_definition(stack, template)
    params = definition["States"]["Run training job"]["Parameters"]
    assert params["OutputDataConfig"]["KmsKeyId"].startswith("arn:aws:kms:")
    assert "VolumeKmsKeyId" not in definition["States"]["On-demand capacity"]["Parameters"]["resource_config"]
    rules = stack.workflow.request_rules
    assert (rules.max_keep_alive_seconds, rules.remote_debug) == (900, True)
    plain_stack, plain_template = _app_template({})
    plain_params = _workflow_definition(plain_stack, plain_template)["States"]["Run training job"][
        "Parameters"
    ]
    assert "KmsKeyId" not in plain_params["OutputDataConfig"]


def test_defaults_for_the_new_fields_are_checked_at_synth_and_reach_the_rules():
    workflow = build_workflow(
        cdk.App(),
        defaults=WorkflowDefaults(
            keep_alive_seconds=900, infra_check=True, environment={"NCCL_DEBUG": "WARN"}
        ),
    )
    assert workflow.request_rules.defaults["keep_alive_seconds"] == 900
    assert workflow.request_rules.defaults["environment"] == {"NCCL_DEBUG": "WARN"}
    with pytest.raises(ValueError, match=r"TrainingWorkflow: defaults.environment.PATH: name must start"):
        build_workflow(cdk.App(), defaults=WorkflowDefaults(environment={"PATH": "/x"}))
    with pytest.raises(ValueError, match=r"defaults.keep_alive_seconds: must be an integer in \[0, 60\]"):
        build_workflow(cdk.App(), max_keep_alive_seconds=60, defaults=WorkflowDefaults(keep_alive_seconds=61))
