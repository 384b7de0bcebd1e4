"""A checkpoint's ``COMPLETE`` marker, the same in both storage backends: what it records, how it is read, and the
checks made from it without reading the checkpoint's data (sizes against what is there).

``COMPLETE`` is JSON: the facts of the save (``FACTS``: world size, layout, step, model identity, job), ``files``
(every other file or object of the checkpoint and its size) and ``sha256`` (each one's checksum). It is written
last, so a marker that cannot be read, a listed file missing or of another size, or a file it does not list is
damage, never an interrupted write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from training.trainer.checkpoint.names import MARKER

FACTS = ("world_size", "data_parallel", "step", "model_shape", "job")
"""What a save records about itself (``STARTED``, then ``COMPLETE``)."""


def parse(text: str | bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(the marker, None), or (None, why it cannot be used)."""
    try:
        marker = json.loads(text)
        files = marker["files"]
        if not isinstance(files, dict) or not all(isinstance(size, int) for size in files.values()):
            raise TypeError("'files' is not a map of names to sizes")
        return marker, None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return None, unreadable(err)


def unreadable(err: BaseException) -> str:
    """Why a marker that could not be read (``err``) cannot be used."""
    return f"unreadable {MARKER} marker ({type(err).__name__}: {str(err)[:200]})"


def text(digests: Mapping[str, tuple[int, str]], facts: Mapping[str, Any]) -> str:
    """``COMPLETE``'s content: ``facts`` (``FACTS``), every file's size and checksum (``digests``: ``{name: (size,
    sha256)}``)."""
    files = {name: size for name, (size, _) in sorted(digests.items())}
    sums = {name: digest for name, (_, digest) in sorted(digests.items())}
    marker = {key: facts.get(key) for key in FACTS}
    return json.dumps({**marker, "files": files, "sha256": sums})


def size_problem(marker: Mapping[str, Any], present: Mapping[str, int]) -> str | None:
    """Why a sealed checkpoint holding ``present`` (``{name: size}`` of its files or objects, its marker left out)
    fails the checks its marker allows without reading data: a listed file missing or of another size than listed,
    a file the marker does not list. None when it passes."""
    for name, size in marker["files"].items():
        if name not in present:
            return f"{name} is missing"
        if present[name] != size:
            return f"{name} has {present[name]} bytes, {MARKER} lists {size}"
    for name in sorted(present):
        if name not in marker["files"]:
            return f"{name} is not listed in {MARKER}"
    return None


def checksum_problem(marker: Mapping[str, Any], names: list[str], digest) -> str | None:
    """The first of ``names`` whose SHA-256 (``digest(name)``; an ``OSError`` when it cannot be read) differs from
    the marker's, or None. A marker written before checksums existed has none to compare (its sizes were checked)."""
    sums = marker.get("sha256")
    if sums is None:
        return None
    for name in names:
        try:
            if digest(name) != sums.get(name):
                return f"checksum mismatch in {name}"
        except OSError as err:
            return f"cannot read {name}: {err.strerror or err}"
    return None
