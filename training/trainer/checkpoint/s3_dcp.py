"""torch.distributed.checkpoint straight to and from S3: s3torchconnector's writer and reader, with the size and
SHA-256 of every object each rank uploads recorded as its bytes pass (no second read to seal a checkpoint).

``HashingS3Writer`` is s3torchconnector's ``S3StorageWriter`` whose file system wraps each upload stream: what DCP
writes goes to S3 unchanged (a multipart upload that completes only when the stream closes without an error, so
a killed or failed upload leaves no object), and when the upload has completed its ``(size, sha256)`` is recorded
under the object's name within the checkpoint (``digests``). DCP's own rename of ``.metadata.tmp`` to
``.metadata`` (a copy, then a delete, on S3) carries the record along. ``verified_reader`` is s3torchconnector's
``S3StorageReader``. ``client_config`` and ``s3_client`` are the one place that says how the connector reaches S3:
the region, and an endpoint (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, the SDKs' own variables; unset in a
job) addressed path-style, as S3-compatible servers need.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from s3torchconnector import S3ClientConfig, S3ReaderConstructor
from s3torchconnector._s3client import (
    S3Client,  # the client type S3FileSystem takes (its s3_client parameter)
)
from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter

from training.trainer.checkpoint import safe_load

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""The environment variables the AWS SDKs read for a custom S3 endpoint, in their order of precedence."""

READ_CHUNK = 64 * 1024 * 1024
"""Bytes per ranged read when an object is hashed (the connector splits each into parallel part requests)."""


def endpoint() -> str | None:
    """The custom S3 endpoint the environment names (an S3-compatible server), or None for AWS's own."""
    return next((os.environ[name] for name in ENDPOINT_VARIABLES if os.environ.get(name)), None)


def region() -> str:
    """The AWS region of the job (``AWS_REGION``, ``AWS_DEFAULT_REGION``, or boto3's configured one)."""
    found = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not found:
        import boto3

        found = boto3.session.Session().region_name
    if not found:
        raise ValueError("checkpoint_dir: no AWS region is set (AWS_REGION); S3 checkpoints need one")
    return found


@dataclass(frozen=True)
class Tuning:
    """How the connector moves bytes: the throughput it aims at (it opens connections to match) and the size of
    each part of an upload or ranged download. The connector's defaults: 10 Gbit/s, 8 MiB."""

    throughput_gbps: float = 10.0
    part_size: int = 8 * 1024 * 1024
    writer_threads: int = 1
    """DCP's writer threads per rank: each writes objects of its own (``__<rank>_<n>.distcp``), so a rank's share
    is cut into this many objects, uploaded at once."""


DEFAULT_TUNING = Tuning()


def client_config(tuning: Tuning = DEFAULT_TUNING) -> S3ClientConfig:
    """The connector's settings: ``tuning``'s rate and part size, and path-style addressing when an endpoint is given (an
    S3-compatible server has no bucket sub-domains)."""
    return S3ClientConfig(
        throughput_target_gbps=tuning.throughput_gbps, part_size=tuning.part_size,
        force_path_style=endpoint() is not None,
    )  # fmt: skip


def s3_client(tuning: Tuning = DEFAULT_TUNING) -> S3Client:
    return S3Client(region(), endpoint=endpoint(), s3client_config=client_config(tuning))


def split_uri(uri: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``."""
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    bucket, key = uri[5:].split("/", 1)
    return bucket, key


class _HashingStream:
    """A write-only stream that passes every byte to ``inner`` (the connector's upload) and hashes it. Not an
    ``io.IOBase``: one of those closes itself when collected, and closing completes the upload, so a write that
    failed half-way must never be closed by anyone but the code that saw it succeed."""

    def __init__(self, inner: Any):
        self._inner = inner
        self._hash = hashlib.sha256()
        self.size = 0
        self.closed = False

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self.size += len(view)
        self._inner.write(view)
        return len(view)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._inner.flush()

    def close(self) -> None:
        if not self.closed:
            self._inner.close()  # completes the upload (raises when it failed)
            self.closed = True

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class _HashingFileSystem(S3FileSystem):
    """The connector's S3 file system, recording ``(size, sha256)`` of every object whose upload completed,
    keyed by its name relative to ``base`` (the checkpoint's URI)."""

    def __init__(self, base: str, tuning: Tuning):
        super().__init__(region(), s3_client=s3_client(tuning))
        self.base = base.rstrip("/") + "/"
        self.digests: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()  # DCP's writer threads upload several objects at once

    def _name(self, path: str | os.PathLike) -> str:
        text = os.fspath(path)
        if not text.startswith(self.base):
            raise ValueError(f"{text} is outside the checkpoint {self.base}")
        return text[len(self.base) :]

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:  # type: ignore[override]
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as upload:
            hashing = _HashingStream(upload)
            yield hashing  # type: ignore[misc]
            hashing.close()
        with self._lock:  # reached only when the upload completed
            self.digests[self._name(path)] = (hashing.size, hashing.hexdigest())

    def rename(self, old_path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(old_path, new_path)
        with self._lock:
            self.digests[self._name(new_path)] = self.digests.pop(self._name(old_path))


class HashingS3Writer(S3StorageWriter):
    """DCP's writer for the checkpoint at ``uri`` (``s3://bucket/prefix/step_N``): each rank uploads its own
    shards there; ``digests`` holds ``{name: (size, sha256)}`` of what this rank uploaded (rank 0 also
    ``.metadata``, once every rank's shards are written)."""

    def __init__(self, uri: str, tuning: Tuning = DEFAULT_TUNING):
        threads = tuning.writer_threads
        super().__init__(region(), uri, s3client_config=client_config(tuning), thread_count=threads)
        self.fs: _HashingFileSystem = _HashingFileSystem(uri, tuning)  # type: ignore[assignment]
        self.path = self.fs.init_path(uri)

    @property
    def digests(self) -> dict[str, tuple[int, str]]:
        return dict(self.fs.digests)


class _SafeS3Reader(safe_load.SafeMetadata, S3StorageReader):
    """The connector's reader, its ``.metadata`` read without unpickling anything but DCP's metadata classes."""


def reader(uri: str, tuning: Tuning = DEFAULT_TUNING) -> S3StorageReader:
    """DCP's reader for the checkpoint at ``uri``: each rank fetches only the byte ranges of the shards its own
    state needs (the connector's DCP-optimized reader, ranges coalesced); its ``.metadata`` read by
    ``safe_load.SafeMetadata``."""
    storage = _SafeS3Reader(region(), uri, s3client_config=client_config(tuning))
    constructor = storage._reader_constructor
    storage.fs = S3FileSystem(region(), s3_client=s3_client(tuning), reader_constructor=constructor)
    storage.path = storage.fs.init_path(uri)
    return storage


def put_object(client: S3Client, uri: str, data: bytes) -> tuple[int, str]:
    """Upload ``data`` as the object ``uri`` through the connector; its ``(size, sha256)``."""
    bucket, key = split_uri(uri)
    with client.put_object(bucket, key) as upload:
        upload.write(data)
    return len(data), hashlib.sha256(data).hexdigest()


def object_sha256(client: S3Client, uri: str) -> tuple[int, str]:
    """``(size, sha256)`` of the object ``uri``, read once in ranged parts (never held whole in memory)."""
    bucket, key = split_uri(uri)
    digest, size = hashlib.sha256(), 0
    stream = client.get_object(bucket, key, reader_constructor=S3ReaderConstructor.range_based(buffer_size=0))
    while True:
        chunk = stream.read(READ_CHUNK)
        if not chunk:
            return size, digest.hexdigest()
        digest.update(chunk)
        size += len(chunk)


def get_object(client: S3Client, uri: str) -> bytes:
    """The whole (small) object ``uri``."""
    bucket, key = split_uri(uri)
    return client.get_object(bucket, key, reader_constructor=S3ReaderConstructor.sequential()).read()
