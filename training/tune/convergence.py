"""Convergence across precisions: the winner's configuration trained in a reference precision (bf16) and in each
low precision asked for, from the same initial weights and data (the same seed), and each loss curve checked
against the reference's.

The checks and thresholds are Megatron-Bridge's published defaults for its loss-curve comparison
(``scripts/performance/README.md``: ``--skip_first_percent_loss`` 0.20, ``--correlation_threshold`` 0.95,
``--high/medium/low_loss_tolerance`` 0.10 / 0.05 / 0.02 for losses above 2.0 / from 0.5 to 2.0 / below 0.5,
``--max_outlier_ratio`` 0.1): the first 20% of the points are skipped, the rest must correlate with the
reference's at least 0.95, the final loss (mean of the last 10% of the points) must be within the tolerance of
the reference's magnitude, and at most 10% of the points may lie outside it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from training.contract import hardware, settings_parse, settings_table

SKIP_FRACTION = 0.20
MIN_CORRELATION = 0.95
MAX_OUTLIER_SHARE = 0.10
FINAL_FRACTION = 0.10


def tolerance(loss: float) -> float:
    """Relative tolerance for a loss of this size."""
    if loss > 2.0:
        return 0.10
    if loss >= 0.5:
        return 0.05
    return 0.02


@dataclass(frozen=True)
class Comparison:
    """One precision against the reference."""

    precision: str
    reference: str
    points: int
    correlation: float | None
    final_loss: float
    reference_final_loss: float
    final_difference: float
    tolerance: float
    outlier_share: float
    passed: bool
    why: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def compare(
    precision: str,
    curve: Sequence[tuple[int, float]],
    reference: str,
    reference_curve: Sequence[tuple[int, float]],
) -> Comparison:
    """``curve`` (step, loss) against ``reference_curve`` on their common steps after the skipped first 20%."""
    ref = dict(reference_curve)
    common = [(step, loss, ref[step]) for step, loss in curve if step in ref]
    start = math.ceil(SKIP_FRACTION * len(common))
    kept = common[start:]
    if len(kept) < 3:
        return Comparison(precision, reference, len(kept), None, math.nan, math.nan, math.nan, math.nan, 1.0, False,
                          f"only {len(kept)} common steps after skipping the first {SKIP_FRACTION:.0%}")  # fmt: skip
    ours, theirs = [loss for _, loss, _ in kept], [r for _, _, r in kept]
    tail = max(1, math.ceil(FINAL_FRACTION * len(kept)))
    final, ref_final = statistics.fmean(ours[-tail:]), statistics.fmean(theirs[-tail:])
    allowed = tolerance(ref_final)
    difference = abs(final - ref_final) / abs(ref_final)
    outliers = sum(abs(a - b) > tolerance(b) * abs(b) for a, b in zip(ours, theirs, strict=True)) / len(kept)
    correlation = _pearson(ours, theirs)
    failures = []
    if correlation is not None and correlation < MIN_CORRELATION:
        failures.append(f"correlation {correlation:.3f} < {MIN_CORRELATION}")
    if difference > allowed:
        failures.append(f"final loss differs by {difference:.2%} > {allowed:.0%}")
    if outliers > MAX_OUTLIER_SHARE:
        failures.append(f"{outliers:.0%} of points outside the tolerance > {MAX_OUTLIER_SHARE:.0%}")
    why = "; ".join(failures) or (
        f"final loss within {difference:.2%} (tolerance {allowed:.0%}), "
        + ("correlation n/a (flat curve)" if correlation is None else f"correlation {correlation:.3f}")
    )
    return Comparison(precision, reference, len(kept), correlation, final, ref_final, difference, allowed,
                      outliers, not failures, why)  # fmt: skip


def run_settings(
    base: Mapping[str, str], settings: Mapping[str, Any], precision: str
) -> tuple[dict[str, Any], list[str]]:
    """The winner's ``settings`` in ``precision`` for one convergence run, with every setting that only the other
    kind of precision runs set to what this one can (the trainer's rules, ``settings_checks.check_levers``):
    ``quantized_model_init`` off outside fp8/mxfp8; on the Transformer Engine path (fp8, mxfp8, nvfp4) ``compile``
    true -> auto, selective activation checkpointing -> full, ``attention_backend`` -> auto. Returns the settings
    and one note per change (the report shows them: the runs differ in that too)."""
    merged = {**base, **{k: settings_parse.format_setting(v) for k, v in settings.items()}}

    def value(name: str) -> Any:
        spec = settings_table.HYPERPARAMETERS_BY_NAME[name]
        return spec.parse(merged[name]) if name in merged else spec.default

    out, notes = {**settings, "precision": precision}, []
    changes = []
    if precision not in hardware.QUANTIZED_INIT_PRECISIONS and value("quantized_model_init"):
        changes.append(("quantized_model_init", False))
    if precision in hardware.TE_PRECISIONS:
        if value("compile") == "true":
            changes.append(("compile", "auto"))
        if value("activation_checkpointing") == "selective":
            changes.append(("activation_checkpointing", "full"))
        if value("attention_backend") != "auto":
            changes.append(("attention_backend", "auto"))
    for name, new in changes:
        out[name] = new
        notes.append(
            f"convergence run {precision}: {name}={settings_parse.format_setting(value(name))} cannot run in "
            f"{precision}; it ran with {name}={settings_parse.format_setting(new)}"
        )
    return out, notes
