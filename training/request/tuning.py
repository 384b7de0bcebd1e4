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
from dataclasses import dataclass, field
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
    objective: str | None = None,
    finish: Callable[[estimate.Plan, Mapping[str, Any]], estimate.Plan] | None = None,
) -> Candidates:
    """Every combination of ``space`` over the request whose parsed settings are ``values`` and whose setup (instance
    type and count, time limit, packed documents) is ``setup``, planned and ranked. Each candidate is the
    request's settings with its own (``settings_parse.override_settings``: the trainer's cross-setting rules checked
    again); nothing is parsed from the request again. ``data_check``: why a candidate's settings (on the setup's
    world size) cannot run on the request's data, or None (``fine_tuning.candidate_check``: conversation data).
    ``objective``: the run's, resolved from its data (dpo on preference pairs: a DPO step's measurement is looked
    for first); ``finish``: the request's plan made whole for a candidate's plan and settings
    (``fine_tuning.candidate_plan``: a DPO run's reference, its cost applied once), so candidates are ranked and
    costed on the step they will time."""
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
        planned = estimate.plan_of(trial, settings, measurements=measurements, image_tag=image_tag,
                                   check_memory=False, objective=objective)  # fmt: skip
        if finish is not None:
            planned = finish(planned, settings)
        (fitting if planned.memory.fits else not_fitting).append(Candidate(overrides, planned))
    fitting.sort(key=lambda c: (-c.tokens_per_sec, c.plan.memory.peak_gib))
    not_fitting.sort(key=lambda c: c.plan.memory.peak_gib / c.plan.memory.limit_gib)
    edge = Candidate(not_fitting[0].overrides, not_fitting[0].plan, probe=True) if not_fitting else None
    return Candidates(fitting, edge, len(combinations), not_fitting, refused)


def _describe(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={settings_parse.format_setting(v)}" for k, v in overrides.items())
