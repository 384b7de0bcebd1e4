"""What a checkpoint's ``COMPLETE`` marker records about the model it holds (``model_shape``: the shape, RMSNorm's
epsilon, the position encoding and, with LoRA, the adapters' rank, alpha, targets and frozen base) and why a run
cannot continue it, in one set of words: the trainer refuses such a checkpoint at its start
(``training.trainer.checkpoint``), and the request check refuses ``resume_from``'s before launch
(``training.request.decision``) with the same sentences, from :func:`mismatch`.

Part of the contract between the infrastructure (``constructs_lib``) and the trainer: standard library only (the
frozen base's sampled SHA-256 is the trainer's, ``lora.base_reference``; the request check, which cannot read the
weights, compares everything else).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.contract import settings_checks, settings_parse, settings_table, shapes
from training.models import settings as model_settings

REMEDY = {
    "checkpoint_dir": "use another checkpoint_dir or the checkpoint's model settings",
    "resume_from": "continue a run of this model shape, or give this run the earlier run's model settings",
}
"""What the user can change when a checkpoint's model shape differs, by the setting that chose the checkpoint."""

POSITION_SETTINGS = (
    "rms_norm_eps", "position_encoding", "rope_theta", "rope_scaling", *shapes.LLAMA3_ROPE_SETTINGS
)  # fmt: skip
"""Model settings recorded next to the shape (RMSNorm's epsilon and the position encoding): a model trained with
one cannot continue with another."""

LEGACY_MODEL_SETTINGS: dict[str, Any] = {
    "position_encoding": "none", "tie_embeddings": False, "rms_norm_eps": shapes.NORM_EPS
}  # fmt: skip
"""What a checkpoint written before a setting was recorded holds: every model before RoPE was NoPE, before tying
untied, before ``rms_norm_eps`` 1e-5 (and before grouped-query attention, one key/value head per query head;
before RoPE scaling, none)."""

LORA_SETTINGS = ("lora_rank", "lora_alpha", "lora_targets")
"""The adapters' settings a LoRA checkpoint records and a resume must match."""


def lora_settings(settings: Any) -> dict[str, Any] | None:
    """The adapters' settings of parsed settings (a mapping, or a ``TrainConfig``): rank, alpha (the contract's
    default 2 x rank) and the targeted projections in block order, comma-joined; None without LoRA."""
    get = settings.get if isinstance(settings, Mapping) else lambda name: getattr(settings, name, None)
    rank = int(get("lora_rank") or 0)
    if not rank:
        return None
    alpha = get("lora_alpha")
    targets = settings_checks.lora_target_modules(get("lora_targets") or settings_table.LORA_ALL_LINEAR)
    return {
        "lora_rank": rank,
        "lora_alpha": float(alpha if alpha is not None else 2 * rank),
        "lora_targets": ",".join(targets),
    }


def model_identity(values: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint of the model of parsed settings ``values`` records and a resume must match: the shape
    (``ARCHITECTURE_NAMES``: the dims, key/value heads, tying), ``rms_norm_eps``, ``position_encoding`` and, with
    RoPE, ``rope_theta`` and ``rope_scaling`` (with llama3's four parameters); with LoRA, the adapters' settings
    under ``lora`` (the trainer adds the frozen base they refer to)."""
    shape = settings_parse.model_shape(values)
    identity: dict[str, Any] = {name: getattr(shape, name) for name in settings_table.ARCHITECTURE_NAMES}
    identity["rms_norm_eps"] = float(values["rms_norm_eps"])
    identity["position_encoding"] = values["position_encoding"]
    if values["position_encoding"] == "rope":
        identity["rope_theta"] = float(values["rope_theta"])
        identity["rope_scaling"] = values["rope_scaling"]
        if values["rope_scaling"] != "none":
            identity |= {name: values[name] for name in shapes.LLAMA3_ROPE_SETTINGS}
    if values.get("model_config"):
        identity["model_config"] = values[
            "model_config"
        ]  # another family, or what the flat settings cannot say
    adapters = lora_settings(values)
    if adapters is not None:
        identity["lora"] = adapters
    return identity


def with_legacy(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's recorded identity with what checkpoints of earlier versions left out."""
    stored = {**LEGACY_MODEL_SETTINGS, **stored}
    stored.setdefault("num_kv_heads", stored.get("num_heads"))
    if stored["position_encoding"] == "rope":
        stored.setdefault("rope_scaling", "none")
    return stored


def mismatch(where: str, stored: Any, ours: Mapping[str, Any] | None, remedy: str) -> str | None:
    """A one-line message when the checkpoint at ``where`` (``stored``: its marker's ``model_shape``) holds a
    model of another shape than ``ours`` (:func:`model_identity`), one trained with other position settings
    (``POSITION_SETTINGS``; a checkpoint without them was NoPE), another family (``model_config``), or other LoRA
    adapters (:func:`lora_mismatch`);
    None when it can be continued, or when the marker records no shape."""
    if ours is None or not isinstance(stored, dict):
        return None
    stored = with_legacy(stored)
    lora_problem = lora_mismatch(where, stored.get("lora"), ours.get("lora"), remedy)
    if lora_problem is not None:
        return lora_problem
    dims = [name for name in ours if name not in (*POSITION_SETTINGS, "lora", "model_config")]
    stored_dims = {name: stored.get(name) for name in dims}
    if stored_dims != {name: ours[name] for name in dims}:
        return (
            f"{where} holds a model of shape {_shape_text(stored_dims)}, but this run's shape is "
            f"{_shape_text({name: ours[name] for name in dims})}; {remedy}"
        )
    problem = _model_config_mismatch(where, stored.get("model_config"), ours.get("model_config"), remedy)
    if problem is not None:
        return problem
    if "position_encoding" not in ours:
        return None
    mine = {name: ours[name] for name in POSITION_SETTINGS if name in ours}
    theirs = {name: stored[name] for name in POSITION_SETTINGS if name in stored}
    if mine == theirs:
        return None
    if mine.get("rms_norm_eps") == theirs.get("rms_norm_eps"):  # named only when it is what differs
        mine.pop("rms_norm_eps", None), theirs.pop("rms_norm_eps", None)
    return (
        f"{where} holds a model trained with {_settings_text(theirs)}, but this run has {_settings_text(mine)}; "
        f"{remedy}"
    )


def _model_config_mismatch(where: str, stored: Any, ours: Any, remedy: str) -> str | None:
    """Why the checkpoint at ``where`` holds another model than this run's beyond the flat shape (its
    ``model_config``: the family and what the flat settings do not say), naming what differs; None when the same."""
    if stored == ours:
        return None
    flat = {"family": model_settings.FLAT_FAMILY}  # no model_config: the model of the flat settings
    theirs, mine = stored or flat, ours or flat
    differing = [key for key in sorted(set(theirs) | set(mine)) if theirs.get(key) != mine.get(key)]
    shown = ", ".join(f"{key} {theirs.get(key)!r} vs {mine.get(key)!r}" for key in differing[:3])
    return (
        f"{where} holds a {theirs.get('family')} model, but this run's is a {mine.get('family')} model ({shown}); "
        f"{remedy}"
    )


def lora_mismatch(where: str, stored: Any, ours: Any, remedy: str) -> str | None:
    """Why a run cannot continue the checkpoint at ``where``: one of full fine-tuning and one of LoRA, LoRA
    adapters of another rank, alpha or targets, or adapters trained on another frozen base (compared when both
    name theirs: the request check cannot read the weights the trainer samples); None when they match."""
    if stored == ours:
        return None
    if not stored or not ours:
        theirs = "LoRA adapters (lora_rank > 0)" if stored else "a full fine-tuning run (every weight)"
        mine = "trains LoRA adapters" if ours else "is full fine-tuning (lora_rank=0)"
        return f"{where} holds {theirs}, but this run {mine}; {remedy}"
    if any(stored.get(name) != ours.get(name) for name in LORA_SETTINGS):
        text = ", ".join
        return (
            f"{where} holds LoRA adapters of {text(f'{n}={stored.get(n)}' for n in LORA_SETTINGS)}, but this run "
            f"has {text(f'{n}={ours.get(n)}' for n in LORA_SETTINGS)}; {remedy}"
        )
    if "base" not in ours or _same_base(stored.get("base"), ours.get("base")):
        return None
    return (
        f"{where} holds LoRA adapters trained on another frozen base ({_base_text(stored.get('base'))}) than this "
        f"run's ({_base_text(ours.get('base'))}); give init_from (or seed) the base they were trained on, or {remedy}"
    )


def _same_base(stored: Any, ours: Any) -> bool:
    """Whether two ``lora.base_reference`` values name the same frozen base: the same seed, or ``init_from`` files
    of the same sampled SHA-256 wherever the folder is now (a base copied or mounted elsewhere is the same base);
    an unreadable folder matches only the same path unreadable alike."""
    if not isinstance(stored, dict) or not isinstance(ours, dict):
        return False
    digests = str(stored.get("sha256", "")), str(ours.get("sha256", ""))
    if "init_from" in stored and "init_from" in ours and not any(d.startswith("unreadable") for d in digests):
        return digests[0] == digests[1]
    return stored == ours


def _base_text(base: Any) -> str:
    if not isinstance(base, dict):
        return "unknown"
    if "init_from" in base:
        return f"init_from={base['init_from']} with sampled SHA-256 {str(base.get('sha256'))[:16]}"
    return f"a generated base of seed={base.get('seed')}"


def _shape_text(shape: dict[str, Any]) -> str:
    """``(num_layers=2, ...)``; key/value heads only when fewer than the heads (grouped-query attention), tying
    only when tied (the defaults of every model before they existed)."""
    shown = {
        key: value
        for key, value in shape.items()
        if not (key == "num_kv_heads" and value == shape.get("num_heads"))
        and not (key == "tie_embeddings" and not value)
    }
    return "(" + ", ".join(f"{key}={value}" for key, value in shown.items()) + ")"


def _settings_text(settings: dict[str, Any]) -> str:
    """``position_encoding=rope, rope_theta=10000``; RoPE scaling only when there is one."""
    return ", ".join(
        f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
        for key, value in settings.items()
        if not (key == "rope_scaling" and value == "none")
    )
