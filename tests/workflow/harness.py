"""Run the real synthesized training workflow in moto's ASL engine.

* :func:`resolve` turns the template's ``DefinitionString`` (``Fn::Join`` with ``Ref``/``GetAtt``/``Fn::Select``/
  ``Fn::Split``) into plain ASL JSON with plausible fake names and ARNs.
* :class:`SageMakerSync` is a test-only ``createTrainingJob.sync`` integration for moto 5.2.5 (pinned exactly:
  it subclasses moto internals): it records each request, creates the job in moto's SageMaker backend, gives the
  job the outcome the test asked for, then polls ``DescribeTrainingJob`` like Step Functions does; a job that ends
  ``Failed``/``Stopped`` fails the task with ``States.TaskFailed`` and the description as ``Cause``.
* :class:`Outcomes` lets a test choose job outcomes by job-name prefix (each test uses its own prefix, so tests
  can share one state machine and run executions concurrently).
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.sagemaker.models import sagemaker_backends
from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
    FailureEvent,
    FailureEventException,
)
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
    StatesErrorNameType,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task import state_task_factory
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.resource import ResourceCondition
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
    StateTaskServiceCallback,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_unsupported import (
    StateTaskServiceUnsupported,
)
from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from moto.stepfunctions.parser.asl.utils.boto_client import boto_client_for
from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

ACCOUNT = DEFAULT_ACCOUNT_ID
REGION = "us-west-2"
PARTITION = "aws"
TERMINAL_OK = {"Completed"}
TERMINAL_FAILED = {"Failed", "Stopped"}

# ----------------------------------------------------------------------------------------------------------------
# Template -> plain ASL
# ----------------------------------------------------------------------------------------------------------------

_PSEUDO = {
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::Partition": PARTITION,
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::StackName": "Test",
}


def _fake_name(logical_id: str) -> str:
    return f"fake-{logical_id.lower()}"


def _fake_arn(resource: dict[str, Any], logical_id: str) -> str:
    kind = resource["Type"]
    name = _fake_name(logical_id)
    prefix = f"arn:{PARTITION}"
    return {
        "AWS::IAM::Role": f"{prefix}:iam::{ACCOUNT}:role/{name}",
        "AWS::S3::Bucket": f"{prefix}:s3:::{name}",
        "AWS::ECR::Repository": f"{prefix}:ecr:{REGION}:{ACCOUNT}:repository/{name}",
        "AWS::KMS::Key": f"{prefix}:kms:{REGION}:{ACCOUNT}:key/00000000-0000-4000-8000-000000000000",
        "AWS::SNS::Topic": f"{prefix}:sns:{REGION}:{ACCOUNT}:{name}",
        "AWS::Logs::LogGroup": f"{prefix}:logs:{REGION}:{ACCOUNT}:log-group:{name}:*",
    }.get(kind, f"{prefix}:fake:{REGION}:{ACCOUNT}:{kind.split('::')[-1].lower()}/{name}")


def resolve(node: Any, resources: dict[str, Any]) -> Any:
    """Resolve CloudFormation intrinsics in ``node`` with fake but well-formed values."""
    if isinstance(node, list):
        return [resolve(item, resources) for item in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((fn, arg),) = node.items()
        if fn == "Ref":
            if arg in _PSEUDO:
                return _PSEUDO[arg]
            resource = resources[arg]
            return _fake_arn(resource, arg) if resource["Type"] == "AWS::SNS::Topic" else _fake_name(arg)
        if fn == "Fn::GetAtt":
            logical_id, attribute = arg
            if attribute == "Arn":
                return _fake_arn(resources[logical_id], logical_id)
            return f"{_fake_name(logical_id)}-{attribute.lower()}"
        if fn == "Fn::Join":
            separator, parts = arg
            return separator.join(str(resolve(part, resources)) for part in parts)
        if fn == "Fn::Select":
            index, items = arg
            return resolve(items, resources)[int(index)]
        if fn == "Fn::Split":
            separator, text = arg
            return str(resolve(text, resources)).split(separator)
    return {key: resolve(value, resources) for key, value in node.items()}


def definition_of(template: dict[str, Any]) -> dict[str, Any]:
    """The plain ASL of the template's only state machine."""
    resources = template["Resources"]
    (machine,) = [r for r in resources.values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    return json.loads(resolve(machine["Properties"]["DefinitionString"], resources))


# ----------------------------------------------------------------------------------------------------------------
# Job outcomes chosen by the test
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    status: str = "Completed"
    failure_reason: str | None = None
    training_seconds: int = 3600
    billable_seconds: int = 3600


COMPLETED = Outcome()


def capacity_error(n: int = 1) -> Outcome:
    return Outcome(
        "Failed", f"CapacityError: Unable to provision requested ML compute capacity (attempt {n})"
    )


class Outcomes:
    """Outcomes per job-name prefix, used in launch order (the last one repeats); requests as sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: dict[str, list[Outcome]] = {}
        self._launches: dict[str, int] = defaultdict(int)
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def plan(self, prefix: str, *outcomes: Outcome) -> None:
        with self._lock:
            self._plans[prefix] = list(outcomes)

    def next_for(self, job_name: str, request: dict[str, Any]) -> Outcome:
        prefix = job_name.rsplit("-", 5)[0]  # <prefix>-<UUID with 4 hyphens>
        with self._lock:
            self.requests[prefix].append(request)
            plan = self._plans.get(prefix, [COMPLETED])
            index = self._launches[prefix]
            self._launches[prefix] += 1
            return plan[min(index, len(plan) - 1)]


OUTCOMES = Outcomes()


class SageMakerSync(StateTaskServiceUnsupported):
    """``arn:aws:states:::sagemaker:createTrainingJob.sync`` against moto's SageMaker backend."""

    def __init__(self) -> None:
        # moto's sync loop needs a task-token callback endpoint (it interrupts it when the job ends).
        StateTaskServiceCallback.__init__(
            self, supported_integration_patterns={ResourceCondition.Sync, ResourceCondition.WaitForTaskToken}
        )

    def _eval_service_task(self, env, resource_runtime_part, normalised_parameters, state_credentials):
        if self._get_boto_service_action() != "create_training_job":
            super()._eval_service_task(env, resource_runtime_part, normalised_parameters, state_credentials)
            return
        client = boto_client_for(
            service="sagemaker", region=resource_runtime_part.region, state_credentials=state_credentials
        )
        name = normalised_parameters["TrainingJobName"]
        outcome = OUTCOMES.next_for(name, json.loads(json.dumps(normalised_parameters)))
        response = client.create_training_job(**normalised_parameters)
        job = sagemaker_backends[ACCOUNT][resource_runtime_part.region].training_jobs[name]
        job.training_job_status = outcome.status
        job.secondary_status = outcome.status
        # moto replaces MetricDefinitions with its own; keep what was sent, like SageMaker does.
        job.algorithm_specification = normalised_parameters["AlgorithmSpecification"]
        if outcome.failure_reason is not None:
            job.failure_reason = outcome.failure_reason
        if outcome.status == "Completed":
            job.training_time_in_seconds = outcome.training_seconds
            job.billable_time_in_seconds = outcome.billable_seconds
        env.stack.append({"TrainingJobArn": response["TrainingJobArn"], "TrainingJobName": name})

    def _build_sync_resolver(self, env, resource_runtime_part, normalised_parameters, state_credentials):
        submitted = env.stack.pop()
        client = boto_client_for(
            service="sagemaker", region=resource_runtime_part.region, state_credentials=state_credentials
        )

        def poll() -> Any:
            described = client.describe_training_job(TrainingJobName=submitted["TrainingJobName"])
            described.pop("ResponseMetadata", None)
            described = json.loads(to_json_str(described))
            status = described["TrainingJobStatus"]
            if status in TERMINAL_OK:
                return described
            if status not in TERMINAL_FAILED:
                return None
            raise FailureEventException(
                FailureEvent(
                    env=env,
                    error_name=StatesErrorName(typ=StatesErrorNameType.StatesTaskFailed),
                    event_type=HistoryEventType.TaskFailed,
                    event_details=EventDetails(
                        taskFailedEventDetails=TaskFailedEventDetails(
                            resource=self._get_sfn_resource(),
                            resourceType=self._get_sfn_resource_type(),
                            error=StatesErrorNameType.StatesTaskFailed.to_name(),
                            cause=to_json_str(described),
                        )
                    ),
                )
            )

        return poll


_original_service_for = state_task_factory.state_task_service_for


def _service_for(service_name: str):
    if service_name == "sagemaker":
        return SageMakerSync()
    return _original_service_for(service_name)


_original_parse = AmazonStateLanguageParser.parse


@functools.lru_cache(maxsize=8)
def _cached_parse(definition: str):
    # Parsing our ~90-state definition with moto's ANTLR parser takes about 0.4 s; it is done once per execution.
    # The parsed program holds no per-execution state (that lives in the Environment), so it is reused.
    return _original_parse(definition)


@contextmanager
def moto_workflow(definition: dict[str, Any]) -> Iterator[Workflow]:
    """moto with ASL execution and the SageMaker .sync adapter, and the workflow created in it."""
    state_task_factory.state_task_service_for = _service_for
    AmazonStateLanguageParser.parse = staticmethod(_cached_parse)
    try:
        with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
            yield Workflow(definition)
    finally:
        state_task_factory.state_task_service_for = _original_service_for
        AmazonStateLanguageParser.parse = staticmethod(_original_parse)


class Workflow:
    def __init__(self, definition: dict[str, Any]) -> None:
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        self.sagemaker = boto3.client("sagemaker", region_name=REGION)
        self.arn = self.sfn.create_state_machine(
            name="training-workflow",
            definition=json.dumps(definition),
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/fake-state-machine-role",
        )["stateMachineArn"]

    def start(self, execution_input: Any, name: str | None = None) -> str:
        return self.sfn.start_execution(
            stateMachineArn=self.arn, name=name or str(uuid.uuid4()), input=json.dumps(execution_input)
        )["executionArn"]

    def wait(self, execution_arn: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            described = self.sfn.describe_execution(executionArn=execution_arn)
            if described["status"] != "RUNNING":
                return described
            if time.monotonic() > deadline:
                raise TimeoutError(f"execution {execution_arn} still running after {timeout} s")
            time.sleep(0.05)

    def run(self, execution_input: Any, name: str | None = None) -> dict[str, Any]:
        return self.wait(self.start(execution_input, name))

    def jobs(self, prefix: str) -> list[str]:
        summaries = self.sagemaker.list_training_jobs(NameContains=f"{prefix}-", MaxResults=100)
        return [s["TrainingJobName"] for s in summaries["TrainingJobSummaries"]]

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        return self.sfn.get_execution_history(executionArn=execution_arn, maxResults=1000)["events"]
