"""The request check's reading of a training plan (``training.request.reads.training_plan_problems``): the plan a
request names, as ``DescribeTrainingPlan`` describes it, must hold the job's instance type and count. The whole
workflow with a plan is in tests/workflow/test_executions.py; here the rule's edges, on botocore's shapes."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from training.request.reads import plan_capacity_problems, training_plan_problems

ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/week"
B200 = "ml.p6-b200.48xlarge"


def capacity(instance_type: str, count: int, status: str = "Active") -> dict[str, Any]:
    return {"ReservedCapacityArn": ARN.replace("training-plan", "reserved-capacity"), "InstanceType": instance_type,
            "TotalInstanceCount": count, "Status": status}  # fmt: skip


def plan(*capacities: dict[str, Any], status: str = "Active", **changes: Any) -> dict[str, Any]:
    return {"TrainingPlanArn": ARN, "TrainingPlanName": "week", "Status": status, "TargetResources": ["training-job"],
            "ReservedCapacitySummaries": list(capacities), **changes}  # fmt: skip


def test_a_plan_that_holds_the_job_is_accepted_in_any_state_a_job_can_wait_in():
    for status in ("Pending", "Scheduled", "Active"):
        assert plan_capacity_problems(plan(capacity(B200, 4), status=status), B200, 4) == []
    # other jobs using an Active plan's instances: the job waits (MaxPendingTimeInSeconds), nothing to refuse
    assert plan_capacity_problems(plan(capacity(B200, 4), AvailableInstanceCount=0), B200, 4) == []


def test_the_largest_reserved_capacity_of_the_type_bounds_the_job_and_ended_ones_do_not_count():
    segments = plan(capacity(B200, 2), capacity(B200, 4, "Expired"), capacity(B200, 3, "Scheduled"))
    assert plan_capacity_problems(segments, B200, 3) == []
    assert plan_capacity_problems(segments, B200, 4) == [
        "instance_count: the training plan week reserves at most 3 x ml.p6-b200.48xlarge at once (its largest "
        "reserved capacity of that type); must be at most 3; got 4"
    ]


def test_another_instance_type_is_refused_naming_what_the_plan_holds():
    mixed = plan(capacity("ml.p5.48xlarge", 2), capacity("ml.p5en.48xlarge", 1))
    assert plan_capacity_problems(mixed, B200, 1, "evaluate.instance_type") == [
        "evaluate.instance_type: the training plan week reserves 1 x ml.p5en.48xlarge, 2 x ml.p5.48xlarge, no "
        'ml.p6-b200.48xlarge (SageMaker runs a job in a plan only on the plan\'s instance type); got "ml.p6-b200.48xlarge"'
    ]


def test_an_ended_plan_or_one_for_other_resources_is_refused():
    assert plan_capacity_problems(
        plan(capacity(B200, 4), status="Failed", StatusMessage="payment"), B200, 1
    ) == [
        "training_plan_arn: the training plan week is Failed (payment); a job in it would never start; name a "
        "Scheduled or Active plan"
    ]
    assert plan_capacity_problems(plan(capacity(B200, 4), TargetResources=["hyperpod-cluster"]), B200, 1) == [
        "training_plan_arn: the training plan week is for hyperpod-cluster, not SageMaker training jobs (a plan "
        "serves only its target resources)"
    ]


def test_a_plan_that_says_nothing_of_its_capacities_is_left_to_sagemaker():
    assert plan_capacity_problems(plan(), B200, 64) == []


class Plans:
    """``describe_training_plan`` answering one plan, or raising SageMaker's error ``code``."""

    def __init__(self, answer: dict[str, Any] | None = None, code: str = "ResourceNotFound") -> None:
        self.answer, self.code = answer, code
        self.asked: list[str] = []

    def describe_training_plan(self, TrainingPlanName: str) -> dict[str, Any]:  # noqa: N803 - boto3's name
        self.asked.append(TrainingPlanName)
        if self.answer is None:
            raise ClientError({"Error": {"Code": self.code, "Message": "no"}}, "DescribeTrainingPlan")
        return self.answer


def test_the_plan_is_described_by_its_arn_and_sagemakers_refusals_are_named():
    found = Plans(plan(capacity(B200, 2)))
    assert training_plan_problems(found, ARN, B200, 2) == [] and found.asked == [ARN]
    assert training_plan_problems(Plans(), ARN, B200, 2) == [
        f'training_plan_arn: no training plan week in this account and region; got "{ARN}"'
    ]
    assert training_plan_problems(Plans(code="AccessDeniedException"), ARN, B200, 2) == [
        "training_plan_arn: the training plan week cannot be described (AccessDeniedException): this workflow runs "
        f'only in its own account\'s plans; got "{ARN}"'
    ]
    with pytest.raises(
        ClientError
    ):  # throttling and the like: the caller's (the Lambda fails and is retried)
        training_plan_problems(Plans(code="ThrottlingException"), ARN, B200, 2)
