"""The SageMaker Python SDK path: the deployed workflow's exact training job, launched from a notebook without it.

Its one job: turn a request into the deployed workflow's own ``CreateTrainingJob`` request, decided by the
workflow's own decision (:func:`training.request.decision.decide_request`: the same refusals, ``resume_from``
included) and rendered from its own states (:func:`constructs_lib.workflow.launch_request.launch_request`), then
hand it to the SDK: :func:`launch_direct` creates the job through sagemaker-core with that exact request (and
follows it), :func:`model_trainer` builds an SDK v3 ``ModelTrainer`` from it; and read such a *direct run* back
(:func:`direct_run`) so ``result``, ``logs``, ``watch`` and ``stop`` accept its job name.

A direct run's name is its training job's name and stands where the workflow puts its execution name: its
checkpoints go under the workflow's runs (``<checkpoint prefix><workflow segment>/<name>/``, so a later run can
``resume_from`` it) and its ``training-workflow-execution`` tag is the name. What it does not get, having no
execution: the workflow's capacity relaunches, its failure and success notifications, and the execution's run
record (history, summary output).

The SDK (``pip install 'blackwell-training-cdk[sdk]'``) is imported only inside the functions that need it, so the
CLI starts as fast as before and the Lambda never sees it. Telemetry: sagemaker-core's client sends none;
``ModelTrainer.train`` does unless opted out, so :func:`model_trainer` opts out unless ``telemetry=True``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from constructs_lib.cli.errors import InvalidRequest, OperatorError
from constructs_lib.cli.records import Job, Run
from constructs_lib.cli.request import new_run_name
from training.request.job import job_checkpoint_uri

if TYPE_CHECKING:
    from collections.abc import Iterator

    from constructs_lib.cli.records import LogEvent
    from training.request.rules import RequestRules


class TrainingRuns(Protocol):
    """What this module uses of :class:`constructs_lib.cli.api.TrainingRuns` (which calls it: no import back)."""

    session: Any

    def client(self, service: str) -> Any: ...
    def execution_arn(self, run: str) -> str: ...
    def log_events(self, run: str, *, follow: bool = False) -> Iterator[LogEvent]: ...
    def result(self, run: str) -> dict[str, Any]: ...

    @property
    def rules(self) -> RequestRules: ...
    @property
    def definition(self) -> dict[str, Any]: ...
    @property
    def state_machine_arn(self) -> str: ...
    @property
    def region(self) -> str: ...


EXECUTION_TAG = "training-workflow-execution"
"""The job tag the workflow's template sets to the execution name (a direct run's: its own name)."""

RUN_STATUS = {
    "InProgress": "RUNNING",
    "Stopping": "RUNNING",
    "Completed": "SUCCEEDED",
    "Failed": "FAILED",
    "Stopped": "ABORTED",
}
"""A direct run's status, in the words of an execution's, from its job's ``TrainingJobStatus``."""

SDK_EXTRA = "pip install 'blackwell-training-cdk[sdk]'"


def _job_name_problem(name: str, limits: Mapping[str, Any]) -> str | None:
    """Why ``name`` cannot name a training job (SageMaker's own length and pattern), or None."""
    low, high, pattern = int(limits["min"]), int(limits["max"]), limits["pattern"]
    if not (low <= len(name) <= high and re.fullmatch(pattern, name)):
        return (
            f"name: must be a SageMaker training job name, {low} to {high} of A-Z a-z 0-9 and inner hyphens "
            f"(pattern {pattern}); got {name!r}"
        )
    return None


def _name_taken(runs: TrainingRuns, name: str) -> str | None:
    """Why ``name`` is taken (an execution of the workflow, or a training job), or None; checkpoints under its run
    folder are the workflow's decision's (``reads.run_folder_problems``)."""
    from botocore.exceptions import ClientError

    sfn = runs.client("stepfunctions")
    try:
        sfn.describe_execution(executionArn=runs.execution_arn(name))
        return f"name: the workflow already has a run named {name}; choose another name"
    except (sfn.exceptions.ExecutionDoesNotExist, sfn.exceptions.InvalidArn):
        pass
    try:
        runs.client("sagemaker").describe_training_job(TrainingJobName=name)
        return f"name: a training job named {name} already exists; choose another name"
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in ("ValidationException", "ResourceNotFound"):
            raise
    return None


def direct_request(
    runs: TrainingRuns, request: Mapping[str, Any], *, name: str | None = None
) -> dict[str, Any]:
    """The exact boto3 ``CreateTrainingJob`` request the deployed workflow would send for ``request``, for a
    training job named ``name`` (default ``<job_name_prefix>-<UTC time>-<hex>``). Raises ``InvalidRequest`` with
    every problem, before any write, when the workflow would refuse ``request`` or the name is not usable."""
    from botocore.exceptions import ClientError

    from constructs_lib.workflow.launch_request import execution_context, launch_request
    from training.request.decision import decide_request
    from training.request.reads import Reads

    name = name or new_run_name(request)
    rules = runs.rules
    problem = _job_name_problem(name, rules.sagemaker()["TrainingJobName"])
    if problem is not None:
        raise InvalidRequest([problem])
    # The workflow's own decision, with what it reads from S3 and SageMaker (as TrainingRuns.check); the evaluation
    # states have no direct counterpart, so a request with evaluate is refused (and its evaluation not read).
    evaluates = request.get("evaluate") is not None
    reads = Reads(runs.client("s3"), runs.client("sagemaker"), before_launch=not evaluates)
    try:
        decision = decide_request(dict(request), rules, reads=reads, execution=name)
    except ClientError as error:
        raise OperatorError(
            f"cannot read what the request names (resume_from's checkpoints in S3, the training plan): {error}"
        ) from None
    problems = list(decision.problems)
    if evaluates:
        problems.append(
            "evaluate: a direct run launches its training job only; submit it through the workflow to evaluate "
            "after training, or evaluate it when it ends with `blackwell-training evaluate RUN`"
        )
    taken = _name_taken(runs, name)
    if problems or taken:
        raise InvalidRequest(problems + ([taken] if taken else []))
    context = execution_context(
        name=name, execution_input=dict(request), state_machine_arn=runs.state_machine_arn
    )
    try:
        return launch_request(runs.definition, decision.state(), context, job_name=name)
    except ValueError as error:
        raise OperatorError(str(error)) from None


def direct_run(runs: TrainingRuns, run: str) -> Run | None:
    """The training job ``run`` (its name or ARN) as a direct run of this workflow, or None when there is no such
    job: its checkpoints under the workflow's runs at the name of its ``training-workflow-execution`` tag, which
    is the job's name (``launch_direct``) or its start (``ModelTrainer`` appends ``-<time>``)."""
    from botocore.exceptions import ClientError

    if run.startswith("arn:"):
        if ":training-job/" not in run:
            return None
        run = run.split(":training-job/", 1)[1]
    if _job_name_problem(run, runs.rules.sagemaker()["TrainingJobName"]) is not None:
        return None
    sagemaker = runs.client("sagemaker")
    try:
        described = sagemaker.describe_training_job(TrainingJobName=run)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("ValidationException", "ResourceNotFound"):
            return None
        raise
    runs_uri = runs.rules.runs_uri()
    checkpoint = job_checkpoint_uri(described)
    tags = sagemaker.list_tags(ResourceArn=described["TrainingJobArn"]).get("Tags", [])
    launched_as = next((t["Value"] for t in tags if t.get("Key") == EXECUTION_TAG), None)
    if (
        runs_uri is None
        or launched_as is None
        or checkpoint != f"{runs_uri}{launched_as}/"
        or not (run == launched_as or run.startswith(f"{launched_as}-"))  # ModelTrainer adds -<time>
    ):
        return None  # not launched with this workflow's request
    job = Job(name=run)
    job.update(described)
    status, ended = job.status, job.ended
    return Run(
        name=run,
        arn=described["TrainingJobArn"],
        status=RUN_STATUS.get(status, "RUNNING"),
        region=runs.region,
        started=described.get("CreationTime"),
        stopped=(described.get("TrainingEndTime") or described.get("LastModifiedTime")) if ended else None,
        error={"Failed": "TrainingJobFailed", "Stopped": "TrainingJobStopped"}.get(status),
        cause=described.get("FailureReason") if status == "Failed" else None,
        jobs=[job],
        direct=True,
    )


TELEMETRY_OFF = {"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}}
"""The SDK defaults config that opts out of its telemetry (``SageMaker.PythonSDK.Modules.TelemetryOptOut``, read by
``sagemaker.core.telemetry.telemetry_logging`` through the session's ``sagemaker_config``)."""


def _import_sdk(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise OperatorError(f"the SageMaker Python SDK is not installed ({error}): {SDK_EXTRA}") from None


def sdk_session(runs: TrainingRuns, *, telemetry: bool = False) -> Any:
    """A ``sagemaker.core.helper.session_helper.Session`` over the runs' boto3 session, its default bucket the
    workflow's own (so the SDK makes no call to find or create one), its telemetry off unless ``telemetry``."""
    session_helper = _import_sdk("sagemaker.core.helper.session_helper")
    return session_helper.Session(
        boto_session=runs.session,
        default_bucket=runs.rules.bucket_name,
        sagemaker_config=None if telemetry else TELEMETRY_OFF,
    )


def launch_direct(
    runs: TrainingRuns,
    request: Mapping[str, Any],
    *,
    name: str | None = None,
    wait: bool = True,
    logs: bool = True,
    out: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Create the training job ``name`` through sagemaker-core with the exact request the deployed workflow would
    send (:func:`direct_request`: refused before any call as the workflow refuses it); with ``wait``, follow it
    until it ends, each new log line (every host) given to ``out`` with ``logs``. Returns ``runs.result(name)``:
    the summary ``result`` gives a workflow run.

    The request goes out unchanged through sagemaker-core's own client (``SageMakerClient``, signed with the runs'
    session). Not through
    ``TrainingJob.create``: its serializer (``sagemaker.core.utils.utils._serialize_shape`` in sagemaker-core
    2.27.0) drops every false or zero value inside a nested shape, so ``InfraCheckConfig: {EnableInfraCheck:
    false}`` would arrive as ``{}``, and it fills fields from an SDK defaults file when one exists. The logs are
    read with the runs' own boto3 session (:meth:`TrainingRuns.log_events`): ``TrainingJob.wait(logs=True)`` reads
    them with a process-wide default ``boto3.Session()``, so another region or profile than the one given."""
    boto3_request = direct_request(runs, request, name=name)
    sdk = _import_sdk("sagemaker.core.utils.utils")
    client = sdk.SageMakerClient(session=runs.session, region_name=runs.region).sagemaker_client
    client.create_training_job(**boto3_request)
    job_name = boto3_request["TrainingJobName"]
    if wait:
        for event in runs.log_events(job_name, follow=True):
            if logs:
                out(f"[{event.host}] {event.message}")
    return runs.result(job_name)


SHAPES_MODEL_TRAINER_CANNOT_CARRY = ("EnableSageMakerMetricsTimeSeries",)
"""``AlgorithmSpecification`` fields that ``ModelTrainer`` builds itself and so cannot carry."""


def model_trainer(
    runs: TrainingRuns, request: Mapping[str, Any], *, name: str | None = None, telemetry: bool = False
) -> Any:
    """A ``sagemaker.train.ModelTrainer`` configured with the deployed workflow's request for ``request``
    (:func:`direct_request`, refused as the workflow refuses it): image, role, compute (instance type and count,
    volume, spot, training plan, keep-alive), stopping condition (always set), checkpoint and output config,
    channels (``train``, ``resume``), hyperparameters, networking (VPC, network isolation, inter-node
    encryption), environment, tags, metric definitions, retry strategy and the other ``with_*`` settings.

    What it cannot carry: the exact job name (``ModelTrainer.train`` names the job ``<name>-<yyyymmddHHMMSS>``,
    cut at 63 characters), ``AlgorithmSpecification.EnableSageMakerMetricsTimeSeries`` (``ModelTrainer`` builds
    the algorithm specification itself), any request field ``ModelTrainer`` has no setting for (each is
    named in a ``UserWarning``), and a false or zero value inside a nested shape: sagemaker-core's serializer drops
    it, so ``InfraCheckConfig: {EnableInfraCheck: false}`` is sent as ``{}`` (the same default). ``launch_direct``
    sends the request whole."""
    boto3_request = direct_request(runs, request, name=name)
    train = _import_sdk("sagemaker.train")
    from sagemaker.core.utils.code_injection.codec import transform

    fields = transform(boto3_request, "CreateTrainingJobRequest")
    trainer = _trainer_from_fields(train, fields, sdk_session(runs, telemetry=telemetry))
    left = sorted(set(fields) - _CARRIED)
    dropped = [
        f"AlgorithmSpecification.{k}"
        for k in SHAPES_MODEL_TRAINER_CANNOT_CARRY
        if k in (boto3_request.get("AlgorithmSpecification") or {})
    ]
    if left or dropped:
        import warnings

        warnings.warn(
            f"ModelTrainer cannot carry these fields of the workflow's request: {', '.join(dropped + left)} "
            "(launch_direct sends them)",
            UserWarning,
            stacklevel=3,
        )
    return trainer


_CARRIED = frozenset(
    {
        "training_job_name",
        "role_arn",
        "algorithm_specification",
        "hyper_parameters",
        "resource_config",
        "enable_managed_spot_training",
        "stopping_condition",
        "checkpoint_config",
        "output_data_config",
        "input_data_config",
        "vpc_config",
        "enable_network_isolation",
        "enable_inter_container_traffic_encryption",
        "environment",
        "tags",
        "retry_strategy",
        "infra_check_config",
        "remote_debug_config",
        "tensor_board_output_config",
        "session_chaining_config",
    }
)
"""The request fields (sagemaker-core's snake_case names) that :func:`model_trainer` hands to ``ModelTrainer``."""


def _trainer_from_fields(train: Any, fields: Mapping[str, Any], session: Any) -> Any:
    from sagemaker.core import shapes
    from sagemaker.core.training.configs import Compute, Networking

    algorithm = dict(fields["algorithm_specification"])
    resources = dict(fields["resource_config"])
    vpc = dict(fields.get("vpc_config") or {})
    trainer = train.ModelTrainer(
        sagemaker_session=session,
        role=fields["role_arn"],
        base_job_name=fields["training_job_name"],
        training_image=algorithm["training_image"],
        training_input_mode=algorithm.get("training_input_mode", "File"),
        compute=Compute(**resources, enable_managed_spot_training=fields.get("enable_managed_spot_training")),
        networking=Networking(
            **vpc,
            enable_network_isolation=fields.get("enable_network_isolation"),
            enable_inter_container_traffic_encryption=fields.get("enable_inter_container_traffic_encryption"),
        ),
        stopping_condition=shapes.StoppingCondition(**fields["stopping_condition"]),
        output_data_config=shapes.OutputDataConfig(**fields["output_data_config"]),
        checkpoint_config=(  # none for S3-direct checkpoints: the trainer writes the run's prefix itself
            shapes.CheckpointConfig(**fields["checkpoint_config"])
            if fields.get("checkpoint_config")
            else None
        ),
        input_data_config=[shapes.Channel(**c) for c in fields.get("input_data_config") or []] or None,
        hyperparameters=dict(fields.get("hyper_parameters") or {}),
        environment=dict(fields.get("environment") or {}),
        tags=[shapes.Tag(**t) for t in fields.get("tags") or []] or None,
    )
    if algorithm.get("metric_definitions"):
        trainer = trainer.with_metric_definitions(
            [shapes.MetricDefinition(**m) for m in algorithm["metric_definitions"]]
        )
    for key, method, shape in (
        ("retry_strategy", "with_retry_strategy", shapes.RetryStrategy),
        ("infra_check_config", "with_infra_check_config", shapes.InfraCheckConfig),
        ("remote_debug_config", "with_remote_debug_config", shapes.RemoteDebugConfig),
        ("tensor_board_output_config", "with_tensorboard_output_config", shapes.TensorBoardOutputConfig),
        ("session_chaining_config", "with_session_chaining_config", shapes.SessionChainingConfig),
    ):
        if fields.get(key):
            trainer = getattr(trainer, method)(shape(**fields[key]))
    return trainer
