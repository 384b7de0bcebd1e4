"""The training workflow: a Step Functions state machine that checks a request, launches one SageMaker training
job with capacity retries, and reports how it ended.

* ``construct``: ``TrainingWorkflow``; checks the props and composes the parts below (the only module that holds
  the workflow's attributes); ``defaults``: ``WorkflowDefaults``; ``rules``: what an execution may ask for (the
  ``RequestRules`` made from the props); ``job_network``: the jobs' ``VpcConfig``;
* ``request``: the ``CreateTrainingJob`` request, a pure function of the workflow's settings;
* ``request_check``: the Lambda ``handler`` of **the request check**, which runs what decides a request
  (``training.request.decision.decide_request``, pure Python, no aws_cdk, shared by the Lambda function, the
  operator CLI, the SDK path and the construct; ``RequestRules`` and ``validate_request`` re-exported here);
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

Names are re-exported lazily, so importing ``request_check`` (or this package's ``RequestRules``) loads no aws_cdk.
"""

from __future__ import annotations

from typing import Any

from constructs_lib._shared.lazy import lazy_attribute

_EXPORTS = {
    "RequestRules": "training.request.rules",
    "RequestValidator": ".request_function",
    "TrainingWorkflow": ".construct",
    "WorkflowDefaults": ".defaults",
    "validate_request": "training.request.decision",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
