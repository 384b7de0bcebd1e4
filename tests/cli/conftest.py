"""A deployed stack in moto for the CLI tests: the real synthesized workflow executing in moto's ASL engine (the
workflow tests' harness), its stack outputs in moto's CloudFormation, SageMaker jobs in moto, and CloudWatch Logs
that the tests fill with lines in the trainer's real format (the contract's formatters)."""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aws_cdk as cdk
import boto3
import pytest
from moto.sagemaker.models import sagemaker_backends

from constructs_lib.cli.job_logs import LOG_GROUP
from constructs_lib.cli.main import main
from tests.cdk_helpers import synth_with_nag
from tests.workflow.harness import ACCOUNT, OUTCOMES, REGION, Outcome, definition_of, moto_workflow
from tests.workflow.stacks import build_workflow
from training.request.rules import RequestRules

STACK = "CliTest"
DEPLOYED_MAX_INSTANCE_COUNT = 2
DEPLOYED_DATA_SOURCES = ("corpus/",)
"""The workflow in moto is deployed with settings other than cdk.json's defaults (4 instances, ``data/``), so the
tests tell the deployed workflow's rules from the offline ones."""


@pytest.fixture(scope="module")
def template():
    def build(app: cdk.App) -> None:
        build_workflow(
            app,
            max_capacity_retries=1,
            capacity_retry_wait=cdk.Duration.seconds(1),
            max_instance_count=DEPLOYED_MAX_INSTANCE_COUNT,
            data_sources=list(DEPLOYED_DATA_SOURCES),
            remote_debug=True,
        )

    result = synth_with_nag(build)
    return result.templates["Test.template.json"]


@pytest.fixture(scope="module")
def deployed(template, tmp_path_factory):
    """moto with the workflow and a stack whose outputs name it; the working directory holds a cdk.json naming
    that stack and region."""
    definition = definition_of(template)
    rules = RequestRules.from_state_machine_definition(definition)
    with moto_workflow(definition) as workflow:
        stack_template = {  # the workflow's own bucket (the one its rules name)
            "Resources": {
                "Checkpoints": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": rules.bucket_name}}
            },
            "Outputs": {
                "StateMachineArn": {"Value": workflow.arn},
                "CheckpointBucketName": {"Value": {"Ref": "Checkpoints"}},
            },
        }
        cloudformation = boto3.client("cloudformation", region_name=REGION)
        cloudformation.create_stack(StackName=STACK, TemplateBody=json.dumps(stack_template))
        logs = boto3.client("logs", region_name=REGION)
        logs.create_log_group(logGroupName=LOG_GROUP)
        project = tmp_path_factory.mktemp("project")
        (project / "cdk.json").write_text(json.dumps({"context": {"stackName": STACK, "region": REGION}}))
        yield Deployment(workflow, logs, project, rules)


@pytest.fixture
def cli(deployed, monkeypatch, capsys):
    """Run ``blackwell-training`` in the project folder; returns (exit status, stdout, stderr)."""
    monkeypatch.chdir(deployed.project)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "300")  # rich tables at full width

    def run(
        *argv: str, stdin: str = "", tty: bool = False, sleep: Callable[[float], None] | None = None
    ) -> Result:
        capsys.readouterr()
        source = Terminal(stdin) if tty else io.StringIO(stdin)
        status = main(list(argv), stdin=source, sleep=sleep or (lambda _s: time.sleep(0.05)))
        out, err = capsys.readouterr()
        return Result(status, out, err)

    return run


class Terminal(io.StringIO):
    """Standard input that says it is a terminal (for the confirmation prompt)."""

    def isatty(self) -> bool:
        return True


@dataclass
class Result:
    status: int
    out: str
    err: str


@dataclass
class Deployment:
    workflow: Any
    logs: Any
    project: Any
    rules: RequestRules
    streams: set[str] = field(default_factory=set)

    def prefix(self) -> str:
        return "c" + uuid.uuid4().hex[:12]

    def plan(self, prefix: str, *outcomes: Outcome) -> None:
        OUTCOMES.plan(prefix, *outcomes)

    def wait_for_job(self, prefix: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.workflow.jobs(prefix)
            if jobs:
                return sorted(jobs)[-1]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no job {prefix}-* after {timeout} s")
            time.sleep(0.05)

    def log(self, job: str, host: str, *lines: str) -> None:
        """Lines as the job's host ``host`` would have written them to CloudWatch Logs."""
        stream = f"{job}/{host}-1763887200"
        if stream not in self.streams:
            self.logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            self.streams.add(stream)
        now = int(time.time() * 1000)
        self.logs.put_log_events(
            logGroupName=LOG_GROUP,
            logStreamName=stream,
            logEvents=[{"timestamp": now + i, "message": line} for i, line in enumerate(lines)],
        )

    def finish(
        self, job: str, status: str = "Completed", *, seconds: int = 1800, reason: str | None = None
    ) -> None:
        """End the moto job as SageMaker would (the workflow's .sync poll then sees it)."""
        record = sagemaker_backends[ACCOUNT][REGION].training_jobs[job]
        record.training_job_status = status
        record.secondary_status = status
        record.training_time_in_seconds = seconds
        record.billable_time_in_seconds = seconds
        if reason is not None:
            record.failure_reason = reason

    @property
    def bucket(self) -> str:
        return str(self.rules.bucket_name)

    def executions(self) -> list[str]:
        listed = self.workflow.sfn.list_executions(stateMachineArn=self.workflow.arn, maxResults=1000)
        return [e["name"] for e in listed["executions"]]

    def execution(self, name: str) -> dict[str, Any]:
        arn = self.workflow.arn.replace(":stateMachine:", ":execution:") + f":{name}"
        return self.workflow.sfn.describe_execution(executionArn=arn)

    def wait_until_ended(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        arn = self.workflow.arn.replace(":stateMachine:", ":execution:") + f":{name}"
        return self.workflow.wait(arn, timeout)
