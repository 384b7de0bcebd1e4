"""Where shards and the manifest go: a local folder or an S3 prefix, one interface, never an overwrite.

``put`` creates an object only where none exists: in a folder by a hard link from a file already complete
(``os.link`` fails when the name exists), in S3 by a conditional write (``PutObject`` with ``If-None-Match: *``,
which S3 refuses with 412 when the key exists, also against a concurrent writer) carrying its SHA-256 as the
object's checksum (``ChecksumSHA256``: S3 verifies the bytes on arrival and returns it on ``HeadObject``). A file
above ``MULTIPART_BYTES`` (one PUT stops at 5 GB; a shard's token file is about as large as its object's text) goes
up in parts through s3transfer's managed upload, each part's SHA-256 verified by S3, its
``CompleteMultipartUpload`` conditional the same way (``If-None-Match: *``) and the whole file's SHA-256 kept in
the object's metadata (``x-amz-meta-sha256``: a multipart object's own checksum is one of its parts'). A name
that already exists with the same SHA-256 counts as written (a rerun writing the same bytes again); with other bytes
it is ``StoreError``: nothing is ever replaced.

``head`` gives ``(bytes, sha256)`` of an object (S3: its stored checksum, no download), ``get`` its bytes,
``listing`` every name under a prefix with its size. In S3 whether an object is there is always asked by listing it
(``S3Store.exists``), never by a 404: the job's role may list only its prefixes, and S3 answers a reader without
``s3:ListBucket`` for the request 403 for a missing key.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from training.prepare.kinds import file_sha256

MULTIPART_BYTES = 1 << 30
"""Above this a file is uploaded in parts (S3's single ``PutObject`` takes at most 5 GB)."""
PART_BYTES = 1 << 28
"""One part of a multipart upload (256 MiB: 10,000 parts reach 2.5 TB)."""
SHA256_METADATA = "sha256"


class StoreError(RuntimeError):
    """An object exists with other bytes, or the store refused a write."""


class Store(Protocol):
    where: str

    def head(self, name: str) -> tuple[int, str | None] | None: ...
    def get(self, name: str) -> bytes | None: ...
    def put(self, name: str, path: Path, sha256: str) -> bool: ...
    def listing(self, prefix: str = "") -> dict[str, int]: ...


def same_or_refuse(store: Store, name: str, sha256: str) -> bool:
    """After a refused create: False when the existing object holds these bytes (nothing to do), else
    ``StoreError``."""
    found = store.head(name)
    if found is not None and found[1] == sha256:
        return False
    raise StoreError(
        f"{store.where}{name} already exists with other bytes (sha256 {found[1] if found else '?'}, these "
        f"{sha256}); it is never overwritten: prepare into another output, or delete the old output first"
    )


class LocalStore:
    """A local output folder."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.where = f"{self.folder}/"

    def head(self, name: str) -> tuple[int, str | None] | None:
        path = self.folder / name
        return (path.stat().st_size, file_sha256(path)) if path.is_file() else None

    def get(self, name: str) -> bytes | None:
        path = self.folder / name
        return path.read_bytes() if path.is_file() else None

    def put(self, name: str, path: Path, sha256: str) -> bool:
        target = self.folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.resolve() == target.resolve():
            return True  # written in place (a local run's scratch is the output)
        staged = target.with_name(target.name + f".{os.getpid()}.partial")
        shutil.copyfile(path, staged)
        try:
            os.link(staged, target)  # fails when the name exists: never replaced
        except FileExistsError:
            return same_or_refuse(self, name, sha256)
        finally:
            staged.unlink(missing_ok=True)
        return True

    def listing(self, prefix: str = "") -> dict[str, int]:
        base = self.folder / prefix
        if not base.is_dir():
            return {}
        return {p.relative_to(self.folder).as_posix(): p.stat().st_size for p in base.rglob("*")
                if p.is_file() and not p.name.endswith(".partial")}  # fmt: skip


class S3Store:
    """An S3 prefix (``s3://bucket/prefix/``) through a boto3 client."""

    def __init__(self, uri: str, client: Any, *, multipart_bytes: int = MULTIPART_BYTES,
                 part_bytes: int = PART_BYTES):  # fmt: skip
        if not uri.startswith("s3://") or not uri.endswith("/"):
            raise ValueError(f"output: must be s3://bucket/prefix/ (ending in /); got {uri}")
        self.bucket, _, self.prefix = uri[5:].partition("/")
        self.client, self.where = client, uri
        self.multipart_bytes, self.part_bytes = multipart_bytes, part_bytes
        client.meta.events.register("before-parameter-build.s3.CompleteMultipartUpload", _if_none_match,
                                    unique_id="training.prepare.store.if-none-match")  # fmt: skip

    def exists(self, name: str) -> bool:
        """Whether the object ``name`` is there, by listing it (``ListObjectsV2`` with its key as the prefix: the
        role's ``s3:ListBucket`` is granted under an ``s3:prefix`` condition, which a listing carries and
        ``HeadObject``/``GetObject`` do not, so S3 answers those 403, not 404, for a missing key). A key is the
        first of the keys it prefixes, so one listed key answers."""
        key = self.prefix + name
        found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1).get("Contents", [])
        return bool(found) and found[0]["Key"] == key

    def head(self, name: str) -> tuple[int, str | None] | None:
        if not self.exists(name):
            return None
        found = self.client.head_object(Bucket=self.bucket, Key=self.prefix + name, ChecksumMode="ENABLED")
        checksum = found.get("ChecksumSHA256")
        parts = (
            "-" in found.get("ETag", "")
            or "-" in (checksum or "")
            or found.get("ChecksumType") == "COMPOSITE"
        )
        if checksum and not parts:  # one PUT: the whole file's SHA-256, verified by S3 on arrival
            return int(found["ContentLength"]), base64.b64decode(checksum).hex()
        return int(found["ContentLength"]), (found.get("Metadata") or {}).get(SHA256_METADATA)

    def get(self, name: str) -> bytes | None:
        if not self.exists(name):
            return None
        return self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()

    def put(self, name: str, path: Path, sha256: str) -> bool:
        from botocore.exceptions import ClientError  # noqa: PLC0415

        try:
            if path.stat().st_size > self.multipart_bytes:
                self._upload_parts(name, path, sha256)
            else:
                checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
                with open(path, "rb") as body:
                    self.client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=body, IfNoneMatch="*",
                                           ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum,
                                           Metadata={SHA256_METADATA: sha256})  # fmt: skip
        except ClientError as err:
            if err.response["Error"]["Code"] in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return same_or_refuse(self, name, sha256)
            raise
        return True

    def _upload_parts(self, name: str, path: Path, sha256: str) -> None:
        """s3transfer's managed multipart upload (parts in parallel, retried), completed only where no object is."""
        from s3transfer.manager import TransferConfig, TransferManager  # noqa: PLC0415 - boto3's own transfer

        config = TransferConfig(multipart_threshold=self.multipart_bytes, multipart_chunksize=self.part_bytes)
        with TransferManager(self.client, config) as manager:
            manager.upload(str(path), self.bucket, self.prefix + name,
                           extra_args={"ChecksumAlgorithm": "SHA256", "Metadata": {SHA256_METADATA: sha256}}).result()  # fmt: skip

    def listing(self, prefix: str = "") -> dict[str, int]:
        found: dict[str, int] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                found[item["Key"][len(self.prefix) :]] = int(item["Size"])
        return found


def _if_none_match(params: dict[str, Any], **_: Any) -> None:
    """Every ``CompleteMultipartUpload`` of a store's client creates only: S3 answers 412 where the key exists."""
    params.setdefault("IfNoneMatch", "*")
