"""Put the tuning report and the measurement records into S3, where the workflow's summary, the CLI and the request
check read them (the execution role may write the bucket's tuning prefix). boto3 comes with the DLC (and with
the CLI); nothing is uploaded without a URI (a local run). The bucket is versioned: an upload over an object of an
earlier attempt of the same job keeps the earlier version."""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key)."""
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key


def upload_folder(folder: Path, uri: str, s3: Any = None) -> list[str]:
    """Every file under ``folder`` to ``uri`` (an ``s3://bucket/prefix/``), keeping relative paths; the keys."""
    s3 = s3 or _client()
    bucket, prefix = split_uri(uri if uri.endswith("/") else uri + "/")
    keys = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = prefix + path.relative_to(folder).as_posix()
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        s3.upload_file(str(path), bucket, key, ExtraArgs={"ContentType": content_type})
        keys.append(key)
    return keys


def put_records(records: Sequence[dict[str, Any]], uri: str, s3: Any = None) -> str:
    """The measurement records as one JSON object at ``uri`` (``s3://bucket/key.json``); returns the key."""
    s3 = s3 or _client()
    bucket, key = split_uri(uri)
    body = json.dumps({"records": list(records)}, indent=1, default=str).encode()
    s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
    return key


def _client() -> Any:
    import boto3  # in the DLC; imported only when there is something to upload

    return boto3.client("s3")
