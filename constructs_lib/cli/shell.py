"""One ``blackwell-training`` command's context: its parsed arguments, the consoles, standard input, and the API
object (:class:`~constructs_lib.cli.api.TrainingRuns`, made on first use so that offline commands make no AWS
session); the exit statuses; the argument types the commands share."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from constructs_lib.cli.errors import OperatorError, explain
from constructs_lib.cli.request import Project, apply_settings, load_request

EXIT_OK, EXIT_RUN_FAILED, EXIT_INVALID, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
RUN_HELP = (
    "run name (execution name), execution ARN, or the name of a training job launched directly (SDK path)"
)


@dataclass(frozen=True)
class Parents:
    """The argument groups subcommands share (argparse parent parsers): ``common`` (--region, --profile, --stack,
    --json), ``request`` (FILE and --set) and ``polling`` (--interval)."""

    common: argparse.ArgumentParser
    request: argparse.ArgumentParser
    polling: argparse.ArgumentParser


def shared_arguments() -> Parents:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--region", help="AWS region (default: AWS_REGION, the profile's, or cdk.json's region)"
    )
    common.add_argument("--profile", help="AWS CLI profile (default: AWS_PROFILE or the default profile)")
    common.add_argument("--stack", help="CloudFormation stack name (default: cdk.json's stackName)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")
    polling = argparse.ArgumentParser(add_help=False)
    polling.add_argument(
        "--interval", type=positive_seconds, default=10.0, help="seconds between polls (default 10)"
    )
    request = argparse.ArgumentParser(add_help=False)
    request.add_argument("file", nargs="?", help="the execution input: a JSON file, - for standard input")
    request.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set one field (JSON value or text); hyperparameters.NAME=VALUE sets one trainer setting",
    )
    return Parents(common=common, request=request, polling=polling)


class Shell:
    """One command: its arguments, consoles and the API object."""

    def __init__(self, args: argparse.Namespace, out: Any, stdin: IO[str], sleep: Callable[[float], None]):
        self.args, self.out, self.stdin, self.sleep = args, out, stdin, sleep
        self.project = Project.find()
        self._runs: Any = None

    @property
    def runs(self) -> Any:
        if self._runs is None:
            from constructs_lib.cli.api import TrainingRuns

            interval = getattr(self.args, "interval", 10.0)
            self._runs = TrainingRuns(
                stack_name=self.args.stack or self.project.stack_name,
                region=self.args.region or session_region(self.args.profile) or self.project.region,
                profile=self.args.profile,
                poll_seconds=interval,
                sleep=self.sleep,
            )
        return self._runs

    def emit(self, value: Any) -> None:
        self.out.print(json.dumps(value, indent=2, default=str), markup=False)

    def request(self) -> dict[str, Any]:
        return apply_settings(load_request(self.args.file, self.stdin), self.args.settings)


def session_region(profile: str | None) -> str | None:
    """The region boto3 would pick (AWS_REGION, AWS_DEFAULT_REGION, the profile's), or None."""
    import boto3

    try:
        return boto3.Session(profile_name=profile).region_name
    except Exception as error:
        if explain(error) is None:
            raise
        raise OperatorError(explain(error)) from None


def _integer_at_least_1(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be {what}, 1 or more; got {text!r}")
    return value


def host_number(text: str) -> int:
    return _integer_at_least_1(text, "a host number")


def positive_integer(text: str) -> int:
    return _integer_at_least_1(text, "an integer")


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds; got {text!r}")
    return value


def run_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be an integer in [1, 1000]; got {text!r}")
    return value
