"""``launch_request`` is one source: a field added to the deployed workflow's launch template (fixed or taken from
the state) reaches the rendered request with no code of its own, and a state it cannot evaluate is refused."""

from __future__ import annotations

import copy

import aws_cdk as cdk
import pytest
from aws_cdk import assertions

from constructs_lib.workflow.launch_request import execution_context, launch_request
from constructs_lib.workflow.request_check import decide
from tests.workflow.harness import definition_of
from tests.workflow.stacks import build_workflow
from training.request.rules import RequestRules


@pytest.fixture(scope="module")
def definition() -> dict:
    app = cdk.App()
    build_workflow(app)
    return definition_of(assertions.Template.from_stack(app.node.find_child("Test")).to_json())


def _launch_states(definition: dict) -> list[dict]:
    return [
        s
        for s in definition["States"].values()
        if str(s.get("Resource", "")).startswith("arn:aws:states:::sagemaker:createTrainingJob")
    ]


def _render(definition: dict, execution_input: dict) -> dict:
    """The request the launch state renders for ``execution_input``, decided against the workflow's bucket (in moto,
    empty: the request check lists this run's folder before a launch)."""
    import boto3
    from moto import mock_aws

    rules = RequestRules.from_state_machine_definition(definition)
    event = {"input": execution_input, "rules": rules.to_json(), "execution": "run-1"}
    with mock_aws():
        s3 = boto3.client("s3", region_name=rules.region)
        s3.create_bucket(
            Bucket=rules.bucket_name, CreateBucketConfiguration={"LocationConstraint": rules.region}
        )
        decided = decide(event, s3=s3)
    context = execution_context(name="run-1", execution_input=execution_input)
    return launch_request(definition, decided, context)


def test_a_field_added_to_the_template_reaches_the_rendered_request_without_code(definition):
    changed = copy.deepcopy(definition)
    launches = _launch_states(changed)
    assert launches
    for state in launches:
        state["Parameters"]["ExperimentConfig"] = {"TrialComponentDisplayName": "fixed"}
        state["Parameters"]["SessionChainingConfig"] = {"EnableSessionTagChaining.$": "$.launch.spot"}
    before = _render(definition, {"instance_count": 2})
    after = _render(changed, {"instance_count": 2})
    assert after.pop("ExperimentConfig") == {"TrialComponentDisplayName": "fixed"}
    assert after.pop("SessionChainingConfig") == {"EnableSessionTagChaining": False}
    before.pop("TrainingJobName"), after.pop("TrainingJobName")  # a UUID each
    assert after == before


def test_a_state_the_evaluator_cannot_follow_is_refused_by_name(definition):
    changed = copy.deepcopy(definition)
    for state in _launch_states(changed):
        state["Parameters"]["Odd.$"] = "States.Hash($.config.instance_type, 'SHA-256')"
    with pytest.raises(ValueError, match="cannot render the deployed workflow's CreateTrainingJob request"):
        _render(changed, {})
