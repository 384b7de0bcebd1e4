"""The training workflow's first states: decide the request with the ``RequestValidator`` Lambda function.

``Decide request`` invokes :func:`constructs_lib.workflow.request_check.handler` with the raw execution input (any JSON
value, so a non-object input is an ``InvalidInput`` like any other), this execution's name and the workflow's
:class:`~training.request.rules.RequestRules` (a JSON string fixed at synth time). Its result replaces
the state: ``config`` (every input field), ``hyperparameters`` (the exact ``HyperParameters`` map), ``channels``
(``InputDataConfig``), ``resume``, ``request`` (the per-execution request fields), ``evaluation`` (the evaluation
job's parts, or null) and ``tune`` (a tuning run's decided part, or null). ``Request valid?`` ends a bad request in
``InvalidInput`` with every problem
in the cause, before any SageMaker call; a validator that fails itself ends in ``RequestValidationFailed``.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from constructs_lib.workflow.request_function import RequestValidator
from training.request.rules import DECIDE_STATE, INVALID_INPUT_ERROR

VALIDATOR_FAILED_ERROR = "RequestValidationFailed"


def decide_request_states(
    scope: Construct, *, validator: RequestValidator, rules_json: str, next_state: sfn.IChainable
) -> sfn.Chain:
    """``Decide request`` -> ``Request valid?`` -> ``next_state`` (or ``Invalid input``)."""
    invalid = sfn.Fail(
        scope,
        "Invalid input",
        comment="Every problem of the input, each naming the field, the value and what is allowed.",
        error=INVALID_INPUT_ERROR,
        cause_path="$.cause",
    )
    broken = sfn.Fail(
        scope,
        "Request validation failed",
        comment="The validator itself failed (not the input): see its log group.",
        error=VALIDATOR_FAILED_ERROR,
        cause_path="$.Cause",
    )
    decide = tasks.LambdaInvoke(
        scope,
        DECIDE_STATE,
        comment="Check every input field, the trainer settings, SageMaker's limits and resume_from.",
        lambda_function=validator.function,
        payload=sfn.TaskInput.from_object(
            {
                "input": sfn.JsonPath.string_at("$$.Execution.Input"),
                "execution": sfn.JsonPath.string_at("$$.Execution.Name"),
                "rules": rules_json,
            }
        ),
        result_selector={
            "valid.$": "$.Payload.valid",
            "cause.$": "$.Payload.cause",
            "config.$": "$.Payload.config",
            "hyperparameters.$": "$.Payload.hyperparameters",
            "channels.$": "$.Payload.channels",
            "resume.$": "$.Payload.resume",
            "request.$": "$.Payload.request",
            "plan.$": "$.Payload.plan",
            "evaluation.$": "$.Payload.evaluation",
            "evaluation_only.$": "$.Payload.evaluation_only",
            "tune.$": "$.Payload.tune",
        },
        result_path="$",
        task_timeout=sfn.Timeout.duration(Duration.minutes(2)),
    )
    decide.add_catch(broken, errors=["States.ALL"], result_path="$")
    valid = sfn.Choice(scope, "Request valid?")
    valid.when(sfn.Condition.boolean_equals("$.valid", True), next_state)
    valid.otherwise(invalid)
    return decide.next(valid)
