"""The training jobs of a workflow execution, in launch order, from its Step Functions history (one job per
launch: capacity errors relaunch), each described by SageMaker."""

from __future__ import annotations

import json
from typing import Any

from constructs_lib.cli.records import Job

TRAINING_JOB_RESOURCE = "createTrainingJob"


def execution_jobs(sfn: Any, sagemaker: Any, execution_arn: str) -> list[Job]:
    """The execution's training jobs in launch order, from its history, each described."""
    jobs: list[Job] = []
    kwargs: dict[str, Any] = {"executionArn": execution_arn, "maxResults": 1000}
    while True:
        page = sfn.get_execution_history(**kwargs)
        for event in page["events"]:
            details = event.get("taskScheduledEventDetails") or {}
            if details.get("resourceType") == "sagemaker" and str(details.get("resource", "")).startswith(
                TRAINING_JOB_RESOURCE
            ):
                request = json.loads(details.get("parameters") or "{}")
                if request.get("TrainingJobName"):
                    jobs.append(Job.from_request(request))
        if not page.get("nextToken"):
            break
        kwargs["nextToken"] = page["nextToken"]
    from botocore.exceptions import ClientError

    for job in jobs:
        try:
            job.update(sagemaker.describe_training_job(TrainingJobName=job.name))
        except ClientError as error:  # a job that CreateTrainingJob refused was never created
            if error.response.get("Error", {}).get("Code") not in (
                "ValidationException",
                "ResourceNotFound",
            ):
                raise
    return jobs
