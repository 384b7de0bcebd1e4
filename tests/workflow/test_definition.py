"""The synthesized definition itself: valid ASL (asl-validator), JSONPath only, shape and retry policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from constructs_lib.training_workflow import (
    CREATE_TRAINING_JOB_SYNC,
    TRANSIENT_SAGEMAKER_ERRORS,
    WorkflowDefaults,
)
from tests.cdk_helpers import synth_with_nag
from tests.conftest import ROOT
from tests.workflow.harness import definition_of
from tests.workflow.stacks import build_workflow
from training.contract import GPU_INSTANCE_TYPES, PRECISIONS, instance_types_supporting

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


def test_one_launch_state_with_sync_integration_retry_and_catch(definition):
    launches = [s for s in _states(definition).values() if s.get("Resource") == CREATE_TRAINING_JOB_SYNC]
    assert len(launches) == 1
    (launch,) = launches
    (retry,) = launch["Retry"]
    assert retry["ErrorEquals"] == list(TRANSIENT_SAGEMAKER_ERRORS)
    assert retry["BackoffRate"] == 2 and retry["MaxAttempts"] == 5 and retry["JitterStrategy"] == "FULL"
    assert [c["ErrorEquals"] for c in launch["Catch"]] == [["States.TaskFailed"], ["States.ALL"]]
    assert launch["Parameters"]["TrainingJobName.$"] == (
        "States.Format('{}-{}', $.config.job_name_prefix, States.UUID())"
    )


def test_every_input_check_ends_in_invalid_input(definition):
    fails = {name: s for name, s in _states(definition).items() if s["Type"] == "Fail"}
    invalid = {name for name, s in fails.items() if s.get("Error") == "InvalidInput"}
    assert invalid == {name for name in fails if name.startswith("Invalid ")}
    assert {s.get("Error") for name, s in fails.items() if name not in invalid} == {
        "LaunchFailed",
        "TrainingJobFailed",
        "CapacityError",
    }


def test_precision_rules_come_from_the_contract(definition):
    choice = _states(definition)["Check precision on instance_type"]
    guarded = {rule.get("StringEquals") or rule["And"][0]["StringEquals"] for rule in choice["Choices"]}
    expected = {
        p for p in PRECISIONS if set(instance_types_supporting(p)) != set(definition_instance_types())
    }
    assert guarded == expected


def definition_instance_types():

    return set(GPU_INSTANCE_TYPES)


def test_no_sagemaker_state_is_reachable_without_passing_every_check(definition):
    """Walk the graph from StartAt: every path to the launch state passes every 'Check <field>' state."""
    states = _states(definition)
    launch = next(n for n, s in states.items() if s.get("Resource") == CREATE_TRAINING_JOB_SYNC)
    checks = {n for n in states if n.startswith("Check ") and " " not in n[len("Check ") :]}

    def successors(name):
        s = states[name]
        nxt = [s["Next"]] if "Next" in s else []
        nxt += [c["Next"] for c in s.get("Choices", [])]
        nxt += [s["Default"]] if "Default" in s else []
        return nxt

    def paths(name, seen):
        if name == launch:
            yield seen
            return
        for n in successors(name):
            if n not in seen and states[n]["Type"] != "Fail":
                yield from paths(n, seen | {n})

    found = 0
    for seen in paths(definition["StartAt"], frozenset({definition["StartAt"]})):
        found += 1
        assert checks <= seen
    assert found >= 3  # one per capacity mode at least


def test_timeout_bounds_every_execution(definition):
    assert definition["TimeoutSeconds"] == 7 * 86400


def test_state_names_fit_asl_limits(definition):
    assert all(len(name) <= 80 for name in _states(definition))
    assert len(_states(definition)) < 120


def test_hopper_only_workflow_rejects_blackwell_precisions_outright():
    """With no allowed instance able to run mxfp8/nvfp4, the rule is the precision alone."""
    result = synth_with_nag(
        lambda app: build_workflow(
            app,
            allowed_instance_types=["ml.p5.48xlarge", "ml.p5en.48xlarge"],
            defaults=WorkflowDefaults(instance_type="ml.p5.48xlarge"),
        )
    )
    assert result.violations == ()
    choice = definition_of(result.templates["Test.template.json"])["States"][
        "Check precision on instance_type"
    ]
    assert choice["Choices"] == [
        {
            "Variable": "$.config.precision",
            "StringEquals": precision,
            "Next": f"Invalid precision {precision} for instance_type",
        }
        for precision in ("mxfp8", "nvfp4")
    ]
