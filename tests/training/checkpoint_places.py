"""Where a test's run keeps its checkpoints, the same test against both storage backends: ``FolderPlace`` (a
folder) and ``S3Place`` (a run's prefix on the session's S3-compatible server on loopback, ``s3_server``). A test
takes the ``place`` fixture (``tests/training/conftest.py``), parametrized over both; it fills, damages and reads
the place by checkpoint-relative names (``step_00000006/.metadata``) and gives the trainer ``place.setting`` as its
``checkpoint_dir``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from training.trainer.checkpoint import marker
from training.trainer.checkpoint.names import MARKER


class FolderPlace:
    kind = "folder"

    def __init__(self, root: Path):
        self.root = root

    @property
    def setting(self) -> str:
        return str(self.root)

    def where(self, name: str) -> Any:
        """What the trainer prints for the checkpoint ``name``: its folder."""
        return self.root / name

    def write(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def delete(self, key: str) -> None:
        (self.root / key).unlink()

    def contents(self) -> dict[str, bytes]:
        """Every file (relative key -> bytes)."""
        if not self.root.is_dir():
            return {}
        return {
            str(p.relative_to(self.root)): p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()
        }

    def names(self) -> list[str]:
        """The names at the top: checkpoints (an empty folder too), ``.unusable`` records, ``.tmp`` folders."""
        return sorted(p.name for p in self.root.iterdir()) if self.root.is_dir() else []

    def unseal(self, name: str) -> str:
        """What a save written whole but never sealed leaves: no ``COMPLETE``, the ``.tmp`` name; the name it is
        found under."""
        (self.root / name / MARKER).unlink()
        (self.root / name).rename(self.root / f"{name}.tmp")
        return f"{name}.tmp"


class S3Place:
    kind = "s3"

    def __init__(self, client: Any, bucket: str, prefix: str = "checkpoints/test/run-1/"):
        self.client, self.bucket, self.prefix = client, bucket, prefix

    @property
    def setting(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def where(self, name: str) -> Any:
        """What the trainer prints for the checkpoint ``name``: its URI."""
        return f"{self.setting}{name}"

    def write(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.prefix + key)

    def listed(self) -> list[str]:
        found: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        ):
            found += [item["Key"][len(self.prefix) :] for item in page.get("Contents", [])]
        return sorted(found)

    def contents(self) -> dict[str, bytes]:
        return {key: self.read(key) for key in self.listed()}

    def names(self) -> list[str]:
        return sorted({key.split("/", 1)[0] for key in self.listed()})

    def unseal(self, name: str) -> str:
        """What a save every rank uploaded but never sealed leaves: no ``COMPLETE``; the name it is found under."""
        self.delete(f"{name}/{MARKER}")
        return name


def copy_in(place: FolderPlace | S3Place, folder: Path, name: str, step: int | None = None) -> str:
    """The checkpoint folder ``folder`` into ``place`` as ``name``; ``step``: its marker says that step instead
    (its trainer state still says its own). Returns ``name``."""
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        if path.name == MARKER and step is not None:
            data = json.dumps({**json.loads(data), "step": step}).encode()
        place.write(f"{name}/{path.name}", data)
    return name


def truncate(place: FolderPlace | S3Place, key: str) -> None:
    data = place.read(key)
    place.write(key, data[: len(data) // 2])


def damage(place: FolderPlace | S3Place, key: str) -> None:
    """Flip bytes in the middle of ``key``; its size stays the same (a truncation check cannot see it)."""
    raw = bytearray(place.read(key))
    middle = len(raw) // 2
    raw[middle : middle + 8] = bytes(b ^ 0xFF for b in raw[middle : middle + 8])
    place.write(key, bytes(raw))


def reseal(place: FolderPlace | S3Place, name: str) -> None:
    """Rewrite ``COMPLETE`` with the files' present sizes and checksums: damage no check sees, only the load."""
    found = json.loads(place.read(f"{name}/{MARKER}"))
    files = {k.split("/", 1)[1]: v for k, v in place.contents().items() if k.startswith(f"{name}/")}
    files.pop(MARKER)
    found["files"] = {key: len(data) for key, data in files.items()}
    found["sha256"] = {key: hashlib.sha256(data).hexdigest() for key, data in files.items()}
    place.write(f"{name}/{MARKER}", json.dumps(found).encode())


def complete(place: FolderPlace | S3Place) -> list[str]:
    """The names of the complete checkpoints (sealed, not set aside, every listed file at its size), oldest
    first: the trainer's rule, read from the test's side."""
    contents = place.contents()
    found = []
    for name in place.names():
        if f"{name}/{MARKER}" not in contents or f"{name}.unusable" in contents or name.endswith(".tmp"):
            continue
        parsed, _ = marker.parse(contents[f"{name}/{MARKER}"])
        present = {k.split("/", 1)[1]: len(v) for k, v in contents.items() if k.startswith(f"{name}/")}
        present.pop(MARKER)
        if parsed is not None and marker.size_problem(parsed, present) is None:
            found.append(name)
    return found
