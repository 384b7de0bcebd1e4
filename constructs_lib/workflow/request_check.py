"""The request check's Lambda function: :func:`handler` runs the one decision
(``training.request.decision.decide_request``) on the workflow's event and returns what the state becomes.

Why a Lambda function and not JSONata states: the checks that matter are the trainer's own rules (every setting of
``training/contract/``, its parsers and its cross-setting rules), and running the contract runs exactly
those rules, so a new trainer setting is checked with no edit here. A JSONata copy of them would be a second
implementation to keep in step, could not list S3 to decide ``resume_from`` on its own, and is not evaluated by
moto 5.2.5 (the tests would need a second evaluator). The Lambda asset (``request_function``) holds only this module
and ``training/request/``'s decision (standard library only; ``boto3`` from the Lambda runtime is imported only to
read S3 and to describe an evaluated training job).

SageMaker's request constraints (name length and pattern, hyperparameter count and sizes, S3 URI length and
pattern, input modes, training plan ARN pattern, tag and environment counts, patterns and lengths, the warm-pool
keep-alive maximum) are read from botocore's service model at synth time (``rules.sagemaker_limits``) and carried
in the rules, so the Lambda needs no botocore of a particular version.

Nothing here imports ``aws_cdk``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from training.request.decision import decide_request
from training.request.reads import Reads
from training.request.rules import RequestRules


def decide(
    event: Mapping[str, Any], s3: Any = None, sagemaker: Any = None, *, problems: list[str] | None = None
) -> dict[str, Any]:
    """The Lambda's work: ``event`` = ``{"input": <execution input>, "rules": <RequestRules or its JSON>,
    "execution": <this execution's name>}``. Returns ``{"valid", "cause", "config", "hyperparameters",
    "channels", "resume", "request", "plan", "evaluation", "evaluation_only", "tune"}``
    (``decision.Decision.state``: all but the first two null when not valid). ``s3``: a boto3 S3 client to read
    the stored tuning measurements for the plan (without one: the plan's estimate), and (default: one for the
    rules' region, made on first use) to read the ``init_from`` folder's config.json, to check ``train_data_uri``
    holds data, to decide ``resume_from`` and to read the evaluation's task folder and the model's tokenizer;
    ``sagemaker``: a SageMaker client for an evaluation-only request's training job (default: likewise);
    ``problems``: a list that receives every problem (the state's ``cause`` keeps only what fits)."""
    rules = RequestRules.from_json(event["rules"])
    reads = Reads(
        s3 if s3 is not None else _OnFirstUse("s3", rules),
        sagemaker if sagemaker is not None else _OnFirstUse("sagemaker", rules),
        measurements=None if s3 is not None else (),
        before_launch=True,
    )
    decision = decide_request(event.get("input"), rules, reads=reads, execution=event.get("execution"))
    if problems is not None:
        problems.extend(decision.problems)
    return decision.state()


LOGGED_PROBLEMS = 1000
LOGGED_CHARS = 8192


LOG = logging.getLogger(__name__)
LOG.setLevel(logging.INFO)  # the Lambda runtime's root handler writes it to the function's log group


def log_decision(execution: Any, problems: list[str]) -> None:
    """One record with the outcome, then every problem in its own (the state's ``cause`` keeps only what fits:
    ``training.request.bounds``), at most ``LOGGED_PROBLEMS`` of ``LOGGED_CHARS`` characters each."""
    LOG.info(json.dumps({"execution": execution, "valid": not problems, "problems": len(problems)}))
    for problem in problems[:LOGGED_PROBLEMS]:
        LOG.info(json.dumps({"execution": execution, "problem": problem[:LOGGED_CHARS]}))


class _OnFirstUse:
    """A boto3 client of the rules' region, made on first use (boto3 is imported only when a service is called)."""

    def __init__(self, service: str, rules: RequestRules) -> None:
        self._service, self._rules, self._client = service, rules, None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            import boto3  # noqa: PLC0415 - in the Lambda runtime; the CLI passes its own clients

            region = self._rules.region
            self._client = (
                boto3.client(self._service, region_name=region) if region else boto3.client(self._service)
            )
        return getattr(self._client, name)


def handler(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Lambda entry point (see :func:`decide`): with an S3 client, so that the plan reads the stored measurements."""
    rules = RequestRules.from_json(event["rules"])
    problems: list[str] = []
    state = decide(
        event, _OnFirstUse("s3", rules) if rules.bucket_name is not None else None, problems=problems
    )
    log_decision(event.get("execution"), problems)
    return state
