"""Following runs: ``runs`` (recent runs), ``watch`` (live until a run ends), ``logs`` (every host's job log lines),
``stop`` (a run and so its job) and ``shell`` (an SSM session in a running job's container)."""

from __future__ import annotations

import json
from typing import Any, TextIO, cast

from constructs_lib.cli import render
from constructs_lib.cli.errors import OperatorError
from constructs_lib.cli.progress import format_duration
from constructs_lib.cli.records import Run, Snapshot
from constructs_lib.cli.shell import (
    EXIT_OK,
    EXIT_RUN_FAILED,
    RUN_HELP,
    Parents,
    Shell,
    host_number,
    run_count,
)

SESSION_MANAGER_PLUGIN = "session-manager-plugin"


def register(sub: Any, parents: Parents) -> dict[str, Any]:
    """Add ``runs``, ``watch``, ``logs``, ``stop`` and ``shell`` to the subcommands; their handlers by name."""
    common, polling = parents.common, parents.polling
    runs = sub.add_parser(
        "runs",
        parents=[common],
        help="recent runs, newest first",
        description="Recent runs of the deployed workflow, newest first: status, training job, instance type and "
        "count, launches, duration, a cost estimate (billable seconds x the contract's on-demand price) and the "
        "warm pool (DescribeTrainingJob's WarmPoolStatus: Available, InUse, Reused or Terminated).",
    )
    runs.add_argument("--limit", type=run_count, default=20, help="how many, 1 to 1000 (default 20)")
    sub.add_parser(
        "watch",
        parents=[common, polling],
        help="follow a run live until it ends",
        description="Follow a run live until it ends: execution state, job status and secondary status, and the "
        "trainer's progress (step N/M, loss, tokens/s, MFU, ETA); exits 0 when the run succeeds, 1 with SageMaker's "
        "failure reason otherwise.",
    ).add_argument("run", help=RUN_HELP)
    logs = sub.add_parser(
        "logs",
        parents=[common, polling],
        help="a run's training job logs (all hosts)",
        description="The CloudWatch log lines of every training job of the run (every launch, every host), "
        "each prefixed with its host; with --follow, keep polling every --interval seconds until the run ends.",
    )
    logs.add_argument("run", help=RUN_HELP)
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    stop = sub.add_parser(
        "stop",
        parents=[common],
        help="stop a run (and so its training job)",
        description="Stop the run's execution; Step Functions then stops its training job (a directly launched "
        "job is stopped through SageMaker; checkpoints already written stay). Asks for confirmation in a terminal; pass --yes otherwise.",
    )
    stop.add_argument("run", help=RUN_HELP)
    stop.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    shell = sub.add_parser(
        "shell",
        parents=[common],
        help="open a shell in a running job's container (remote debugging)",
        description="Open an SSM session into the training container of the run's running job (submitted with "
        "remote_debug true): `aws ssm start-session --target sagemaker-training-job:<job>_algo-<host>`. Needs the "
        "AWS CLI and its Session Manager plugin; without them, or with --print, the command is printed.",
    )
    shell.add_argument("run", help="run name (execution name) or execution ARN")
    shell.add_argument(
        "--host", type=host_number, default=1, help="which host, 1 to the job's count (default 1)"
    )
    shell.add_argument("--print", action="store_true", help="print the command instead of running it")
    return {"runs": do_runs, "watch": do_watch, "logs": do_logs, "stop": do_stop, "shell": do_shell}


def do_runs(shell: Shell) -> int:
    listed = shell.runs.runs(shell.args.limit)
    if shell.args.json:
        shell.emit([run.as_dict() for run in listed])
        return EXIT_OK
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"Runs of {shell.runs.stack_name} ({shell.runs.region})")
    for column in (
        "run",
        "status",
        "job",
        "instances",
        "launches",
        "duration",
        "cost (est.)",
        "warm pool",
    ):
        table.add_column(column, justify="right" if column in ("launches", "duration") else "left")
    for run in listed:
        job = run.job
        cells = (
            run.name,
            run.status,
            f"{job.name} ({job.status})" if job else "-",
            f"{job.instance_count} x {job.instance_type}" if job else "-",
            str(len(run.jobs)),
            format_duration(run.duration_seconds),
            render.cost_text(run.cost_usd, job.capacity if job else None),
            job.warm_pool if job else "-",
        )
        table.add_row(*(Text(cell) for cell in cells))  # as they are, never rich markup
    shell.out.print(table)
    return EXIT_OK


def do_watch(shell: Shell) -> int:
    return watch_until_ended(shell, shell.args.run)


def do_logs(shell: Shell) -> int:
    for event in shell.runs.log_events(shell.args.run, follow=shell.args.follow):
        if shell.args.json:
            shell.out.print(json.dumps(event.as_dict()), markup=False)
        else:
            shell.out.print(f"[{event.host}] {event.message}", markup=False)
    return EXIT_OK


def do_stop(shell: Shell) -> int:
    run = shell.runs.run(shell.args.run)
    if not shell.args.yes:
        if not shell.stdin.isatty():
            raise OperatorError(
                f"stopping run {run.name} needs confirmation: run it in a terminal or pass --yes"
            )
        from rich.prompt import Confirm

        job = f" and its training job {run.job.name}" if run.job else ""
        if not Confirm.ask(
            f"Stop run {run.name}{job}?", console=shell.out, stream=cast(TextIO, shell.stdin), default=False
        ):
            shell.out.print("not stopped", markup=False)
            return EXIT_OK
    stopped = shell.runs.stop(run.arn)
    if shell.args.json:
        shell.emit({"name": stopped.name, "stopped": True, "job": stopped.job.name if stopped.job else None})
    else:
        how = "SageMaker stops it" if stopped.direct else "Step Functions stops its training job"
        shell.out.print(f"stopping run {stopped.name}; {how}", markup=False)
    return EXIT_OK


def do_shell(shell: Shell) -> int:
    import shlex
    import shutil
    import subprocess

    command = shell.runs.shell_command(shell.args.run, shell.args.host)
    text = shlex.join(command)
    missing = [tool for tool in ("aws", SESSION_MANAGER_PLUGIN) if shutil.which(tool) is None]
    if shell.args.print or missing:
        if shell.args.json:
            shell.emit({"command": command, "missing": missing})
        else:
            shell.out.print(text, markup=False)
        if missing and not shell.args.print:
            raise OperatorError(
                f"cannot open the session here: {' and '.join(missing)} not found on PATH (install the AWS CLI "
                "and its Session Manager plugin, or run the printed command where they are)"
            )
        return EXIT_OK
    return subprocess.call(command)


def watch_until_ended(shell: Shell, name: str) -> int:
    last: Snapshot | None = None
    if shell.args.json:
        for last in shell.runs.watch(name):
            shell.out.print(json.dumps(last.as_dict(), default=str), markup=False)
    elif shell.out.is_terminal:
        last = _watch_live(shell, name)
    else:
        shown = None
        for last in shell.runs.watch(name):
            line = render.status_line(last)
            if line != shown:
                shell.out.print(line, markup=False)
                shown = line
    assert last is not None
    return _ended(shell, last.run)


def _watch_live(shell: Shell, name: str) -> Snapshot | None:
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    last = None
    columns = (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[detail]}", markup=False),
    )
    with Progress(*columns, console=shell.out) as bar:
        task = bar.add_task(name, total=None, detail="starting")
        for last in shell.runs.watch(name):
            progress = last.progress
            bar.update(
                task, total=progress.max_steps, completed=progress.step or 0, detail=render.status_line(last)
            )
    return last


def _ended(shell: Shell, run: Run) -> int:
    if shell.args.json:
        return EXIT_OK if run.status == "SUCCEEDED" else EXIT_RUN_FAILED
    if run.status == "SUCCEEDED":
        shell.out.print(
            f"run {run.name} SUCCEEDED; `blackwell-training result {run.name}` sums it up", markup=False
        )
        return EXIT_OK
    reason = run.cause or (run.job.failure_reason if run.job else None) or "no reason given"
    shell.out.print(f"run {run.name} {run.status}: {run.error or 'error'}: {reason}", markup=False)
    return EXIT_RUN_FAILED
