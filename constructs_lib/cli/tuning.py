"""Tuning runs for the CLI and the Python API: the tuning plan of a request (its trials and cost, before paying),
the stored measurements the plan uses, a finished tuning run's report (read from the run's checkpoint folder,
where SageMaker uploaded the job's ``tune/``), and its winning request (the run's own input with the winner's
settings, ready to submit). ``TrainingRuns`` keeps thin methods over these; nothing here prints.

Example::

    runs = TrainingRuns()
    tuning = runs.tune({"precision": "mxfp8", "tune": {"max_cost_usd": 300}})  # the plan's candidates, measured
    print(runs.tune_report(tuning.name)["winner"], runs.winning_request(tuning.name))
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from constructs_lib.cli.errors import InvalidRequest, OperatorError
from training.contract.tuning import TUNE_REPORT_FILE
from training.request.tuning import with_settings


def tune_plan(
    request: Mapping[str, Any],
    rules: Any,
    measurements: list[dict[str, Any]] | None = None,
    s3: Any = None,
    *,
    init_from: str | Path | None = None,
    data_folder: str | Path | None = None,
) -> dict[str, Any]:
    """The tuning plan of ``request`` (a ``tune`` block of ``{}`` when it has none: the default search space)
    under ``rules``: the trials, their predicted figures and expected seconds, the cost and its bound. With the
    S3 client ``s3``, an ``init_from`` model's config.json is read first, as the workflow does; offline, from
    ``init_from``, a local copy of the folder (without either such a request is refused: its shape is not known
    offline), and ``data_folder``, a local copy of the ``train_data_uri`` folder (prepared conversations: the
    candidates the data cannot fill are left out), as ``plan_request`` does. Raises ``InvalidRequest`` with every
    problem the workflow would refuse it for."""
    from constructs_lib.cli.request import decide
    from training.request.reads import Reads

    reads = Reads(
        s3, measurements=measurements or (), local_init_from=init_from, local_train_data=data_folder
    )
    decision = decide(
        with_tune(request), rules, reads, init_from=init_from, data_folder=data_folder,
        unread_shape="init_from: the tuning plan needs the model folder's config.json from S3 (its shape): plan it "
        "with --deployed or --stack, or offline with a local copy of the folder (--init-from DIR)",
    )  # fmt: skip
    if decision.problems:
        raise InvalidRequest(decision.problems)
    assert decision.tune is not None and decision.fields is not None
    # every refused combination (the workflow's state carries the count and the first few)
    return {**decision.tune["plan"], "refused_by_the_trainer": decision.tune_refused,
            "instance_type": decision.fields.instance_type, "instance_count": decision.fields.instance_count}  # fmt: skip


def with_tune(request: Mapping[str, Any]) -> dict[str, Any]:
    """``request`` as a tuning run: its ``tune`` block, or ``{}`` (every default) when it has none."""
    out = dict(request)
    if out.get("tune") is None:
        out["tune"] = {}
    return out


def measurements(s3: Any, rules: Any) -> list[dict[str, Any]]:
    """The deployed workflow's stored measurement records of its image (what its request check reads)."""
    from training.request.reads import read_measurements

    return read_measurements(s3, rules)


def report_uri(summary: Mapping[str, Any] | None, rules: Any, name: str) -> str:
    """Where run ``name``'s tuning report is: its summary says so; before it has one, the workflow's layout."""
    tune = (summary or {}).get("tune")
    if isinstance(tune, Mapping) and tune.get("report_uri"):
        return str(tune["report_uri"])
    uri = rules.tuning_paths(name)["report_uri"]
    if uri is None:
        raise OperatorError("the deployed workflow's rules name no bucket: cannot find the tuning report")
    return str(uri)


def read_report(s3: Any, uri: str, name: str) -> dict[str, Any]:
    """``report.json`` under the report ``uri`` (``s3://bucket/.../tune/``)."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    from botocore.exceptions import ClientError

    try:
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}{TUNE_REPORT_FILE}")["Body"].read()
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "AccessDenied"):
            raise OperatorError(
                f"run {name} has no tuning report at {uri}{TUNE_REPORT_FILE} "
                f"({error.response['Error']['Code']}): not a tuning run, or its job has not written it yet"
            ) from None
        raise
    return json.loads(body)


def winning_request(
    execution_input: Mapping[str, Any], report: Mapping[str, Any], name: str
) -> dict[str, Any]:
    """The run's own execution input without its ``tune`` block, with the winner's settings: a training request
    ready to submit (same instance, capacity, data, tags)."""
    winner = report.get("winner") or {}
    if not winner.get("settings"):
        raise OperatorError(f"tuning run {name} has no winner: no trial ran ok (see its report)")
    request = {k: v for k, v in execution_input.items() if k != "tune"}
    return with_settings(request, winner["settings"])


def execution_input(sfn: Any, arn: str) -> dict[str, Any]:
    """The input an execution was started with."""
    return json.loads(sfn.describe_execution(executionArn=arn).get("input") or "{}")


class TuningOperations:
    """The tuning operations of :class:`~constructs_lib.cli.api.TrainingRuns` (mixed into it): each a thin call of
    the functions above with the deployed workflow's clients and rules."""

    def tune_plan(self: Any, request: Mapping[str, Any], *, rules: Any = None) -> dict[str, Any]:
        """The tuning plan of ``request`` under ``rules`` (default: the deployed workflow's, with its stored
        measurements): trials, predicted figures, cost. ``InvalidRequest`` when the workflow would refuse it."""
        rules = self.rules if rules is None else rules
        s3 = self.client("s3") if rules.bucket_name else None
        return tune_plan(request, rules, measurements(s3, rules) if s3 else [], s3)

    def tune(self: Any, request: Mapping[str, Any], *, name: str | None = None, rules: Any = None) -> Any:
        """Start a tuning run of ``request`` (``{}`` as its ``tune`` block when it has none), checked like
        :meth:`submit`; returns the run."""
        return self.submit(with_tune(request), name=name, rules=rules)

    def measurements(self: Any) -> list[dict[str, Any]]:
        """The stored measurement records of the deployed workflow's image (what its plans use)."""
        return measurements(self.client("s3"), self.rules)

    def tune_report(self: Any, run: str) -> dict[str, Any]:
        """A tuning run's report (``report.json``: every trial's row, where it was measured, the winner)."""
        current = self.run(run)
        uri = report_uri(current.summary, self.rules, current.name)
        return {**read_report(self.client("s3"), uri, current.name), "report_uri": uri}

    def winning_request(self: Any, run: str) -> dict[str, Any]:
        """The tuning run's own input with the winner's settings and no ``tune`` block: ready to submit."""
        report = self.tune_report(run)
        return winning_request(
            execution_input(self.client("stepfunctions"), self.execution_arn(run)), report, run
        )
