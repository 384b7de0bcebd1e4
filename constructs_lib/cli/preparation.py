"""Data preparation from the operator's side (boto3; no aws_cdk import): the plan before launch (the input's
objects and bytes from one listing, then ``training.prepare.plan``), the start of a ``DataPreparation`` execution,
and its progress (complete shards against input objects, the manifest, the execution's status and, for a failed
one, its Processing job's ``ExitMessage``: the script's error line).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.prepare import plan
from training.request import data_manifest as manifest
from training.request.data_manifest import RECORD_FILE


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or not uri.endswith("/"):
        raise ValueError(f"must be s3://bucket/prefix/ (ending in /); got {uri}")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix


def input_size(s3: Any, uri: str) -> tuple[int, int]:
    """(input objects, their bytes) under ``uri``: the objects a preparation reads (known formats only)."""
    return plan.prefix_size(s3, uri)


def local_size(folder: str | Path) -> tuple[int, int]:
    """:func:`input_size` of a local folder (the plan offline)."""
    return plan.folder_size(folder)


def plan_for(objects: int, size: int, **options: Any) -> dict[str, Any]:
    """The plan as the CLI shows it: the row, its inputs, the sources of its figures and its lines in words."""
    chosen = plan.plan(size, objects, **options)
    return {**asdict(chosen), "row": chosen.row(), "input_objects": objects, "input_bytes": size,
            "rate": plan.MEASURED, "lines": plan.describe(chosen, objects, size)}  # fmt: skip


def start(sfn: Any, state_machine_arn: str, request: dict[str, Any], name: str | None = None) -> str:
    """Start a preparation (the execution input: ``name``, ``input_uri``, ``model_uri``, ...); its ARN."""
    missing = [field for field in ("name", "input_uri", "model_uri") if not request.get(field)]
    if missing:
        raise ValueError(f"{', '.join(missing)}: must be given (see docs/data.md)")
    execution = name or f"prepare-{request['name']}-{uuid.uuid4().hex[:8]}"
    return sfn.start_execution(stateMachineArn=state_machine_arn, name=execution, input=json.dumps(request))[
        "executionArn"
    ]


@dataclass(frozen=True)
class Progress:
    status: str
    complete: int
    objects: int
    manifest: bool
    output_uri: str
    exit_message: str | None = None

    def line(self) -> str:
        share = f"{100 * self.complete / self.objects:.0f}%" if self.objects else "-"
        done = f"manifest {self.output_uri}{manifest.MANIFEST_FILE}" if self.manifest else "no manifest yet"
        said = f"; the job said: {self.exit_message}" if self.exit_message else ""
        return f"{self.status}: {self.complete} of {self.objects} shards complete ({share}); {done}{said}"


def progress(s3: Any, sfn: Any, execution_arn: str | None, input_uri: str, output_uri: str) -> Progress:
    """Where a preparation stands: its shards' records under ``output_uri`` against the input objects, the
    manifest, and the execution's status (``-`` without one)."""
    objects, _ = input_size(s3, input_uri)
    bucket, prefix = _split(output_uri)
    complete, has_manifest = 0, False
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            name = item["Key"][len(prefix) :]
            complete += name.startswith(manifest.SHARDS) and name.endswith("/" + RECORD_FILE)
            has_manifest = has_manifest or name == manifest.MANIFEST_FILE
    status = sfn.describe_execution(executionArn=execution_arn)["status"] if execution_arn else "-"
    said = exit_message(sfn, execution_arn) if execution_arn and status == "FAILED" else None
    return Progress(status, complete, objects, has_manifest, output_uri, said)


def exit_message(sfn: Any, execution_arn: str) -> str | None:
    """A failed execution's Processing job ``ExitMessage`` (what the script wrote to ``/opt/ml/output/message``):
    from the task failure's cause, the ``DescribeProcessingJob`` answer the sync integration hands back."""
    history = sfn.get_execution_history(executionArn=execution_arn, reverseOrder=True, maxResults=100)
    for event in history["events"]:
        cause = (event.get("taskFailedEventDetails") or {}).get("cause") or ""
        try:
            described = json.loads(cause)
        except ValueError:
            continue
        if isinstance(described, dict) and described.get("ExitMessage"):
            return str(described["ExitMessage"])
    return None
