"""The exact ``CreateTrainingJob`` request a deployed training workflow sends for an input, rendered outside it.

Its one job: one source for the request. The workflow's request is the ``Parameters`` template of its
``createTrainingJob.sync`` task (built by :mod:`constructs_lib.workflow.request`), filled from the state that its
``Decide request`` result and the launch states (``Prepare launch``, capacity mode, node count, input data) build.
:func:`launch_request` evaluates those very states of the deployed definition (``DescribeStateMachine``), from the
request's decision (:func:`constructs_lib.workflow.request_check.decide`, the Lambda's own function) to the
first launch task, so a field added to the template or to the launch states reaches any other launch path (the
SageMaker Python SDK path of ``blackwell-training``) with no edit here. Only the job name differs where the caller
names the job. Pure Python (:mod:`constructs_lib._shared.asl_eval`); no AWS call, no ``aws_cdk``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from constructs_lib._shared.asl_eval import AslPathError, AslUnsupported, evaluate_payload, walk
from training.request.rules import DECIDE_STATE

CREATE_TRAINING_JOB_RESOURCE = "arn:aws:states:::sagemaker:createTrainingJob"
"""The ``Resource`` of the launch task, with or without ``.sync``."""


def _is_launch(_name: str, state: Mapping[str, Any]) -> bool:
    resource = str(state.get("Resource", ""))
    return state.get("Type") == "Task" and resource.split(".sync")[0] == CREATE_TRAINING_JOB_RESOURCE


def execution_arn(state_machine_arn: str, name: str) -> str:
    """The ARN of the execution ``name`` of ``state_machine_arn``."""
    return f"{state_machine_arn.replace(':stateMachine:', ':execution:', 1)}:{name}"


def execution_context(
    *, name: str, execution_input: Any, state_machine_arn: str | None = None, start: datetime | None = None
) -> dict[str, Any]:
    """The context object (``$$``) of an execution named ``name`` of ``state_machine_arn``."""
    arn = state_machine_arn or "arn:aws:states:::stateMachine:direct"
    started = (start or datetime.now(UTC)).isoformat().replace("+00:00", "Z")
    return {
        "Execution": {
            "Id": execution_arn(arn, name),
            "Name": name,
            "Input": execution_input,
            "StartTime": started,
        },
        "StateMachine": {"Id": arn, "Name": arn.rsplit(":", 1)[-1]},
    }


def launch_request(
    definition: str | Mapping[str, Any],
    decided: Mapping[str, Any],
    context: Mapping[str, Any],
    *,
    job_name: str | None = None,
) -> dict[str, Any]:
    """The boto3 ``CreateTrainingJob`` keyword arguments of the first launch of the deployed workflow
    ``definition`` for the decision ``decided`` (what ``request_check.decide`` returned for the input, valid) in
    the execution ``context`` (:func:`execution_context`). ``job_name``: the ``TrainingJobName`` (default: the
    workflow's own, ``<job_name_prefix>-<UUID>``).

    Raises ``ValueError`` when ``decided`` is not valid, and ``ValueError`` naming the state when the definition
    uses something the evaluator does not implement (a newer workflow than this code)."""
    if not decided.get("valid"):
        raise ValueError(f"the request is not valid: {decided.get('cause')}")
    machine = json.loads(definition) if isinstance(definition, str) else definition
    states = machine.get("States", {})
    decide_state = states.get(DECIDE_STATE)
    if decide_state is None or "Next" not in decide_state:
        raise ValueError(f"definition: no '{DECIDE_STATE}' state (not a TrainingWorkflow?)")
    try:
        if decide_state.get("ResultPath", "$") != "$" or "ResultSelector" not in decide_state:
            raise AslUnsupported(f"'{DECIDE_STATE}': needs a ResultSelector and ResultPath $")
        data = evaluate_payload(decide_state["ResultSelector"], {"Payload": dict(decided)}, context)
        launch_name, launch_input = walk(machine, decide_state["Next"], data, context, _is_launch)
        request = evaluate_payload(states[launch_name]["Parameters"], launch_input, context)
    except (AslUnsupported, AslPathError) as error:
        raise ValueError(
            f"cannot render the deployed workflow's CreateTrainingJob request ({error}): "
            "is this blackwell-training as new as the deployed stack?"
        ) from None
    if job_name is not None:
        request["TrainingJobName"] = job_name
    return request
