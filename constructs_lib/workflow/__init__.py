"""The training workflow: a Step Functions state machine that checks a request, launches one SageMaker training
job with capacity retries, and reports how it ended.

* ``construct``: ``TrainingWorkflow`` and ``WorkflowDefaults``; checks the props and composes the parts below
  (the only module that holds the workflow's attributes);
* ``request``: the ``CreateTrainingJob`` request, a pure function of the workflow's settings;
* ``request_check``: **the request check** (``validate_request``, the Lambda ``handler``; ``RequestRules`` from
  ``request_rules``, the per-field checks in ``request_fields``, the ``evaluate`` block's in
  ``request_evaluation``): pure Python, no aws_cdk, shared by the Lambda function, the operator CLI and the
  construct;
* ``request_function``: ``RequestValidator``, the Lambda function that runs the check; ``request_states``: the
  states that call it first;
* ``states``: preparation, capacity mode and the launch loop, one per kind of job (``JobKind``: training,
  evaluation); ``evaluation_states``: the evaluation job's entries and summary; ``launch_retry``: which refused
  launches are retried;
* ``observability``: the alarm, the notification topic and rule, and the EventBridge trigger; ``dashboard``: the
  CloudWatch dashboard;
* ``permissions``: the IAM grants (state machine, data sources, remote debugging, MLflow); ``props``: the checks
  of the construct's props;
* ``launch_request``: the request rendered from a deployed definition (the SDK path).

Names are re-exported lazily, so importing ``request_check`` loads no aws_cdk.
"""

from __future__ import annotations

from typing import Any

from constructs_lib._shared.lazy import lazy_attribute

_EXPORTS = {
    "RequestRules": ".request_check",
    "RequestValidator": ".request_function",
    "TrainingWorkflow": ".construct",
    "WorkflowDefaults": ".construct",
    "validate_request": ".request_check",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
