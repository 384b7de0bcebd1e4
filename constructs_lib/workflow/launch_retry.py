"""Which ``CreateTrainingJob`` refusals the training workflow retries: only those that retrying can fix.

Step Functions reports an error of the SageMaker integration's API call as ``SageMaker.AmazonSageMakerException``
(or the modelled exception's name) with SageMaker's status and error code in the cause: ``... (Service:
AmazonSageMaker; Status Code: 400; Error Code: ValidationException; ...)``. A ``Retry`` field matches error names
only, so it cannot tell throttling from a bad request; a ``Choice`` on the cause can:

* throttling and server-side errors (``ThrottlingException``, status 5xx) are retried with exponential backoff, a
  bounded number of times;
* ``ResourceLimitExceeded`` (an account quota that frees up when other jobs end), and throttling reported under
  its own error name, keep the ``Retry`` field's backoff;
* every other client error (``ValidationException``, ``AccessDeniedException``, ...) ends the execution at once
  with ``LaunchFailed`` and SageMaker's message: retrying the same request cannot succeed.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

API_ERROR = "SageMaker.AmazonSageMakerException"
"""The error name of a refused SageMaker API call in Step Functions' SageMaker integration."""
QUOTA_ERRORS = ("SageMaker.ResourceLimitExceededException", "SageMaker.ThrottlingException")
"""Error names the ``Retry`` field backs off on (an account quota; throttling when named on its own)."""
RETRYABLE_CAUSES = (
    "*Error Code: ThrottlingException*",
    "*Error Code: ThrottledException*",
    "*Error Code: InternalFailure*",
    "*Error Code: ServiceUnavailable*",
    "*Status Code: 5*",
)
"""Causes of a refusal that a later identical request can overcome."""
LAUNCH_RETRIES = 5
FIRST_BACKOFF_SECONDS = 15
MAX_BACKOFF_SECONDS = 300


def add_quota_retry(launch: sfn.CustomState) -> None:
    """Account-quota and named throttling refusals: the ``Retry`` field's backoff."""
    launch.add_retry(
        errors=list(QUOTA_ERRORS),
        interval=Duration.seconds(FIRST_BACKOFF_SECONDS),
        max_attempts=LAUNCH_RETRIES,
        backoff_rate=2,
        max_delay=Duration.minutes(5),
        jitter_strategy=sfn.JitterType.FULL,
    )


def initial_state(first_backoff: int = FIRST_BACKOFF_SECONDS) -> dict[str, int]:
    """Fields the retry states keep in the execution state (add them before the first launch)."""
    return {"launch_errors": 0, "launch_backoff": first_backoff}


def api_error_states(
    scope: Construct, *, relaunch: sfn.IChainable, launch_failed: sfn.IChainable, suffix: str = ""
) -> sfn.Choice:
    """Catch target for :data:`API_ERROR` (``result_path="$.failure"``): wait and ``relaunch`` when the cause is
    retryable and retries are left, else ``launch_failed``. ``suffix`` ends every state name (one set of these
    states per kind of job)."""
    retryable = sfn.Condition.or_(
        *(sfn.Condition.string_matches("$.failure.Cause", pattern) for pattern in RETRYABLE_CAUSES)
    )
    count = sfn.Pass(
        scope,
        f"Count launch error{suffix}",
        parameters={
            "errors.$": "States.MathAdd($.launch_errors, 1)",
            "backoff.$": "States.MathAdd($.launch_backoff, $.launch_backoff)",
        },
        result_path="$.launch_retry",
    )
    store_errors = sfn.Pass(
        scope,
        f"Store launch errors{suffix}",
        input_path="$.launch_retry.errors",
        result_path="$.launch_errors",
    )
    wait = sfn.Wait(
        scope,
        f"Back off before relaunch{suffix}",
        comment="Throttled or a SageMaker server error: the same request may succeed later.",
        time=sfn.WaitTime.seconds_path("$.launch_backoff"),
    )
    grow = sfn.Choice(scope, f"Backoff at its ceiling?{suffix}")
    keep = sfn.Pass(
        scope,
        f"Keep backoff ceiling{suffix}",
        result=sfn.Result.from_number(MAX_BACKOFF_SECONDS),
        result_path="$.launch_backoff",
    )
    double = sfn.Pass(
        scope, f"Double backoff{suffix}", input_path="$.launch_retry.backoff", result_path="$.launch_backoff"
    )
    grow.when(
        sfn.Condition.number_greater_than("$.launch_retry.backoff", MAX_BACKOFF_SECONDS), keep.next(relaunch)
    )
    grow.otherwise(double.next(relaunch))
    choice = sfn.Choice(scope, f"Retryable launch error?{suffix}")
    choice.when(
        sfn.Condition.and_(retryable, sfn.Condition.number_less_than("$.launch_errors", LAUNCH_RETRIES)),
        wait.next(count).next(store_errors).next(grow),
    )
    choice.otherwise(launch_failed)
    return choice
