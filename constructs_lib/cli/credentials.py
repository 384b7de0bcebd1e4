"""``make deploy`` and ``make destroy``'s first step: are there AWS credentials at all? Without them the CDK CLI
would synthesize the app (most of a minute) and then stop with its own error; this says so in the CLI's one line
first, with the CLI's exit status 3 (``blackwell-training``'s "something to fix first": docs/exit-status.md).

    python -m constructs_lib.cli.credentials [CDK ARGUMENTS ...]

It resolves credentials as the CDK CLI and boto3 do, without calling AWS: the environment, ``--profile NAME``
among the CDK arguments (``CDK_ARGS``) or ``AWS_PROFILE``, the shared files, SSO, a container's or an instance's
role. Whether they are still valid is the CDK CLI's to find (it says so in one line too).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from constructs_lib.cli.errors import explain
from constructs_lib.cli.shell import EXIT_ERROR, EXIT_OK


def profile_of(cdk_args: Sequence[str]) -> str | None:
    """The ``--profile`` the CDK arguments name (``--profile NAME`` or ``--profile=NAME``), or None."""
    for i, arg in enumerate(cdk_args):
        if arg == "--profile" and i + 1 < len(cdk_args):
            return cdk_args[i + 1]
        if arg.startswith("--profile="):
            return arg.split("=", 1)[1]
    return None


def problem(cdk_args: Sequence[str]) -> str | None:
    """Why the CDK CLI would find no credentials (one line), or None when some are found."""
    import boto3
    from botocore.exceptions import NoCredentialsError

    try:
        found = boto3.Session(profile_name=profile_of(cdk_args)).get_credentials()
    except Exception as error:  # an unknown profile, an expired SSO sign-in, ...: botocore's own errors
        line = explain(error)
        if line is None:
            raise
        return line
    return None if found is not None else explain(NoCredentialsError())


def main(argv: Sequence[str] | None = None) -> int:
    line = problem(sys.argv[1:] if argv is None else argv)
    if line is None:
        return EXIT_OK
    print(f"error: {line}", file=sys.stderr)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
