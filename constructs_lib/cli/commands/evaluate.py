"""Evaluation: ``evaluate`` (lm-evaluation-harness on a finished run's model, as an evaluation-only run of the
workflow) and ``compare`` (runs side by side: precision, final and validation loss, and their scores)."""

from __future__ import annotations

from typing import Any

from constructs_lib.cli import render_compare
from constructs_lib.cli.commands.follow import watch_until_ended
from constructs_lib.cli.shell import EXIT_OK, RUN_HELP, Parents, Shell, positive_integer


def register(sub: Any, parents: Parents) -> dict[str, Any]:
    """Add ``evaluate`` and ``compare`` to the subcommands; their handlers by name."""
    common, polling = parents.common, parents.polling
    evaluate = sub.add_parser(
        "evaluate",
        parents=[common, polling],
        help="score a finished run's model on evaluation tasks (lm-evaluation-harness)",
        description="Start an evaluation-only run of the workflow: a job in the training image runs "
        "lm-evaluation-harness, offline and always network-isolated (its scores go to the run's summary and "
        "metrics, not to MLflow), on the run's Hugging Face export, over the tasks of the task folder "
        "(python -m training.evaluate.prepare_tasks writes the standard set: hellaswag, arc_easy, "
        "piqa, winogrande). Checked first like submit: an unknown task, a folder outside the data prefixes or a "
        "model without a tokenizer is refused before anything starts (exit 2). See docs/evaluation.md.",
    )
    evaluate.add_argument("run", help=RUN_HELP)
    evaluate.add_argument(
        "--tasks-uri",
        dest="task_data_uri",
        required=True,
        help="the task folder: s3://<bucket>/<data prefix>.../",
    )
    evaluate.add_argument(
        "--tasks", nargs="+", help="task names (default: hellaswag arc_easy piqa winogrande)"
    )
    evaluate.add_argument(
        "--limit", type=positive_integer, help="examples per task (for trying a set-up only)"
    )
    evaluate.add_argument(
        "--batch-size", dest="batch_size", type=positive_integer, help="lm-eval batch size (default 32)"
    )
    evaluate.add_argument(
        "--instance-type",
        dest="instance_type",
        help="default: ml.p5.4xlarge (one H100) when the model's weights fit one GPU, else the run's own",
    )
    evaluate.add_argument(
        "--max-runtime-seconds", dest="max_runtime_seconds", type=positive_integer, help="default 14400"
    )
    evaluate.add_argument("--name", help="the evaluation run's name (default: <run>-eval-<UTC time>)")
    evaluate.add_argument("--wait", action="store_true", help="then watch it until it ends")
    compare = sub.add_parser(
        "compare",
        parents=[common],
        help="runs side by side: precision, final and validation loss, evaluation scores",
        description="Runs side by side: precision, max_steps, final training loss and validation loss, and each "
        "evaluated task's acc and acc_norm with their standard errors (from the run's own evaluation, the "
        "evaluation-only run named, or the newest evaluation of the run started later). Local results folders "
        "(python -m training.evaluate's output: scores.json) instead of runs are read here, without AWS: "
        "their scores, and the precision and max_steps of the run whose model they evaluated.",
    )
    compare.add_argument(
        "runs", nargs="+", metavar="RUN", help="run names or execution ARNs, or local results folders"
    )
    return {"evaluate": do_evaluate, "compare": do_compare}


def do_evaluate(shell: Shell) -> int:
    args = shell.args
    options = {k: getattr(args, k) for k in ("tasks", "task_data_uri", "limit", "batch_size", "instance_type",
                                             "max_runtime_seconds")}  # fmt: skip
    run = shell.runs.evaluate(args.run, name=args.name, **options)
    if args.json and not args.wait:
        shell.emit({"name": run.name, "arn": run.arn, "links": run.links, "evaluates": args.run})
    elif not args.json:
        shell.out.print(f"started evaluation {run.name} of run {args.run}", markup=False)
        shell.out.print(f"  execution: {run.links['execution']}", markup=False)
        shell.out.print(f"  scores when it ends: blackwell-training result {run.name}", markup=False)
    return watch_until_ended(shell, run.name) if args.wait else EXIT_OK


def do_compare(shell: Shell) -> int:
    from constructs_lib.cli.evaluation import compare_rows

    rows = compare_rows(lambda: shell.runs, shell.args.runs)
    if shell.args.json:
        shell.emit(rows)
    else:
        render_compare.print_compare(shell.out, rows)
    return EXIT_OK
