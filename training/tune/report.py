"""The tuning report: one row per trial (predicted next to measured, the plan's error, status, MFU, cost), ranked;
the winner; the measurement records; and the table as Markdown, CSV, JSON and plain text.

Ranking: trials that ran ``ok`` by measured tokens/s per GPU (the median step time's, warm-up excluded), then
``near-oom`` ones (they ran, but too close to the edge to choose), then the rest in trial order. The winner is the
first ``ok`` row. Costs are projected only when the trials ran on the GPU of the instance type they are for (a
CPU run's dollars would be meaningless); the full run is the base request's tokens (``max_steps`` x its tokens
per optimizer step) at the measured throughput.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from training.contract import hardware, metric_lines, settings_parse, settings_table, shapes, tuning
from training.plan import estimate, inputs, measured
from training.tune.outcome import TrialResult

GB_PER_GIB = 2**30 / 1e9


@dataclass(frozen=True)
class Where:
    """Where the trials ran and for what: the instance type they are for, the hardware they ran on (from the
    trainer's config line), the image and its versions, the job."""

    instance_type: str
    instance_count: int
    device: str
    gpu: str | None
    world_size: int | None
    image_tag: str
    torch_version: str | None
    te_version: str | None
    job: str | None
    measured_at: str
    host: str

    @property
    def on_target(self) -> bool:
        """Whether the trials ran on the GPUs of the instance type they are for (costs are projected only then)."""
        target = hardware.GPU_INSTANCE_TYPES.get(self.instance_type)
        return self.device == "cuda" and target is not None and self.gpu == target.gpu


@dataclass
class Row:
    """One trial in the table."""

    rank: int
    trial: int
    configuration: str
    settings: dict[str, Any]
    status: str
    probe: bool
    error: str | None
    basis: str
    predicted_tokens_per_sec: float | None
    measured_tokens_per_sec: float | None
    step_seconds: dict[str, float | None] | None
    predicted_tensors_gb: float | None
    predicted_peak_gb: float | None
    measured_allocated_gb: float | None
    measured_reserved_gb: float | None
    memory_error_pct: float | None
    mfu: float | None
    usd_per_billion_tokens: float | None
    full_run_seconds: float | None
    full_run_usd: float | None
    alloc_retries: float | None = None
    stopped_early: bool = False
    seconds: float | None = None
    first_step_seconds: float | None = None
    log: str | None = None
    notes: list[str] = field(default_factory=list)
    tokens_per_step: int | None = None
    predicted_spread: tuple[float, float] | None = None
    """The plan's low-high tokens/s per GPU when its figure is an estimate (``timing.Spread``)."""
    """Tokens of one optimizer step per GPU: batch_size x grad_accum_steps x seq_length of the trial's settings."""
    stable: bool | None = None
    """Whether the trial's step time met the stability target (its last window's CV under ``tune_cv_target``, which
    ends a trial early); False: it ran to its cap without, so its speed, and its rank, are less certain; None: it
    did not run, or there was no target."""

    def tokens_per_sec_range(self) -> tuple[float, float] | None:
        """Tokens/s per GPU at the p90 and the p10 step time (the slow and the fast end of the timed steps)."""
        s = self.step_seconds or {}
        slow, fast = s.get("p90"), s.get("p10")
        if not self.tokens_per_step or not slow or not fast:
            return None
        return self.tokens_per_step / slow, self.tokens_per_step / fast


def trial_request(base: Mapping[str, Any], overrides: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """The execution input a trial stands for (to plan it): the instance and every trainer setting."""
    return {
        "instance_type": where.instance_type,
        "instance_count": where.instance_count,
        "hyperparameters": {**base, **overrides},
    }


def tokens_per_step(values: Mapping[str, Any]) -> int:
    """Tokens of one optimizer step on one GPU (every micro-batch of it)."""
    return (
        int(values["batch_size"])
        * int(values["seq_length"])
        * int(values.get(tuning.GRAD_ACCUM_SETTING) or 1)
    )


def make_row(
    result: TrialResult,
    base: Mapping[str, Any],
    where: Where,
    architecture: Mapping[str, Any] | None = None,
    cv_target: float = 0.0,
) -> Row:
    """A trial's row: its plan (the article's figures or an estimate from them, as the request check saw it) next
    to what it measured.
    ``architecture``: the ``init_from`` model's settings, when the base has one (they give the shape);
    ``cv_target``: the stability target the trial ran under (0: none)."""
    request = trial_request(base, result.settings, where)
    try:  # a trial the trainer refused (its status says why) has no plan and no figures
        values: Mapping[str, Any] | None = settings_parse.parse_hyperparameters(
            inputs.trainer_settings(request), architecture
        )
        planned: estimate.Plan | None = estimate.make_plan(request, architecture=architecture)
    except (settings_table.ContractError, KeyError):
        values, planned = None, None
    row = Row(
        rank=0, trial=result.index, configuration=describe(result.settings), settings=dict(result.settings),
        status=result.status, probe=result.probe, error=result.error,
        basis=planned.timing.basis if planned else "estimate",
        predicted_tokens_per_sec=planned.timing.tokens_per_sec_per_gpu if planned else None,
        predicted_spread=planned.timing.spread.tokens_per_sec_per_gpu if planned and planned.timing.spread else None,
        measured_tokens_per_sec=None, step_seconds=result.spread.as_dict() if result.spread else None,
        predicted_tensors_gb=planned.memory.tensors_gib * GB_PER_GIB if planned else None,
        predicted_peak_gb=planned.memory.peak_gib * GB_PER_GIB if planned else None,
        measured_allocated_gb=result.summary.get("max_allocated_gb"),
        measured_reserved_gb=result.summary.get("max_reserved_gb"),
        memory_error_pct=None, mfu=None, usd_per_billion_tokens=None, full_run_seconds=None, full_run_usd=None,
        alloc_retries=result.summary.get("alloc_retries"), stopped_early=result.stopped_early,
        seconds=result.seconds, first_step_seconds=result.first_step_seconds, log=result.log,
        tokens_per_step=None if values is None else tokens_per_step(values),
        stable=result.stopped_early if result.ran and cv_target > 0 else None,
    )  # fmt: skip
    base_tokens = tokens_per_step(settings_parse.parse_hyperparameters(dict(base), architecture))
    if row.tokens_per_step not in (None, base_tokens):
        row.notes.append(
            f"{row.tokens_per_step} tokens per optimizer step per GPU, not the base request's {base_tokens}"
        )
    if (
        row.measured_allocated_gb and row.predicted_tensors_gb and where.device == "cuda"
    ):  # RSS is not tensors
        row.memory_error_pct = (
            100.0 * (row.predicted_tensors_gb - row.measured_allocated_gb) / row.measured_allocated_gb
        )
    if result.ran and result.spread is not None and values is not None:
        _throughput(
            row, values, settings_parse.parse_hyperparameters(dict(base), architecture), result, where
        )
    return row


def _throughput(
    row: Row, values: Mapping[str, Any], base_values: Mapping[str, Any], result: TrialResult, where: Where
) -> None:
    """Measured tokens/s per GPU from the median step time; MFU against the GPU's dense bf16 peak whatever the
    trial's precision (the bf16-equivalent MFU: one denominator for every row, as the plan's ``mfu_bf16`` and the
    trainer's ``mfu_bf16``, so rows of different precisions compare); the cost per billion tokens and the base
    request's full run at that speed (on the target hardware only)."""
    assert result.spread is not None
    tps = tokens_per_step(values) / result.spread.median
    row.measured_tokens_per_sec = tps
    shape = settings_parse.model_shape(values)
    peak = hardware.PEAK_TFLOPS.get(where.gpu or "", {}).get("bf16")
    if peak and where.device == "cuda":
        flops = shapes.flops_per_token(shape, values["seq_length"], settings_parse.lora_parameters(values))
        row.mfu = tps * flops / (peak * 1e12)
    gpus = (result.config and int(result.config.get("world_size", 0))) or where.world_size or 1
    run_tokens = tokens_per_step(base_values) * int(base_values["max_steps"]) * gpus
    row.full_run_seconds = run_tokens / (tps * gpus)
    price = hardware.ON_DEMAND_USD_PER_HOUR.get(where.instance_type)
    if where.on_target and price is not None:
        per_second = price * where.instance_count / 3600.0
        row.usd_per_billion_tokens = per_second * 1e9 / (tps * gpus)
        row.full_run_usd = per_second * row.full_run_seconds


def tokens_per_step_notes(
    rows: Sequence[Row], base: Mapping[str, Any], architecture: Mapping[str, Any] | None = None
) -> list[str]:
    """What the report says of the tokens per optimizer step, checked on every row (batch_size x
    grad_accum_steps x seq_length): that every trial kept the base request's, or which did not (their throughput
    still compares; their loss per step and their projected full run are of another batch)."""
    values = {k: v for k, v in base.items() if k in settings_table.HYPERPARAMETERS_BY_NAME}
    wanted = tokens_per_step(settings_parse.parse_hyperparameters(values, architecture))
    other = [row for row in rows if row.tokens_per_step is not None and row.tokens_per_step != wanted]
    if not other:
        return [
            f"every trial trains the base request's {wanted:,} tokens per optimizer step per GPU (batch_size x "
            "grad_accum_steps x seq_length: its grad_accum_steps makes up for its micro-batch)"
        ]
    listed = ", ".join(
        f"trial {row.trial} {row.tokens_per_step:,}" for row in sorted(other, key=lambda r: r.trial)
    )
    return [
        f"WARNING: {len(other)} of {len(rows)} trials train other tokens per optimizer step per GPU than the base "
        f"request's {wanted:,} ({listed}): their throughput compares, their loss per step does not"
    ]


def describe(settings: Mapping[str, Any]) -> str:
    return " ".join(
        f"{k}={settings_parse.format_setting(v)}" for k, v in tuning.trial_overrides(settings).items()
    )


def rank(rows: list[Row]) -> list[Row]:
    """Rows best first (see the module doc), ``rank`` set from 1."""
    order = {"ok": 0, "near-oom": 1}

    def key(row: Row) -> tuple[int, float, int]:
        group = order.get(row.status, 2)
        speed = -(row.measured_tokens_per_sec or 0.0) if group < 2 else 0.0
        return group, speed, row.trial

    ranked = sorted(rows, key=key)
    for number, row in enumerate(ranked, start=1):
        row.rank = number
    return ranked


def winner(rows: Sequence[Row]) -> Row | None:
    return next((row for row in rows if row.status == "ok"), None)


def records(
    rows: Sequence[Row], base: Mapping[str, Any], where: Where, architecture: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The measurement records of every trial that ran or ran out of memory (``training.plan.measured``)."""
    out = []
    for row in rows:
        if row.status not in ("ok", "near-oom", "oom"):
            continue
        values = settings_parse.parse_hyperparameters(
            inputs.trainer_settings(trial_request(base, row.settings, where)), architecture
        )
        key = measured.make_key(
            values, instance_type=where.instance_type, instance_count=where.instance_count,
            image_tag=where.image_tag, torch_version=where.torch_version, te_version=where.te_version,
        )  # fmt: skip
        figures = {
            "status": row.status,
            "tokens_per_sec_per_gpu": row.measured_tokens_per_sec,
            "step_seconds": row.step_seconds,
            "max_allocated_gb": row.measured_allocated_gb,
            "max_reserved_gb": row.measured_reserved_gb,
            "alloc_retries": row.alloc_retries,
            "mfu": row.mfu,
        }
        place = {
            "device": where.device, "gpu": where.gpu, "world_size": where.world_size, "job": where.job,
            "measured_at": where.measured_at, "host": where.host, "trial": row.trial,
        }  # fmt: skip
        out.append(measured.make_record(key, figures, place))
    return out


# ----------------------------------------------------------------------------------------------------------------
# The table in four forms
# ----------------------------------------------------------------------------------------------------------------

COLUMNS: tuple[tuple[str, str], ...] = (
    ("rank", "#"),
    ("configuration", "configuration"),
    ("status", "status"),
    ("predicted_tokens_per_sec", "predicted tok/s/GPU"),
    ("measured_tokens_per_sec", "measured tok/s/GPU [p90-p10 step]"),
    ("step", "step s (median [p10-p90], cv)"),
    ("predicted_peak_gb", "predicted peak GB"),
    ("measured_allocated_gb", "measured allocated GB"),
    ("measured_reserved_gb", "measured reserved GB"),
    ("memory_error_pct", "plan memory error"),
    ("mfu", "MFU"),
    ("usd_per_billion_tokens", "$ per B tokens"),
    ("full_run", "full run (time, $)"),
)
"""The table's columns: key and heading (``docs/tuning.md`` says what each one means)."""
GPU_COLUMNS = (
    "predicted_tokens_per_sec", "predicted_peak_gb", "measured_allocated_gb", "measured_reserved_gb",
    "memory_error_pct", "mfu", "usd_per_billion_tokens",
)  # fmt: skip
"""Columns that carry nothing when the trials ran on a CPU: the plan's figures are a GPU's, and a CPU process's
peak resident set is not a GPU's memory (the CSV and JSON keep every field)."""


def shown_columns(rows: Sequence[Row], where: Where | None = None) -> list[tuple[str, str]]:
    """:data:`COLUMNS` less what carries nothing: a column with no value in any row, and, when ``where`` says the
    trials ran on a CPU, :data:`GPU_COLUMNS`."""
    texts = [cells(row) for row in rows]
    cpu = where is not None and where.device != "cuda"
    return [
        (key, heading.replace("/GPU", "/process") if cpu else heading)
        for key, heading in COLUMNS
        if not (cpu and key in GPU_COLUMNS)
        and (
            key in ("rank", "configuration", "status")
            or any(t[key] not in ("-", "- (estimate)") for t in texts)
        )
    ]


def stability_notes(rows: Sequence[Row], cv_target: float, window: int) -> list[str]:
    """Which trials never met the stability target: their median step time, and so their rank, is less sure."""
    unstable = [row for row in rows if row.stable is False]
    if not unstable:
        return []
    listed = ", ".join(f"#{row.rank}" for row in sorted(unstable, key=lambda r: r.rank))
    return [
        f"{len(unstable)} of {len(rows)} trials never met the stability target (the CV of {window} consecutive "
        f"timed steps under {cv_target:.0%}) before their cap: {listed}; their range [p90-p10 step] says how "
        "sure their throughput is, and rows whose ranges overlap are not told apart"
    ]


def cells(row: Row) -> dict[str, str]:
    """A row's cells as text ('-' where nothing was measured or nothing can be said)."""

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    step = "-"
    if row.step_seconds:
        s = row.step_seconds
        spread = "-" if s["cv"] is None else f"{s['cv']:.1%}"
        step = f"{s['median']:.4g} [{s['p10']:.4g}-{s['p90']:.4g}], {spread} ({s['steps']:.0f} steps)"
    status = (
        row.status + (" (probe)" if row.probe else "") + (", never stable" if row.stable is False else "")
    )
    speed = num(row.measured_tokens_per_sec, ",.0f")
    if (span := row.tokens_per_sec_range()) and row.measured_tokens_per_sec is not None:
        speed += f" [{span[0]:,.0f}-{span[1]:,.0f}]"
    band = f" {row.predicted_spread[0]:,.0f}-{row.predicted_spread[1]:,.0f}" if row.predicted_spread else ""
    full = "-"
    if row.full_run_seconds is not None:
        full = metric_lines.format_duration(row.full_run_seconds)
        full += f", ${row.full_run_usd:,.0f}" if row.full_run_usd is not None else ", $ -"
    return {
        "rank": str(row.rank),
        "configuration": row.configuration,
        "status": status,
        "predicted_tokens_per_sec": num(row.predicted_tokens_per_sec, ",.0f") + f" ({row.basis}{band})",
        "measured_tokens_per_sec": speed,
        "step": step,
        "predicted_peak_gb": (
            "-"
            if row.predicted_peak_gb is None
            else f"{row.predicted_peak_gb:.2f} ({row.predicted_tensors_gb:.2f} tensors)"
        ),  # fmt: skip
        "measured_allocated_gb": num(row.measured_allocated_gb, ".2f"),
        "measured_reserved_gb": num(row.measured_reserved_gb, ".2f"),
        "memory_error_pct": "-" if row.memory_error_pct is None else f"{row.memory_error_pct:+.0f}%",
        "mfu": "-" if row.mfu is None else f"{row.mfu:.1%}",
        "usd_per_billion_tokens": num(row.usd_per_billion_tokens, ",.2f"),
        "full_run": full,
    }


def markdown(rows: Sequence[Row], heading: str, notes: Sequence[str] = (), where: Where | None = None) -> str:
    columns = shown_columns(rows, where)
    lines = [heading, "", *[f"- {note}" for note in notes], *([""] if notes else [])]
    lines += ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        text = cells(row)
        lines.append("| " + " | ".join(text[k].replace("|", "/") for k, _ in columns) + " |")
    failures = [row for row in rows if row.error]
    if failures:
        lines += ["", "Why:", ""] + [
            f"- #{row.rank} {row.configuration}: {row.status}: {row.error}" for row in failures
        ]
    return "\n".join(lines) + "\n"


def plain(rows: Sequence[Row], where: Where | None = None) -> str:
    """Fixed-width text (the driver's log and a terminal without the CLI)."""
    columns = shown_columns(rows, where)
    table = [[h for _, h in columns]] + [[cells(row)[k] for k, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    out = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    return "\n".join(out) + "\n"


CSV_FIELDS = (
    "rank", "trial", "configuration", "status", "probe", "error", "basis", "predicted_tokens_per_sec",
    "measured_tokens_per_sec", "step_median_s", "step_p10_s", "step_p90_s", "step_cv", "timed_steps", "stable",
    "predicted_peak_gb", "predicted_tensors_gb", "measured_allocated_gb", "measured_reserved_gb", "memory_error_pct",
    "alloc_retries", "mfu", "usd_per_billion_tokens", "full_run_seconds", "full_run_usd", "trial_seconds",
    "first_step_seconds",
)  # fmt: skip


def csv_text(rows: Sequence[Row]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        s = row.step_seconds or {}
        writer.writerow({
            **{k: getattr(row, k) for k in CSV_FIELDS if hasattr(row, k)},
            "step_median_s": s.get("median"), "step_p10_s": s.get("p10"), "step_p90_s": s.get("p90"),
            "step_cv": s.get("cv"), "timed_steps": s.get("steps"), "trial_seconds": row.seconds,
        })  # fmt: skip
    return buffer.getvalue()


def report_json(rows: Sequence[Row], where: Where, extra: Mapping[str, Any]) -> str:
    best = winner(rows)
    data = {
        "where": asdict(where),
        "measured_on_target": where.on_target,
        "rows": [asdict(row) for row in rows],
        "winner": None if best is None else {"trial": best.trial, "settings": best.settings},
        **extra,
    }
    return json.dumps(data, indent=2, default=str) + "\n"
