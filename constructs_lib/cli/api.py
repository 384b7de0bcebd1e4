"""The Python API of ``blackwell-training``: find the deployed workflow and start, list, follow, stop and sum up runs.

A *run* is one execution of the training workflow's state machine (found through the stack output
``StateMachineArn``), named by its execution name or ARN. Its training jobs (one per launch: capacity errors
relaunch) are read from the execution's history, their logs from CloudWatch Logs (``/aws/sagemaker/TrainingJobs``,
one stream per host). boto3 honours ``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` and the AWS CLI's other settings.

A request is checked locally with the deployed workflow's own rules (:attr:`TrainingRuns.rules`, read from its state
machine definition), so ``submit`` refuses exactly what the workflow would refuse, before anything starts.

Errors a user can act on (stack not deployed, unknown run, invalid request) are raised as ``OperatorError`` with a
one-line message; ``constructs_lib.cli.errors.explain`` says botocore's own errors in one line.

Example::

    runs = TrainingRuns(stack_name="BlackwellTraining", region="us-west-2")
    run = runs.submit({"precision": "mxfp8"})  # checked with the deployed workflow's rules first
    for snapshot in runs.watch(run.name):
        print(snapshot.run.status, snapshot.progress.describe())
    print(runs.result(run.name))
    curve = runs.curve(run.name)  # loss, val_loss and tokens/s of every launch (constructs_lib.cli.curves)
    print(curve.series("loss", "tokens"))
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from constructs_lib.cli.curves import RunCurve, curve_of
from constructs_lib.cli.errors import InvalidRequest, OperatorError
from constructs_lib.cli.evaluation import with_later_evaluation
from constructs_lib.cli.history import execution_jobs
from constructs_lib.cli.job_logs import LogCursor
from constructs_lib.cli.progress import Progress
from constructs_lib.cli.records import LogEvent, Run, Snapshot
from constructs_lib.cli.request import DEFAULT_STACK_NAME, EXECUTION_NAME, new_run_name
from constructs_lib.cli.summary import run_result
from constructs_lib.cli.tuning import TuningOperations

if TYPE_CHECKING:
    from training.request.rules import RequestRules

STATE_MACHINE_OUTPUT = "StateMachineArn"
BUCKET_OUTPUT = "CheckpointBucketName"
STOP_ERROR = "StoppedByUser"


class TrainingRuns(TuningOperations):
    """Operate the runs of one deployed ``BlackwellTrainingStack`` (keyword-only settings; tuning runs too).

    :param stack_name: the CloudFormation stack. Default ``BlackwellTraining``.
    :param region: AWS region. Default: the profile's or ``AWS_REGION``.
    :param profile: AWS CLI profile. Default: ``AWS_PROFILE`` or the default profile.
    :param session: a ``boto3.Session`` to use instead of region and profile.
    :param poll_seconds: pause between polls of ``watch`` and ``logs --follow``. Default 10.
    :param sleep: how to pause (tests pass their own). Default ``time.sleep``.
    """

    def __init__(
        self,
        *,
        stack_name: str = DEFAULT_STACK_NAME,
        region: str | None = None,
        profile: str | None = None,
        session: Any = None,
        poll_seconds: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if session is None:
            import boto3

            session = boto3.Session(profile_name=profile, region_name=region)
        self.session = session
        self.stack_name = stack_name
        self.poll_seconds = poll_seconds
        self.sleep = sleep
        self._clients: dict[str, Any] = {}
        self._outputs: dict[str, str] | None = None
        self._rules: RequestRules | None = None
        self._definition: dict[str, Any] | None = None

    # ---- deployment ---------------------------------------------------------------------------------------------
    def client(self, service: str) -> Any:
        if service not in self._clients:
            try:
                self._clients[service] = self.session.client(service)
            except (
                ValueError
            ) as error:  # botocore: "Invalid endpoint: ..." (AWS_ENDPOINT_URL), a bad region name
                raise OperatorError(
                    f"cannot make an AWS {service} client: {error} (AWS_ENDPOINT_URL? --region?)"
                ) from None
        return self._clients[service]

    @property
    def region(self) -> str:
        return self.client("stepfunctions").meta.region_name

    @property
    def outputs(self) -> dict[str, str]:
        """The stack's outputs (read once)."""
        if self._outputs is None:
            from botocore.exceptions import ClientError

            try:
                stacks = self.client("cloudformation").describe_stacks(StackName=self.stack_name)["Stacks"]
            except ClientError as error:
                if "does not exist" in str(error):
                    raise OperatorError(
                        f"stack {self.stack_name} is not deployed in {self.region} "
                        "(deploy it with `make deploy`, or pass --stack/--region)"
                    ) from None
                raise
            self._outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
        return self._outputs

    @property
    def state_machine_arn(self) -> str:
        arn = self.outputs.get(STATE_MACHINE_OUTPUT)
        if not arn:
            raise OperatorError(
                f"stack {self.stack_name} in {self.region} has no output {STATE_MACHINE_OUTPUT}: "
                "is it a Blackwell training stack, fully deployed?"
            )
        return arn

    @property
    def definition(self) -> dict[str, Any]:
        """The deployed workflow's state machine definition (``DescribeStateMachine``), read once."""
        if self._definition is None:
            sfn, arn = self.client("stepfunctions"), self.state_machine_arn
            try:
                text = sfn.describe_state_machine(stateMachineArn=arn)["definition"]
            except (sfn.exceptions.StateMachineDoesNotExist, sfn.exceptions.InvalidArn):
                raise OperatorError(
                    f"stack {self.stack_name} names state machine {arn}, which does not exist "
                    "(deleted? redeploy the stack with `make deploy`)"
                ) from None
            self._definition = json.loads(text)
        return self._definition

    @property
    def rules(self) -> RequestRules:
        """The deployed workflow's own request rules (instance types, limits, defaults, data sources, bucket and
        workflow segment), read once from its state machine definition (``DescribeStateMachine``)."""
        if self._rules is None:
            from training.request.rules import RequestRules

            definition, arn = self.definition, self.state_machine_arn
            try:
                self._rules = RequestRules.from_state_machine_definition(definition)
            except (ValueError, TypeError) as error:
                raise OperatorError(
                    f"cannot read the request rules of state machine {arn} ({error}): is stack "
                    f"{self.stack_name} a Blackwell training stack deployed from this version? (`make deploy`)"
                ) from None
        return self._rules

    def check(self, request: Mapping[str, Any], *, name: str | None = None, rules: Any = None) -> list[str]:
        """Every problem the workflow would find in ``request`` (empty: it would launch), one line each
        (:meth:`decide`'s)."""
        return self.decide(request, name=name, rules=rules).problems

    def decide(self, request: Mapping[str, Any], *, name: str | None = None, rules: Any = None) -> Any:
        """The workflow's own decision of ``request`` (``training.request.decision.decide_request``) under ``rules``
        (default: the deployed workflow's, :attr:`rules`), with what it reads from S3 and SageMaker
        (``init_from``'s config.json, the measurements, the data, the run ``name``'s folder, ``resume_from``'s
        checkpoint, the evaluation's tasks and tokenizer); its ``skipped`` names what it could not check (the run's
        folder without ``name``). A read S3 or SageMaker refuses is left to the workflow, which decides it before
        launching (the decision then has no problem and says so in ``skipped``)."""
        from training.request.decision import Decision, decide_request

        rules = self.rules if rules is None else rules
        if rules.bucket_name is None:
            return decide_request(dict(request), rules)
        from botocore.exceptions import ClientError

        from training.request.reads import Reads

        reads = Reads(self.client("s3"), self.client("sagemaker"), before_launch=True)
        try:
            return decide_request(dict(request), rules, reads=reads, execution=name)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            return Decision(
                [], skipped=[f"what S3 or SageMaker refused to show ({code}): left to the workflow"]
            )

    def execution_arn(self, run: str) -> str:
        """The ARN of run ``run`` (an execution name or ARN)."""
        if run.startswith("arn:"):
            return run
        from constructs_lib.workflow.launch_request import execution_arn

        return execution_arn(self.state_machine_arn, run)

    # ---- submit -------------------------------------------------------------------------------------------------
    def submit(
        self, request: Mapping[str, Any], *, name: str | None = None, rules: Any = None, check: bool = True
    ) -> Run:
        """Check ``request`` as the workflow would (:meth:`check`, with ``rules``; default: the deployed workflow's
        own) and raise ``InvalidRequest`` listing every problem before anything starts, then start it as run
        ``name`` (default: generated). ``check=False`` leaves every check to the workflow."""
        name = name or new_run_name(request)
        problems = (
            []
            if EXECUTION_NAME.match(name)
            else [f"--name: must be 1 to 80 of A-Z a-z 0-9 - _; got {name!r}"]
        )
        if check:  # the workflow's decision refuses a name whose checkpoint folder holds an earlier run's
            problems += self.check(request, name=name, rules=rules)
        if problems:
            raise InvalidRequest(problems)
        sfn = self.client("stepfunctions")
        try:
            started = sfn.start_execution(
                stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(dict(request))
            )
        except sfn.exceptions.ExecutionAlreadyExists:
            raise OperatorError(f"a run named {name} already exists: choose another --name") from None
        return Run(name=name, arn=started["executionArn"], status="RUNNING", region=self.region)

    # ---- the SageMaker Python SDK path (constructs_lib.cli.direct) -----------------------------------------------
    def direct_request(self, request: Mapping[str, Any], *, name: str | None = None) -> dict[str, Any]:
        """The exact ``CreateTrainingJob`` request the deployed workflow would send for ``request``, for a job
        named ``name``; ``InvalidRequest`` with every problem when the workflow would refuse it (see
        :func:`constructs_lib.cli.direct.direct_request`)."""
        from constructs_lib.cli.direct import direct_request

        return direct_request(self, request, name=name)

    def model_trainer(
        self, request: Mapping[str, Any], *, name: str | None = None, telemetry: bool = False
    ) -> Any:
        """A ``sagemaker.train.ModelTrainer`` set up with the workflow's request for ``request`` (needs the
        ``sdk`` extra; see :func:`constructs_lib.cli.direct.model_trainer` for what it cannot carry)."""
        from constructs_lib.cli.direct import model_trainer

        return model_trainer(self, request, name=name, telemetry=telemetry)

    def launch_direct(
        self, request: Mapping[str, Any], *, name: str | None = None, wait: bool = True, logs: bool = True
    ) -> dict[str, Any]:
        """Validate ``request`` with the deployed rules, create its training job through sagemaker-core with the
        workflow's exact request, and with ``wait`` follow it (logs streamed); returns :meth:`result`'s summary
        (needs the ``sdk`` extra; see :func:`constructs_lib.cli.direct.launch_direct`)."""
        from constructs_lib.cli.direct import launch_direct

        return launch_direct(self, request, name=name, wait=wait, logs=logs)

    # ---- read ---------------------------------------------------------------------------------------------------
    def run(self, run: str) -> Run:
        """The run ``run`` now: the execution, its jobs (described), its summary when it succeeded."""
        sfn = self.client("stepfunctions")
        arn = self.execution_arn(run)
        try:
            described = sfn.describe_execution(executionArn=arn)
        except (sfn.exceptions.ExecutionDoesNotExist, sfn.exceptions.InvalidArn):
            direct = self._direct_run(run)
            if direct is None:
                raise OperatorError(
                    f"unknown run {run}: no such execution of {self.state_machine_arn}, nor a training job "
                    "launched directly with its request (`blackwell-training runs` lists the executions)"
                ) from None
            return direct
        result = Run(
            name=described["name"],
            arn=arn,
            status=described["status"],
            region=self.region,
            started=described.get("startDate"),
            stopped=described.get("stopDate"),
            error=described.get("error"),
            cause=described.get("cause"),
        )
        if described.get("output"):
            try:
                output = json.loads(described["output"])
                result.summary = output if isinstance(output, dict) else None
            except ValueError:
                result.summary = None
        result.jobs = execution_jobs(self.client("stepfunctions"), self.client("sagemaker"), arn)
        return result

    def _direct_run(self, run: str) -> Run | None:
        """The training job named ``run`` (or with ARN ``run``) as a direct run, when it is one of this workflow's
        (its checkpoints under the workflow's runs, its execution tag its own name); else None."""
        from constructs_lib.cli.direct import direct_run

        return direct_run(self, run)

    def runs(self, limit: int = 20) -> list[Run]:
        """The ``limit`` most recent runs, newest first."""
        if not 1 <= limit <= 1000:
            raise OperatorError(f"--limit: must be an integer in [1, 1000]; got {limit}")
        listed = self.client("stepfunctions").list_executions(
            stateMachineArn=self.state_machine_arn, maxResults=limit
        )["executions"]
        return [self.run(item["executionArn"]) for item in listed[:limit]]

    # ---- logs and progress --------------------------------------------------------------------------------------
    def log_events(self, run: str, *, follow: bool = False) -> Iterator[LogEvent]:
        """The log lines of every job of the run (all hosts), oldest first per poll; with ``follow``, keep polling
        until the run ends, then read what is left."""
        cursors: dict[str, LogCursor] = {}
        while True:
            current = self.run(run)
            for job in current.jobs:
                cursor = cursors.setdefault(job.name, LogCursor(self.client("logs"), job.name))
                yield from cursor.read()
            if not follow or not current.running:
                return
            self.sleep(self.poll_seconds)

    def watch(self, run: str) -> Iterator[Snapshot]:
        """A snapshot (run state, job status, trainer progress) per poll, until the run ends (the last one is the
        end state)."""
        cursors: dict[str, LogCursor] = {}
        progress = Progress()
        while True:
            current = self.run(run)
            for job in current.jobs:
                progress.expect(job.hyperparameters)
                cursor = cursors.setdefault(job.name, LogCursor(self.client("logs"), job.name))
                for event in cursor.read():
                    progress.feed(event.message)
            yield Snapshot(current, progress)
            if not current.running:
                return
            self.sleep(self.poll_seconds)

    def curve(self, run: str) -> RunCurve:
        """The run's loss, ``val_loss`` and tokens/s over every launch, from its jobs' log lines
        (:func:`constructs_lib.cli.curves.curve_of`)."""
        return self.result_and_curve(run)[1]

    def result_and_curve(self, run: str) -> tuple[dict[str, Any], RunCurve]:
        """:meth:`result` and :meth:`curve` of ``run`` from one read of the run and of each job's log lines."""
        current = self.run(run)
        launches = [(job, LogCursor(self.client("logs"), job.name).read()) for job in current.jobs]
        training = [events for job, events in launches if job.kind == "training"]
        result = with_later_evaluation(self, run_result(current, training[-1] if training else []))
        return result, curve_of(current.name, launches)

    # ---- remote debugging ---------------------------------------------------------------------------------------
    def shell_command(self, run: str, host: int = 1) -> list[str]:
        """``aws ssm start-session`` into host ``host`` (1-based) of the run's running training job
        (:func:`constructs_lib.cli.remote_shell.session_command`)."""
        from constructs_lib.cli.remote_shell import session_command

        profile = self.session.profile_name if hasattr(self.session, "profile_name") else None
        return session_command(self.run(run), host, region=self.region, profile=profile)

    # ---- act ----------------------------------------------------------------------------------------------------
    def stop(self, run: str) -> Run:
        """Stop the run's execution (Step Functions then stops its training job), or a direct run's training job;
        returns the run as it was."""
        current = self.run(run)
        if not current.running:
            raise OperatorError(f"run {current.name} has already ended ({current.status})")
        if current.direct:
            self.client("sagemaker").stop_training_job(TrainingJobName=current.name)
            return current
        self.client("stepfunctions").stop_execution(
            executionArn=current.arn, error=STOP_ERROR, cause="Stopped with blackwell-training stop"
        )
        return current

    # ---- evaluation (constructs_lib.cli.evaluation) --------------------------------------------------------------
    def evaluate(self, run: str, *, name: str | None = None, **options: Any) -> Run:
        """Start an evaluation-only run of the finished run ``run``'s model (``options``: the ``evaluate`` block's
        fields, e.g. ``tasks``, ``task_data_uri``, ``limit``), named ``name`` (default ``<run>-eval-<time>``)."""
        from constructs_lib.cli.evaluation import evaluation_input, evaluation_name

        current = self.run(run)
        return self.submit(evaluation_input(current, options), name=name or evaluation_name(current.name))

    def compare(self, runs: list[str]) -> list[dict[str, Any]]:
        """Each run's precision, steps, final and validation loss and evaluation scores, side by side."""
        from constructs_lib.cli.evaluation import compare_row

        return [compare_row(self, name) for name in dict.fromkeys(runs)]

    def result(self, run: str) -> dict[str, Any]:
        """The run's summary: status, final metrics, artifact and checkpoint URIs, training and billable time, the
        cost estimate, the trainer's own summary line, and console links. ``restarted_from`` is
        ``none (N checkpoints unusable)`` when the trainer found checkpoints and none was usable (the job's
        ``final:unusable_checkpoints`` metric, or its summary line), else None."""
        current = self.run(run)
        events = LogCursor(self.client("logs"), current.job.name).read() if current.job else []
        return with_later_evaluation(self, run_result(current, events))
