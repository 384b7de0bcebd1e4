"""Measured throughput and memory of a configuration: the records a tuning run stores, their key, and the rules
that decide whether a record stands for a request.

A record (JSON, one per trial, ``training.tune`` writes them) holds the key (every trainer setting that changes
throughput or memory, :func:`training.contract.tuning.measurement_key_settings`; the instance type and count; the
image tag and the torch and Transformer Engine versions in that image), what was measured and where. The key's
settings say which step was timed (``tuning.measured_step``): a DPO step's record (``objective`` dpo and its
reference) stands for DPO runs only, its time already holding the reference's forward; a DPO run without one takes
the next-token record of its settings (the plan then scales it, ``training.plan.preference``). A record
stands for a request only when every part of the key is equal, it was measured on the GPU of the request's
instance type (never a CPU run), and it comes from the image the request would run:

* its tag, and only a tag that names one image: none is matched for an image without a tag or tagged ``latest``
  (``MUTABLE_TAGS``: a tag that moves to each new push would match the records of an older image);
* its torch and Transformer Engine versions: the caller's when it knows them (``versions``), else those of the
  newest record of that tag (a tag pushed again with other versions, e.g. the same ``training/`` on another base
  image, makes the records of the earlier build stale).

A record of another image or other versions is stale and never used. Of several records for one key the newest
wins.

Pure Python (standard library and ``contract`` only): the request-check Lambda and the CLI pass the records they
read from S3 to ``training.plan``; nothing here reads S3.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from training.contract import hardware, tuning

SCHEMA = 1
MUTABLE_TAGS = frozenset({"latest"})
"""Image tags that move to each new push (``tuning.image_tag`` gives ``latest`` for an URI without a tag): no
record is matched under them."""
THROUGHPUT_STATUSES = ("ok", "near-oom")
"""Records whose throughput stands (a run that ended with its summary)."""


def key_settings(values: Mapping[str, Any], objective: str | None = None) -> dict[str, Any]:
    """The key's trainer settings from parsed settings (``settings_parse.parse_hyperparameters``' output) and the
    step they time (``objective``: the run's, resolved from its data; ``tuning.measured_step``)."""
    return {
        **{name: values[name] for name in tuning.measurement_key_settings()},
        **tuning.measured_step(values, objective),
    }


def dpo_step(record: Mapping[str, Any]) -> bool:
    """Whether ``record`` timed a DPO step (its key says ``objective`` dpo): its time holds the reference's."""
    return ((record.get("key") or {}).get("settings") or {}).get("objective") == "dpo"


def make_key(
    values: Mapping[str, Any],
    *,
    instance_type: str,
    instance_count: int,
    image_tag: str,
    torch_version: str | None,
    te_version: str | None,
    objective: str | None = None,
) -> dict[str, Any]:
    """A record's key: the parsed trainer settings that matter and the step they time (``objective``: the run's,
    resolved from its data), the hardware and the image."""
    return {
        "settings": key_settings(values, objective),
        "instance_type": instance_type,
        "instance_count": instance_count,
        "image_tag": image_tag,
        "torch": torch_version,
        "transformer_engine": te_version,
    }


def well_formed(record: Any) -> bool:
    """Whether ``record`` has this schema's shape (what :func:`find`, :func:`same_hardware` and the plan read): a
    stored file from another version or a hand-edited one is skipped, never fatal to a request's check."""
    if not isinstance(record, Mapping) or record.get("schema") != SCHEMA:
        return False
    key, measured, where = record.get("key"), record.get("measured"), record.get("where")
    if not (isinstance(key, Mapping) and isinstance(measured, Mapping) and isinstance(where, Mapping)):
        return False
    shape = (
        isinstance(key.get("settings"), Mapping)
        and isinstance(key.get("instance_type"), str)
        and isinstance(key.get("instance_count"), int)
        and isinstance(key.get("image_tag"), str)
        and isinstance(measured.get("status"), str)
    )
    tps = measured.get("tokens_per_sec_per_gpu")
    if not shape or (measured["status"] in THROUGHPUT_STATUSES and not _positive(tps)):
        return False
    peak = measured.get("max_allocated_gb")
    return peak is None or (isinstance(peak, int | float) and not isinstance(peak, bool) and peak >= 0)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


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
    gpu = hardware.GPU_INSTANCE_TYPES.get(instance_type)
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


def matchable_tag(image_tag: str | None) -> bool:
    """Whether records can be matched under ``image_tag``: a tag is known and names one image (not ``latest``)."""
    return bool(image_tag) and image_tag not in MUTABLE_TAGS


def _newest(records: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return max(records, key=lambda r: str((r.get("where") or {}).get("measured_at", "")), default=None)


def image_versions(records: Iterable[Mapping[str, Any]], image_tag: str) -> dict[str, str | None] | None:
    """The torch and Transformer Engine versions of the image ``image_tag`` as its newest record says (None
    without one): what the image holds now, as far as the records can tell."""
    newest = _newest(r for r in records if (r.get("key") or {}).get("image_tag") == image_tag)
    if newest is None:
        return None
    key = newest["key"]
    return {"torch": key.get("torch"), "transformer_engine": key.get("transformer_engine")}


def find(
    records: Iterable[Mapping[str, Any]],
    values: Mapping[str, Any],
    *,
    instance_type: str,
    instance_count: int,
    image_tag: str | None,
    versions: Mapping[str, str | None] | None = None,
    objective: str | None = None,
) -> dict[str, Any] | None:
    """The newest record that stands for parsed settings ``values`` on ``instance_count`` x ``instance_type`` with
    the image ``image_tag`` and ``versions`` (``{"torch": ..., "transformer_engine": ...}``; default: those of the
    tag's newest record); None when there is none, or ``image_tag`` is None or mutable (nothing can be matched).
    ``objective``: the run's, resolved from its data (default: the settings' own); a DPO run takes a DPO step's
    record of its reference, else the next-token record of its settings (:func:`dpo_step` tells them apart)."""
    if not matchable_tag(image_tag):
        return None
    assert image_tag is not None
    records = list(records)
    if versions is None:
        versions = image_versions(records, image_tag)
    wanted = key_settings(values, objective)
    keys = [wanted] + (
        [key_settings(values, "next_token")] if dpo_step({"key": {"settings": wanted}}) else []
    )
    for settings in keys:
        found = [
            dict(r)
            for r in records
            if _matches(r, settings, instance_type, instance_count, image_tag, versions)
            and (r.get("measured") or {}).get("status") in THROUGHPUT_STATUSES
        ]
        if found:
            return max(found, key=lambda r: str(r["where"].get("measured_at", "")))
    return None


def same_hardware(
    records: Iterable[Mapping[str, Any]], *, instance_type: str, image_tag: str | None
) -> list[dict[str, Any]]:
    """Every record of this instance type and image (its tag and current versions, as :func:`find`) measured on
    its GPUs (any settings, any status): the plan's memory error is checked against them."""
    if not matchable_tag(image_tag):
        return []
    assert image_tag is not None
    records = list(records)
    versions = image_versions(records, image_tag) or {}
    gpu = hardware.GPU_INSTANCE_TYPES.get(instance_type)
    return [
        dict(r)
        for r in records
        if r.get("schema") == SCHEMA
        and gpu is not None
        and (r.get("where") or {}).get("gpu") == gpu.gpu
        and (r.get("key") or {}).get("instance_type") == instance_type
        and (r.get("key") or {}).get("image_tag") == image_tag
        and all((r.get("key") or {}).get(name) == value for name, value in versions.items())
    ]
