"""What decides a request: :func:`decide_request`, the one function that turns an execution input into either a
complete, checked ``CreateTrainingJob`` decision or the list of every problem, each one line naming the field, the
value and what is allowed. Its body is the order of the decision, top to bottom; each step is a function of the
request read once (``value.Request``).

Every caller runs this one function, so they cannot disagree:

* the workflow's Lambda function (``constructs_lib.workflow.request_check.handler``), before ``CreateTrainingJob``;
* the operator CLI: ``validate`` and ``plan`` offline (cdk.json's rules) or under the deployed rules, ``submit``
  and ``tune``, and the Python API (``TrainingRuns.check``);
* the SageMaker Python SDK path (``constructs_lib.cli.direct``), whose request is rendered from this decision;
* the construct, which checks its own defaults with it at synth time (:func:`validate_request`).

Where the steps are: the input fields' table (``fields``), what one deployment allows (``rules``), the request read
once (``value``: the trainer settings parsed in one place), the checks between fields (``checks``), the
``evaluate`` and ``tune`` blocks (``evaluate_block``, ``tune_block``, with the candidates and cost of ``tuning``),
the memory, time and cost plan (``plan``, with the stored measurements' rules of ``measured``), what is read from S3
and SageMaker (``reads``) and the job's per-execution request fields (``job``); the trainer's settings themselves
are the contract's (``contract``).

Pure Python (standard library only; boto3 clients are passed in): the request check's Lambda asset holds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training.contract import checkpoint_identity
from training.contract.container import RESUME_CHANNEL
from training.plan import estimate as plan_estimate
from training.plan import refusal
from training.request import bounds, checks, evaluate_block, fine_tuning, job
from training.request.fields import show
from training.request.reads import (
    Reads,
    data_problems,
    prepared_problems,
    resume,
    run_folder_problems,
    training_plan_problems,
)
from training.request.rules import RequestRules
from training.request.tune_block import TuneDecision, decide_tune
from training.request.value import Fields, Request, read_request


@dataclass
class Decision:
    """What :func:`decide_request` decided. ``problems`` empty: the request launches with ``fields`` (every input
    field, decided: a tuning run's time limit, spot's wait), ``hyperparameters`` (the exact ``HyperParameters``
    map), ``channels`` (its ``InputDataConfig``), ``plan`` (memory, time and cost; ``ignored`` when launched
    although it does not fit; none for a tuning run, whose trials each have theirs in ``tune``), ``tune`` (a tuning
    run's paths and plan of trials), ``resume`` (the checkpoint it continues from), ``evaluation`` (the evaluation
    job's decided parts) and ``job`` (the per-execution request fields). ``estimate``: the plan of the request
    itself, also of a tuning run and of one refused for its memory (what ``blackwell-training plan`` shows)."""

    problems: list[str]
    request: Request | None = None
    fields: Fields | None = None
    hyperparameters: dict[str, str] = field(default_factory=dict)
    channels: list[dict[str, Any]] = field(default_factory=list)
    estimate: plan_estimate.Plan | None = None
    plan: dict[str, Any] | None = None
    tune: dict[str, Any] | None = None
    resume: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = None
    job: dict[str, Any] | None = None
    tune_refused: list[str] = field(default_factory=list)
    """A tuning run's combinations the trainer's rules refuse, every one (``tune`` carries the count and the first
    few: ``bounds``)."""
    notes: list[str] = field(default_factory=list)
    """What the request is told without being refused (``checks.notes``), one line each; not in the workflow's
    state."""
    skipped: list[str] = field(default_factory=list)
    """The checks this decision could not make with what it was let read (``skipped_checks``: offline, without S3
    or SageMaker, or without the run's name); the workflow makes every one before launch."""

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def cause(self) -> str:
        """Every problem, one line each, within ``bounds.CAUSE_LIMIT_CHARS`` (``problems`` holds them all)."""
        return bounds.bounded_cause(self.problems)

    @property
    def config(self) -> dict[str, Any]:
        """The decided fields as a JSON object (empty when the input was not one)."""
        return {} if self.fields is None else self.fields.as_dict()

    def state(self) -> dict[str, Any]:
        """The Lambda's result, which the workflow's state becomes (``request_states``): everything but ``valid``
        and ``cause`` null when not valid."""
        valid = self.valid
        return {
            "valid": valid,
            "cause": self.cause,
            "config": self.config if valid else None,
            "hyperparameters": self.hyperparameters if valid else None,
            "channels": self.channels if valid else None,
            "resume": self.resume if valid else None,
            "request": self.job if valid else None,
            "plan": self.plan if valid else None,
            "evaluation": self.evaluation if valid else None,
            "evaluation_only": bool(valid and self.evaluation and self.evaluation["only"]),
            "tune": self.tune if valid else None,
        }


def decide_request(
    raw: object, rules: RequestRules, *, reads: Reads | None = None, execution: str | None = None
) -> Decision:
    """The decision about the execution input ``raw`` under ``rules``, in order: the input read once (with the
    ``init_from`` model's config.json, read first: the settings and the plan need its shape), each field, the tags
    and environment, the rules between fields, the ``evaluate`` block, the execution's name, the trainer settings,
    conversation data against its model and the settings (``fine_tuning``), a tuning run's candidates and cost, the
    memory plan and a step against the time limit, the decision's size, then what only a launch reads (the data, the
    run's own folder, ``resume_from``'s checkpoint, the evaluation's tasks, tokenizer and training job, the training
    plan), and what it could not check. ``reads``: what may be read (default: nothing, offline); ``execution``: this
    execution's name."""
    reads = reads or Reads()
    if not isinstance(raw, Mapping):
        return Decision([f"input: must be a JSON object of input fields; got {show(raw)}"])
    request = read_request(raw, rules, reads)
    problems = [*request.unknown, *request.field_problems]
    problems += checks.map_problems(request, rules)
    problems += checks.cross_field_problems(request, rules)
    problems += evaluate_block.input_problems(request, rules)
    problems += checks.tune_with_evaluate(request)
    problems += checks.checkpoint_backend_problems(request)
    problems += checks.execution_name_problems(execution, rules)
    problems += request.settings.problems
    problems += fine_tuning.problems(request)  # conversation data against init_from and the settings
    tune = _tuning_run(request, rules, reads, execution) if not problems else None
    problems += tune.problems if tune is not None else []
    fields = decided_fields(request, tune, valid=not problems)
    decision = Decision(problems, request, fields)
    if not problems:
        _job_and_plan(decision, request, rules, reads, tune)
        if (
            decision.hyperparameters and tune is None
        ):  # a tuning run keeps its folder (``job.checkpoint_backend``)
            backend = job.checkpoint_backend(request.settings.each, fields.instance_count, tuning=False)
            decision.hyperparameters = job.with_checkpoint_place(
                decision.hyperparameters, backend, rules, execution
            )
    decision.problems[:0] = request.read_problems  # the init_from folder's first, then every other one
    if decision.valid:  # the state stays well under Step Functions' limit, offline as in the workflow
        decision.problems += bounds.size_problems(request, fields, rules)
    if decision.valid and reads.before_launch:
        _before_launch(decision, request, rules, reads, execution)
    if decision.valid:
        decision.problems += bounds.state_problems(decision.state())
    decision.skipped = skipped_checks(request, rules, reads, execution)
    decision.notes = checks.notes(request)
    return decision


def skipped_checks(request: Request, rules: RequestRules, reads: Reads, execution: str | None) -> list[str]:
    """What the decision of ``request`` did not check, one line each, because it was not let read it (``reads``:
    no S3 or SageMaker, or not before a launch) or does not know it (the workflow's bucket, this run's name); every
    one is checked by the workflow before it launches. Empty in the workflow."""
    fields, skipped = request.fields, []
    uris = [u for u in (fields.train_data_uri, fields.init_from) if isinstance(u, str)]
    if request.evaluate is not None and isinstance(request.evaluate.task_data_uri, str):
        uris.append(request.evaluate.task_data_uri)
    if rules.bucket_name is None and uris and any(not s.startswith("s3://") for s in rules.data_sources):
        skipped.append(
            "the data sources' bucket: the workflow's bucket is not known here, so train_data_uri, init_from and "
            "evaluate.task_data_uri were matched on their key only, in any bucket (give --bucket NAME, the stack "
            "output CheckpointBucketName, or --deployed)"
        )
    if fields.init_from is not None and request.architecture is None and not request.read_problems:
        skipped.append(
            "init_from: the model folder's config.json (read from S3 before launch): the settings against the "
            f"model's shape, the memory and time plan and a tuning run's candidates{fine_tuning.model_unread(request)} "
            "(offline: a local copy of the folder, --init-from DIR)"
        )
    skipped += fine_tuning.skipped_checks(request)
    evaluates_only = request.evaluate is not None and request.evaluate.training_job is not None
    if not evaluates_only and rules.image_tag() is not None and not reads.knows_measurements:
        skipped.append(
            "the plan's throughput: a stored tuning measurement of this configuration (S3) would replace the "
            "published figures, and with them the step time checked against max_runtime_seconds and a tuning "
            "run's cost"
        )
    if not evaluates_only and execution is None:
        skipped.append(
            "the run's name: that its checkpoint folder holds no earlier run's (one S3 listing when it is started)"
        )
    if reads.before_launch:
        return skipped
    if fields.train_data_uri is not None:
        skipped.append("train_data_uri: that it holds the training data (one S3 listing before launch)")
    if fields.resume_from is not None:
        skipped.append("resume_from: that run's newest complete checkpoint, below max_steps (read from S3)")
    if request.evaluate is not None:
        job = ", the training job it names (SageMaker)" if evaluates_only else ""
        skipped.append(f"evaluate: the task folder's tasks and the model's tokenizer (read from S3){job}")
    if fields.training_plan_arn is not None:
        skipped.append(
            "training_plan_arn: that the plan exists in the account and region, is Scheduled or Active, serves "
            "training jobs and reserves the job's instances (SageMaker's DescribeTrainingPlan before launch)"
        )
    return skipped


def validate_request(raw: object, rules: RequestRules) -> list[str]:
    """Every problem of the execution input ``raw`` under ``rules``, offline (empty: valid)."""
    return decide_request(raw, rules).problems


def prepare_request(
    raw: object,
    rules: RequestRules,
    architecture: Mapping[str, Any] | None = None,
    *,
    measurements: Sequence[Mapping[str, Any]] = (),
    execution: str | None = None,
) -> Decision:
    """The decision without S3, with what the caller knows: ``architecture``, the ``init_from`` model's settings
    (``reads.read_init_from``; without them the shape checks and the memory plan wait for a read), and
    ``measurements``, stored tuning records for the plan."""
    reads = Reads(architecture=architecture, measurements=measurements)
    return decide_request(raw, rules, reads=reads, execution=execution)


def _tuning_run(
    request: Request, rules: RequestRules, reads: Reads, execution: str | None
) -> TuneDecision | None:
    """A tuning run's decision (``tune_block``), or None for a training run."""
    if request.tune is None:
        return None
    return decide_tune(request, rules, measurements=reads.measurements(rules), execution=execution)


def decided_fields(request: Request, tune: TuneDecision | None, *, valid: bool) -> Fields:
    """The fields the job runs with: a tuning run's time limit is its cost bound (SageMaker keeps it), and spot's
    wait defaults to the time limit (a valid request's)."""
    fields = request.fields
    if tune is not None and tune.max_runtime_seconds is not None:
        fields = fields.but(max_runtime_seconds=tune.max_runtime_seconds)
    if valid and fields.use_spot and fields.max_wait_seconds is None:
        fields = fields.but(max_wait_seconds=fields.max_runtime_seconds)
    return fields


def _job_and_plan(
    decision: Decision, request: Request, rules: RequestRules, reads: Reads, tune: TuneDecision | None
) -> None:
    """A request with no problem so far: its job's settings and channels, and its memory plan (with the stored
    measurements; refused when it does not fit, unless ``ignore_memory_estimate``)."""
    assert decision.fields is not None
    fields = decision.fields
    decision.hyperparameters = dict(
        tune.hyperparameters
        if tune is not None and tune.tune is not None
        else request.settings.hyperparameters
    )
    decision.tune = tune.tune if tune is not None else None
    decision.tune_refused = list(tune.refused) if tune is not None else []
    decision.channels = job.channels(fields)
    if request.settings.values is None:
        return  # init_from before its config.json is read: its shape is not known
    estimate = plan_estimate.plan_of(
        request.setup(fields),
        request.settings.values,
        max_instance_count=rules.max_instance_count,
        instance_types=rules.allowed_instance_types,
        measurements=reads.measurements(rules),
        image_tag=rules.image_tag(),
        objective=fine_tuning.objective(request),
    )
    estimate = fine_tuning.with_data_plan(estimate, request)
    decision.estimate = estimate
    if tune is not None:
        return  # each trial has its own plan (in tune)
    ignored = bool(fields.ignore_memory_estimate) and not estimate.memory.fits
    decision.plan = {**estimate.to_dict(), "ignored": ignored}
    refused = None if fields.ignore_memory_estimate else refusal.refusal(estimate)
    if refused:
        decision.problems.append(refused)
        decision.hyperparameters, decision.channels = {}, []
    decision.problems += checks.one_step_problems(estimate, rules)


def _before_launch(
    decision: Decision, request: Request, rules: RequestRules, reads: Reads, execution: str | None
) -> None:
    """What only S3 and SageMaker can tell, in order, each when nothing before it refused: the data prefix holds an
    object (and, when a sharded preparation wrote it, its complete manifest agreeing with its files), the run's own
    checkpoint folder holds no earlier run's (unless ``resume_from`` continues it), the run ``resume_from`` names
    has a complete checkpoint below ``max_steps``, the evaluation's tasks, tokenizer and instance type, and the
    training plan holds the job's instances."""
    fields = decision.fields
    assert fields is not None
    if fields.train_data_uri is not None:
        decision.problems += data_problems(reads.s3, fields.train_data_uri)
        if decision.valid:
            decision.problems += prepared_problems(reads.s3, fields.train_data_uri)
    trains = request.evaluate is None or request.evaluate.training_job is None
    if decision.valid and trains and execution is not None and fields.resume_from != execution:
        decision.problems += run_folder_problems(reads.s3, rules, execution, tuning=request.tune is not None)
    if decision.valid and fields.resume_from is not None:
        assert request.settings.values is not None
        max_steps = request.settings.values["max_steps"]
        identity = checkpoint_identity.model_identity(request.settings.values)
        decision.resume, problems = resume(
            reads.s3, rules, fields.resume_from, execution, max_steps, identity
        )
        decision.problems += problems
        if decision.resume is not None and not decision.resume["in_place"]:
            decision.channels.append(job.channel(RESUME_CHANNEL, decision.resume["uri"], "File"))
    if decision.valid and fields.evaluate is not None:
        parameters = (decision.plan or {}).get("parameters")
        decision.evaluation, problems = evaluate_block.decide(
            request, fields, rules, reads, str(execution), parameters
        )
        decision.problems += problems
    if decision.valid and fields.training_plan_arn is not None:
        decision.problems += training_plan_problems(
            reads.sagemaker, fields.training_plan_arn, *_plan_job(decision)
        )
    if decision.valid:
        decision.job = job.job_fields(fields, rules, str(execution))


def _plan_job(decision: Decision) -> tuple[str, int, str]:
    """The instance type and count of the job a training plan must hold, and the field that chose the type: an
    evaluation-only request's one evaluation instance, else the training (or tuning) job's instances (an evaluation
    after it takes one of the same type)."""
    assert decision.fields is not None
    evaluation = decision.evaluation
    if evaluation is not None and evaluation["only"]:
        config = evaluation["config"]
        return config["instance_type"], config["instance_count"], "evaluate.instance_type"
    return decision.fields.instance_type, decision.fields.instance_count, "instance_type"
