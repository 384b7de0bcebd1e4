"""Executions of the real synthesized workflow in moto (ASL engine + a test-only SageMaker .sync adapter).

One synthesis and one moto state machine per module; each test uses its own job-name prefix, so outcomes and
recorded ``CreateTrainingJob`` requests never mix.
"""

from __future__ import annotations

import json
import uuid

import aws_cdk as cdk
import pytest
from aws_cdk import aws_events as events
from moto.events.models import EventPattern

from constructs_lib._shared.console_links import run_links
from constructs_lib._shared.nag import logical_id
from tests.cdk_helpers import synth_with_nag
from tests.workflow.harness import (
    ACCOUNT,
    OUTCOMES,
    REGION,
    TRAINING_PLANS,
    Outcome,
    capacity_error,
    definition_of,
    moto_workflow,
)
from tests.workflow.stacks import build_workflow
from training.contract.container import CHECKPOINT_LOCAL_PATH, MODEL_DIR
from training.contract.hardware import DEFAULT_INSTANCE_TYPE
from training.contract.metric_lines import metric_definitions
from training.plan.estimate import make_plan
from training.request.decision import validate_request
from training.request.rules import RequestRules

MAX_CAPACITY_RETRIES = 2
PLAN_ARN = f"arn:aws:sagemaker:{REGION}:012345678901:training-plan/b200-week"
GOV_PLAN_ARN = f"arn:aws-us-gov:sagemaker:{REGION}:000000000000:training-plan/x"
TRAINING_PLANS.add(
    GOV_PLAN_ARN, DEFAULT_INSTANCE_TYPE, 1
)  # the request check describes every plan it is given
TRIGGER_PATTERN = {"source": ["blackwell-training"], "detail-type": ["Start training job"]}


@pytest.fixture(scope="module")
def synthesized():
    holder = {}

    def build(app: cdk.App) -> None:
        holder["workflow"] = build_workflow(
            app,
            max_capacity_retries=MAX_CAPACITY_RETRIES,
            capacity_retry_wait=cdk.Duration.seconds(1),
            notifications=True,
            event_pattern=events.EventPattern(
                source=TRIGGER_PATTERN["source"], detail_type=TRIGGER_PATTERN["detail-type"]
            ),
        )

    result = synth_with_nag(build)
    assert result.violations == ()
    return holder["workflow"], result.templates["Test.template.json"]


@pytest.fixture(scope="module")
def workflow(synthesized):
    _, template = synthesized
    with moto_workflow(definition_of(template)) as wf:
        # the workflow's bucket, as deployed: the request check lists a new run's checkpoint folder there
        bucket = "fake-" + logical_id(synthesized[0].bucket).lower()
        wf.s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        yield wf


@pytest.fixture(scope="module")
def rules(workflow):
    """The rules the deployed state machine hands its Lambda function (names resolved)."""
    return RequestRules.from_json(
        workflow.definition["States"]["Decide request"]["Parameters"]["Payload"]["rules"]
    )


def _prefix() -> str:
    return "t" + uuid.uuid4().hex[:12]


def _run(workflow, execution_input: dict, name: str | None = None) -> dict:
    result = workflow.run(execution_input, name)
    if result.get("output"):
        result["summary"] = json.loads(result["output"])
    return result


# ---- happy paths, one per capacity mode ---------------------------------------------------------------------


def test_on_demand_defaults_create_the_expected_request(workflow, synthesized):
    prefix = _prefix()
    name = f"exec-{prefix}"
    result = _run(workflow, {"job_name_prefix": prefix}, name)
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    bucket = "fake-" + logical_id(synthesized[0].bucket).lower()

    assert request["TrainingJobName"].startswith(f"{prefix}-") and len(request["TrainingJobName"]) <= 63
    assert request["RoleArn"].startswith(f"arn:aws:iam::{ACCOUNT}:role/fake-executionrole")
    spec = request["AlgorithmSpecification"]
    assert (
        spec["TrainingImage"].endswith(":v1") and ".dkr.ecr.us-west-2.amazonaws.com/" in spec["TrainingImage"]
    )
    assert spec["TrainingInputMode"] == "File"
    assert spec["EnableSageMakerMetricsTimeSeries"] is True
    assert spec["MetricDefinitions"] == [m.as_sagemaker() for m in metric_definitions()]
    assert request["HyperParameters"] == {
        "precision": "bf16",
        "batch_size": "1",
        "seq_length": "8192",
        "activation_checkpointing": "none",
        "checkpoint_dir": CHECKPOINT_LOCAL_PATH,
        "model_dir": MODEL_DIR,
    }
    assert request["ResourceConfig"] == {
        "InstanceType": DEFAULT_INSTANCE_TYPE,
        "InstanceCount": 1,
        "VolumeSizeInGB": 512,
        "KeepAlivePeriodInSeconds": 0,
    }
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400}
    assert request["EnableManagedSpotTraining"] is False
    assert request["EnableInterContainerTrafficEncryption"] is False
    assert request["CheckpointConfig"] == {
        "S3Uri": f"s3://{bucket}/checkpoints/Test-Workflow/{name}/",
        "LocalPath": CHECKPOINT_LOCAL_PATH,
    }
    assert request["OutputDataConfig"] == {"S3OutputPath": f"s3://{bucket}/output/"}
    assert request["RetryStrategy"] == {"MaximumRetryAttempts": 2}
    assert {t["Key"]: t["Value"] for t in request["Tags"]} == {
        "training-workflow": "Test/Workflow",
        "training-workflow-execution": name,
    }
    assert "VpcConfig" not in request and "InputDataConfig" not in request
    assert request["Environment"] == {}
    assert request["InfraCheckConfig"] == {"EnableInfraCheck": False}
    assert request["RemoteDebugConfig"] == {"EnableRemoteDebug": False}

    summary = result["summary"]
    assert summary == {
        "job_name": request["TrainingJobName"],
        "status": "Completed",
        "training_seconds": 3600,
        "billable_seconds": 3600,
        "model_artifacts": f"s3://{bucket}/output/{request['TrainingJobName']}/output/model.tar.gz",
        "hugging_face_model": {
            "archive": f"s3://{bucket}/output/{request['TrainingJobName']}/output/model.tar.gz",
            "folder": "hf/",
        },
        "checkpoint_uri": f"s3://{bucket}/checkpoints/Test-Workflow/{name}/",
        "final_metrics": summary["final_metrics"],
        "image_uri": spec["TrainingImage"],
        "instance_type": DEFAULT_INSTANCE_TYPE,
        "instance_count": 1,
        "launches": 1,
        "resumed_from": None,
        "plan": summary["plan"],
        "memory_estimate_ignored": False,
        "links": run_links(
            partition="aws",
            region=REGION,
            execution_arn=result["executionArn"],
            job=request["TrainingJobName"],
        ),
        "evaluation": None,  # none asked for
    }
    assert [m["MetricName"] for m in summary["final_metrics"]] == ["train:progress"]  # moto's canned metric
    assert summary["plan"] == {**make_plan({}).to_dict(), "ignored": False}  # the defaults' plan, as launched


def test_training_plan_request(workflow):
    TRAINING_PLANS.add(PLAN_ARN, DEFAULT_INSTANCE_TYPE, 2)
    prefix = _prefix()
    result = _run(
        workflow,
        {"job_name_prefix": prefix, "training_plan_arn": PLAN_ARN, "instance_count": 2, "precision": "mxfp8"},
    )
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    assert request["ResourceConfig"] == {
        "InstanceType": DEFAULT_INSTANCE_TYPE,
        "InstanceCount": 2,
        "VolumeSizeInGB": 512,
        "TrainingPlanArn": PLAN_ARN,
        "KeepAlivePeriodInSeconds": 0,
    }
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400, "MaxPendingTimeInSeconds": 172800}
    assert request["EnableManagedSpotTraining"] is False
    assert request["EnableInterContainerTrafficEncryption"] is True
    assert request["HyperParameters"]["precision"] == "mxfp8"


@pytest.mark.parametrize(
    "plan, asked, cause",
    [
        (
            (DEFAULT_INSTANCE_TYPE, 2, "Active"),
            {"instance_count": 4},
            "instance_count: the training plan {name} reserves at most 2 x ml.p6-b200.48xlarge at once (its largest "
            "reserved capacity of that type); must be at most 2; got 4",
        ),
        (
            ("ml.p5.48xlarge", 4, "Scheduled"),
            {"instance_count": 2},
            "instance_type: the training plan {name} reserves 4 x ml.p5.48xlarge, no ml.p6-b200.48xlarge (SageMaker "
            'runs a job in a plan only on the plan\'s instance type); got "ml.p6-b200.48xlarge"',
        ),
        (
            (DEFAULT_INSTANCE_TYPE, 4, "Expired"),
            {},
            "training_plan_arn: the training plan {name} is Expired; a job in it would never start; name a Scheduled "
            "or Active plan",
        ),
        (None, {}, 'training_plan_arn: no training plan {name} in this account and region; got "{arn}"'),
    ],
    ids=["too-few-instances", "another-instance-type", "expired", "no-such-plan"],
)
def test_a_training_plan_that_cannot_hold_the_job_is_refused_before_launch(workflow, plan, asked, cause):
    """The request check describes the plan (DescribeTrainingPlan): the job would wait in it forever, or fail."""
    name = f"plan-{uuid.uuid4().hex[:8]}"
    arn = PLAN_ARN.replace("b200-week", name)
    if plan is not None:
        instance_type, count, status = plan
        TRAINING_PLANS.add(arn, instance_type, count, status=status)
    prefix = _prefix()
    result = _run(workflow, {"job_name_prefix": prefix, "training_plan_arn": arn, **asked})
    assert (result["status"], result["error"]) == ("FAILED", "InvalidInput"), result
    assert result["cause"] == cause.format(name=name, arn=arn)
    assert OUTCOMES.requests[prefix] == []  # nothing launched


def test_managed_spot_request_defaults_max_wait_to_the_runtime(workflow):
    prefix = _prefix()
    result = _run(workflow, {"job_name_prefix": prefix, "use_spot": True, "max_runtime_seconds": 7200})
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 7200}
    assert "TrainingPlanArn" not in request["ResourceConfig"]
    assert "KeepAlivePeriodInSeconds" not in request["ResourceConfig"]  # no warm pool with spot


def test_managed_spot_request_with_max_wait(workflow):
    prefix = _prefix()
    result = _run(
        workflow,
        {"job_name_prefix": prefix, "use_spot": True, "max_runtime_seconds": 3600, "max_wait_seconds": 10800},
    )
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 10800}


def test_every_field_reaches_the_request_as_strings(workflow):
    prefix = _prefix()
    result = _run(
        workflow,
        {
            "job_name_prefix": prefix,
            "precision": "fp8",
            "num_layers": 32,
            "batch_size": 4,
            "seq_length": 4096,
            "activation_checkpointing": True,
            "instance_type": "ml.p5.48xlarge",
            "hyperparameters": {"max-steps": 50, "fp8_recipe": "current"},
        },
    )
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    assert request["HyperParameters"] == {
        "max_steps": "50",
        "fp8_recipe": "current",
        "precision": "fp8",
        "num_layers": "32",
        "batch_size": "4",
        "seq_length": "4096",
        "activation_checkpointing": "true",
        "checkpoint_dir": CHECKPOINT_LOCAL_PATH,
        "model_dir": MODEL_DIR,
    }
    assert request["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge"


def test_without_num_layers_the_model_preset_decides_the_depth(workflow):
    prefix = _prefix()
    result = _run(
        workflow, {"job_name_prefix": prefix, "num_layers": None, "hyperparameters": {"model_preset": "8b"}}
    )
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    assert "num_layers" not in request["HyperParameters"]
    assert request["HyperParameters"]["model_preset"] == "8b"
    # ... and the trainer then takes the preset's 32 layers.
    from training.contract.settings_parse import parse_hyperparameters

    assert parse_hyperparameters(request["HyperParameters"])["num_layers"] == 32


@pytest.mark.parametrize(
    "edge",
    [
        # 4096 sequences of 1M tokens cannot fit any GPU: the bounds themselves are what is tested here (one step
        # of them, about 60 h by the plan, within the workflow's longest time limit)
        {
            "num_layers": 1,
            "batch_size": 4096,
            "seq_length": 1_048_576,
            "ignore_memory_estimate": True,
            "max_runtime_seconds": 7 * 24 * 3600,
        },  # fmt: skip
        {"num_layers": 512, "seq_length": 8},
        {"max_runtime_seconds": 1, "seq_length": 8},  # one step of 8 tokens fits one second
        {"instance_count": 4},
        {"training_plan_arn": GOV_PLAN_ARN},
        {"use_spot": True, "max_runtime_seconds": 600, "max_wait_seconds": 600},
        {"precision": "fp16", "instance_type": "ml.p4d.24xlarge"},
        {"hyperparameters": {}},
        {"hyperparameters": {"max-steps": 10, "learning_rate": 0.001, "grad_clip": "0", "seed": " 7 "}},
    ],
    ids=lambda e: ",".join(e),
)
def test_boundary_values_are_accepted(workflow, edge):
    prefix = _prefix()
    result = _run(workflow, {"job_name_prefix": prefix, **edge})
    assert result["status"] == "SUCCEEDED", result.get("cause")
    assert len(OUTCOMES.requests[prefix]) == 1


def test_job_name_prefix_of_26_characters_gives_a_63_character_name(workflow):
    prefix = "A" + _prefix()[:12] + "-" * 2 + "b" * 11
    assert len(prefix) == 26
    result = _run(workflow, {"job_name_prefix": prefix})
    assert result["status"] == "SUCCEEDED", result
    assert len(result["summary"]["job_name"]) == 63


# ---- invalid input: InvalidInput, cause names the field, no SageMaker call ----------------------------------

INVALID = [
    ("precision", {"precision": "fp4"}),
    ("precision", {"precision": 8}),
    ("precision", {"precision": None}),
    ("num_layers", {"num_layers": 0}),
    ("num_layers", {"num_layers": 513}),
    ("num_layers", {"num_layers": 2.5}),
    ("num_layers", {"num_layers": "16"}),
    ("batch_size", {"batch_size": 4097}),
    ("batch_size", {"batch_size": True}),
    ("seq_length", {"seq_length": 4}),
    ("seq_length", {"seq_length": 1e20}),
    ("activation_checkpointing", {"activation_checkpointing": "true"}),
    ("instance_type", {"instance_type": "ml.p3.2xlarge"}),
    ("instance_type", {"instance_type": ["ml.p5.48xlarge"]}),
    ("instance_count", {"instance_count": 0}),
    ("instance_count", {"instance_count": 5}),
    ("training_plan_arn", {"training_plan_arn": 12}),
    ("training_plan_arn", {"training_plan_arn": "arn:aws:sagemaker:eu-west-1:012345678901:training-plan/x"}),
    ("training_plan_arn", {"training_plan_arn": "arn:aws:sagemaker:us-west-2:12345678901:training-plan/x"}),
    ("training_plan_arn", {"training_plan_arn": "arn:aws:sagemaker:us-west-2:0123456789012:training-plan/x"}),
    ("training_plan_arn", {"training_plan_arn": "arn:aws:sagemaker:us-west-2:01234567890a:training-plan/x"}),
    ("training_plan_arn", {"training_plan_arn": "arn:aws:sagemaker:us-west-2:012345678901:training-job/x"}),
    ("training_plan_arn", {"training_plan_arn": "arn:aws::sagemaker:us-west-2:012345678901:training-plan/x"}),
    ("training_plan_arn", {"training_plan_arn": "arn:awsX:sagemaker:us-west-2:012345678901:training-plan/x"}),
    ("training_plan_arn", {"training_plan_arn": "arn:aws:ec2:us-west-2:012345678901:training-plan/x"}),
    ("training_plan_arn", {"training_plan_arn": "xarn:aws:sagemaker:us-west-2:012345678901:training-plan/x"}),
    ("use_spot", {"use_spot": 1}),
    ("use_spot", {"use_spot": True, "training_plan_arn": PLAN_ARN}),
    ("max_runtime_seconds", {"max_runtime_seconds": 0}),
    ("max_runtime_seconds", {"max_runtime_seconds": 7 * 86400 + 1}),
    ("max_wait_seconds", {"max_wait_seconds": 7200}),
    ("max_wait_seconds", {"use_spot": True, "max_runtime_seconds": 7200, "max_wait_seconds": 3600}),
    ("max_wait_seconds", {"use_spot": True, "max_wait_seconds": "7200"}),
    ("hyperparameters", {"hyperparameters": ["max_steps=5"]}),
    ("hyperparameters", {"hyperparameters": "max_steps=5"}),
    ("hyperparameters", {"hyperparameters": None}),
    ("hyperparameters.max_steps", {"hyperparameters": {"max_steps": 0}}),
    ("hyperparameters", {"hyperparameters": {"a": "1", "seed": -1}}),
    ("hyperparameters.seed", {"hyperparameters": {"seed": -1}}),
    ("hyperparameters", {"hyperparameters": {"flag": True}}),
    ("hyperparameters", {"hyperparameters": {"flag": None}}),
    ("hyperparameters", {"hyperparameters": {"nested": {"a": "b"}}}),
    ("hyperparameters", {"hyperparameters": {"list": ["a"]}}),
    ("job_name_prefix", {"job_name_prefix": ""}),
    ("job_name_prefix", {"job_name_prefix": "-lead"}),
    ("job_name_prefix", {"job_name_prefix": "under_score"}),
    ("job_name_prefix", {"job_name_prefix": "dot.ted"}),
    ("job_name_prefix", {"job_name_prefix": "sp ace"}),
    ("job_name_prefix", {"job_name_prefix": 42}),
    ("precision", {"precision": "mxfp8", "instance_type": "ml.p5.48xlarge"}),
    ("precision", {"precision": "nvfp4", "instance_type": "ml.p4de.24xlarge"}),
    ("precision", {"precision": "fp8", "instance_type": "ml.p4d.24xlarge"}),
    ("precison", {"precison": "bf16"}),
    ("extra", {"extra": None}),
]


@pytest.mark.parametrize("field, bad", INVALID, ids=[f"{f}:{json.dumps(b)[:60]}" for f, b in INVALID])
def test_invalid_input_fails_before_any_sagemaker_call(workflow, rules, field, bad):
    before = len(workflow.sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"])
    result = _run(workflow, bad)
    assert result["status"] == "FAILED"
    assert result["error"] == "InvalidInput", result.get("cause")
    assert result["cause"].startswith(f"{field}: "), result["cause"]
    assert result["cause"] == "; ".join(validate_request(bad, rules))  # the operator's local check agrees
    after = len(workflow.sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"])
    assert after == before


def test_invalid_cause_says_what_is_allowed_and_what_was_given(workflow):
    result = _run(workflow, {"num_layers": 2.5})
    assert result["cause"] == "num_layers: must be an integer in [1, 512], or null; got 2.5"
    result = _run(workflow, {"precision": "mxfp8", "instance_type": "ml.p5.48xlarge"})
    assert result["cause"] == (
        "precision: mxfp8 cannot run on the GPUs of instance_type ml.p5.48xlarge; it needs one of "
        "ml.p6-b200.48xlarge, ml.p6-b300.48xlarge, ml.p6e-gb200.36xlarge"
    )


# ---- failures and capacity retries ----------------------------------------------------------------------------


def test_failed_job_surfaces_name_and_reason(workflow):
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome("Failed", "AlgorithmError: ExecuteUserScriptError: exit code 1"))
    result = _run(workflow, {"job_name_prefix": prefix})
    assert result["status"] == "FAILED"
    assert result["error"] == "TrainingJobFailed"
    (job,) = workflow.jobs(prefix)
    assert (
        result["cause"]
        == f"Training job {job} ended Failed: AlgorithmError: ExecuteUserScriptError: exit code 1"
    )
    assert len(OUTCOMES.requests[prefix]) == 1  # not retried


def test_stopped_job_without_reason_is_reported(workflow):
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome("Stopped"))
    result = _run(workflow, {"job_name_prefix": prefix})
    assert result["error"] == "TrainingJobFailed"
    assert result["cause"].endswith("ended Stopped: (SageMaker gave no FailureReason)")


def test_capacity_error_relaunches_with_a_new_name_and_the_same_checkpoints(workflow):
    prefix = _prefix()
    OUTCOMES.plan(prefix, capacity_error(1), capacity_error(2), Outcome())
    result = _run(workflow, {"job_name_prefix": prefix, "use_spot": True})
    assert result["status"] == "SUCCEEDED", result
    requests = OUTCOMES.requests[prefix]
    assert len(requests) == 3
    assert len({r["TrainingJobName"] for r in requests}) == 3
    assert len({r["CheckpointConfig"]["S3Uri"] for r in requests}) == 1
    assert all(r["EnableManagedSpotTraining"] for r in requests)
    assert result["summary"]["launches"] == 3
    assert result["summary"]["job_name"] == requests[-1]["TrainingJobName"]
    assert sorted(workflow.jobs(prefix)) == sorted(r["TrainingJobName"] for r in requests)


def test_several_instances_keep_checkpoints_in_s3_directly_across_relaunches(workflow, synthesized):
    """instance_count=2 decides S3-direct checkpoints: every launch (the first and the capacity relaunch) has no
    CheckpointConfig (SageMaker would copy the whole prefix to each instance at start) and gives the trainer the
    run's prefix itself as checkpoint_dir, the same prefix the folder backend's CheckpointConfig names; the summary
    names it too."""
    prefix = _prefix()
    name = f"exec-{prefix}"
    OUTCOMES.plan(prefix, capacity_error(1), Outcome())
    result = _run(workflow, {"job_name_prefix": prefix, "instance_count": 2, "use_spot": True}, name)
    assert result["status"] == "SUCCEEDED", result
    bucket = "fake-" + logical_id(synthesized[0].bucket).lower()
    run_prefix = f"s3://{bucket}/checkpoints/Test-Workflow/{name}/"
    requests = OUTCOMES.requests[prefix]
    assert len(requests) == 2 and len({r["TrainingJobName"] for r in requests}) == 2
    for request in requests:
        assert "CheckpointConfig" not in request
        assert request["HyperParameters"]["checkpoint_backend"] == "s3"
        assert request["HyperParameters"]["checkpoint_dir"] == run_prefix
        assert request["ResourceConfig"]["InstanceCount"] == 2
    assert result["summary"]["checkpoint_uri"] == run_prefix and result["summary"]["launches"] == 2


def test_one_instance_asking_for_s3_checkpoints_gets_them(workflow):
    """checkpoint_backend=s3 on one instance: S3 direct as asked (no CheckpointConfig); folder on two instances:
    SageMaker's CheckpointConfig and /opt/ml/checkpoints as asked."""
    prefix, other = _prefix(), _prefix()
    assert (
        _run(workflow, {"job_name_prefix": prefix, "hyperparameters": {"checkpoint_backend": "s3"}})["status"]
        == "SUCCEEDED"
    )
    (direct,) = OUTCOMES.requests[prefix]
    assert "CheckpointConfig" not in direct and direct["HyperParameters"]["checkpoint_dir"].startswith(
        "s3://"
    )
    folder_input = {
        "job_name_prefix": other,
        "instance_count": 2,
        "hyperparameters": {"checkpoint_backend": "folder"},
    }
    assert _run(workflow, folder_input)["status"] == "SUCCEEDED"
    (copied,) = OUTCOMES.requests[other]
    assert copied["CheckpointConfig"]["LocalPath"] == CHECKPOINT_LOCAL_PATH
    assert copied["HyperParameters"]["checkpoint_dir"] == CHECKPOINT_LOCAL_PATH


def test_capacity_error_gives_up_after_the_bound(workflow):
    prefix = _prefix()
    OUTCOMES.plan(prefix, capacity_error())
    result = _run(workflow, {"job_name_prefix": prefix})
    assert result["status"] == "FAILED"
    assert result["error"] == "CapacityError"
    launches = MAX_CAPACITY_RETRIES + 1
    assert len(OUTCOMES.requests[prefix]) == launches
    last = OUTCOMES.requests[prefix][-1]["TrainingJobName"]
    assert result["cause"].startswith(
        f"Gave up after {launches} launches without capacity; last job {last}: "
    )
    assert "CapacityError" in result["cause"]


# ---- EventBridge trigger ----------------------------------------------------------------------------------------


def test_eventbridge_trigger_delivers_detail_as_input(workflow, synthesized):
    """moto's EventBridge delivers to no Step Functions target, ignores InputPath, and has no TestEventPattern:
    match the rule's pattern with the matcher moto's PutEvents uses, check the target's InputPath, then start an
    execution with the event's detail as EventBridge would."""
    _, template = synthesized
    (rule,) = [
        r
        for r in template["Resources"].values()
        if r["Type"] == "AWS::Events::Rule"
        and r["Properties"]["EventPattern"].get("source") == ["blackwell-training"]
    ]
    (target,) = rule["Properties"]["Targets"]
    assert target["InputPath"] == "$.detail"
    prefix = _prefix()
    event = {
        "id": str(uuid.uuid4()),
        "account": ACCOUNT,
        "source": "blackwell-training",
        "detail-type": "Start training job",
        "time": "2026-11-22T00:00:00Z",
        "region": REGION,
        "resources": [],
        "detail": {"job_name_prefix": prefix, "precision": "mxfp8", "use_spot": True},
    }
    pattern = EventPattern.load(json.dumps(rule["Properties"]["EventPattern"]))
    assert pattern.matches_event(event)
    assert not pattern.matches_event({**event, "source": "someone-else"})
    assert not pattern.matches_event({**event, "detail-type": "Other"})

    result = _run(workflow, event["detail"])
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    assert request["HyperParameters"]["precision"] == "mxfp8"
    assert request["EnableManagedSpotTraining"] is True
