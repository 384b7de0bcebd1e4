"""Data preparation: ``prepare-plan`` (instances, time and cost before launch, from the measured tokenization rate),
``prepare`` (start a ``DataPreparation`` execution, optionally following it) and ``prepare-status`` (complete shards
against input objects, the manifest, the execution's status). See docs/data.md."""

from __future__ import annotations

from typing import Any

from constructs_lib.cli import preparation
from constructs_lib.cli.errors import OperatorError
from constructs_lib.cli.shell import EXIT_OK, Parents, Shell, positive_integer


def register(sub: Any, parents: Parents) -> dict[str, Any]:
    """Add ``prepare-plan``, ``prepare`` and ``prepare-status``; their handlers by name."""
    common = parents.common
    planned = sub.add_parser("prepare-plan", parents=[common], help="instances, time and cost of a preparation",
                             description="The plan of preparing INPUT (s3://bucket/prefix/, or a local folder "
                             "offline): instances, processes busy, hours and dollars, from the tokenization rate "
                             "measured with training.measure.tokenize_rate and the instance prices it names.")  # fmt: skip
    planned.add_argument("input", help="s3://bucket/prefix/ or a local folder")
    _sizing(planned)
    started = sub.add_parser("prepare", parents=[common, parents.polling], help="start a data preparation",
                             description="Start a preparation of the deployed DataPreparation state machine: INPUT "
                             "tokenized by the tokenizer in MODEL into <output prefix>NAME/ (docs/data.md).")  # fmt: skip
    started.add_argument(
        "name", help="the output folder's name (the same name again completes an earlier run)"
    )
    started.add_argument("--input", required=True, dest="input_uri", help="s3://bucket/prefix/ of the corpus")
    started.add_argument(
        "--model", required=True, dest="model_uri", help="s3://... folder with tokenizer.json"
    )
    started.add_argument("--state-machine", required=True, help="the DataPreparation state machine's ARN")
    started.add_argument("--kind", choices=("text", "chat", "pairs"), help="default text")
    started.add_argument("--text-field", dest="text_field", help="default text")
    started.add_argument("--validation-fraction", dest="validation_fraction", type=float, help="default 0.01")
    started.add_argument("--template-seconds", dest="template_seconds", type=float,
                         help="chat: the longest one rendering of the chat template may take (default 10)")  # fmt: skip
    started.add_argument("--wait", action="store_true", help="then show its progress until it ends")
    _sizing(started)
    status = sub.add_parser("prepare-status", parents=[common], help="a preparation's progress")
    status.add_argument("output_uri", help="s3://bucket/<output prefix>NAME/")
    status.add_argument("--input", required=True, dest="input_uri", help="s3://bucket/prefix/ of the corpus")
    status.add_argument("--execution", help="the execution's ARN (its status too)")
    return {"prepare-plan": do_plan, "prepare": do_prepare, "prepare-status": do_status}


def _sizing(parser: Any) -> None:
    parser.add_argument("--instance-type", dest="instance_type", help="default ml.c5.18xlarge")
    parser.add_argument("--instance-count", dest="instance_count", type=positive_integer,
                        help="default: the fewest that finish within --target-hours")  # fmt: skip
    parser.add_argument("--target-hours", dest="target_hours", type=float, default=2.0, help="default 2")
    parser.add_argument("--usd-per-hour", dest="usd_per_hour", type=float,
                        help="your price of one instance-hour (default: the plan's table, its source named)")  # fmt: skip


def _plan(shell: Shell, uri: str) -> dict[str, Any]:
    args = shell.args
    options = {k: getattr(args, k) for k in ("instance_type", "instance_count", "usd_per_hour")
               if getattr(args, k, None) is not None}  # fmt: skip
    try:
        objects, size = preparation.input_size(_client(shell, "s3"), uri) if uri.startswith("s3://") else \
            preparation.local_size(uri)  # fmt: skip
        return preparation.plan_for(objects, size, target_hours=args.target_hours, **options)
    except ValueError as err:
        raise OperatorError(str(err)) from None


def do_plan(shell: Shell) -> int:
    planned = _plan(shell, shell.args.input)
    if shell.args.json:
        shell.emit(planned)
        return EXIT_OK
    for line in planned["lines"]:
        shell.out.print(line, markup=False)
    return EXIT_OK


def do_prepare(shell: Shell) -> int:
    args = shell.args
    planned = _plan(shell, args.input_uri)
    request = {"name": args.name, "input_uri": args.input_uri, "model_uri": args.model_uri,
               "instance_type": planned["instance_type"], "instance_count": planned["instance_count"]}  # fmt: skip
    request.update(
        {
            k: getattr(args, k)
            for k in ("kind", "text_field", "validation_fraction", "template_seconds")
            if getattr(args, k) is not None
        }  # fmt: skip
    )
    sfn = _client(shell, "stepfunctions")
    try:
        arn = preparation.start(sfn, args.state_machine, request)
    except ValueError as err:
        raise OperatorError(str(err)) from None
    shell.out.print(f"started preparation {args.name}: {planned['row']}", markup=False)
    shell.out.print(f"  execution: {arn}", markup=False)
    if not args.wait:
        return EXIT_OK
    output = _output_uri(sfn, arn)
    while True:
        state = preparation.progress(_client(shell, "s3"), sfn, arn, args.input_uri, output)
        shell.out.print(state.line(), markup=False)
        if state.status != "RUNNING":
            return EXIT_OK if state.status == "SUCCEEDED" else 1
        shell.sleep(getattr(args, "interval", 10.0))


def do_status(shell: Shell) -> int:
    args = shell.args
    sfn = _client(shell, "stepfunctions") if args.execution else None
    state = preparation.progress(_client(shell, "s3"), sfn, args.execution, args.input_uri, args.output_uri)
    if args.json:
        shell.emit(state.__dict__)
    else:
        shell.out.print(state.line(), markup=False)
    return EXIT_OK


def _output_uri(sfn: Any, arn: str) -> str:
    """The output folder an execution prepares into: from its state machine's definition (the job's output)."""
    described = sfn.describe_execution(executionArn=arn)
    name = __import__("json").loads(described["input"])["name"]
    definition = sfn.describe_state_machine(stateMachineArn=described["stateMachineArn"])["definition"]
    marker = "States.Format('s3://"
    start = definition.index(marker) + len("States.Format('")
    return definition[start : definition.index("{}", start)] + f"{name}/"


def _client(shell: Shell, service: str) -> Any:
    import boto3  # noqa: PLC0415 - the CLI's own dependency, imported when a command needs AWS

    args = shell.args
    return boto3.Session(profile_name=args.profile, region_name=args.region).client(service)
