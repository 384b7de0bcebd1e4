"""Run the data preparation's state machine in moto's ASL engine, its Processing job running the real script.

:class:`ProcessingSync` is a test-only ``createProcessingJob.sync`` integration for moto 5.2.5 (pinned exactly: it
subclasses moto internals, as ``harness.SageMakerSync`` does for training jobs): it records the request, creates the
job in moto's SageMaker backend, then runs what the job would run: ``python -m training.prepare.job`` with the
request's ``ContainerArguments``, once per instance of ``ProcessingResources.ClusterConfig.InstanceCount``, each
instance given its share of the input prefix's objects (as ``ShardedByS3Key`` hands them out) and the whole model
folder (``FullyReplicated``) in a folder of its own (its ``/opt/ml/processing`` paths, the scratch included, moved
under the instance's folder), against moto's S3. The job ends ``Completed``, or ``Failed`` with SageMaker's own
generic ``FailureReason`` and, as SageMaker does, the first 1 KB of what the instances wrote to
``/opt/ml/output/message`` (here each instance's own file) as ``ExitMessage``; the sync integration then polls
``DescribeProcessingJob``.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from moto import mock_aws
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
from moto.stepfunctions.parser.asl.utils.boto_client import boto_client_for
from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

from tests.workflow.harness import ACCOUNT, AwsSdkAsStepFunctions, Workflow
from training.prepare import job

REQUESTS: list[dict[str, Any]] = []


def run_instances(params: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """Run the job's script as its instances; (status, failure reason, exit message)."""
    args = list(params["AppSpecification"]["ContainerArguments"])
    inputs = {i["InputName"]: i["S3Input"] for i in params["ProcessingInputs"]}
    count = int(params["ProcessingResources"]["ClusterConfig"]["InstanceCount"])
    s3 = boto3.client("s3", region_name="us-west-2")
    status, reason = "Completed", None
    with tempfile.TemporaryDirectory(prefix="processing-") as tmp:
        model = _download(s3, inputs["model"]["S3Uri"], Path(tmp) / "model", 0, 1)
        messages = []
        for index in range(count):
            data = _download(s3, inputs["data"]["S3Uri"], Path(tmp) / f"algo-{index + 1}", index, count)
            here = [*args]
            here[here.index("--local-input") + 1] = str(data)
            here[here.index("--model") + 1] = str(model)
            messages.append(Path(tmp) / f"algo-{index + 1}-output" / "message")
            here[here.index("--exit-message") + 1] = str(messages[-1])
            scratch = here[here.index("--scratch") + 1]
            assert scratch.startswith("/opt/ml/processing/"), scratch  # on the job's volume
            here[here.index("--scratch") + 1] = str(Path(tmp) / f"algo-{index + 1}-volume" / "scratch")
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                code = job.main([*here, "--workers", "1"])
            if code:
                reason = f"AlgorithmError: See job logs for more information (exit code {code})"
                status = "Failed"
                break
        written = b"".join(m.read_bytes() for m in messages if m.is_file())
    return status, reason, written[:1024].decode("utf-8", "ignore") or None


def _download(s3: Any, uri: str, folder: Path, index: int, count: int) -> Path:
    bucket, _, prefix = uri[5:].partition("/")
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))
    folder.mkdir(parents=True)
    for key in keys[index::count]:
        target = folder / key[len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
    return folder


class ProcessingSync(StateTaskServiceUnsupported):
    """``arn:aws:states:::sagemaker:createProcessingJob.sync`` against moto, running the job's script."""

    def __init__(self) -> None:
        StateTaskServiceCallback.__init__(
            self, supported_integration_patterns={ResourceCondition.Sync, ResourceCondition.WaitForTaskToken}
        )

    def _eval_service_task(self, env, resource_runtime_part, normalised_parameters, state_credentials):
        if self._get_boto_service_action() != "create_processing_job":
            super()._eval_service_task(env, resource_runtime_part, normalised_parameters, state_credentials)
            return
        params = json.loads(json.dumps(normalised_parameters))
        REQUESTS.append(params)
        client = boto_client_for(service="sagemaker", region=resource_runtime_part.region,
                                 state_credentials=state_credentials)  # fmt: skip
        accepted = {k: v for k, v in params.items() if k not in ("Environment",)}
        client.create_processing_job(**accepted)
        status, reason, message = run_instances(params)
        described = sagemaker_backends[ACCOUNT][resource_runtime_part.region].processing_jobs[
            params["ProcessingJobName"]
        ]
        described.processing_job_status = status
        described.failure_reason = reason
        described.exit_message = message
        env.stack.append({"ProcessingJobName": params["ProcessingJobName"]})

    def _build_sync_resolver(self, env, resource_runtime_part, normalised_parameters, state_credentials):
        submitted = env.stack.pop()
        client = boto_client_for(service="sagemaker", region=resource_runtime_part.region,
                                 state_credentials=state_credentials)  # fmt: skip

        def poll() -> Any:
            described = client.describe_processing_job(ProcessingJobName=submitted["ProcessingJobName"])
            described.pop("ResponseMetadata", None)
            described = json.loads(to_json_str(described))
            if described["ProcessingJobStatus"] == "Completed":
                return described
            raise FailureEventException(FailureEvent(
                env=env, error_name=StatesErrorName(typ=StatesErrorNameType.StatesTaskFailed),
                event_type=HistoryEventType.TaskFailed,
                event_details=EventDetails(taskFailedEventDetails=TaskFailedEventDetails(
                    resource=self._get_sfn_resource(), resourceType=self._get_sfn_resource_type(),
                    error=StatesErrorNameType.StatesTaskFailed.to_name(), cause=to_json_str(described))),
            ))  # fmt: skip

        return poll


_original = state_task_factory.state_task_service_for


def _service_for(service_name: str):
    if service_name == "sagemaker":
        return ProcessingSync()
    if service_name == "aws-sdk":
        return AwsSdkAsStepFunctions()
    return _original(service_name)


@contextmanager
def moto_preparation(definition: dict[str, Any]) -> Iterator[Workflow]:
    state_task_factory.state_task_service_for = _service_for
    try:
        with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
            yield Workflow(definition, "data-preparation")
    finally:
        state_task_factory.state_task_service_for = _original
