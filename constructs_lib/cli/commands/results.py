"""After a run: ``result`` (its summary: metrics, artifacts, time, cost, the plan against what was measured) and
``curves`` (loss, val_loss and tokens/s of one or more runs: a PNG or a plot in the terminal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from constructs_lib.cli import render
from constructs_lib.cli.curves import X_AXES
from constructs_lib.cli.errors import OperatorError
from constructs_lib.cli.shell import EXIT_OK, EXIT_RUN_FAILED, RUN_HELP, Parents, Shell


def register(sub: Any, parents: Parents) -> dict[str, Any]:
    """Add ``result`` and ``curves`` to the subcommands; their handlers by name."""
    common = parents.common
    sub.add_parser(
        "result",
        parents=[common],
        help="a run's summary: metrics, artifacts, time, cost",
        description="A run's summary: final metrics, model artifact and checkpoint URIs, training and billable time, "
        "cost estimate and console links (a tuning run: its ranked table); exits 1 when the run failed, timed out "
        "or was stopped.",
    ).add_argument("run", help=RUN_HELP)
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
    return {"result": do_result, "curves": do_curves}


def do_result(shell: Shell) -> int:
    if shell.args.json:
        result = shell.runs.result(shell.args.run)
        if result.get("tune"):  # a tuning run: its ranked table too
            result["tune_report"] = shell.runs.tune_report(shell.args.run)
        shell.emit(result)
    else:
        from constructs_lib.cli.plots import sparkline

        result, curve = shell.runs.result_and_curve(shell.args.run)
        render.print_result(shell.out, result, sparkline(curve.series("loss", "step")[1]))
        if result.get("tune"):
            render.print_tune_report(shell.out, shell.runs.tune_report(shell.args.run))
    return EXIT_OK if result["status"] in ("SUCCEEDED", "RUNNING") else EXIT_RUN_FAILED


def do_curves(shell: Shell) -> int:
    out_path = Path(shell.args.out) if shell.args.out else None
    if out_path is not None:
        if out_path.suffix.lower() != ".png":
            raise OperatorError(f"--out: must name a .png file; got {shell.args.out!r}")
        if out_path.exists():
            raise OperatorError(f"--out: {out_path} already exists; choose another name or remove it first")
        if not out_path.parent.is_dir():
            raise OperatorError(f"--out: folder {out_path.parent} does not exist")
    curves = [shell.runs.curve(name) for name in dict.fromkeys(shell.args.runs)]
    empty = [curve.name for curve in curves if not curve.train and not curve.validation]
    if shell.args.json:
        shell.emit({"x": shell.args.axis, "runs": [curve.as_dict() for curve in curves]})
        return EXIT_OK
    if len(empty) == len(curves):
        raise OperatorError(f"no step lines yet in the logs of {', '.join(empty)}: nothing to draw")
    unpriced = [curve.name for curve in curves if curve.missing(shell.args.axis)]
    if unpriced:
        why = {"cost": "no on-demand price (a training plan, or an instance type without a price)"}
        raise OperatorError(
            f"--x {shell.args.axis}: {', '.join(unpriced)} has points without it "
            f"({why.get(shell.args.axis, 'no config line with batch_size, seq_length and world_size')}); "
            f"choose another --x"
        )
    for name in empty:
        shell.out.print(f"note: run {name} has no step lines yet", markup=False)
    from constructs_lib.cli import plots

    if out_path is not None:
        plots.png(curves, shell.args.axis, out_path)
        shell.out.print(f"wrote {out_path}", markup=False)
    else:
        from rich.text import Text

        shell.out.print(Text.from_ansi(plots.terminal(curves, shell.args.axis, shell.out.width)))
    return EXIT_OK
