"""The synthesized definition itself: valid ASL (asl-validator), JSONPath only, shape and retry policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from constructs_lib.workflow import launch_retry
from constructs_lib.workflow.construct import CREATE_TRAINING_JOB_SYNC
from constructs_lib.workflow.defaults import WorkflowDefaults
from tests.cdk_helpers import synth_with_nag
from tests.conftest import ROOT
from tests.workflow.harness import definition_of
from tests.workflow.stacks import build_workflow
from training.request.decision import validate_request
from training.request.rules import RequestRules

VALIDATOR = ROOT / "node_modules" / "asl-validator" / "dist" / "bin" / "asl-validator.js"
NODE = Path(sys.executable).parent / "node"


@pytest.fixture(scope="module")
def definition():
    result = synth_with_nag(lambda app: build_workflow(app))
    assert result.violations == ()
    return definition_of(result.templates["Test.template.json"])


def test_asl_validator_accepts_the_resolved_definition(definition, tmp_path):
    if not VALIDATOR.exists() or not NODE.exists():
        pytest.skip("asl-validator or the venv's node is not installed (run make setup)")
    path = tmp_path / "definition.json"
    path.write_text(json.dumps(definition))
    run = subprocess.run(
        [str(NODE), str(VALIDATOR), "--json-path", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_jsonpath_only(definition):
    text = json.dumps(definition)
    assert definition.get("QueryLanguage", "JSONPath") == "JSONPath"
    assert "JSONata" not in text and "{%" not in text


def _states(definition):
    return definition["States"]


def test_two_launch_states_with_sync_integration_retry_and_catch(definition):
    """With and without InputDataConfig (SageMaker refuses an empty list); training has the same two again without
    CheckpointConfig, for S3-direct checkpoints, chosen by ``Checkpoint backend?``; the same retry and catch policy."""
    launches = {n: s for n, s in _states(definition).items() if s.get("Resource") == CREATE_TRAINING_JOB_SYNC}
    kinds = ("evaluation", "training", "tuning")
    s3_tails = (" (S3 checkpoints)", " (S3 checkpoints, no input data)")
    assert sorted(launches) == sorted(
        [f"Run {kind} job{tail}" for kind in kinds for tail in ("", " (no input data)")]
        + [f"Run training job{tail}" for tail in s3_tails]
    )
    for kind in kinds:
        assert launches[f"Run {kind} job"]["Parameters"]["InputDataConfig.$"] == "$.channels"
        assert "InputDataConfig" not in json.dumps(launches[f"Run {kind} job (no input data)"]["Parameters"])
    assert launches["Run training job"]["Parameters"]["CheckpointConfig"]
    for tail in s3_tails:
        parameters = launches[f"Run training job{tail}"]["Parameters"]
        assert "CheckpointConfig" not in parameters
        assert {k: v for k, v in parameters.items() if k != "InputDataConfig.$"} == {
            k: v for k, v in launches["Run training job"]["Parameters"].items()
            if k not in ("CheckpointConfig", "InputDataConfig.$")
        }  # fmt: skip
    backend = _states(definition)["Checkpoint backend?"]
    assert backend["Choices"] == [
        {"And": [{"Variable": "$.hyperparameters.checkpoint_backend", "IsPresent": True},
                 {"Variable": "$.hyperparameters.checkpoint_backend", "StringEquals": "s3"}],
         "Next": "Input data? (S3 checkpoints)"}
    ]  # fmt: skip
    assert backend["Default"] == "Input data?"
    for launch in launches.values():
        (retry,) = launch["Retry"]
        assert retry["ErrorEquals"] == list(launch_retry.QUOTA_ERRORS)
        assert retry["BackoffRate"] == 2 and retry["MaxAttempts"] == 5 and retry["JitterStrategy"] == "FULL"
        assert [c["ErrorEquals"] for c in launch["Catch"]] == [
            [launch_retry.API_ERROR],
            ["States.TaskFailed"],
            ["States.ALL"],
        ]
        assert launch["Parameters"]["TrainingJobName.$"] == (
            "States.Format('{}-{}', $.config.job_name_prefix, States.UUID())"
        )
        assert launch["Parameters"]["HyperParameters.$"] == "$.hyperparameters"


def test_a_refused_request_is_retried_only_when_throttled_or_a_server_error(definition):
    choice = _states(definition)["Retryable launch error?"]
    (rule,) = choice["Choices"]
    patterns = [c["StringMatches"] for c in rule["And"][0]["Or"]]
    assert patterns == list(launch_retry.RETRYABLE_CAUSES)
    assert not any("Validation" in p or "AccessDenied" in p for p in patterns)
    assert choice["Default"] == "Launch failed"


def test_failures_end_in_named_errors(definition):
    fails = {name: s for name, s in _states(definition).items() if s["Type"] == "Fail"}
    assert {s.get("Error") for s in fails.values()} == {
        "InvalidInput",
        "RequestValidationFailed",
        "LaunchFailed",
        "TrainingJobFailed",
        "EvaluationJobFailed",
        "TuningJobFailed",
        "CapacityError",
    }


def test_the_request_is_decided_first_with_the_workflows_rules(definition):
    first = _states(definition)[definition["StartAt"]]
    assert definition["StartAt"] == "Decide request"
    assert first["Resource"] == "arn:aws:states:::lambda:invoke"
    payload = first["Parameters"]["Payload"]
    assert payload["input.$"] == "$$.Execution.Input" and payload["execution.$"] == "$$.Execution.Name"
    rules = RequestRules.from_json(payload["rules"])
    assert rules.workflow_segment == "Test-Workflow" and rules.limits["TrainingJobName"]["max"] == 63
    assert first["Next"] == "Request valid?"


def test_no_sagemaker_state_is_reachable_without_a_valid_decision(definition):
    """Walk the graph from StartAt: every path to a launch state passes 'Request valid?' on its valid branch."""
    states = _states(definition)
    launches = {n for n, s in states.items() if s.get("Resource") == CREATE_TRAINING_JOB_SYNC}
    (valid_rule,) = states["Request valid?"]["Choices"]
    assert valid_rule == {"Variable": "$.valid", "BooleanEquals": True, "Next": "Train first?"}
    assert states["Request valid?"]["Default"] == "Invalid input"

    def successors(name):
        s = states[name]
        nxt = [s["Next"]] if "Next" in s else []
        nxt += [c["Next"] for c in s.get("Choices", [])]
        nxt += [s["Default"]] if "Default" in s else []
        return nxt

    def paths(name, seen):
        if name in launches:
            yield seen
            return
        for n in successors(name):
            if n not in seen and states[n]["Type"] != "Fail":
                yield from paths(n, seen | {n})

    found = 0
    for seen in paths(definition["StartAt"], frozenset({definition["StartAt"]})):
        found += 1
        prepared = {"Prepare launch", "Prepare evaluation", "Prepare launch (tuning)"}
        assert "Request valid?" in seen and prepared & seen
    assert found >= 6  # three capacity modes, one or several nodes


def test_training_and_evaluation_share_the_launch_loop_under_their_own_names(definition):
    """One launch loop, three kinds of job: every shared state exists once per kind (evaluation's and tuning's
    with a suffix); a tuning input goes to its own job before anything else."""
    states = _states(definition)
    for base in ("Input data?", "Capacity mode", "Count launch", "Wait for capacity", "Retryable launch error?",
                 "Normalize result", "Launch failed", "No capacity"):  # fmt: skip
        assert base in states and f"{base} (evaluation)" in states and f"{base} (tuning)" in states
    tuning = {"And": [{"Variable": "$.tune", "IsPresent": True}, {"Variable": "$.tune", "IsNull": False}]}
    assert states["Train first?"]["Choices"] == [
        {**tuning, "Next": "Prepare launch (tuning)"},
        {"Variable": "$.evaluation_only", "BooleanEquals": True, "Next": "Evaluate only"},
    ]
    assert states["Evaluate after training?"]["Choices"][0]["IsNull"] is True


def test_every_wait_state_waits_what_the_construct_was_given(definition):
    """The seconds of each Wait state (tests/workflow/harness.py runs them without waiting): ``capacity_retry_wait``
    (default 10 minutes) before a capacity relaunch, the execution's ``launch_backoff`` (from ``launch_retry_backoff``,
    doubled at each retry: test_requests.py) before a retried launch; nothing else waits."""
    waits = {name: state for name, state in _states(definition).items() if state["Type"] == "Wait"}
    for kind in ("", " (evaluation)", " (tuning)"):
        assert waits.pop(f"Wait for capacity{kind}")["Seconds"] == 600
        assert waits.pop(f"Back off before relaunch{kind}")["SecondsPath"] == "$.launch_backoff"
    assert waits == {}


def test_timeout_bounds_every_execution(definition):
    assert definition["TimeoutSeconds"] == 7 * 86400


def test_state_names_fit_asl_limits(definition):
    assert all(len(name) <= 80 for name in _states(definition))
    assert len(_states(definition)) < 150


def test_hopper_only_workflow_carries_its_instance_types_in_the_rules():
    result = synth_with_nag(
        lambda app: build_workflow(
            app,
            allowed_instance_types=["ml.p5.48xlarge", "ml.p5en.48xlarge"],
            defaults=WorkflowDefaults(instance_type="ml.p5.48xlarge"),
        )
    )
    assert result.violations == ()
    payload = definition_of(result.templates["Test.template.json"])["States"]["Decide request"]["Parameters"]
    rules = RequestRules.from_json(payload["Payload"]["rules"])
    assert rules.allowed_instance_types == ("ml.p5.48xlarge", "ml.p5en.48xlarge")
    assert validate_request({"precision": "mxfp8"}, rules) == [
        "precision: mxfp8 cannot run on the GPUs of instance_type ml.p5.48xlarge; it needs one of no allowed "
        "instance type"
    ]
