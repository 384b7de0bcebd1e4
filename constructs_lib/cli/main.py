"""``blackwell-training``: the command-line front end (argparse for the arguments, rich for tables and the progress
bar) over :mod:`constructs_lib.cli.api`. Every error is one line on standard error, never a traceback.

Exit status: 0 success; 1 the run failed, timed out or was stopped (watch, submit --wait, result); 2 an invalid
request or command line; 3 an error to fix first (no credentials, stack not deployed, unknown run, ...); 130
interrupted (the run itself goes on).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO

from constructs_lib.cli import render
from constructs_lib.cli.commands import evaluate, follow, launch, prepare, results, tune
from constructs_lib.cli.errors import InvalidRequest, OperatorError, explain
from constructs_lib.cli.shell import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_INVALID, Shell, shared_arguments

COMMAND_GROUPS = (launch, follow, results, evaluate, tune, prepare)
"""The modules of :mod:`constructs_lib.cli.commands`, in the order their subcommands are listed."""


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[Shell], int]]]:
    """The ``blackwell-training`` parser and every subcommand's handler by name."""
    parser = argparse.ArgumentParser(
        prog="blackwell-training",
        description="Start, follow, stop and sum up training runs of the deployed Blackwell training workflow.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parents = shared_arguments()
    handlers: dict[str, Callable[[Shell], int]] = {}
    for group in COMMAND_GROUPS:
        handlers.update(group.register(sub, parents))
    return parser, handlers


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: IO[str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run ``blackwell-training`` with ``argv``; returns the exit status (the console script exits with it)."""
    from rich.console import Console

    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    out = Console(file=stdout or sys.stdout, highlight=False, soft_wrap=True)
    err = Console(file=stderr or sys.stderr, highlight=False, soft_wrap=True)
    try:
        shell = Shell(args, out, stdin or sys.stdin, sleep)
        return handlers[args.command](shell)
    except InvalidRequest as error:
        render.print_problems(error.problems, err, out if args.json else None)
        return EXIT_INVALID
    except OperatorError as error:
        err.print(f"error: {error}", markup=False)
        return EXIT_ERROR
    except KeyboardInterrupt:
        err.print("interrupted; a started run goes on (`blackwell-training stop RUN` stops it)", markup=False)
        return EXIT_INTERRUPTED
    except Exception as error:
        line = explain(error)
        if line is None:
            raise
        err.print(f"error: {line}", markup=False)
        return EXIT_ERROR


def console_script() -> None:
    sys.exit(main())
