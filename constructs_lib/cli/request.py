"""The request and the project: read a request (file or standard input), apply ``--set key=value``, validate it
with the workflow's own decision (``training.request.decision``), and find ``cdk.json``'s settings."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from constructs_lib.cli.errors import InvalidRequest, OperatorError

DEFAULT_STACK_NAME = "BlackwellTraining"
EXECUTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
"""Execution names the workflow accepts (they become an S3 key segment of the run's checkpoints)."""


@dataclass(frozen=True)
class Project:
    """The app's settings: ``cdk.json``'s ``context`` (nearest ``cdk.json`` at or above the working directory), or
    the defaults when there is none."""

    context: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @classmethod
    def find(cls, start: Path | None = None) -> Project:
        here = (start or Path.cwd()).resolve()
        for folder in (here, *here.parents):
            candidate = folder / "cdk.json"
            if candidate.is_file():
                try:
                    data = json.loads(candidate.read_text())
                except (OSError, ValueError) as error:
                    raise OperatorError(f"{candidate}: not readable as JSON ({error})") from None
                context = data.get("context") if isinstance(data, dict) else None
                if not isinstance(data, dict) or not isinstance(context, dict | None):
                    raise OperatorError(
                        f'{candidate}: must be a JSON object whose "context" is an object of settings'
                    )
                return cls(context=dict(context or {}), path=candidate)
        return cls()

    @property
    def stack_name(self) -> str:
        return str(self.context.get("stackName") or DEFAULT_STACK_NAME)

    @property
    def region(self) -> str | None:
        return self.context.get("region") or None

    def rules(self, bucket_name: str | None = None) -> Any:
        """The ``RequestRules`` this project deploys (``bucket_name`` from the stack's outputs, when known)."""
        from training.request.rules import RequestRules

        try:
            rules = RequestRules.from_cdk_context(self.context)
        except ValueError as error:
            raise OperatorError(f"{self.path or 'cdk.json'}: {error}") from None
        return replace(rules, bucket_name=bucket_name) if bucket_name else rules


def validate(request: object, rules: Any) -> list[str]:
    """Every problem of ``request`` under ``rules``, offline (the workflow's own decision, no AWS call)."""
    return check_offline(request, rules).problems


def check_offline(
    request: object, rules: Any, *, init_from: str | Path | None = None, data_folder: str | Path | None = None
) -> Any:
    """The workflow's own decision (``decide_request``) of ``request`` under ``rules``, offline: no AWS call; its
    ``skipped`` names the checks that need S3, SageMaker, the run's name or the workflow's bucket. ``init_from``,
    ``data_folder``: local copies of the request's ``init_from`` and ``train_data_uri`` folders, read as the
    workflow reads S3 (the model's shape, chat template and tokenizer; conversation data's metadata.json)."""
    from training.request.reads import Reads

    reads = Reads(local_init_from=init_from, local_train_data=data_folder)
    return decide(request, rules, reads, init_from=init_from, data_folder=data_folder)


def decide(
    request: object,
    rules: Any,
    reads: Any,
    *,
    init_from: str | Path | None = None,
    data_folder: str | Path | None = None,
    unread_shape: str | None = None,
) -> Any:
    """The workflow's own decision (``decide_request``) of ``request`` under ``rules`` as the CLI makes it, reading
    through ``reads`` (``training.request.reads.Reads``: S3 or none, and ``init_from`` and ``data_folder``, the local
    copies it was given, read in S3's place); a copy of a folder the decided request does not set is refused.
    ``unread_shape``: the refusal (a caller that needs the model's shape) when the decided ``init_from`` could be read
    neither from S3 nor from a local copy."""
    from training.request.decision import decide_request

    decision = decide_request(request, rules, reads=reads)
    fields = decision.fields
    unread = (
        init_from is None and reads.s3 is None and fields is not None and isinstance(fields.init_from, str)
    )
    if unread_shape is not None and unread:
        raise InvalidRequest([unread_shape])  # the decided field (the input's, else the workflow's default)
    refuse_unused_copies(fields, init_from=init_from, data_folder=data_folder)
    return decision


LOCAL_COPY_OPTIONS = {"init_from": "--init-from", "train_data_uri": "--data-folder"}
"""The request's S3 folders the CLI reads from a local copy offline, and the option that names the copy."""


def refuse_unused_copies(fields: Any, **copies: str | Path | None) -> None:
    """Refuses a local copy (``init_from``, ``data_folder``) of a folder the decided request does not set (the
    input's field, else the workflow's default)."""
    problems = []
    for name, folder in zip(LOCAL_COPY_OPTIONS, (copies["init_from"], copies["data_folder"]), strict=True):
        if folder is not None and fields is not None and getattr(fields, name) is None:
            flag = LOCAL_COPY_OPTIONS[name]
            problems.append(
                f"{flag} {folder}: the request has no {name} (the S3 folder the job would read); set it, and "
                f"{flag} gives that folder's local copy"
            )
    if problems:
        raise InvalidRequest(problems)


def load_request(source: str | None, stdin: IO[str] | None = None) -> dict[str, Any]:
    """The request in file ``source`` (``-``: standard input; None: ``{}``, all defaults) as a JSON object."""
    if source is None:
        return {}
    try:
        if source == "-":
            if stdin is None:
                raise OperatorError("no standard input to read the request from")
            text, where = stdin.read(), "standard input"
        else:
            text, where = Path(source).read_text(), source
    except OSError as error:
        raise OperatorError(f"cannot read {source}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        where = "standard input" if source == "-" else source
        raise InvalidRequest(
            [f"{where}: not UTF-8 text, so not JSON ({error.reason} at byte {error.start})"]
        ) from None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise InvalidRequest([f"{where}: not valid JSON ({error})"]) from None
    if not isinstance(value, dict):
        raise InvalidRequest([f"{where}: must be a JSON object of input fields; got {type(value).__name__}"])
    return value


def apply_settings(request: Mapping[str, Any], settings: Sequence[str]) -> dict[str, Any]:
    """``request`` with each ``key=value`` set. A value is read as JSON when it parses (``16``, ``true``,
    ``null``), else as text; ``hyperparameters.<name>=<value>`` sets one trainer setting (always text)."""
    merged: dict[str, Any] = json.loads(json.dumps(dict(request)))
    for setting in settings:
        key, sep, text = setting.partition("=")
        if not sep or not key:
            raise InvalidRequest([f"--set {setting}: must be KEY=VALUE (e.g. precision=mxfp8)"])
        if key.startswith("hyperparameters."):
            name = key.removeprefix("hyperparameters.")
            extras = merged.get("hyperparameters")
            if extras is None:
                extras = merged["hyperparameters"] = {}
            if not name:
                raise InvalidRequest(
                    [
                        f"--set {setting}: must be hyperparameters.NAME=VALUE (e.g. hyperparameters.max_steps=2000)"
                    ]
                )
            if not isinstance(extras, dict):
                raise InvalidRequest([f"--set {setting}: hyperparameters must be an object of text values"])
            extras[name] = text
            continue
        try:
            merged[key] = json.loads(text)
        except ValueError:
            merged[key] = text
    return merged


def new_run_name(request: Mapping[str, Any], now: datetime | None = None) -> str:
    """``<job_name_prefix or run>-<UTC yyyymmdd-hhmmss>-<4 hex>``, at most 80 characters."""
    prefix = request.get("job_name_prefix")
    prefix = prefix if isinstance(prefix, str) and EXECUTION_NAME.match(prefix) else "run"
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{prefix[:59]}-{stamp}-{secrets.token_hex(2)}"


def plan_request(
    request: object,
    rules: Any,
    s3: Any = None,
    *,
    init_from: str | Path | None = None,
    data_folder: str | Path | None = None,
    measurements: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The memory, time and cost plan (``training.plan``) of ``request`` merged over ``rules``' defaults, as a
    JSON-ready dict: the workflow's own decision's (``decide_request``). Raises ``InvalidRequest`` with every
    problem other than the memory estimate's own (a plan that does not fit is still shown, with its advice). A
    request with ``init_from`` is planned with the shape of that model folder's config.json, read with the S3 client
    ``s3``, or from ``init_from``, a local copy of the folder (without either, it is refused: its shape is not known
    offline); ``data_folder``: a local copy of the ``train_data_uri`` folder (prepared conversations: the plan
    counts their windows), read in place of S3. The throughput is measured where a stored tuning record of the
    rules' image stands for the request (``measurements``: records the caller read, e.g. from a local tuning report;
    else read with ``s3``; the same rules as the workflow's, :mod:`training.plan.measured`), else the plan's
    estimate. ``notes``: what the decision notes without refusing (``checks.notes``)."""
    from training.request.decision import decide_request
    from training.request.reads import Reads

    reads = Reads(s3, local_init_from=init_from, local_train_data=data_folder, measurements=measurements)
    decision = decide(
        request, rules, reads, init_from=init_from, data_folder=data_folder,
        unread_shape="init_from: the plan needs the model folder's config.json from S3 (its shape): plan with "
        "--deployed or --stack, or offline with a local copy of the folder (--init-from DIR)",
    )  # fmt: skip
    problems = [p for p in decision.problems if not p.startswith(("memory:", "ignore_memory_estimate:"))]
    if problems:
        raise InvalidRequest(problems)
    if decision.estimate is None and isinstance(request, Mapping):
        # ignore_memory_estimate's own value was the only problem: the plan does not depend on it
        decision = decide_request({**request, "ignore_memory_estimate": False}, rules, reads=reads)
        problems = [p for p in decision.problems if not p.startswith("memory:")]
        if problems or decision.estimate is None:
            raise InvalidRequest(problems)
    assert decision.estimate is not None
    return {**decision.estimate.to_dict(), "notes": decision.notes}
