"""A tuning run's plan, from its candidates (``tuning.candidates``): the trials kept (``max_trials``, the probe
at the memory edge), what they are expected to cost and how long the job may run (``max_cost_usd`` keeps the top
trials that fit in it), why nothing fits when nothing does, and the hyperparameters of the one SageMaker job that runs
them. Pure Python (standard library, ``contract`` and ``plan`` only): part of the request-check Lambda's asset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from training.contract import hardware, settings_table, tuning
from training.plan import estimate, memory
from training.request.tuning import (
    DOES_NOT_DIVIDE,
    LISTED_REFUSALS,
    Candidate,
    Candidates,
    Convergence,
    TuneSettings,
    candidates,
)

JOB_START_SECONDS = 600.0
"""Assumed billable start of one tuning job before its first trial (instance set-up, pulling the ~20 GB image,
the toolkit): not measured here (no GPU), a round upper figure. Only the cost estimate uses it."""
TRIAL_START_SECONDS = 90.0
"""Assumed start of one trial on a GPU instance before its first step (torchrun, imports, NCCL, building and
sharding the model). On this project's 2-core CPU machine the driver's own overhead was measured
(``python -m training.measure.tune_overhead``); GPU start-up is larger and not measured here."""
SAVE_GB_PER_SECOND_PER_GPU = 1.0
"""Assumed local write speed of one rank's checkpoint shard (the trial's one save)."""
REPORT_SECONDS = 120.0
"""Kept at the end of the job's time for the report and SageMaker's last upload of the checkpoint folder."""


def trial_seconds(candidate: Candidate, settings: TuneSettings) -> float:
    """Expected seconds of one trial: its start-up, a DPO run's reference pass over the data before step 1 (each
    trial is a fresh run: ``dpo_reference`` precomputed scores every window again), warm-up and timed steps at the
    predicted step time (the cap: a trial that settles early ends sooner) and its one checkpoint save (fp32
    parameters and AdamW's two moments, 12 bytes per parameter, spread over the ranks)."""
    s = candidate.plan.setup
    steps = settings.warmup_steps + settings.max_measured_steps
    save = 12.0 * s.shape.parameter_count() / s.world_size / 1e9 / SAVE_GB_PER_SECOND_PER_GPU
    return TRIAL_START_SECONDS + reference_pass_seconds(candidate) + steps * candidate.step_seconds() + save


def reference_pass_seconds(candidate: Candidate) -> float:
    """A DPO candidate's reference pass before its first step (its plan's ``preference`` part); 0 for any
    other, and for ``adapter_off`` (its reference is in every step's time)."""
    part = candidate.plan.preference or {}
    return float(part.get("reference_pass_seconds") or 0.0)


def convergence_seconds(candidate: Candidate, convergence: Convergence) -> float:
    """Expected seconds of the convergence runs on ``candidate`` (the reference and each precision; each a fresh
    run, a DPO one with its own reference pass)."""
    runs = 1 + len(convergence.precisions)
    one = (
        TRIAL_START_SECONDS + reference_pass_seconds(candidate) + convergence.steps * candidate.step_seconds()
    )
    return runs * one


def convergence_timeout(candidate: Candidate, settings: TuneSettings) -> int:
    """Hard limit of one convergence run: three times its expected time, at least a trial's timeout."""
    assert settings.convergence is not None
    one = (
        TRIAL_START_SECONDS
        + reference_pass_seconds(candidate)
        + settings.convergence.steps * candidate.step_seconds()
    )
    return int(max(settings.trial_timeout_seconds, 3 * one))


@dataclass
class TunePlan:
    """What a tuning run will do and cost: ``trials`` (ranked, the probe last), the seconds and dollars expected
    (``expected_*``: start-up plus every trial and the convergence runs at their predicted times) and at most
    (``max_runtime_seconds``: the job's own limit, from the trials' timeouts and ``max_cost_usd``)."""

    settings: TuneSettings
    found: Candidates
    trials: list[Candidate]
    trimmed_by_cost: int
    trial_seconds: list[float]
    expected_seconds: float
    max_runtime_seconds: int
    expected_cost_usd: float | None
    max_cost_usd: float | None
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what the CLI shows and the execution's summary carries."""
        return {
            "trials": [
                {
                    "settings": c.overrides,
                    "probe": c.probe,
                    "predicted_tokens_per_sec_per_gpu": round(c.tokens_per_sec),
                    "throughput_basis": c.plan.timing.basis,
                    "predicted_tokens_per_sec_per_gpu_spread": (
                        None
                        if c.plan.timing.spread is None
                        else [round(v) for v in c.plan.timing.spread.tokens_per_sec_per_gpu]
                    ),
                    "predicted_peak_gib": round(c.plan.memory.peak_gib, 2),
                    "fits": c.plan.memory.fits,
                    "expected_seconds": round(seconds),
                }
                for c, seconds in zip(self.trials, self.trial_seconds, strict=True)
            ],
            "considered": self.found.considered,
            "predicted_not_to_fit": len(self.found.not_fitting),
            "refused_by_the_trainer": self.found.refused[:LISTED_REFUSALS],
            "refused_by_the_trainer_count": len(self.found.refused),
            "trimmed_by_cost": self.trimmed_by_cost,
            "expected_seconds": round(self.expected_seconds),
            "expected_cost_usd": None if self.expected_cost_usd is None else round(self.expected_cost_usd, 2),
            "max_runtime_seconds": self.max_runtime_seconds,
            "max_cost_usd": None if self.max_cost_usd is None else round(self.max_cost_usd, 2),
            "cost_basis": (
                f"job start-up {JOB_START_SECONDS:.0f} s and trial start-up {TRIAL_START_SECONDS:.0f} s (assumed), "
                "steps at the plan's predicted step time, on-demand prices of " + hardware.PRICES_AS_OF
            ),
        }


def no_fit_problem(
    found: Candidates,
    space: Mapping[str, Sequence[Any]],
    values: Mapping[str, Any],
    *,
    max_instance_count: int,
    instance_types: Sequence[str] = (),
    world: int | None = None,
) -> str:
    """Why a search space leaves nothing to run, naming the field, and what would help: when the trainer's rules
    refuse every combination :func:`refused_advice` (``world``: the job's GPUs), else :func:`no_fit_advice`."""
    parts = [f"no candidate of the {found.considered} combinations is predicted to fit"]
    if found.not_fitting:
        nearest = found.not_fitting[0]
        parts.append(
            f"{len(found.not_fitting)} exceed the memory limit (nearest: {nearest.describe()} at "
            f"{nearest.plan.memory.peak_gib:.1f} GiB of {nearest.plan.memory.limit_gib:.1f} GiB allowed)"
        )
    if found.refused:
        parts.append(f"{len(found.refused)} are refused by the trainer's rules (first: {found.refused[0]})")
    if found.refused and len(found.refused) == found.considered:
        advice = refused_advice(found, world)
    else:
        advice = no_fit_advice(
            found, space, values, max_instance_count=max_instance_count, instance_types=instance_types
        )
    return "tune.search_space: " + "; ".join(parts) + "; " + advice


LAYOUT_REFUSAL = "data_parallel_replicate: must divide the number of GPUs"
"""How the trainer's rules refuse a ``data_parallel_replicate`` (``inputs.replicate_setting``)."""


def refused_advice(found: Candidates, world: int | None) -> str:
    """What to change when the trainer's rules refuse every combination (nothing was planned, so no memory
    advice): the request's batch when no micro-batch divides it, the layouts that divide the job's ``world`` GPUs
    when none of the space's does, else the values the reasons name."""
    if all(DOES_NOT_DIVIDE in r for r in found.refused):
        return (
            "raise the request's batch_size (or grad_accum_steps) to the global batch the micro-batches should "
            "split, or list micro-batches that divide it"
        )
    if world is not None and all(LAYOUT_REFUSAL in r for r in found.refused):
        divisors = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
        return (
            f"list data_parallel_replicate values that divide the job's {world} GPUs ({divisors}), or leave it out "
            "of the search space (auto)"
        )
    return (
        "every combination is refused by the trainer's rules, before any memory was planned: change the values the "
        "reasons name (blackwell-training tune --dry-run lists every one)"
    )


def no_fit_advice(
    found: Candidates,
    space: Mapping[str, Sequence[Any]],
    values: Mapping[str, Any],
    *,
    max_instance_count: int,
    instance_types: Sequence[str],
) -> str:
    """What would make a candidate fit, leaving out what the space already tried: more instances (the fewest under
    which the nearest candidate fits, up to the workflow's ``max_instance_count``), a larger allowed instance type,
    micro-batches below the smallest tried, full activation checkpointing when not tried."""
    hints = []
    if found.not_fitting:
        s = found.not_fitting[0].plan.setup
        counts = range(s.instance_count + 1, max_instance_count + 1)
        count = next((k for k in counts if memory.estimate_memory(replace(s, instance_count=k)).fits), None)
        if count is not None:
            peak = memory.estimate_memory(replace(s, instance_count=count)).peak_gib
            hints.append(f"instance_count {count} (the nearest candidate then plans {peak:.1f} GiB)")
        bigger = [t for t in instance_types if t != s.instance_type and hardware.GPU_INSTANCE_TYPES[t].supports(
            s.precision) and memory.estimate_memory(replace(s, instance_type=t)).fits]  # fmt: skip
        if bigger:
            hints.append("instance_type " + " or ".join(bigger))
    smallest = min(int(b) for b in space.get("batch_size", (values["batch_size"],)))
    if smallest > 1:
        hints.append(f"batch_size values below {smallest}")
    if "full" not in {settings_table.AC_ALIASES.get(str(a).lower(), str(a)) for a in
                      space.get("activation_checkpointing", (values["activation_checkpointing"],))}:  # fmt: skip
        hints.append("activation_checkpointing full")
    if not hints:
        return (
            f"no instance count up to {max_instance_count}, allowed instance type, micro-batch or activation "
            "checkpointing fits it: tune a smaller model (model_preset) or seq_length"
        )
    return "it would fit with: " + "; ".join(hints)


def plan_tuning(
    values: Mapping[str, Any],
    setup: memory.Setup,
    settings: TuneSettings,
    *,
    max_runtime_seconds: int,
    measurements: Sequence[Mapping[str, Any]] = (),
    image_tag: str | None = None,
    max_instance_count: int | None = None,
    instance_types: Sequence[str] = (),
    data_check: Callable[[Mapping[str, Any], int], str | None] | None = None,
    objective: str | None = None,
    finish: Callable[[estimate.Plan, Mapping[str, Any]], estimate.Plan] | None = None,
) -> TunePlan:
    """The tuning run of the request whose parsed settings are ``values`` on ``setup`` under ``settings``;
    ``problems`` lists what refuses it (no candidate fits, a cost bound below one trial, a trial list too long).
    ``max_instance_count`` and ``instance_types``: what the workflow allows, for the advice when nothing fits
    (default: the request's own count and type); ``data_check``, ``objective`` and ``finish``: :func:`candidates`'."""
    found = candidates(values, setup, settings.search_space, measurements=measurements, image_tag=image_tag,
                       data_check=data_check, objective=objective, finish=finish)  # fmt: skip
    chosen = found.ranked[: settings.max_trials]
    if settings.probe_memory_edge and found.edge is not None and chosen:
        chosen.append(found.edge)
    instance_type, count = setup.instance_type, setup.instance_count
    price = hardware.ON_DEMAND_USD_PER_HOUR.get(instance_type)
    most = setup.instance_count if max_instance_count is None else max_instance_count
    problems = (
        []
        if found.ranked
        else [
            no_fit_problem(
                found,
                settings.search_space,
                values,
                max_instance_count=most,
                instance_types=instance_types,
                world=setup.world_size,
            )
        ]  # fmt: skip
    )
    seconds = [trial_seconds(c, settings) for c in chosen]
    extra = convergence_seconds(chosen[0], settings.convergence) if chosen and settings.convergence else 0.0
    kept, trimmed = len(chosen), 0
    budget = None
    if settings.max_cost_usd is not None and chosen:
        if price is None:
            problems.append(
                f"tune.max_cost_usd: {instance_type} has no on-demand price in this version "
                "(hardware.ON_DEMAND_USD_PER_HOUR), so the bound cannot be kept; leave max_cost_usd out"
            )
        else:
            budget = settings.max_cost_usd * 3600.0 / (price * count) - JOB_START_SECONDS - REPORT_SECONDS
            need = seconds[0] + extra
            if need > budget:
                one = (JOB_START_SECONDS + REPORT_SECONDS + need) * price * count / 3600.0
                what = "one trial and the convergence runs" if extra else "one trial"
                problems.append(
                    f"tune.max_cost_usd: must cover at least {what} (${one:,.2f}: the job's start-up, the "
                    f"best candidate's trial {seconds[0]:.0f} s"
                    + (f", convergence {extra:.0f} s" if extra else "")
                    + f", on {count} x {instance_type}); got {settings.max_cost_usd:g}"
                )
            else:
                kept = max(n for n in range(1, len(chosen) + 1) if sum(seconds[:n]) + extra <= budget)
                trimmed = len(chosen) - kept
    chosen, seconds = chosen[:kept], seconds[:kept]
    text = tuning.format_trials([c.trial() for c in chosen])
    if len(text) > 2500:
        problems.append(
            f"tune.max_trials: the {len(chosen)} trials take {len(text)} characters, more than one SageMaker "
            "hyperparameter holds (2500); lower max_trials"
        )
    timeouts = settings.trial_timeout_seconds * len(chosen)
    if chosen and settings.convergence:
        timeouts += convergence_timeout(chosen[0], settings) * (1 + len(settings.convergence.precisions))
    runtime = min(max_runtime_seconds, int(timeouts + REPORT_SECONDS))
    if budget is not None:
        runtime = min(runtime, int(budget + REPORT_SECONDS))
    expected = JOB_START_SECONDS + sum(seconds) + extra + REPORT_SECONDS
    cost = None if price is None else expected * price * count / 3600.0
    worst = None if price is None else (JOB_START_SECONDS + runtime) * price * count / 3600.0
    return TunePlan(settings, found, chosen, trimmed, seconds, expected, runtime, cost, worst, problems)


def job_hyperparameters(
    tuned: TunePlan,
    *,
    instance_type: str,
    image_uri: str | None,
) -> dict[str, str]:
    """The ``tune_*`` hyperparameters of the tuning job (``tuning.TUNE_HYPERPARAMETERS``), as strings."""
    s = tuned.settings
    out = {
        tuning.TUNE_TRIALS: tuning.format_trials([c.trial() for c in tuned.trials]),
        "tune_warmup_steps": str(s.warmup_steps),
        "tune_max_measured_steps": str(s.max_measured_steps),
        "tune_window_steps": str(s.window_steps),
        "tune_cv_target": repr(float(s.cv_target)),
        "tune_trial_timeout_seconds": str(s.trial_timeout_seconds),
        "tune_deadline_seconds": str(max(1, tuned.max_runtime_seconds - int(REPORT_SECONDS))),
        "tune_instance_type": instance_type,
    }
    if image_uri:
        out["tune_image_uri"] = image_uri
    if s.convergence is not None and tuned.trials:
        out.update(
            tune_convergence_precisions=",".join(s.convergence.precisions),
            tune_convergence_reference=s.convergence.reference,
            tune_convergence_steps=str(s.convergence.steps),
            tune_convergence_timeout_seconds=str(convergence_timeout(tuned.trials[0], s)),
        )
    return out
