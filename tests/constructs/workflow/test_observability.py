"""The notification the workflow sends when an execution ends: readable text, rendered here by moto's EventBridge
input transformer from events shaped like Step Functions' ``Execution Status Change`` events."""

from __future__ import annotations

import json
import re

import aws_cdk as cdk
import pytest
from aws_cdk import assertions

from tests.workflow.stacks import build_workflow

ARN = "arn:aws:states:us-west-2:123456789012:execution:wf:run-7"
CONSOLE = f"https://console.aws.amazon.com/states/home?region=us-west-2#/v2/executions/details/{ARN}"


@pytest.fixture(scope="module")
def transformer():
    app = cdk.App()
    build_workflow(app, notifications=True)
    template = assertions.Template.from_stack(app.node.find_child("Test"))
    rules = template.find_resources(
        "AWS::Events::Rule", {"Properties": {"Description": assertions.Match.string_like_regexp("ends")}}
    )
    ((_, rule),) = rules.items()
    (target,) = rule["Properties"]["Targets"]
    return target["InputTransformer"]


def _event(status: str, **detail) -> dict:
    return {
        "version": "0",
        "id": "0d3a7ae9-1d4e-4a6b-9f33-1f2a3b4c5d6e",
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": "123456789012",
        "time": "2026-11-23T09:00:00Z",
        "region": "us-west-2",
        "resources": [ARN],
        "ingestion-time": "2026-11-23T09:00:01Z",
        "detail": {
            "executionArn": ARN,
            "stateMachineArn": "arn:aws:states:us-west-2:123456789012:stateMachine:wf",
            "name": "run-7",
            "status": status,
            "input": "{}",
            "output": None,
            "error": None,
            "cause": None,
            **detail,
        },
    }


def _render(transformer, event) -> dict:
    """The input EventBridge would deliver, by its documented rules: a placeholder that is a whole JSON value
    becomes the value as JSON; one inside a string becomes the value's text, not escaped. (moto's own transformer
    quotes no string values, so it cannot render this template.)"""
    values = {}
    for key, path in transformer["InputPathsMap"].items():
        node = event
        for part in path.removeprefix("$.").split("."):
            node = node[part]
        values[key] = node
    template = re.sub(
        r"(?<=:)<([A-Za-z0-9_-]+)>(?=[,}])",
        lambda m: json.dumps(values[m.group(1)]),
        transformer["InputTemplate"],
    )
    template = re.sub(r"<([A-Za-z0-9_-]+)>", lambda m: str(values[m.group(1)]), template)
    return json.loads(template)


def test_a_failure_names_the_run_status_reason_and_console_link(transformer):
    cause = 'Training job run-7-abc ended Failed: AlgorithmError: "CUDA out of memory" at step 12'
    message = _render(transformer, _event("FAILED", error="TrainingJobFailed", cause=cause))
    assert message == {
        "message": "Training run run-7 ended: FAILED",
        "run": "run-7",
        "status": "FAILED",
        "error": "TrainingJobFailed",
        "cause": cause,  # quotes and all: it is a JSON value of its own
        "summary": None,
        "console": CONSOLE,
        "details": "blackwell-training result run-7",
    }


def test_a_success_carries_the_summary_with_metrics_and_links(transformer):
    summary = json.dumps(
        {
            "job_name": "run-7-abc",
            "final_metrics": [{"MetricName": "final:loss", "Value": 1.9}],
            "links": {
                "training_job": "https://console.aws.amazon.com/sagemaker/home?region=us-west-2#/jobs/run-7-abc"
            },
        }
    )
    message = _render(transformer, _event("SUCCEEDED", output=summary))
    assert message["message"] == "Training run run-7 ended: SUCCEEDED"
    assert json.loads(message["summary"])["final_metrics"] == [{"MetricName": "final:loss", "Value": 1.9}]
    assert message["console"] == CONSOLE and message["error"] is None


def test_only_quote_free_fields_are_spliced_into_text(transformer):
    text_only = re.sub(r"(?<=:)<[A-Za-z0-9_-]+>(?=[,}])", "null", transformer["InputTemplate"])
    in_strings = set(re.findall(r"<([A-Za-z0-9_-]+)>", text_only))
    assert in_strings  # the headline, the console link and the command
    paths = {transformer["InputPathsMap"][key] for key in in_strings}
    assert paths <= {"$.detail.name", "$.detail.status", "$.region", "$.detail.executionArn"}
