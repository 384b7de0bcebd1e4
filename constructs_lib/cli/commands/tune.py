"""Tuning: ``tune`` (show a tuning run's trials and cost, start it, follow it, print its ranked table and write the
winning request) and ``tune-apply`` (write a finished tuning run's winning request)."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from constructs_lib.cli import render
from constructs_lib.cli.commands.follow import watch_until_ended
from constructs_lib.cli.commands.launch import local_copies, local_copy_options
from constructs_lib.cli.errors import InvalidRequest, OperatorError
from constructs_lib.cli.shell import EXIT_OK, EXIT_RUN_FAILED, RUN_HELP, Parents, Shell
from constructs_lib.cli.tuning import tune_plan


def register(sub: Any, parents: Parents) -> dict[str, Any]:
    """Add ``tune`` and ``tune-apply`` to the subcommands; their handlers by name."""
    tune = sub.add_parser(
        "tune",
        parents=[parents.common, parents.request, parents.polling],
        help="measure the configurations the plan picks on your model and instance, in one tuning job",
        description="A tuning run: the request's `tune` block (or the defaults: micro-batch, activation "
        "checkpointing and the precisions the GPU runs) gives the candidates; the plan drops those that do not "
        "fit, keeps the best predicted (max_trials) and one probe past the memory edge; one SageMaker job runs "
        "each as a short fresh trial and ranks them by measured throughput. It shows the trials and the cost "
        "first (max_cost_usd bounds it), then starts. --dry-run only shows them (offline with cdk.json's "
        "settings unless --deployed; --init-from DIR and --data-folder DIR read local copies of the request's init_from and "
        "train_data_uri folders, as validate and plan do). --wait follows the run and prints the ranked table; --apply writes the "
        "winning request. Docs: docs/tuning.md.",
    )
    tune.add_argument("--name", help="run (execution) name (default: <job_name_prefix>-<UTC time>-<hex>)")
    tune.add_argument("--dry-run", action="store_true", help="show the trials and the cost; start nothing")
    tune.add_argument("--deployed", action="store_true", help="with --dry-run: the deployed workflow's rules")
    local_copy_options(tune)
    tune.add_argument("--wait", action="store_true", help="follow the run, then print its ranked table")
    tune.add_argument("--apply", metavar="OUT.json", help="with --wait: write the winning request here")
    apply = sub.add_parser(
        "tune-apply",
        parents=[parents.common],
        help="write a finished tuning run's winning request (its input with the winner's settings)",
        description="Write the winning request of a finished tuning run: the run's own input (instance, "
        "capacity, data, tags) with the winner's settings and no tune block, ready for `blackwell-training "
        "submit`. Never over an existing file.",
    )
    apply.add_argument("run", help=RUN_HELP)
    apply.add_argument("out", metavar="OUT.json", help="the file to write (must not exist)")
    return {"tune": do_tune, "tune-apply": do_tune_apply}


def _writable(path_text: str | None) -> Path | None:
    if path_text is None:
        return None
    path = Path(path_text)
    if path.exists():
        raise OperatorError(f"{path}: exists already; choose another file (a request is never written over)")
    if not path.parent.is_dir():
        raise OperatorError(f"{path}: folder {path.parent} does not exist")
    return path


def do_tune(shell: Shell) -> int:
    """With --json, one JSON object at the end (the plan, the run, with --wait its final status and report, with
    --apply what was written); without, the plan, the run's progress and its ranked table as they come."""
    args = shell.args
    if args.apply and not args.wait:
        raise OperatorError(
            "--apply needs --wait (or use `blackwell-training tune-apply RUN OUT.json` later)"
        )
    out_path = _writable(args.apply)
    request = shell.request()
    offline = args.dry_run and not (args.deployed or args.stack)
    copies = local_copies(shell)
    if any(copies.values()) and not args.dry_run:
        raise InvalidRequest(
            ["--init-from, --data-folder: with --dry-run only; a run reads the folders from S3"]
        )
    # the deployed rules and their stored measurements, or cdk.json's rules offline (the plan's estimates, the
    # local copies of the request's folders)
    planned = (
        tune_plan(request, shell.project.rules(), **copies) if offline else shell.runs.tune_plan(request)
    )
    result: dict[str, Any] = {"plan": planned}
    if not args.json:
        render.print_tune_plan(shell.out, planned)
    if args.dry_run:
        return _done(shell, result, EXIT_OK)
    run = shell.runs.tune(request, name=args.name)
    result.update(name=run.name, arn=run.arn, links=run.links)
    if not args.json:
        shell.out.print(f"started tuning run {run.name}", markup=False)
        shell.out.print(f"  execution: {run.links['execution']}", markup=False)
    if not args.wait:
        return _done(shell, result, EXIT_OK)
    status = _wait(shell, run.name, result)
    if status != EXIT_OK:
        return _done(shell, result, status)
    result["report"] = report = shell.runs.tune_report(run.name)
    if not args.json:
        render.print_tune_report(shell.out, report)
    if out_path is not None:
        result["written"] = _write(shell, out_path, shell.runs.winning_request(run.name))
    return _done(shell, result, EXIT_OK)


def _wait(shell: Shell, name: str, result: dict[str, Any]) -> int:
    """Follow the run to its end: as ``watch`` does on a terminal; with --json quietly (its last status goes into
    the one object printed at the end)."""
    if not shell.args.json:
        return watch_until_ended(shell, name)
    (last,) = deque(shell.runs.watch(name), maxlen=1)
    result["status"] = last.as_dict()
    return EXIT_OK if last.run.status == "SUCCEEDED" else EXIT_RUN_FAILED


def _done(shell: Shell, result: dict[str, Any], status: int) -> int:
    if shell.args.json:
        shell.emit(result)
    return status


def do_tune_apply(shell: Shell) -> int:
    out_path = _writable(shell.args.out)
    assert out_path is not None
    written = _write(shell, out_path, shell.runs.winning_request(shell.args.run))
    if shell.args.json:
        shell.emit(written)
    return EXIT_OK


def _write(shell: Shell, path: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Write the winning request (never over a file); what was written, for --json."""
    with open(path, "x", encoding="utf-8") as handle:  # never over a file created meanwhile
        handle.write(json.dumps(request, indent=2) + "\n")
    if not shell.args.json:
        shell.out.print(
            f"wrote the winning request to {path} (submit it: blackwell-training submit {path})", markup=False
        )
    return {"written": str(path), "request": request}
