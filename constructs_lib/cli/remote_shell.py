"""Remote debugging: the ``aws ssm start-session`` command that opens a shell in a running training job's container
(``blackwell-training shell``), or the one-line reason it cannot."""

from __future__ import annotations

from constructs_lib.cli.errors import OperatorError
from constructs_lib.cli.records import Run


def session_command(current: Run, host: int, *, region: str, profile: str | None) -> list[str]:
    """``aws ssm start-session`` into host ``host`` (1-based) of the run's running training job: the target is
    ``sagemaker-training-job:<job>_algo-<host>``. Refused with a one-line reason when the run has no job, the
    job did not ask for ``remote_debug`` or is not running, or has fewer hosts."""
    job = current.job
    if job is None:
        raise OperatorError(f"run {current.name} has no training job yet ({current.status})")
    if not job.remote_debug:
        raise OperatorError(
            f"training job {job.name} was started without remote debugging: submit with remote_debug true "
            "(the stack needs remoteDebug in cdk.json)"
        )
    if job.status != "InProgress":
        raise OperatorError(
            f"training job {job.name} is {job.status}, not running: there is no shell to open"
        )
    if not 1 <= host <= job.instance_count:
        raise OperatorError(f"--host: must be in [1, {job.instance_count}] (the job's hosts); got {host}")
    command = [
        "aws",
        "ssm",
        "start-session",
        "--target",
        f"sagemaker-training-job:{job.name}_algo-{host}",
    ]
    command += ["--region", region]
    return command + (["--profile", profile] if profile and profile != "default" else [])
