"""Measured throughput and memory of a configuration: the records a tuning run stores, their key, and the rules
that decide whether a record stands for a request.

A record (JSON, one per trial, ``training.tune`` writes them) holds the key (every trainer setting that changes
throughput or memory, :func:`training.request.contract.measurement_key_settings`; the instance type and count; the
image tag and the torch and Transformer Engine versions in that image), what was measured and where. A record
stands for a request only when every part of the key is equal, it was measured on the GPU of the request's
instance type (never a CPU run), and it comes from the image the request would run (its tag; and its versions,
when the caller knows them): a record of another image or other versions is stale and never used. Of several
records for one key the newest wins.

Pure Python (standard library and ``contract`` only): the request-check Lambda and the CLI pass the records they
read from S3 to ``training.request.plan``; nothing here reads S3.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from training.request import contract

SCHEMA = 1
THROUGHPUT_STATUSES = ("ok", "near-oom")
"""Records whose throughput stands (a run that ended with its summary)."""


def key_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The key's trainer settings from parsed settings (``contract.parse_hyperparameters``' output)."""
    return {name: values[name] for name in contract.measurement_key_settings()}


def make_key(
    values: Mapping[str, Any],
    *,
    instance_type: str,
    instance_count: int,
    image_tag: str,
    torch_version: str | None,
    te_version: str | None,
) -> dict[str, Any]:
    """A record's key: the parsed trainer settings that matter, the hardware and the image."""
    return {
        "settings": key_settings(values),
        "instance_type": instance_type,
        "instance_count": instance_count,
        "image_tag": image_tag,
        "torch": torch_version,
        "transformer_engine": te_version,
    }


def make_record(
    key: Mapping[str, Any], measured: Mapping[str, Any], where: Mapping[str, Any]
) -> dict[str, Any]:
    """One stored record (``measured``: status, tokens/s per GPU, step-time spread, memory over ranks, MFU;
    ``where``: device, GPU, world size, job, time of the measurement)."""
    return {"schema": SCHEMA, "key": dict(key), "measured": dict(measured), "where": dict(where)}


def _matches(
    record: Mapping[str, Any],
    settings: Mapping[str, Any],
    instance_type: str,
    instance_count: int,
    image_tag: str,
    versions: Mapping[str, str | None] | None,
) -> bool:
    key, where = record.get("key") or {}, record.get("where") or {}
    gpu = contract.GPU_INSTANCE_TYPES.get(instance_type)
    if record.get("schema") != SCHEMA or gpu is None or where.get("gpu") != gpu.gpu:
        return False
    if (key.get("instance_type"), key.get("instance_count"), key.get("image_tag")) != (
        instance_type,
        instance_count,
        image_tag,
    ):
        return False
    if versions is not None and any(key.get(name) != value for name, value in versions.items()):
        return False
    return key.get("settings") == dict(settings)


def find(
    records: Iterable[Mapping[str, Any]],
    values: Mapping[str, Any],
    *,
    instance_type: str,
    instance_count: int,
    image_tag: str | None,
    versions: Mapping[str, str | None] | None = None,
) -> dict[str, Any] | None:
    """The newest record that stands for parsed settings ``values`` on ``instance_count`` x ``instance_type`` with
    the image ``image_tag`` (and, when given, ``versions``: ``{"torch": ..., "transformer_engine": ...}``); None
    when there is none, or ``image_tag`` is None (the image is not known: nothing can be matched)."""
    if image_tag is None:
        return None
    settings = key_settings(values)
    found = [
        dict(r)
        for r in records
        if _matches(r, settings, instance_type, instance_count, image_tag, versions)
        and (r.get("measured") or {}).get("status") in THROUGHPUT_STATUSES
    ]
    return max(found, key=lambda r: str(r["where"].get("measured_at", ""))) if found else None


def same_hardware(
    records: Iterable[Mapping[str, Any]], *, instance_type: str, image_tag: str | None
) -> list[dict[str, Any]]:
    """Every record of this instance type and image measured on its GPUs (any settings, any status): the plan's
    memory error is checked against them."""
    if image_tag is None:
        return []
    gpu = contract.GPU_INSTANCE_TYPES.get(instance_type)
    return [
        dict(r)
        for r in records
        if r.get("schema") == SCHEMA
        and gpu is not None
        and (r.get("where") or {}).get("gpu") == gpu.gpu
        and (r.get("key") or {}).get("instance_type") == instance_type
        and (r.get("key") or {}).get("image_tag") == image_tag
    ]
