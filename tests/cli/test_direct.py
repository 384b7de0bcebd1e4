"""The SageMaker Python SDK path against the stack in moto (``conftest.py``): the job that ``launch_direct`` creates
through sagemaker-core and the one that ``ModelTrainer`` creates carry the deployed workflow's own request for the
same input (spot, training plan, data and resume cases), a bad input is refused by both before any call, and
``result``/``logs``/``stop`` accept a direct job's name.

A direct job named N and a workflow execution named N put the same execution name into the request (checkpoint
folder, tag), so each case launches the direct job first and then runs the workflow under the same name: the two
requests must then be equal field by field, the job name aside.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from moto.core.responses import ActionResult
from moto.sagemaker.models import sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse

from constructs_lib.cli.api import TrainingRuns
from constructs_lib.cli.errors import InvalidRequest
from tests.cli.conftest import DEPLOYED_DATA_SOURCES, STACK
from tests.workflow.harness import ACCOUNT, OUTCOMES, REGION, TRAINING_PLANS
from tests.workflow.test_requests import _seal_checkpoint
from training.contract.metric_lines import format_summary_line

PLAN = f"arn:aws:sagemaker:{REGION}:123456789012:training-plan/b200"
TRAINING_PLANS.add(PLAN, "ml.p6-b200.48xlarge", 4)  # the request check describes the plan a request names


class Sent:
    """Every ``CreateTrainingJob`` request sent through a boto3 session (botocore's own event, so exactly what
    goes on the wire, whichever library made the call)."""

    def __init__(self, session: Any) -> None:
        self.requests: list[dict[str, Any]] = []
        session.events.register("provide-client-params.sagemaker.CreateTrainingJob", self._record)

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        self.requests.append(dict(params))


def _stop_training_job(self) -> ActionResult:
    """``StopTrainingJob`` for moto 5.2.5's SageMaker, which lacks it (test-only): the job goes ``Stopping``."""
    name = self._get_param("TrainingJobName")
    record = self.sagemaker_backend.training_jobs[name]
    record.training_job_status = record.secondary_status = "Stopping"
    return ActionResult({})


@pytest.fixture
def runs(deployed, monkeypatch):
    monkeypatch.setattr(SageMakerResponse, "stop_training_job", _stop_training_job, raising=False)
    monkeypatch.setenv(
        "SAGEMAKER_VALIDATE_ROLE", "false"
    )  # ModelTrainer would call iam:SimulatePrincipalPolicy
    return TrainingRuns(stack_name=STACK, region=REGION, poll_seconds=1)


@pytest.fixture
def sent(runs):
    return Sent(runs.session)


def _in_progress(name: str) -> None:
    """moto creates a training job ``Completed``; make it run, as SageMaker's would."""
    record = sagemaker_backends[ACCOUNT][REGION].training_jobs[name]
    record.training_job_status = record.secondary_status = "InProgress"


def _workflow_request(deployed, execution_input: dict, name: str) -> dict[str, Any]:
    """The request the workflow sends for ``execution_input`` in an execution named ``name``."""
    prefix = deployed.prefix()
    result = deployed.workflow.run({**execution_input, "job_name_prefix": prefix}, name)
    assert result["status"] == "SUCCEEDED", result
    (request,) = OUTCOMES.requests[prefix]
    return request


def _cases(deployed) -> dict[str, dict]:
    earlier = f"earlier-{deployed.prefix()}"
    _seal_checkpoint(
        deployed.workflow.s3,
        deployed.bucket,
        f"checkpoints/{deployed.rules.workflow_segment}/{earlier}/",
        100,
    )
    data = f"s3://{deployed.bucket}/{DEPLOYED_DATA_SOURCES[0]}set-1/"
    # the data prefix must hold an object (the request check lists it)
    deployed.workflow.s3.put_object(
        Bucket=deployed.bucket, Key=f"{DEPLOYED_DATA_SOURCES[0]}set-1/train.bin", Body=b""
    )
    return {
        "on-demand": {},
        "spot": {"use_spot": True, "instance_count": 2, "max_wait_seconds": 172800},
        "plan": {"training_plan_arn": PLAN, "precision": "mxfp8"},
        "data": {"train_data_uri": data, "train_data_input_mode": "File"},
        "resume": {"resume_from": earlier, "hyperparameters": {"max_steps": "150"}},
    }


CASES = ("on-demand", "spot", "plan", "data", "resume")


@pytest.mark.parametrize("case", CASES)
def test_launch_direct_sends_the_workflows_exact_request(deployed, runs, sent, case):
    execution_input = _cases(deployed)[case]
    name = f"direct-{deployed.prefix()}"
    summary = runs.launch_direct({**execution_input, "job_name_prefix": "x"}, name=name, wait=False)
    (direct,) = sent.requests
    workflow = _workflow_request(deployed, {**execution_input}, name)
    assert direct["TrainingJobName"] == name and summary["name"] == summary["job"] == name
    for key in sorted((set(direct) | set(workflow)) - {"TrainingJobName"}):
        assert direct.get(key) == workflow.get(key), key
    if case == "resume":
        assert [c["ChannelName"] for c in direct["InputDataConfig"]] == ["resume"]


def _as_sagemaker_core_sends(value: Any) -> Any:
    """``value`` as ModelTrainer's requests carry it: sagemaker-core 2.27.0's serializer drops every false or zero
    value inside a nested shape (``{"EnableInfraCheck": False}`` is sent as ``{}``), top-level fields excepted."""
    if isinstance(value, dict):
        return {k: _as_sagemaker_core_sends(v) for k, v in value.items() if v is not False and v != 0}
    if isinstance(value, list):
        return [_as_sagemaker_core_sends(v) for v in value]
    return value


@pytest.mark.parametrize("case", CASES)
def test_model_trainer_creates_the_workflows_request_but_the_name_and_metrics_time_series(
    deployed, runs, sent, case, monkeypatch
):
    from sagemaker.core.telemetry import telemetry_logging

    telemetry: list[Any] = []
    monkeypatch.setattr(telemetry_logging, "_send_telemetry_request", lambda *a, **k: telemetry.append(a))
    execution_input = _cases(deployed)[case]
    name = f"trainer-{deployed.prefix()}"
    with pytest.warns(
        UserWarning, match=r"cannot carry .*AlgorithmSpecification.EnableSageMakerMetricsTimeSeries"
    ):
        trainer = runs.model_trainer(execution_input, name=name)
    assert trainer.stopping_condition.max_runtime_in_seconds == 86400  # set, never the SDK's 3600 s default
    trainer.train(wait=False, logs=False)
    (created,) = sent.requests
    workflow = _workflow_request(deployed, execution_input, name)
    assert created["TrainingJobName"].startswith(f"{name}-")
    workflow["AlgorithmSpecification"].pop("EnableSageMakerMetricsTimeSeries")
    for key in sorted((set(created) | set(workflow)) - {"TrainingJobName", "Environment"}):
        assert created.get(key) == _as_sagemaker_core_sends(workflow.get(key)), key
    assert created.get("Environment", {}) == workflow.get("Environment", {})
    assert telemetry == []  # opted out by default
    assert runs.result(created["TrainingJobName"])["job"] == created["TrainingJobName"]  # a direct run


def test_model_trainer_sends_telemetry_only_when_asked(deployed, runs, monkeypatch):
    from sagemaker.core.telemetry import telemetry_logging

    telemetry: list[Any] = []
    monkeypatch.setattr(telemetry_logging, "_send_telemetry_request", lambda *a, **k: telemetry.append(a))
    with pytest.warns(UserWarning):
        trainer = runs.model_trainer({}, name=f"telemetry-{deployed.prefix()}", telemetry=True)
    trainer.train(wait=False, logs=False)
    assert len(telemetry) == 1


@pytest.mark.parametrize(
    ("execution_input", "words"),
    [
        ({"precison": "bf16"}, "precison: unknown input field (did you mean precision?)"),
        (
            {"hyperparameters": {"max_steps": "-5"}},
            "hyperparameters.max_steps: must be an integer in [1, 100000000]",
        ),
        ({"instance_count": 3}, "instance_count: must be an integer in [1, 2]"),  # the deployed limit
        ({"resume_from": "no-such-run"}, "resume_from: execution no-such-run has no complete checkpoint"),
    ],
)
def test_a_bad_input_is_refused_by_both_paths_before_any_call(deployed, runs, sent, execution_input, words):
    before = deployed.workflow.sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"]
    refused = []
    for launch in (runs.launch_direct, runs.model_trainer):
        with pytest.raises(InvalidRequest) as error:
            launch(execution_input, name=f"bad-{deployed.prefix()}")
        refused.append("; ".join(error.value.problems))
    workflow = deployed.workflow.run(execution_input)
    assert workflow["error"] == "InvalidInput" and refused == [workflow["cause"]] * 2
    assert words in refused[0]
    assert sent.requests == []
    assert deployed.workflow.sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"] == before


def test_a_taken_or_malformed_name_is_refused_before_any_call(deployed, runs, sent, cli):
    execution = f"taken-{deployed.prefix()}"
    assert deployed.workflow.run({}, execution)["status"] == "SUCCEEDED"
    direct = f"direct-{deployed.prefix()}"
    runs.launch_direct({}, name=direct, wait=False)
    for name, words in (
        (execution, f"name: the workflow already has a run named {execution}"),
        (direct, f"name: a training job named {direct} already exists"),
        ("has_underscore", "name: must be a SageMaker training job name"),
    ):
        with pytest.raises(InvalidRequest, match=words):
            runs.launch_direct({}, name=name, wait=False)
    assert len(sent.requests) == 1


def test_launch_direct_waits_streams_logs_and_returns_the_result_summary(deployed, runs, capsys):
    name = f"wait-{deployed.prefix()}"
    created, polled = threading.Event(), threading.Event()

    def on_create(**_: Any) -> None:
        _in_progress(name)
        created.set()

    def finish() -> None:
        assert created.wait(120)  # guards against a hang, never reached when the test works
        deployed.log(name, "algo-1", "step=1 loss=2.5", format_summary_line({"steps": 1, "final_loss": 2.5}))
        polled.clear()
        assert polled.wait(
            120
        )  # a poll after the log line saw the job running (not a sleep: the machine's speed)
        deployed.finish(name, seconds=600)

    runs.session.events.register("after-call.sagemaker.CreateTrainingJob", on_create)
    runs.session.events.register("after-call.sagemaker.DescribeTrainingJob", lambda **_: polled.set())
    worker = threading.Thread(target=finish)
    worker.start()
    result = runs.launch_direct({"use_spot": True}, name=name, wait=True)
    worker.join()
    assert result["name"] == result["job"] == name
    assert (result["status"], result["capacity"], result["launches"]) == ("SUCCEEDED", "spot", 1)
    assert result["trainer_summary"]["final_loss"] == 2.5
    assert result["training_seconds"] == 600 and result["cost_usd"] is not None
    assert "execution" not in result["links"] and result["links"]["training_job"].endswith(f"/jobs/{name}")
    assert "[algo-1] step=1 loss=2.5" in capsys.readouterr().out  # the job's log, streamed while waiting


def test_result_logs_and_stop_accept_a_direct_jobs_name(deployed, runs, cli):
    name = f"ops-{deployed.prefix()}"
    runs.launch_direct({}, name=name, wait=False)
    _in_progress(name)
    deployed.log(name, "algo-1", "step=1 loss=2.5")
    logs = cli("logs", name)
    assert logs.status == 0 and "[algo-1] step=1 loss=2.5" in logs.out
    stopped = cli("stop", name, "--yes")
    assert stopped.status == 0 and f"stopping run {name}; SageMaker stops it" in stopped.out
    described = deployed.workflow.sagemaker.describe_training_job(TrainingJobName=name)
    assert described["TrainingJobStatus"] == "Stopping"
    deployed.finish(name, "Stopped")
    result = cli("result", name)
    assert result.status == 1 and "ABORTED" in result.out
    unknown = cli("result", "no-such-job-or-run")
    assert unknown.status == 3 and "unknown run no-such-job-or-run" in unknown.err


def test_a_direct_runs_name_is_refused_for_a_workflow_run_once_it_has_checkpoints(deployed, runs, cli):
    name = f"shared-{deployed.prefix()}"
    runs.launch_direct({}, name=name, wait=False)
    _seal_checkpoint(
        deployed.workflow.s3, deployed.bucket, f"checkpoints/{deployed.rules.workflow_segment}/{name}/", 10
    )
    before = deployed.executions()
    refused = cli("submit", "--name", name)
    assert (
        refused.status == 2 and f"already holds the checkpoints of an earlier run named {name}" in refused.err
    )
    assert deployed.executions() == before
