"""The plan of one request: its memory, time and cost estimates together (``make_plan`` of an execution
input, ``plan_of`` of parsed settings), the advice when it does not fit, the stored measurement that
stands for it, and the memory estimate's error against the stored measurements (``memory_check``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from training.contract import hardware
from training.plan import checkpoint_time, measured
from training.plan.advice import advice
from training.plan.inputs import parse_request, setup_from_request
from training.plan.memory import Setup, estimate_memory, lora_block_parameters
from training.plan.memory_terms import GIB, Memory
from training.plan.preference import dpo_timing, preference_plan
from training.plan.step_batch import step_plan
from training.plan.timing import Timing, estimate_time


def memory_check(
    s: Setup, records: Sequence[Mapping[str, Any]], *, image_tag: str | None, this: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The plan's memory error against the stored measurements of this instance type and image: each record's
    configuration re-planned now, its tensors estimate (GB) against the measured peak allocated over ranks.
    ``this`` is the record that stands for ``s`` (its own error is reported apart). None without records."""
    found = measured.same_hardware(records, instance_type=s.instance_type, image_tag=image_tag)
    errors, missed = [], 0
    for record in found:
        key, peak = record["key"], record["measured"].get("max_allocated_gb")
        other = setup_from_request(
            {"instance_type": key["instance_type"], "instance_count": key["instance_count"],
             "hyperparameters": dict(key["settings"])}
        )  # fmt: skip
        estimate = estimate_memory(other)
        if record["measured"].get("status") == "oom":
            missed += int(estimate.fits)
            continue
        if peak:
            errors.append((record, 100.0 * (estimate.tensors_gib * GIB / 1e9 - peak) / peak))
    if not errors and not missed:
        return None
    mine = next((error for record, error in errors if this is not None and record is not None and
                 record["key"] == this["key"]), None)  # fmt: skip
    absolute = [abs(error) for _, error in errors]
    return {
        "records": len(errors),
        "mean_abs_error_pct": round(sum(absolute) / len(absolute), 1) if absolute else None,
        "max_abs_error_pct": round(max(absolute), 1) if absolute else None,
        "this_request_error_pct": None if mine is None else round(mine, 1),
        "oom_predicted_to_fit": missed,
        "compared": "the plan's tensors (GB) against the measured peak allocated (max over ranks)",
    }


@dataclass(frozen=True)
class Plan:
    setup: Setup
    memory: Memory
    timing: Timing
    advice: list[str] = field(default_factory=list)
    measured: dict[str, Any] | None = None
    """The stored record whose measured throughput the timing uses (None: the article's figures or an estimate)."""
    memory_check: dict[str, Any] | None = None
    """The plan's memory error against the stored measurements of this instance and image (:func:`memory_check`)."""
    data: dict[str, Any] | None = None
    """Prepared conversation data: its windows of ``seq_length``, the epochs ``max_steps`` makes and how it was
    truncated (``training.request.fine_tuning.data_plan``); None for other data."""
    preference: dict[str, Any] | None = None
    """Preference tuning (``objective`` dpo): its reference, the step's and the run's time with it, the memory a
    kept reference would take (``training.plan.preference``); None for a next-token run."""
    checkpoint: checkpoint_time.CheckpointTimes | None = None
    """The checkpoints' size, save pause, upload and resume time on the request's backend (``checkpoint_time``)."""
    step: dict[str, Any] | None = None
    """What one optimizer step holds: its windows and tokens, and the examples and trained tokens in them
    (``training.plan.step_batch``)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (what the CLI's --json prints and the execution's summary carries)."""
        m, t, s = self.memory, self.timing, self.setup
        return {
            "peak_gib": round(m.peak_gib, 2),
            "tensors_gib": round(m.tensors_gib, 2),
            "allowance_gib": round(m.allowance_gib, 2),
            "limit_gib": round(m.limit_gib, 2),
            "gpu_gib": round(m.gpu_gib, 2),
            "fits": m.fits,
            "moment": m.moment,
            "parts_gib": {k: round(v, 3) for k, v in m.parts.items()},
            "world_size": s.world_size,
            "parameters": s.shape.parameter_count(),
            "tokens_per_sec_per_gpu": round(t.tokens_per_sec_per_gpu),
            "step_seconds": round(t.step_seconds, 4),
            "run_seconds": round(t.run_seconds),
            "cost_usd": None if t.cost_usd is None else round(t.cost_usd, 2),
            "warning": t.warning,
            "advice": self.advice,
            "throughput_source": t.source,
            "throughput_basis": t.basis,
            "throughput_spread": None if t.spread is None else t.spread.to_dict(),
            "measured": None if self.measured is None else self.measured["measured"],
            "memory_check": self.memory_check,
            "price_source": hardware.PRICES_AS_OF,
            "data_parallel": {"replicate": s.replicate, "shard": s.shard_size},
            "network": None if t.network is None else t.network.to_dict(),
            "network_note": t.network_note,
            "instance_type": s.instance_type,
            "instance_count": s.instance_count,
            **({"step": self.step} if self.step is not None else {}),
            **({"data": self.data} if self.data is not None else {}),
            **({"preference": self.preference} if self.preference is not None else {}),
            **({"checkpoint": self.checkpoint.to_dict()} if self.checkpoint is not None else {}),
        }


def make_plan(
    request: Mapping[str, Any],
    *,
    max_instance_count: int = 64,
    instance_types: Sequence[str] = (),
    measurements: Sequence[Mapping[str, Any]] = (),
    image_tag: str | None = None,
    versions: Mapping[str, str | None] | None = None,
    architecture: Mapping[str, Any] | None = None,
) -> Plan:
    """The plan of one plain execution input (:func:`parse_request`, then :func:`plan_of`); ``architecture``: the
    ``init_from`` model's settings."""
    values, s = parse_request(request, architecture)
    planned = plan_of(
        s,
        values,
        max_instance_count=max_instance_count,
        instance_types=instance_types,
        measurements=measurements,
        image_tag=image_tag,
        versions=versions,
    )
    if values.get("objective") == "dpo":  # a plain input does not say its data: auto stays next_token
        planned = with_preference(planned, values)
    return planned


def plan_of(
    s: Setup,
    values: Mapping[str, Any],
    *,
    max_instance_count: int = 64,
    instance_types: Sequence[str] = (),
    measurements: Sequence[Mapping[str, Any]] = (),
    image_tag: str | None = None,
    versions: Mapping[str, str | None] | None = None,
    check_memory: bool = True,
    objective: str | None = None,
) -> Plan:
    """The plan of the setup ``s`` of parsed settings ``values`` (advice only when it does not fit).
    ``measurements``: stored tuning records (:mod:`training.plan.measured`); the one that stands for these
    settings on the image ``image_tag`` (and ``versions``) gives the throughput instead of the estimate,
    and, with ``check_memory``, all of that instance and image check the memory estimate (each record re-planned:
    :func:`memory_check`; False, e.g. for each of a tuning run's candidates, which would re-plan every record once per
    candidate). ``objective``: the run's, resolved from its data (``auto`` on preference pairs is dpo): a DPO run
    takes the record of a DPO step before a next-token one (``measured.find``; :func:`with_preference` then makes
    the plan the DPO run's)."""
    memory = estimate_memory(s)
    hints = (
        [] if memory.fits else advice(s, max_instance_count=max_instance_count, instance_types=instance_types)
    )
    record = measured.find(
        measurements,
        values,
        instance_type=s.instance_type,
        instance_count=s.instance_count,
        image_tag=image_tag,
        versions=versions,
        objective=objective,
    )
    check = (
        memory_check(s, measurements, image_tag=image_tag, this=record)
        if measurements and check_memory
        else None
    )
    gpus = hardware.GPU_INSTANCE_TYPES[s.instance_type].gpus
    saved = trained_parameters(s)
    checkpoint = checkpoint_time.plan_times(values, saved, s.instance_count, gpus)
    return Plan(
        s,
        memory,
        estimate_time(s, record),
        hints,
        record,
        check,
        checkpoint=checkpoint,
        step=step_plan(s, values),
    )


def with_preference(
    estimate: Plan, values: Mapping[str, Any], *, windows: int | None = None, answers: int | None = None
) -> Plan:
    """``estimate`` (the plan of these settings from :func:`plan_of` with objective dpo: a next-token step's time, or
    a measured DPO step's) as the DPO run's: its timing (``preference.dpo_timing``: the reference's cost applied once)
    and the DPO part (``preference.preference_plan``: training.plan.preference)."""
    s = estimate.setup
    step_measured = estimate.measured is not None and measured.dpo_step(estimate.measured)
    part = preference_plan(
        s, values, estimate.timing, windows=windows, answers=answers, step_measured=step_measured
    )
    return replace(estimate, timing=dpo_timing(s, estimate.timing, part), preference=part.to_dict())


def trained_parameters(s: Setup) -> int:
    """The parameters a checkpoint saves with their optimizer state: every weight, or a LoRA run's adapters."""
    if s.lora_rank:
        return s.shape.num_layers * lora_block_parameters(s)
    return s.shape.parameter_count()
