"""AWS console addresses of a run (its execution, its training job, the job's logs), defined once for the workflow's
summary output, its notifications and the operator CLI. Pure Python (no aws_cdk): placeholders ``{region}``,
``{execution_arn}`` and ``{job}`` are filled with values, Step Functions intrinsics or EventBridge fields."""

from __future__ import annotations

CONSOLE_HOSTS = {
    "aws": "console.aws.amazon.com",
    "aws-cn": "console.amazonaws.cn",
    "aws-us-gov": "console.amazonaws-us-gov.com",
}
"""The console's host per partition (unknown partitions get the ``aws`` one)."""

EXECUTION = "https://{host}/states/home?region={region}#/v2/executions/details/{execution_arn}"
TRAINING_JOB = "https://{host}/sagemaker/home?region={region}#/jobs/{job}"
LOGS = (
    "https://{host}/cloudwatch/home?region={region}#logsV2:log-groups/log-group/"
    "$252Faws$252Fsagemaker$252FTrainingJobs$3FlogStreamNameFilter$3D{job}"
)
"""The log group ``/aws/sagemaker/TrainingJobs`` filtered to the job's streams (one per host)."""
DASHBOARD = "https://{host}/cloudwatch/home?region={region}#dashboards/dashboard/{name}"
"""A CloudWatch dashboard (the workflow's)."""


def console_host(partition: str | None) -> str:
    return CONSOLE_HOSTS.get(partition or "aws", CONSOLE_HOSTS["aws"])


def console_host_of_region(region: str | None) -> str:
    """The console host of a region's partition (a region not known here, e.g. a deploy-time token, gets the
    ``aws`` partition's host)."""
    if region and region.startswith("cn-"):
        return CONSOLE_HOSTS["aws-cn"]
    if region and region.startswith("us-gov-"):
        return CONSOLE_HOSTS["aws-us-gov"]
    return CONSOLE_HOSTS["aws"]


def run_links(
    *, partition: str | None, region: str, execution_arn: str | None, job: str | None
) -> dict[str, str]:
    """The run's links that can be made from what is given (``execution``, ``training_job``, ``logs``)."""
    host = console_host(partition)
    links: dict[str, str] = {}
    if execution_arn:
        links["execution"] = EXECUTION.format(host=host, region=region, execution_arn=execution_arn)
    if job:
        links["training_job"] = TRAINING_JOB.format(host=host, region=region, job=job)
        links["logs"] = LOGS.format(host=host, region=region, job=job)
    return links
