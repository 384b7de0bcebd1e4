"""Before and at launch: ``validate`` (the workflow's own check, offline or against the deployed rules), ``plan``
(memory, time and cost before paying) and ``submit`` (check with the deployed rules, then start a run)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from constructs_lib.cli import render
from constructs_lib.cli.commands.follow import watch_until_ended
from constructs_lib.cli.errors import InvalidRequest
from constructs_lib.cli.request import check_offline, plan_request
from constructs_lib.cli.shell import EXIT_INVALID, EXIT_OK, Parents, Shell


def register(sub: Any, parents: Parents) -> dict[str, Any]:
    """Add ``validate``, ``plan`` and ``submit`` to the subcommands; their handlers by name."""
    common, request, polling = parents.common, parents.request, parents.polling
    validate_cmd = sub.add_parser(
        "validate",
        parents=[common, request],
        help="check a request: offline with cdk.json's settings, or with --deployed the deployed workflow's rules",
        description="Check a request with the workflow's own validation. By default offline, no AWS call: under "
        "the rules cdk.json deploys. With --deployed (or --stack), under the exact rules of the deployed "
        "workflow, read from its state machine (what submit checks). Offline, --init-from DIR and --data-folder DIR "
        "read local copies of the request's init_from and train_data_uri folders as the workflow reads S3. Exit 0 "
        "valid, 2 with every problem listed.",
    )
    validate_cmd.add_argument(
        "--deployed",
        action="store_true",
        help="validate with the deployed workflow's own rules (its state machine definition; needs AWS access); "
        "implied by --stack",
    )
    _bucket_option(validate_cmd)
    local_copy_options(validate_cmd)
    plan = sub.add_parser(
        "plan",
        parents=[common, request],
        help="a request's per-GPU peak memory by part, time and cost, before paying",
        description="Estimate a request's per-GPU peak memory (by part, against the GPU's memory with its "
        "headroom), its throughput, run time and on-demand cost (training/plan/'s closed form), and when it "
        "does not fit the smallest changes that do. Offline with cdk.json's settings; with --deployed (or --stack) "
        "under the deployed workflow's rules, reading the init_from folder's config.json and the stored tuning "
        "records from S3. The throughput is the one a tuning run measured for this configuration on this instance "
        "and image where a record stands for it ('measured'), else the plan's estimate. Offline, --init-from DIR "
        "reads the init_from folder from a local copy (and --data-folder DIR the train_data_uri folder: prepared "
        "conversations' windows), --bucket NAME the workflow's bucket (as validate), and --measurements PATH the records of a local tuning report "
        "(with --image, the image the request would run). Exit 0 when it fits, 2 when it does not or is invalid.",
    )
    plan.add_argument(
        "--deployed", action="store_true", help="use the deployed workflow's rules (needs AWS access)"
    )
    _bucket_option(plan)
    local_copy_options(plan)
    plan.add_argument(
        "--measurements",
        metavar="PATH",
        action="append",
        default=[],
        help="tuning records: a tuning report folder (its measurements.json) or a records file; repeatable. The "
        "workflow's rules decide whether one stands for the request (same settings, instance type and count, GPU, "
        "and image: --image)",
    )
    plan.add_argument(
        "--image",
        metavar="URI_OR_TAG",
        help="the training image the request would run (a URI or its tag), which a record must come from; with "
        "--deployed, the deployed workflow's",
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
    return {"validate": do_validate, "plan": do_plan, "submit": do_submit}


def _bucket_option(command: Any) -> None:
    """``--bucket``: the workflow's bucket, offline (validate and plan refuse the same data sources)."""
    command.add_argument(
        "--bucket",
        metavar="NAME",
        help="offline: the workflow's bucket (the stack output CheckpointBucketName), so that data sources in another "
        "bucket are refused as the workflow refuses them (without it they are matched on their key only, and "
        "validate says so)",
    )


def local_copy_options(command: Any) -> None:
    """``--init-from`` and ``--data-folder``: local copies of the request's S3 folders, read offline."""
    command.add_argument(
        "--init-from",
        metavar="DIR",
        help="offline: a local copy of the request's init_from model folder (its config.json gives the shape; its "
        "chat template and tokenizer are what conversation data is checked against), read as the workflow reads S3",
    )
    command.add_argument(
        "--data-folder",
        metavar="DIR",
        help="offline: a local copy of the request's train_data_uri (the prepared folder), read as the workflow "
        "reads S3: conversation data is checked against init_from and the settings (seq_length, the windows)",
    )


def local_copies(shell: Shell) -> dict[str, Any]:
    """The local copies the options name (refused with --deployed: that reads the folders from S3 itself)."""
    copies = {"init_from": shell.args.init_from, "data_folder": shell.args.data_folder}
    if any(copies.values()) and (shell.args.deployed or shell.args.stack):
        raise InvalidRequest(
            ["--init-from, --data-folder: offline only; --deployed reads the folders from S3"]
        )
    return copies


def do_validate(shell: Shell) -> int:
    """Every problem (exit 2), or ``valid`` and the checks that need what this validation could not read (S3,
    SageMaker, the run's name, the workflow's bucket): the workflow makes them before it launches."""
    request = shell.request()
    copies = local_copies(shell)
    if shell.args.deployed or shell.args.stack:
        decision = shell.runs.decide(request)
    else:
        decision = check_offline(request, shell.project.rules(bucket_name=shell.args.bucket), **copies)
    if decision.problems:
        raise InvalidRequest(decision.problems)
    if shell.args.json:
        shell.emit({"valid": True, "problems": [], "notes": decision.notes, "not_checked": decision.skipped})
        return EXIT_OK
    shell.out.print("valid", markup=False)
    for note in decision.notes:
        render.say(shell.out, f"note: {note}")
    if decision.skipped:
        shell.out.print("not checked here (the workflow checks them before it launches):", markup=False)
        for line in decision.skipped:
            shell.out.print(f"  - {line}", markup=False)
    return EXIT_OK


def do_plan(shell: Shell) -> int:
    from training.request.reads import read_local_measurements

    args = shell.args
    request = shell.request()
    deployed = args.deployed or args.stack
    if deployed and args.bucket:
        raise InvalidRequest(["--bucket: offline only; --deployed reads the workflow's own bucket"])
    rules = shell.runs.rules if deployed else shell.project.rules(bucket_name=args.bucket)
    copies = local_copies(shell)
    if args.image:
        bare_tag = not any(mark in args.image for mark in "/:@")
        rules = replace(rules, image_uri=f"image:{args.image}" if bare_tag else args.image)
    records: list[dict[str, Any]] | None = None
    files: list[str] = []
    if args.measurements:
        try:
            records, files = read_local_measurements(args.measurements)
        except (OSError, ValueError) as error:
            raise InvalidRequest([f"--measurements: {error}"]) from None
    planned = plan_request(
        request, rules, s3=shell.runs.client("s3") if deployed else None, measurements=records, **copies
    )  # fmt: skip
    if args.measurements:
        planned["records"] = {"files": files, "read": len(records or []), "image_tag": rules.image_tag()}
    if args.json:
        shell.emit(planned)
    else:
        render.print_plan(shell.out, planned)
    return EXIT_OK if planned["fits"] else EXIT_INVALID


def do_submit(shell: Shell) -> int:
    request = shell.request()
    try:
        planned: dict[str, Any] | None = plan_request(request, shell.runs.rules, s3=shell.runs.client("s3"))
    except InvalidRequest:
        planned = None  # submit's own check lists every problem
    if planned is not None and not shell.args.json:
        render.print_plan(shell.out, planned)
    run = shell.runs.submit(request, name=shell.args.name)
    if shell.args.json and not shell.args.wait:
        shell.emit({"name": run.name, "arn": run.arn, "links": run.links, "plan": planned})
    elif not shell.args.json:
        shell.out.print(f"started run {run.name}", markup=False)
        shell.out.print(f"  execution: {run.links['execution']}", markup=False)
        shell.out.print(f"  follow it: blackwell-training watch {run.name}", markup=False)
    return watch_until_ended(shell, run.name) if shell.args.wait else EXIT_OK
