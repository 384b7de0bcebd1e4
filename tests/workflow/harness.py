"""Run the real synthesized training workflow in moto's ASL engine.

* :func:`resolve` turns the template's ``DefinitionString`` (``Fn::Join`` with ``Ref``/``GetAtt``/``Fn::Select``/
  ``Fn::Split``) into plain ASL JSON with plausible fake names and ARNs.
* :class:`SageMakerSync` is a test-only ``createTrainingJob.sync`` integration for moto 5.2.5 (pinned exactly:
  it subclasses moto internals): it records each request, creates the job in moto's SageMaker backend, gives the
  job the outcome the test asked for, then polls ``DescribeTrainingJob`` like Step Functions does; a job that ends
  ``Failed``/``Stopped`` fails the task with ``States.TaskFailed`` and the description as ``Cause``.
* :class:`LambdaInProcess` is a test-only ``lambda:invoke`` integration: moto runs Lambda functions only in
  Docker, so it runs the workflow's request-validation handler (``constructs_lib.workflow.request_check.handler``)
  in-process, against moto's own S3, and hands its return value back as the ``Payload``.
* :class:`AwsSdkAsStepFunctions` runs ``aws-sdk:*`` tasks against moto's backends as Step Functions returns
  them: an S3 ``GetObject`` ``Body`` as text and every value JSON-ready (moto 5.2.5 hands back the botocore
  stream and datetimes, which its own engine then fails on).
* :class:`Outcomes` lets a test choose job outcomes by job-name prefix (each test uses its own prefix, so tests
  can share one state machine and run executions concurrently).
* :class:`TrainingPlans`: the account's training plans as ``DescribeTrainingPlan`` describes them (moto 5.2.5 has
  no training plans; the request check describes the plan a request names): a test adds the plans it names.
* Wait states go on at once (:func:`_no_wait`): moto's engine waits their seconds in real time (1 s before each
  capacity relaunch or launch retry in these tests, the construct's least); the history still has each Wait state
  with its input, and the seconds are the definition's (tests/workflow/test_definition.py).
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
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.responses import ActionResult
from moto.sagemaker.exceptions import ResourceNotFound
from moto.sagemaker.models import sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse
from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import CustomErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
    FailureEvent,
    FailureEventException,
)
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
    StatesErrorNameType,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task import (
    lambda_eval_utils,
    state_task_factory,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.resource import ResourceCondition
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_aws_sdk import (
    StateTaskServiceAwsSdk,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
    StateTaskServiceCallback,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_lambda import (
    StateTaskServiceLambda,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_unsupported import (
    StateTaskServiceUnsupported,
)
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import WaitFunction
from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from moto.stepfunctions.parser.asl.utils.boto_client import boto_client_for
from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

from constructs_lib.workflow import request_check

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
    (definition,) = definitions_of(template).values()
    return definition


def definitions_of(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The plain ASL of every state machine of the template, by logical ID."""
    resources = template["Resources"]
    return {
        logical_id: json.loads(resolve(r["Properties"]["DefinitionString"], resources))
        for logical_id, r in resources.items()
        if r["Type"] == "AWS::StepFunctions::StateMachine"
    }


# ----------------------------------------------------------------------------------------------------------------
# Job outcomes chosen by the test
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a launch gives: a job ending in ``status``, or (``client_error``: an error code such as
    ``ValidationException``) ``CreateTrainingJob`` refused, no job created. ``final_metrics``: the job's
    ``FinalMetricDataList`` as (name, value) pairs (default: moto's canned one)."""

    status: str = "Completed"
    failure_reason: str | None = None
    training_seconds: int = 3600
    billable_seconds: int = 3600
    client_error: str | None = None
    status_code: int = 400
    final_metrics: tuple[tuple[str, float], ...] = ()
    uploads: tuple[tuple[str, str, str | bytes], ...] = ()
    """(bucket, key, body) of each object the job leaves in S3 (e.g. its checkpoint folder's files), written when it
    is created: the request check, which runs before, sees the run's folder as a new run's, empty."""


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


class TrainingPlans:
    """The account's training plans by ARN, as ``DescribeTrainingPlan`` answers (its fields, botocore's shape)."""

    def __init__(self) -> None:
        self._plans: dict[str, dict[str, Any]] = {}

    def add(
        self,
        arn: str,
        instance_type: str,
        count: int,
        *,
        status: str = "Active",
        targets: tuple[str, ...] = ("training-job",),
    ) -> dict[str, Any]:
        name = arn.rsplit("/", 1)[-1]
        capacity = {"ReservedCapacityArn": arn.replace("training-plan/", "reserved-capacity/"),
                    "InstanceType": instance_type, "TotalInstanceCount": count, "Status": status}  # fmt: skip
        self._plans[arn] = {"TrainingPlanArn": arn, "TrainingPlanName": name, "Status": status,
                            "TotalInstanceCount": count, "AvailableInstanceCount": count, "InUseInstanceCount": 0,
                            "TargetResources": list(targets), "ReservedCapacitySummaries": [capacity]}  # fmt: skip
        return self._plans[arn]

    def describe(self, name_or_arn: str) -> dict[str, Any]:
        for arn, plan in self._plans.items():
            if name_or_arn in (arn, plan["TrainingPlanName"]):
                return plan
        raise ResourceNotFound(f"Training plan with name {name_or_arn} not found.")


TRAINING_PLANS = TrainingPlans()


def _describe_training_plan(self: SageMakerResponse) -> ActionResult:
    return ActionResult(TRAINING_PLANS.describe(self._get_param("TrainingPlanName")))


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
        if outcome.client_error is not None:
            raise ClientError(
                {
                    "Error": {"Code": outcome.client_error, "Message": f"{outcome.client_error} (test)"},
                    "ResponseMetadata": {"HTTPStatusCode": outcome.status_code, "RequestId": "test"},
                },
                "CreateTrainingJob",
            )
        response = client.create_training_job(**normalised_parameters)
        for bucket, key, body in outcome.uploads:
            boto3.client("s3", region_name=resource_runtime_part.region).put_object(
                Bucket=bucket, Key=key, Body=body
            )
        job = sagemaker_backends[ACCOUNT][resource_runtime_part.region].training_jobs[name]
        job.training_job_status = outcome.status
        job.secondary_status = outcome.status
        # moto replaces MetricDefinitions with its own; keep what was sent, like SageMaker does.
        job.algorithm_specification = normalised_parameters["AlgorithmSpecification"]
        if outcome.failure_reason is not None:
            job.failure_reason = outcome.failure_reason
        if outcome.final_metrics:
            job.final_metric_data_list = [
                {"MetricName": name, "Value": value, "Timestamp": job.creation_time}
                for name, value in outcome.final_metrics
            ]
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

    def _from_error(self, env, ex):
        """A refused ``CreateTrainingJob`` as Step Functions reports it for the SageMaker integration: error
        ``SageMaker.AmazonSageMakerException``, the code and status in the cause."""
        if not isinstance(ex, ClientError):
            return super()._from_error(env, ex)
        error = ex.response["Error"]
        cause = (
            f"{error['Message']} (Service: AmazonSageMaker; Status Code: "
            f"{ex.response['ResponseMetadata']['HTTPStatusCode']}; Error Code: {error['Code']}; "
            "Request ID: test; Proxy: null)"
        )
        name = "SageMaker.AmazonSageMakerException"
        return FailureEvent(
            env=env,
            error_name=CustomErrorName(name),
            event_type=HistoryEventType.TaskFailed,
            event_details=EventDetails(
                taskFailedEventDetails=TaskFailedEventDetails(
                    error=name,
                    cause=cause,
                    resource=self._get_sfn_resource(),
                    resourceType=self._get_sfn_resource_type(),
                )
            ),
        )


class LambdaInProcess(StateTaskServiceLambda):
    """``arn:aws:states:::lambda:invoke`` running the request-validation handler in-process."""

    invocations: list[dict[str, Any]] = []

    def _eval_service_task(self, env, resource_runtime_part, normalised_parameters, state_credentials):
        payload = json.loads(normalised_parameters.get("Payload") or b"{}")
        LambdaInProcess.invocations.append(payload)
        try:
            result = request_check.handler(payload, None)
        except Exception as err:  # what Lambda reports for an unhandled exception
            raise lambda_eval_utils.LambdaFunctionErrorException(
                "Unhandled", json.dumps({"errorType": type(err).__name__, "errorMessage": str(err)})
            ) from err
        env.stack.append(
            {"StatusCode": 200, "ExecutedVersion": "$LATEST", "Payload": json.loads(json.dumps(result))}
        )


class AwsSdkAsStepFunctions(StateTaskServiceAwsSdk):
    """``arn:aws:states:::aws-sdk:<service>:<action>`` with the response as Step Functions gives it."""

    def _eval_service_task(self, env, **kwargs):
        super()._eval_service_task(env, **kwargs)
        response = env.stack[-1]
        if hasattr(response.get("Body"), "read"):
            response["Body"] = response["Body"].read().decode()
        env.stack[-1] = json.loads(to_json_str(response))


_original_service_for = state_task_factory.state_task_service_for


def _service_for(service_name: str):
    if service_name == "sagemaker":
        return SageMakerSync()
    if service_name == "lambda":
        return LambdaInProcess()
    if service_name == "aws-sdk":
        return AwsSdkAsStepFunctions()
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
    with moto_workflows({"training-workflow": definition}) as workflows:
        yield workflows["training-workflow"]


_original_wait_interval = WaitFunction._wait_interval


def _no_wait(self, env, wait_seconds: int) -> None:
    """A Wait state's wait, not waited (see the module doc)."""


@contextmanager
def moto_workflows(definitions: dict[str, dict[str, Any]]) -> Iterator[dict[str, Workflow]]:
    """Several workflows (by name) in one moto account, sharing its S3 and SageMaker."""
    state_task_factory.state_task_service_for = _service_for
    AmazonStateLanguageParser.parse = staticmethod(_cached_parse)
    SageMakerResponse.describe_training_plan = _describe_training_plan  # type: ignore[attr-defined]
    WaitFunction._wait_interval = _no_wait  # type: ignore[method-assign]
    try:
        with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
            yield {name: Workflow(definition, name) for name, definition in definitions.items()}
    finally:
        state_task_factory.state_task_service_for = _original_service_for
        AmazonStateLanguageParser.parse = staticmethod(_original_parse)
        del SageMakerResponse.describe_training_plan  # type: ignore[attr-defined]
        WaitFunction._wait_interval = _original_wait_interval  # type: ignore[method-assign]


class Workflow:
    def __init__(self, definition: dict[str, Any], name: str = "training-workflow") -> None:
        self.definition = definition
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        self.sagemaker = boto3.client("sagemaker", region_name=REGION)
        self.s3 = boto3.client("s3", region_name=REGION)
        self.arn = self.sfn.create_state_machine(
            name=name,
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

    def run(self, execution_input: Any, name: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        return self.wait(self.start(execution_input, name), timeout)

    def jobs(self, prefix: str) -> list[str]:
        summaries = self.sagemaker.list_training_jobs(NameContains=f"{prefix}-", MaxResults=100)
        return [s["TrainingJobName"] for s in summaries["TrainingJobSummaries"]]

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        return self.sfn.get_execution_history(executionArn=execution_arn, maxResults=1000)["events"]
