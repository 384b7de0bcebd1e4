"""Errors of ``blackwell-training``, and botocore's errors said as one line a user can act on."""

from __future__ import annotations

from collections.abc import Sequence


class OperatorError(Exception):
    """Something the user must fix, said in one line."""


class InvalidRequest(OperatorError):
    """The request is invalid; ``problems`` lists every problem, one line each."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def explain(error: BaseException) -> str | None:
    """One line for a botocore error (no credentials, no region, unknown profile, unreachable endpoint, a refused
    call); None for anything else."""
    from botocore import exceptions as bx

    if isinstance(error, bx.NoCredentialsError | bx.PartialCredentialsError):
        return "no AWS credentials found: run `aws configure` or `aws sso login`, set AWS_PROFILE or pass --profile"
    if isinstance(error, bx.NoRegionError):
        return "no AWS region: pass --region, set AWS_REGION, or set region in cdk.json"
    if isinstance(error, bx.ProfileNotFound):
        return f"AWS profile not found: {error.kwargs.get('profile')} (see ~/.aws/config)"
    if isinstance(error, bx.EndpointConnectionError):
        return (
            f"cannot reach AWS at {error.kwargs.get('endpoint_url')} (network, region or AWS_ENDPOINT_URL?)"
        )
    if isinstance(error, bx.TokenRetrievalError | bx.SSOError):
        return f"AWS sign-in expired or failed ({error}): run `aws sso login`"
    if isinstance(error, bx.ClientError):
        detail = error.response.get("Error", {})
        code, message = detail.get("Code", "Error"), detail.get("Message", "")
        operation = getattr(error, "operation_name", "the call")
        if code in ("ExpiredToken", "ExpiredTokenException", "RequestExpired"):
            return f"AWS credentials expired ({message}): refresh them and try again"
        return f"AWS refused {operation}: {code}: {message}"
    if isinstance(error, bx.BotoCoreError):
        return f"AWS client error: {error}"
    return None
