"""A tuning run, decided before anything is paid: the ``tune`` block of an execution input (its fields, defaults
and limits), the candidates the plan picks from its search space, what they are expected to cost, and the
hyperparameters of the one SageMaker job that runs them (``training.tune`` in the image).

The candidates: every combination of the search space's values over the base request, each planned
(``training.plan``: memory, and throughput estimated from the article's points or a stored
measurement); those predicted not to fit are dropped, the rest ranked by predicted tokens/s per GPU, the top
``max_trials`` kept, plus one probe just past the predicted memory edge (the dropped candidate nearest to the
limit). Each candidate keeps the base request's tokens per optimizer step (its ``batch_size`` x
``grad_accum_steps`` x ``seq_length``) through its own ``grad_accum_steps``: a micro-batch that cannot divide them
is left out, with the reason (give the request the global batch to split: ``batch_size`` 32, or 8 with
``grad_accum_steps`` 4).

The cost: one job start-up plus each trial's start-up, warm-up and timed steps at the predicted step time and its
one checkpoint save, plus the convergence runs; ``max_cost_usd`` keeps the top trials that fit in it and bounds
the job's run time (SageMaker stops it there), and a bound below one trial is refused.

Pure Python (standard library and ``contract``/``plan`` only): part of the request-check Lambda's asset; the CLI
uses it to show a tuning run's candidates and cost offline.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from training.contract import hardware, settings_parse, settings_table, tuning
from training.plan import estimate, inputs, memory

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
DEFAULT_PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")
"""The default precisions: bf16 and the low precisions the instance's GPU runs (fp32 and fp16 are never faster)."""
MAX_TRIALS_LIMIT = 32
MAX_COMBINATIONS = 2048
"""The most combinations a search space may have: each is planned in the request check (a Lambda function of 256
MB with 30 seconds), and 2,048 is above any space of distinct levers (the default space has 72; a space of every
micro-batch, mode, precision, loss chunk, compile switch and kernel the trainer has, 1,728, fits)."""
LISTED_REFUSALS = 5
"""How many of the combinations the trainer's rules refuse the plan lists (it counts them all): the decision stays
small for any space (``bounds``), and ``blackwell-training tune --dry-run`` lists every one."""
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
CONVERGENCE_PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")


@dataclass(frozen=True)
class Field:
    """One field of the tune block: its kind (int, number, bool), default and range."""

    kind: str
    default: Any
    low: float | None = None
    high: float | None = None

    def allowed(self) -> str:
        if self.kind == "bool":
            return "true or false"
        what = "an integer" if self.kind == "int" else "a number"
        return f"{what} in [{_fmt(self.low)}, {_fmt(self.high)}]"

    def ok(self, value: Any) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        return math.isfinite(value) and self.low <= value <= self.high  # type: ignore[operator]


def _fmt(number: float | None) -> str:
    return "inf" if number is None else (str(int(number)) if float(number).is_integer() else repr(number))


FIELDS: Mapping[str, Field] = {
    "max_trials": Field("int", 12, 1, MAX_TRIALS_LIMIT),
    "probe_memory_edge": Field("bool", True),
    "warmup_steps": Field("int", 3, 1, 100),
    "max_measured_steps": Field("int", 30, 5, 1000),
    "window_steps": Field("int", 8, 3, 100),
    "cv_target": Field("number", 0.02, 0.0, 0.5),
    "trial_timeout_seconds": Field("int", 1200, 60, 14_400),
    "max_cost_usd": Field("number", None, 0.01, 1e7),
}
"""The tune block's scalar fields; besides them ``search_space`` (an object of setting: [values]) and
``convergence`` (``{"precisions": [...], "steps": N, "reference": "bf16"}``, or null)."""
TUNE_KEYS = ("search_space", *FIELDS, "convergence")
CONVERGENCE_FIELDS: Mapping[str, Field] = {"steps": Field("int", 200, 10, 100_000)}


@dataclass(frozen=True)
class Convergence:
    precisions: tuple[str, ...]
    steps: int
    reference: str = "bf16"


@dataclass(frozen=True)
class TuneSettings:
    """A checked tune block (every field with its default filled in)."""

    search_space: dict[str, tuple[Any, ...]]
    max_trials: int = 12
    probe_memory_edge: bool = True
    warmup_steps: int = 3
    max_measured_steps: int = 30
    window_steps: int = 8
    cv_target: float = 0.02
    trial_timeout_seconds: int = 1200
    max_cost_usd: float | None = None
    convergence: Convergence | None = None


def default_space(instance_type: str, instance_count: int = 1) -> dict[str, tuple[Any, ...]]:
    """The issue's defaults: micro-batch, activation checkpointing, and the precisions the GPU supports; on several
    instances also the data-parallel layouts (every state sharded over every GPU, or one replica per instance)."""
    gpu = hardware.GPU_INSTANCE_TYPES[instance_type]
    space: dict[str, tuple[Any, ...]] = {
        "batch_size": DEFAULT_BATCH_SIZES,
        "activation_checkpointing": settings_table.AC_MODES,
        "precision": tuple(p for p in DEFAULT_PRECISIONS if gpu.supports(p)),
    }
    if instance_count > 1:
        space["data_parallel_replicate"] = (1, instance_count)
    return space


def parse_tune(
    raw: Any, instance_type: str, instance_count: int = 1
) -> tuple[TuneSettings | None, list[str]]:
    """The checked tune block of ``raw`` (the input's ``tune``) for ``instance_type``, or every problem (each
    naming its field: ``tune.max_trials``, ``tune.search_space.batch_size``, ...)."""
    if not isinstance(raw, Mapping):
        return None, [
            f"tune: must be an object of {', '.join(TUNE_KEYS)} (all optional), or null; got {_show(raw)}"
        ]
    problems = [
        f"tune.{key}: unknown field; allowed: {', '.join(TUNE_KEYS)}" for key in raw if key not in TUNE_KEYS
    ]
    values: dict[str, Any] = {}
    for name, spec in FIELDS.items():
        value = raw.get(name, spec.default)
        if value is None and spec.default is None:
            values[name] = None
        elif not spec.ok(value):
            problems.append(f"tune.{name}: must be {spec.allowed()}" + (", or null" if spec.default is None else "")
                            + f"; got {_show(value)}")  # fmt: skip
        else:
            values[name] = value
    space, space_problems = parse_space(raw.get("search_space"), instance_type, instance_count)
    convergence, convergence_problems = parse_convergence(raw.get("convergence"), instance_type)
    problems += space_problems + convergence_problems
    if not problems and values["window_steps"] > values["max_measured_steps"]:
        problems.append(
            f"tune.window_steps: must be at most max_measured_steps ({values['max_measured_steps']}); got "
            f"{values['window_steps']}"
        )
    if problems:
        return None, problems
    return TuneSettings(search_space=space, convergence=convergence, **values), []


def parse_space(
    raw: Any, instance_type: str, instance_count: int = 1
) -> tuple[dict[str, tuple[Any, ...]], list[str]]:
    """A search space: absent (null) means :func:`default_space`; otherwise an object naming at least one of
    ``tuning.TUNABLE_SETTINGS``, each with a non-empty list of values the trainer accepts."""
    allowed = ", ".join(tuning.TUNABLE_SETTINGS)
    if raw is None:
        return default_space(instance_type, instance_count), []
    if not isinstance(raw, Mapping) or not raw:
        return {}, [
            f"tune.search_space: must name at least one setting to vary, each with a list of values (of {allowed}), "
            f"or be left out for the default space; got {_show(raw)}"
        ]
    space: dict[str, tuple[Any, ...]] = {}
    problems = []
    for key, values in raw.items():
        name = settings_parse.normalize_name(str(key))
        where = f"tune.search_space.{key}"
        if name not in tuning.TUNABLE_SETTINGS:
            problems.append(f"{where}: unknown setting; allowed: {allowed}")
            continue
        if not isinstance(values, list) or not values:
            problems.append(f"{where}: must be a non-empty list of values; got {_show(values)}")
            continue
        spec = settings_table.HYPERPARAMETERS_BY_NAME[name]
        try:
            parsed = tuple(dict.fromkeys(spec.parse(v) for v in values))
        except settings_table.ContractError:
            problems.append(f"{where}: each value must be {spec.allowed()}; got {_show(values)}")
            continue
        if name in ("precision", "fp8_recipe"):
            # fp8_recipe mxfp8 is MXFP8BlockScaling: the GPUs precision mxfp8 needs (settings_checks.check_fp8_recipe)
            unsupported = [
                p
                for p in parsed
                if not hardware.GPU_INSTANCE_TYPES[instance_type].supports(_recipe_precision(p))
            ]
            if unsupported:
                choices = hardware.PRECISIONS if name == "precision" else hardware.FP8_RECIPES
                problems.append(
                    f"{where}: {', '.join(unsupported)} cannot run on the GPUs of {instance_type}; it runs "
                    + ", ".join(
                        p
                        for p in choices
                        if hardware.GPU_INSTANCE_TYPES[instance_type].supports(_recipe_precision(p))
                    )
                )
                continue
        space[name] = parsed
    combinations = math.prod(len(values) for values in space.values())
    if not problems and combinations > MAX_COMBINATIONS:
        sizes = " x ".join(f"{len(values)} {name}" for name, values in space.items())
        problems.append(
            f"tune.search_space: at most {MAX_COMBINATIONS} combinations (each is planned before launch); got "
            f"{combinations} ({sizes}): list fewer values"
        )
    return space, problems


def _recipe_precision(value: Any) -> str:
    """The precision a value of ``precision`` or ``fp8_recipe`` needs the GPU to run: its own, ``mxfp8``'s for the
    recipe ``mxfp8``; the other recipes need only what the run's precision needs (bf16's, which every type here
    runs: an fp8 run's own precision is checked apart)."""
    return str(value) if value in hardware.PRECISIONS else "bf16"


def parse_convergence(raw: Any, instance_type: str) -> tuple[Convergence | None, list[str]]:
    if raw is None:
        return None, []
    gpu = hardware.GPU_INSTANCE_TYPES[instance_type]
    runnable = [p for p in CONVERGENCE_PRECISIONS if gpu.supports(p)]
    if not isinstance(raw, Mapping) or set(raw) - {"precisions", "steps", "reference"}:
        return None, [
            f"tune.convergence: must be an object of precisions, steps and reference, or null; got {_show(raw)}"
        ]
    problems = []
    reference = raw.get("reference", "bf16")
    if reference not in runnable:
        problems.append(
            f"tune.convergence.reference: must be one of {', '.join(runnable)}; got {_show(reference)}"
        )
    precisions = raw.get("precisions")
    if (
        not isinstance(precisions, list)
        or not precisions
        or not all(p in runnable and p != reference for p in precisions)
    ):
        problems.append(
            f"tune.convergence.precisions: must be a non-empty list of {', '.join(runnable)} (not the reference "
            f"{reference}); got {_show(precisions)}"
        )
    steps = raw.get("steps", CONVERGENCE_FIELDS["steps"].default)
    if not CONVERGENCE_FIELDS["steps"].ok(steps):
        problems.append(
            f"tune.convergence.steps: must be {CONVERGENCE_FIELDS['steps'].allowed()}; got {_show(steps)}"
        )
    if problems or not isinstance(precisions, list):
        return None, problems
    return Convergence(tuple(dict.fromkeys(precisions)), steps, reference), []


def _show(value: Any) -> str:
    import json

    text = json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= 200 else text[:197] + "..."


# ----------------------------------------------------------------------------------------------------------------
# Candidates
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One trial: the settings it changes over the base request, its plan, and whether it probes the edge."""

    overrides: dict[str, Any]
    plan: estimate.Plan
    probe: bool = False

    @property
    def tokens_per_sec(self) -> float:
        return self.plan.timing.tokens_per_sec_per_gpu

    def step_seconds(self) -> float:
        """Predicted seconds of one optimizer step (every micro-batch of it: the plan counts the accumulation)."""
        return self.plan.timing.step_seconds

    def trial(self) -> dict[str, Any]:
        return {**self.overrides, **({tuning.TRIAL_PROBE: True} if self.probe else {})}

    def describe(self) -> str:
        return ", ".join(f"{k}={settings_parse.format_setting(v)}" for k, v in self.overrides.items())


def with_settings(request: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``request`` with trainer settings set: top-level fields where the input has them, else hyperparameters."""
    out = {**request, "hyperparameters": dict(request.get("hyperparameters") or {})}
    for name, value in overrides.items():
        if name in settings_table.TOP_LEVEL_SETTINGS:
            out[name] = value
        else:
            out["hyperparameters"][name] = value
    return out


DOES_NOT_DIVIDE = "does not divide"


def _keep_tokens_per_step(values: Mapping[str, Any], overrides: dict[str, Any]) -> str | None:
    """Set ``grad_accum_steps`` so that the candidate trains the base request's tokens per optimizer step; the
    reason when its micro-batch cannot."""
    tokens = values["batch_size"] * int(values.get(tuning.GRAD_ACCUM_SETTING) or 1) * values["seq_length"]
    batch = overrides.get("batch_size", values["batch_size"])
    seq = overrides.get("seq_length", values["seq_length"])
    if tokens % (batch * seq):
        return (
            f"batch_size {batch} x seq_length {seq} {DOES_NOT_DIVIDE} the request's {tokens} tokens per optimizer "
            "step per GPU (batch_size x grad_accum_steps x seq_length; give it the global batch to split)"
        )
    overrides[tuning.GRAD_ACCUM_SETTING] = tokens // (batch * seq)
    return None


@dataclass
class Candidates:
    """The plan's pick: ``ranked`` (predicted to fit, best first), ``edge`` (the probe, or None), and what was
    left out: predicted non-fits and combinations the trainer refuses (each with its reason)."""

    ranked: list[Candidate]
    edge: Candidate | None
    considered: int
    not_fitting: list[Candidate] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def candidates(
    values: Mapping[str, Any],
    setup: memory.Setup,
    space: Mapping[str, Sequence[Any]],
    *,
    measurements: Sequence[Mapping[str, Any]] = (),
    image_tag: str | None = None,
    data_check: Callable[[Mapping[str, Any], int], str | None] | None = None,
) -> Candidates:
    """Every combination of ``space`` over the request whose parsed settings are ``values`` and whose setup (instance
    type and count, time limit, packed documents) is ``setup``, planned and ranked. Each candidate is the
    request's settings with its own (``settings_parse.override_settings``: the trainer's cross-setting rules checked
    again); nothing is parsed from the request again. ``data_check``: why a candidate's settings (on the setup's
    world size) cannot run on the request's data, or None (``fine_tuning.candidate_check``: conversation data)."""
    names = list(space)
    sm = hardware.GPU_INSTANCE_TYPES[setup.instance_type].sm
    fitting: list[Candidate] = []
    not_fitting: list[Candidate] = []
    refused: list[str] = []
    combinations = list(itertools.product(*(space[name] for name in names)))
    for combination in combinations:
        overrides = dict(zip(names, combination, strict=True))
        asked = _describe(overrides)
        reason = _keep_tokens_per_step(values, overrides)
        if reason is not None:
            refused.append(f"{asked}: {reason}")
            continue
        try:
            settings = settings_parse.override_settings(values, overrides, sm=sm)
            inputs.replicate_setting(settings, setup.instance_count, setup.instance_type)
        except settings_table.ContractError as err:
            refused.append(f"{asked}: {err}")
            continue
        problem = None if data_check is None else data_check(settings, setup.world_size)
        if problem is not None:
            refused.append(f"{asked}: {problem}")
            continue
        trial = inputs.setup_from_values(
            settings,
            instance_type=setup.instance_type,
            instance_count=setup.instance_count,
            max_runtime_seconds=setup.max_runtime_seconds,
            conversations=setup.packed_documents,
        )
        # no memory check: a candidate's plan shows none (the request's own plan does), and it would re-plan every
        # stored record once per candidate
        planned = estimate.plan_of(
            trial, settings, measurements=measurements, image_tag=image_tag, check_memory=False
        )
        (fitting if planned.memory.fits else not_fitting).append(Candidate(overrides, planned))
    fitting.sort(key=lambda c: (-c.tokens_per_sec, c.plan.memory.peak_gib))
    not_fitting.sort(key=lambda c: c.plan.memory.peak_gib / c.plan.memory.limit_gib)
    edge = Candidate(not_fitting[0].overrides, not_fitting[0].plan, probe=True) if not_fitting else None
    return Candidates(fitting, edge, len(combinations), not_fitting, refused)


def _describe(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={settings_parse.format_setting(v)}" for k, v in overrides.items())


# ----------------------------------------------------------------------------------------------------------------
# Cost, and the tuning job's hyperparameters
# ----------------------------------------------------------------------------------------------------------------


def trial_seconds(candidate: Candidate, settings: TuneSettings) -> float:
    """Expected seconds of one trial: its start-up, warm-up and timed steps at the predicted step time (the cap:
    a trial that settles early ends sooner) and its one checkpoint save (fp32 parameters and AdamW's two moments,
    12 bytes per parameter, spread over the ranks)."""
    s = candidate.plan.setup
    steps = settings.warmup_steps + settings.max_measured_steps
    save = 12.0 * s.shape.parameter_count() / s.world_size / 1e9 / SAVE_GB_PER_SECOND_PER_GPU
    return TRIAL_START_SECONDS + steps * candidate.step_seconds() + save


def convergence_seconds(candidate: Candidate, convergence: Convergence) -> float:
    """Expected seconds of the convergence runs on ``candidate`` (the reference and each precision)."""
    runs = 1 + len(convergence.precisions)
    return runs * (TRIAL_START_SECONDS + convergence.steps * candidate.step_seconds())


def convergence_timeout(candidate: Candidate, settings: TuneSettings) -> int:
    """Hard limit of one convergence run: three times its expected time, at least a trial's timeout."""
    assert settings.convergence is not None
    one = TRIAL_START_SECONDS + settings.convergence.steps * candidate.step_seconds()
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
) -> str:
    """Why a search space leaves nothing to run, naming the field, and what would help (:func:`no_fit_advice`)."""
    parts = [f"no candidate of the {found.considered} combinations is predicted to fit"]
    if found.not_fitting:
        nearest = found.not_fitting[0]
        parts.append(
            f"{len(found.not_fitting)} exceed the memory limit (nearest: {nearest.describe()} at "
            f"{nearest.plan.memory.peak_gib:.1f} GiB of {nearest.plan.memory.limit_gib:.1f} GiB allowed)"
        )
    if found.refused:
        parts.append(f"{len(found.refused)} are refused by the trainer's rules (first: {found.refused[0]})")
    undivided = [r for r in found.refused if DOES_NOT_DIVIDE in r]
    if found.refused and len(undivided) == len(found.refused) == found.considered:
        advice = (
            "raise the request's batch_size (or grad_accum_steps) to the global batch the micro-batches should "
            "split, or list micro-batches that divide it"
        )
    else:
        advice = no_fit_advice(
            found, space, values, max_instance_count=max_instance_count, instance_types=instance_types
        )
    return "tune.search_space: " + "; ".join(parts) + "; " + advice


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
) -> TunePlan:
    """The tuning run of the request whose parsed settings are ``values`` on ``setup`` under ``settings``;
    ``problems`` lists what refuses it (no candidate fits, a cost bound below one trial, a trial list too long).
    ``max_instance_count`` and ``instance_types``: what the workflow allows, for the advice when nothing fits
    (default: the request's own count and type); ``data_check``: :func:`candidates`'."""
    found = candidates(values, setup, settings.search_space, measurements=measurements, image_tag=image_tag,
                       data_check=data_check)  # fmt: skip
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
                found, settings.search_space, values, max_instance_count=most, instance_types=instance_types
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
