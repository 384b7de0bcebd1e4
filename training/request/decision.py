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

from training.request import checks, evaluate_block, job, plan
from training.request.contract import RESUME_CHANNEL
from training.request.fields import show
from training.request.reads import Reads, data_problems, resume
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
    estimate: plan.Plan | None = None
    plan: dict[str, Any] | None = None
    tune: dict[str, Any] | None = None
    resume: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = None
    job: dict[str, Any] | None = None

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def cause(self) -> str:
        return "; ".join(self.problems)

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
    and environment, the rules between fields, the ``evaluate`` block, the trainer settings, a tuning run's
    candidates and cost, the memory plan, then what only a launch reads (the data, ``resume_from``'s checkpoint,
    the evaluation's tasks, tokenizer and training job). ``reads``: what may be read (default: nothing, offline);
    ``execution``: this execution's name."""
    reads = reads or Reads()
    if not isinstance(raw, Mapping):
        return Decision([f"input: must be a JSON object of input fields; got {show(raw)}"])
    request = read_request(raw, rules, reads)
    problems = [*request.unknown, *request.field_problems]
    problems += checks.map_problems(request, rules)
    problems += checks.cross_field_problems(request, rules)
    problems += evaluate_block.input_problems(request, rules)
    problems += checks.tune_with_evaluate(request)
    problems += request.settings.problems
    tune = _tuning_run(request, rules, reads, execution) if not problems else None
    problems += tune.problems if tune is not None else []
    fields = decided_fields(request, tune, valid=not problems)
    decision = Decision(problems, request, fields)
    if not problems:
        _job_and_plan(decision, request, rules, reads, tune)
    decision.problems[:0] = request.read_problems  # the init_from folder's first, then every other one
    if decision.valid and reads.before_launch:
        _before_launch(decision, request, rules, reads, execution)
    return decision


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
        tune.hyperparameters if tune is not None else request.settings.hyperparameters
    )
    decision.tune = tune.tune if tune is not None else None
    decision.channels = job.channels(fields)
    if request.settings.values is None:
        return  # init_from before its config.json is read: its shape is not known
    estimate = plan.plan_of(
        request.setup(fields),
        request.settings.values,
        max_instance_count=rules.max_instance_count,
        instance_types=rules.allowed_instance_types,
        measurements=reads.measurements(rules),
        image_tag=rules.image_tag(),
    )
    decision.estimate = estimate
    if tune is not None:
        return  # each trial has its own plan (in tune)
    ignored = bool(fields.ignore_memory_estimate) and not estimate.memory.fits
    decision.plan = {**estimate.to_dict(), "ignored": ignored}
    refused = None if fields.ignore_memory_estimate else plan.refusal(estimate)
    if refused:
        decision.problems.append(refused)
        decision.hyperparameters, decision.channels = {}, []


def _before_launch(
    decision: Decision, request: Request, rules: RequestRules, reads: Reads, execution: str | None
) -> None:
    """What only S3 and SageMaker can tell, in order, each when nothing before it refused: the data prefix holds an
    object, the run ``resume_from`` names has a complete checkpoint below ``max_steps``, and the evaluation's tasks,
    tokenizer and instance type."""
    fields = decision.fields
    assert fields is not None
    if fields.train_data_uri is not None:
        decision.problems += data_problems(reads.s3, fields.train_data_uri)
    if decision.valid and fields.resume_from is not None:
        assert request.settings.values is not None
        max_steps = request.settings.values["max_steps"]
        decision.resume, problems = resume(reads.s3, rules, fields.resume_from, execution, max_steps)
        decision.problems += problems
        if decision.resume is not None:
            decision.channels.append(job.channel(RESUME_CHANNEL, decision.resume["uri"], "File"))
    if decision.valid and fields.evaluate is not None:
        parameters = (decision.plan or {}).get("parameters")
        decision.evaluation, problems = evaluate_block.decide(
            request, fields, rules, reads, str(execution), parameters
        )
        decision.problems += problems
    if decision.valid:
        decision.job = job.job_fields(fields, rules, str(execution))
