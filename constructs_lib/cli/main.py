"""``blackwell-training``: the command-line front end (argparse for the arguments, rich for tables and the progress
bar) over :mod:`constructs_lib.cli.api`. Every error is one line on standard error, never a traceback.

Exit status: 0 success; 1 the run failed, timed out or was stopped (watch, submit --wait, result); 2 an invalid
request or command line; 3 an error to fix first (no credentials, stack not deployed, unknown run, ...); 130
interrupted (the run itself goes on).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TextIO, cast

from constructs_lib.cli.curves import X_AXES
from constructs_lib.cli.errors import InvalidRequest, OperatorError, explain
from constructs_lib.cli.progress import format_duration
from constructs_lib.cli.records import Run, Snapshot
from constructs_lib.cli.request import Project, apply_settings, load_request, plan_request, validate

EXIT_OK, EXIT_RUN_FAILED, EXIT_INVALID, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
RUN_HELP = (
    "run name (execution name), execution ARN, or the name of a training job launched directly (SDK path)"
)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--region", help="AWS region (default: AWS_REGION, the profile's, or cdk.json's region)"
    )
    common.add_argument("--profile", help="AWS CLI profile (default: AWS_PROFILE or the default profile)")
    common.add_argument("--stack", help="CloudFormation stack name (default: cdk.json's stackName)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")
    polling = argparse.ArgumentParser(add_help=False)
    polling.add_argument(
        "--interval", type=_positive_seconds, default=10.0, help="seconds between polls (default 10)"
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

    parser = argparse.ArgumentParser(
        prog="blackwell-training",
        description="Start, follow, stop and sum up training runs of the deployed Blackwell training workflow.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    validate_cmd = sub.add_parser(
        "validate",
        parents=[common, request],
        help="check a request: offline with cdk.json's settings, or with --deployed the deployed workflow's rules",
        description="Check a request with the workflow's own validation. By default offline, no AWS call: under "
        "the rules cdk.json deploys. With --deployed (or --stack), under the exact rules of the deployed "
        "workflow, read from its state machine (what submit checks). Exit 0 valid, 2 with every problem listed.",
    )
    validate_cmd.add_argument(
        "--deployed",
        action="store_true",
        help="validate with the deployed workflow's own rules (its state machine definition; needs AWS access); "
        "implied by --stack",
    )
    plan = sub.add_parser(
        "plan",
        parents=[common, request],
        help="a request's per-GPU peak memory by part, time and cost, before paying",
        description="Estimate a request's per-GPU peak memory (by part, against the GPU's memory with its "
        "headroom), its throughput, run time and on-demand cost (training/plan.py's closed form), and when it "
        "does not fit the smallest changes that do. Offline with cdk.json's settings; with --deployed (or "
        "--stack) under the deployed workflow's rules. Exit 0 when it fits, 2 when it does not or is invalid.",
    )
    plan.add_argument(
        "--deployed", action="store_true", help="use the deployed workflow's rules (needs AWS access)"
    )
    submit = sub.add_parser(
        "submit",
        parents=[common, request, polling],
        help="validate with the deployed workflow's rules, then start a run",
        description="Check the request with the deployed workflow's own rules (read from its state machine: "
        "nothing starts when it would be refused; exit 2 lists every problem), then start it and print its "
        "name and console link. No FILE: the workflow's defaults plus --set.",
    )
    submit.add_argument("--name", help="run (execution) name (default: <job_name_prefix>-<UTC time>-<hex>)")
    submit.add_argument("--wait", action="store_true", help="then watch it until it ends")
    runs = sub.add_parser(
        "runs",
        parents=[common],
        help="recent runs, newest first",
        description="Recent runs of the deployed workflow, newest first: status, training job, instance type and "
        "count, launches, duration, a cost estimate (billable seconds x the contract's on-demand price) and the "
        "warm pool (DescribeTrainingJob's WarmPoolStatus: Available, InUse, Reused or Terminated).",
    )
    runs.add_argument("--limit", type=_run_count, default=20, help="how many, 1 to 1000 (default 20)")
    for name, text, details in (
        (
            "watch",
            "follow a run live until it ends",
            "Follow a run live until it ends: execution state, job status and secondary status, and the trainer's "
            "progress (step N/M, loss, "
            "tokens/s, MFU, ETA); exits 0 when the run succeeds, 1 with SageMaker's failure reason otherwise.",
        ),
        (
            "result",
            "a run's summary: metrics, artifacts, time, cost",
            "A run's summary: final metrics, model artifact and checkpoint URIs, training and billable time, cost estimate and "
            "console links; exits 1 when the run failed, timed out or was stopped.",
        ),
    ):
        extra = [polling] if name == "watch" else []
        sub.add_parser(name, parents=[common, *extra], help=text, description=details).add_argument(
            "run", help=RUN_HELP
        )
    curves = sub.add_parser(
        "curves",
        parents=[common],
        help="loss, val_loss and tokens/s of one or more runs: a PNG, or a plot in the terminal",
        description="Draw the loss and val_loss (and tokens/s) of one or more runs from their job logs, across "
        "every launch of each run (capacity relaunches and resumes continue the same curve). With --out, a PNG "
        "(matplotlib); otherwise a plot in the terminal. --json prints the points instead.",
    )
    curves.add_argument(
        "runs", nargs="+", metavar="RUN", help="run names (execution names) or execution ARNs"
    )
    curves.add_argument("--out", metavar="FILE.png", help="write a PNG here (never over an existing file)")
    curves.add_argument(
        "--x",
        dest="axis",
        choices=tuple(X_AXES),
        default="step",
        help="x axis: step, tokens trained, training hours or on-demand cost so far (default step)",
    )
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
        "--host", type=_host_number, default=1, help="which host, 1 to the job's count (default 1)"
    )
    shell.add_argument("--print", action="store_true", help="print the command instead of running it")
    return parser


SESSION_MANAGER_PLUGIN = "session-manager-plugin"


def _host_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a host number, 1 or more; got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds; got {text!r}")
    return value


def _run_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be an integer in [1, 1000]; got {text!r}")
    return value


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

    args = build_parser().parse_args(argv)
    out = Console(file=stdout or sys.stdout, highlight=False, soft_wrap=True)
    err = Console(file=stderr or sys.stderr, highlight=False, soft_wrap=True)
    try:
        shell = _Shell(args, out, stdin or sys.stdin, sleep)
        return shell.dispatch()
    except InvalidRequest as error:
        _print_problems(error.problems, err, out if args.json else None)
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


class _Shell:
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
                region=self.args.region or _session_region(self.args.profile) or self.project.region,
                profile=self.args.profile,
                poll_seconds=interval,
                sleep=self.sleep,
            )
        return self._runs

    def dispatch(self) -> int:
        return getattr(self, f"do_{self.args.command}")()

    def emit(self, value: Any) -> None:
        self.out.print(json.dumps(value, indent=2, default=str), markup=False)

    def request(self) -> dict[str, Any]:
        return apply_settings(load_request(self.args.file, self.stdin), self.args.settings)

    # ---- commands -----------------------------------------------------------------------------------------------
    def do_validate(self) -> int:
        request = self.request()
        if self.args.deployed or self.args.stack:
            problems = self.runs.check(request)
        else:
            problems = validate(request, self.project.rules())
        if problems:
            raise InvalidRequest(problems)
        if self.args.json:
            self.emit({"valid": True, "problems": []})
        else:
            self.out.print("valid", markup=False)
        return EXIT_OK

    def do_plan(self) -> int:
        request = self.request()
        rules = self.runs.rules if self.args.deployed or self.args.stack else self.project.rules()
        planned = plan_request(request, rules)
        if self.args.json:
            self.emit(planned)
        else:
            _print_plan(self.out, planned)
        return EXIT_OK if planned["fits"] else EXIT_INVALID

    def do_submit(self) -> int:
        request = self.request()
        try:
            planned: dict[str, Any] | None = plan_request(request, self.runs.rules)
        except InvalidRequest:
            planned = None  # submit's own check lists every problem
        if planned is not None and not self.args.json:
            _print_plan(self.out, planned)
        run = self.runs.submit(request, name=self.args.name)
        if self.args.json and not self.args.wait:
            self.emit({"name": run.name, "arn": run.arn, "links": run.links, "plan": planned})
        elif not self.args.json:
            self.out.print(f"started run {run.name}", markup=False)
            self.out.print(f"  execution: {run.links['execution']}", markup=False)
            self.out.print(f"  follow it: blackwell-training watch {run.name}", markup=False)
        return self._watch(run.name) if self.args.wait else EXIT_OK

    def do_watch(self) -> int:
        return self._watch(self.args.run)

    def do_runs(self) -> int:
        listed = self.runs.runs(self.args.limit)
        if self.args.json:
            self.emit([run.as_dict() for run in listed])
            return EXIT_OK
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"Runs of {self.runs.stack_name} ({self.runs.region})")
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
                _cost(run.cost_usd, job.capacity if job else None),
                job.warm_pool if job else "-",
            )
            table.add_row(*(Text(cell) for cell in cells))  # as they are, never rich markup
        self.out.print(table)
        return EXIT_OK

    def do_logs(self) -> int:
        for event in self.runs.log_events(self.args.run, follow=self.args.follow):
            if self.args.json:
                self.out.print(json.dumps(event.as_dict()), markup=False)
            else:
                self.out.print(f"[{event.host}] {event.message}", markup=False)
        return EXIT_OK

    def do_stop(self) -> int:
        run = self.runs.run(self.args.run)
        if not self.args.yes:
            if not self.stdin.isatty():
                raise OperatorError(
                    f"stopping run {run.name} needs confirmation: run it in a terminal or pass --yes"
                )
            from rich.prompt import Confirm

            job = f" and its training job {run.job.name}" if run.job else ""
            if not Confirm.ask(
                f"Stop run {run.name}{job}?", console=self.out, stream=cast(TextIO, self.stdin), default=False
            ):
                self.out.print("not stopped", markup=False)
                return EXIT_OK
        stopped = self.runs.stop(run.arn)
        if self.args.json:
            self.emit(
                {"name": stopped.name, "stopped": True, "job": stopped.job.name if stopped.job else None}
            )
        else:
            how = "SageMaker stops it" if stopped.direct else "Step Functions stops its training job"
            self.out.print(f"stopping run {stopped.name}; {how}", markup=False)
        return EXIT_OK

    def do_curves(self) -> int:
        out_path = Path(self.args.out) if self.args.out else None
        if out_path is not None:
            if out_path.suffix.lower() != ".png":
                raise OperatorError(f"--out: must name a .png file; got {self.args.out!r}")
            if out_path.exists():
                raise OperatorError(
                    f"--out: {out_path} already exists; choose another name or remove it first"
                )
            if not out_path.parent.is_dir():
                raise OperatorError(f"--out: folder {out_path.parent} does not exist")
        curves = [self.runs.curve(name) for name in dict.fromkeys(self.args.runs)]
        empty = [curve.name for curve in curves if not curve.train and not curve.validation]
        if self.args.json:
            self.emit({"x": self.args.axis, "runs": [curve.as_dict() for curve in curves]})
            return EXIT_OK
        if len(empty) == len(curves):
            raise OperatorError(f"no step lines yet in the logs of {', '.join(empty)}: nothing to draw")
        unpriced = [curve.name for curve in curves if curve.missing(self.args.axis)]
        if unpriced:
            why = {"cost": "no on-demand price (a training plan, or an instance type without a price)"}
            raise OperatorError(
                f"--x {self.args.axis}: {', '.join(unpriced)} has points without it "
                f"({why.get(self.args.axis, 'no config line with batch_size, seq_length and world_size')}); "
                f"choose another --x"
            )
        for name in empty:
            self.out.print(f"note: run {name} has no step lines yet", markup=False)
        from constructs_lib.cli import plots

        if out_path is not None:
            plots.png(curves, self.args.axis, out_path)
            self.out.print(f"wrote {out_path}", markup=False)
        else:
            from rich.text import Text

            self.out.print(Text.from_ansi(plots.terminal(curves, self.args.axis, self.out.width)))
        return EXIT_OK

    def do_shell(self) -> int:
        import shlex
        import shutil
        import subprocess

        command = self.runs.shell_command(self.args.run, self.args.host)
        text = shlex.join(command)
        missing = [tool for tool in ("aws", SESSION_MANAGER_PLUGIN) if shutil.which(tool) is None]
        if self.args.print or missing:
            if self.args.json:
                self.emit({"command": command, "missing": missing})
            else:
                self.out.print(text, markup=False)
            if missing and not self.args.print:
                raise OperatorError(
                    f"cannot open the session here: {' and '.join(missing)} not found on PATH (install the AWS CLI "
                    "and its Session Manager plugin, or run the printed command where they are)"
                )
            return EXIT_OK
        return subprocess.call(command)

    def do_result(self) -> int:
        if self.args.json:
            result = self.runs.result(self.args.run)
            self.emit(result)
        else:
            from constructs_lib.cli.plots import sparkline

            result, curve = self.runs.result_and_curve(self.args.run)
            _print_result(self.out, result, sparkline(curve.series("loss", "step")[1]))
        return EXIT_OK if result["status"] in ("SUCCEEDED", "RUNNING") else EXIT_RUN_FAILED

    # ---- watch --------------------------------------------------------------------------------------------------
    def _watch(self, name: str) -> int:
        last: Snapshot | None = None
        if self.args.json:
            for last in self.runs.watch(name):
                self.out.print(json.dumps(last.as_dict(), default=str), markup=False)
        elif self.out.is_terminal:
            last = self._watch_live(name)
        else:
            shown = None
            for last in self.runs.watch(name):
                line = _status_line(last)
                if line != shown:
                    self.out.print(line, markup=False)
                    shown = line
        assert last is not None
        return self._ended(last.run)

    def _watch_live(self, name: str) -> Snapshot | None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

        last = None
        columns = (
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[detail]}", markup=False),
        )
        with Progress(*columns, console=self.out) as bar:
            task = bar.add_task(name, total=None, detail="starting")
            for last in self.runs.watch(name):
                progress = last.progress
                bar.update(
                    task, total=progress.max_steps, completed=progress.step or 0, detail=_status_line(last)
                )
        return last

    def _ended(self, run: Run) -> int:
        if self.args.json:
            return EXIT_OK if run.status == "SUCCEEDED" else EXIT_RUN_FAILED
        if run.status == "SUCCEEDED":
            self.out.print(
                f"run {run.name} SUCCEEDED; `blackwell-training result {run.name}` sums it up", markup=False
            )
            return EXIT_OK
        reason = run.cause or (run.job.failure_reason if run.job else None) or "no reason given"
        self.out.print(f"run {run.name} {run.status}: {run.error or 'error'}: {reason}", markup=False)
        return EXIT_RUN_FAILED


def _print_problems(problems: Sequence[str], err: Any, json_out: Any) -> None:
    """Every problem on standard error, one line each (and as JSON on ``json_out`` with ``--json``)."""
    if json_out is not None:
        json_out.print(json.dumps({"valid": False, "problems": list(problems)}, indent=2), markup=False)
    err.print(f"invalid request ({len(problems)} problem{'s' if len(problems) != 1 else ''}):", markup=False)
    for problem in problems:
        err.print(f"  - {problem}", markup=False)


def _session_region(profile: str | None) -> str | None:
    """The region boto3 would pick (AWS_REGION, AWS_DEFAULT_REGION, the profile's), or None."""
    import boto3

    try:
        return boto3.Session(profile_name=profile).region_name
    except Exception as error:
        if explain(error) is None:
            raise
        raise OperatorError(explain(error)) from None


def _status_line(snapshot: Snapshot) -> str:
    run, job = snapshot.run, snapshot.run.job
    parts = [run.status]
    if job is None:
        parts.append("no training job yet")
    else:
        secondary = (
            f"/{job.secondary_status}" if job.secondary_status and job.secondary_status != job.status else ""
        )
        parts.append(f"job {job.name} {job.status}{secondary}")
        if len(run.jobs) > 1:
            parts.append(f"launch {len(run.jobs)}")
    parts.append(snapshot.progress.describe())
    return " | ".join(parts)


def _cost(cost: float | None, capacity: str | None) -> str:
    if capacity == "training plan":
        return "training plan"
    return "-" if cost is None else f"${cost:,.2f}"


def _hf_text(model: dict[str, Any] | None) -> str | None:
    return f"{model['folder']} in {model['archive']}" if model and model.get("archive") else None


def _print_result(out: Any, result: dict[str, Any], loss_sparkline: str = "") -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(show_header=False, title=f"Run {result['name']}: {result['status']}")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, Any]] = [
        ("job", result["job"]),
        ("instances", f"{result['instance_count']} x {result['instance_type']}" if result["job"] else None),
        ("launches", result["launches"]),
        ("error", f"{result['error']}: {result['cause']}" if result["error"] else None),
        ("restarted from", result["restarted_from"]),
        ("model artifacts", result["model_artifacts"]),
        ("Hugging Face model", _hf_text(result.get("hugging_face_model"))),
        ("checkpoints", result["checkpoint_uri"]),
        ("training time", format_duration(result["training_seconds"])),
        ("billable time", format_duration(result["billable_seconds"])),
        ("cost (est.)", _cost(result["cost_usd"], result["capacity"])),
    ]
    rows += [
        (f"metric {k}", f"{v:.6g}" if isinstance(v, float) else v)
        for k, v in (result["final_metrics"] or {}).items()
    ]
    trainer = dict(result["trainer_summary"] or {})
    if "final_loss" in trainer and loss_sparkline:  # the loss of every logged step, all launches, beside it
        rows.append(("trainer final_loss", f"{trainer.pop('final_loss'):.6g}  {loss_sparkline}"))
    elif loss_sparkline:  # still running, or stopped before its summary line
        rows.append(("loss so far", loss_sparkline))
    rows += [(f"trainer {k}", f"{v:.6g}") for k, v in trainer.items()]
    rows += _estimate_rows(result)
    rows += [(f"link {k}", v) for k, v in result["links"].items()]
    for key, value in rows:
        if value is not None:  # Text: a failure reason's "[/opt/ml/...]" is not rich markup
            table.add_row(Text(key), Text(str(value)))
    out.print(table)


def _print_plan(out: Any, planned: dict[str, Any]) -> None:
    """The plan (``training.plan``) as a rich table: memory by part, then throughput, time and cost."""
    from rich.table import Table
    from rich.text import Text

    verdict = "fits" if planned["fits"] else "DOES NOT FIT"
    table = Table(
        title=f"Plan: {planned['peak_gib']:.1f} GiB per GPU of {planned['limit_gib']:.1f} GiB allowed ({verdict})"
    )
    table.add_column("part (at " + planned["moment"] + ")")
    table.add_column("GiB per GPU", justify="right")
    for name, gib in sorted(planned["parts_gib"].items(), key=lambda kv: -kv[1]):
        table.add_row(Text(name), f"{gib:.2f}")
    table.add_row(
        Text("allowance: CUDA context, workspaces, NCCL, fragmentation"), f"{planned['allowance_gib']:.2f}"
    )
    table.add_row(Text("estimated peak", style="bold"), Text(f"{planned['peak_gib']:.2f}", style="bold"))
    out.print(table)
    cost = (
        "unknown (no on-demand price)"
        if planned["cost_usd"] is None
        else f"${planned['cost_usd']:,.2f} (on-demand prices of {planned.get('price_source', 'unknown date')})"
    )
    out.print(
        f"{planned['world_size']} GPUs; ~{planned['tokens_per_sec_per_gpu']:,} tokens/s per GPU; step "
        f"{planned['step_seconds']:.3f} s; run {format_duration(planned['run_seconds'])}; cost {cost} "
        f"(throughput from the {planned['throughput_source']})",
        markup=False,
    )
    if planned["warning"]:
        out.print(f"warning: {planned['warning']}", markup=False)
    if planned["advice"]:
        out.print("fits with: " + "; ".join(planned["advice"]), markup=False)


def _estimate_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The plan the run was launched with, next to what the trainer measured (estimate against actual)."""
    planned = result.get("plan")
    if not isinstance(planned, dict):
        return []
    measured = result.get("trainer_summary") or {}
    tensors_gb = planned["tensors_gib"] * 2**30 / 1e9  # torch.cuda.max_memory_allocated counts tensors, in GB
    peak = f"{tensors_gb:.1f} GB of tensors ({planned['peak_gib']:.1f} GiB with the allowance)"
    if "peak_mem_gb" in measured:
        peak += f"; measured {measured['peak_mem_gb']:.1f} GB"
    speed = f"{planned['tokens_per_sec_per_gpu']:,} tokens/s per GPU"
    if "tokens_per_sec" in measured:
        speed += f"; measured {measured['tokens_per_sec']:,.0f}"
    ignored = "yes (launched although it did not fit)" if result.get("memory_estimate_ignored") else None
    return [
        ("estimate: peak memory", peak),
        ("estimate: throughput", speed),
        ("memory estimate ignored", ignored),
    ]
