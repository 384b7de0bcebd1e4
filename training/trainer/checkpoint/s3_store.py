"""A run's checkpoint prefix in the checkpoint bucket (``s3://bucket/checkpoints/<segment>/<run>/``) as a store of
checkpoints: what is there, read by one listing; small control objects created only when absent; a checkpoint's
objects deleted marker first; each rank's DCP shards written and read straight through s3torchconnector.

What a user sees under the run's prefix (the same names as a checkpoint folder on disk, with no ``.tmp`` stage:
a checkpoint is sealed where it is written, by its marker)::

    step_00000100/STARTED              written first, by rank 0: step, world size, layout, model, job
    step_00000100/rank_00000.pt ...    each rank's trainer state (step, data position, schedule, RNG)
    step_00000100/__0_0.distcp ...     each rank's DCP shards of the model and optimizer
    step_00000100/.metadata            DCP's index, written by rank 0 once every rank's shards are written
    step_00000100/rank_00000.receipt   each rank's list of what it uploaded (size, SHA-256), once its upload ended
    step_00000100/COMPLETE             the marker, written last by rank 0: every object's size and SHA-256
    step_00000050.unusable             a checkpoint set aside (JSON: why, which job); the prefix is left as it is

Nothing here overwrites: every control object (``STARTED``, receipts, ``COMPLETE``, ``.unusable``) and trainer
state is created with S3's conditional write (``If-None-Match: *``), which S3 refuses when the key exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from training.trainer.checkpoint import s3_dcp
from training.trainer.checkpoint.names import ASIDE, MARKER, METADATA, STARTED, order, receipt_name


@dataclass
class Listing:
    """What the run's prefix holds: every checkpoint's objects (``{name: size}``, names within the checkpoint),
    the checkpoints set aside (their ``.unusable`` record's key is there), and keys of neither kind."""

    checkpoints: dict[str, dict[str, int]] = field(default_factory=dict)
    set_aside: set[str] = field(default_factory=set)
    others: list[str] = field(default_factory=list)

    def sealed(self) -> list[str]:
        """Checkpoints with a marker, not set aside, oldest first."""
        names = [
            n for n, objects in self.checkpoints.items() if MARKER in objects and n not in self.set_aside
        ]
        return sorted(names, key=lambda n: order(n) or (0, 0))

    def incomplete(self) -> list[str]:
        """Checkpoints without a marker (an upload that never finished, or was never sealed), not set aside."""
        names = [
            n for n, objects in self.checkpoints.items() if MARKER not in objects and n not in self.set_aside
        ]
        return sorted(names)

    def taken(self, name: str) -> bool:
        """Whether a new checkpoint may not be written under ``name``: objects there, or a set-aside record."""
        return name in self.checkpoints or name in self.set_aside


def written_whole(objects: dict[str, int], receipts: dict[int, dict[str, Any]], started: Any) -> str | None:
    """Why an unsealed checkpoint holding ``objects`` is not a whole save, or None when it is: a readable
    ``STARTED``; DCP's ``.metadata``; a receipt from every rank of the world size ``STARTED`` records; every object
    a receipt lists present at its size."""
    if not isinstance(started, dict) or not isinstance(started.get("world_size"), int):
        return f"no readable {STARTED}"
    missing = [r for r in range(started["world_size"]) if r not in receipts]
    if missing:
        return f"{receipt_name(missing[0])} is missing: rank {missing[0]}'s upload did not finish"
    listed = {name: entry for receipt in receipts.values() for name, entry in receipt.items()}
    if METADATA not in listed:
        return "no .metadata: DCP's write did not finish"
    for name, (size, _) in sorted(listed.items()):
        if objects.get(name) != size:
            return f"{name} is missing or of another size than its receipt lists"
    return None


class S3Store:
    """The run's prefix ``uri`` (``s3://bucket/prefix/``): listing, conditional creation, reads, deletion of
    checkpoints, and the DCP writer and reader of one checkpoint."""

    def __init__(self, uri: str, tuning: s3_dcp.Tuning = s3_dcp.DEFAULT_TUNING):
        bucket, prefix = s3_dcp.split_uri(uri if uri.endswith("/") else uri + "/")
        self.bucket, self.prefix, self.tuning = bucket, prefix, tuning
        self._client: Any = None
        self._crt: Any = None

    @property
    def client(self) -> Any:
        """boto3's S3 client (made on first use: a process that never touches S3 never builds one)."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            endpoint = s3_dcp.endpoint()
            config = Config(s3={"addressing_style": "path"} if endpoint else {}, retries={"mode": "standard"})
            self._client = boto3.client(
                "s3", region_name=s3_dcp.region(), endpoint_url=endpoint, config=config
            )
        return self._client

    @property
    def crt(self) -> Any:
        """s3torchconnector's client: large objects, read and written in parallel parts."""
        if self._crt is None:
            self._crt = s3_dcp.s3_client(self.tuning)
        return self._crt

    def uri(self, name: str = "") -> str:
        return f"s3://{self.bucket}/{self.prefix}{name}"

    def __str__(self) -> str:
        return self.uri()

    def listing(self) -> Listing:
        """Every key under the prefix, sorted into checkpoints and set-aside records (one paginated listing)."""
        found = Listing()
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for entry in page.get("Contents", []):
                relative = entry["Key"][len(self.prefix) :]
                top, _, rest = relative.partition("/")
                if rest and order(top) is not None:
                    found.checkpoints.setdefault(top, {})[rest] = int(entry["Size"])
                elif not rest and top.endswith(ASIDE) and order(top.removesuffix(ASIDE)) is not None:
                    found.set_aside.add(top.removesuffix(ASIDE))
                else:
                    found.others.append(relative)
        return found

    def read(self, name: str) -> bytes:
        """The object ``name`` (relative to the prefix), whole: for small ones (markers, receipts, states)."""
        return self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()

    def read_json(self, name: str) -> Any:
        """The JSON object ``name``, or None when it is missing or not JSON."""
        try:
            return json.loads(self.read(name))
        except (ValueError, self.client.exceptions.NoSuchKey):
            return None

    def create(self, name: str, data: bytes) -> bool:
        """Create the object ``name`` unless it exists (S3 refuses the write then): whether it was created."""
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data, IfNoneMatch="*")
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in (
                "PreconditionFailed",
                "ConditionalRequestConflict",
            ):
                return False
            raise
        return True

    def sha256(self, name: str) -> tuple[int, str]:
        """(size, SHA-256) of the object ``name``, read once in parts."""
        return s3_dcp.object_sha256(self.crt, self.uri(name))

    def delete_checkpoint(self, name: str, objects: list[str]) -> None:
        """Delete the checkpoint ``name``: its marker first (an interrupted deletion leaves an unsealed prefix,
        never a sealed one with objects missing), then ``objects``, a thousand keys a request."""
        self.client.delete_object(Bucket=self.bucket, Key=f"{self.prefix}{name}/{MARKER}")
        keys = [f"{self.prefix}{name}/{o}" for o in objects if o != MARKER]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": key} for key in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def writer(self, name: str) -> s3_dcp.HashingS3Writer:
        """DCP's writer of this rank's shards of the checkpoint ``name``."""
        return s3_dcp.HashingS3Writer(self.uri(name), self.tuning)

    def reader(self, name: str) -> Any:
        """DCP's reader of the checkpoint ``name`` (each rank fetches the ranges its state needs)."""
        return s3_dcp.reader(self.uri(name), self.tuning)
