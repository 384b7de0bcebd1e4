"""The dry run: what each phase is expected to take on a GPU, from the plan (its step times) and the assumed
start-ups (``modes.StartUp``), against the phase's share; refused when the whole is over the budget or a phase
cannot hold even its first step. Pure Python (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from training.measure.gpu_report import sweep
from training.measure.gpu_report.modes import Gpu, Mode
from training.plan import estimate as plan_estimate

SETUP_SECONDS = 5.0
"""Assumed: nvidia-smi, installing the carried wheels (about 2 MB, no network), the plan."""
REPORT_SECONDS = 5.0
"""Assumed: the text files and three charts."""
KERNEL_CHECK_SECONDS = 10.0
"""Assumed, on top of a worker's start: the loss at a 128K vocabulary and SDPA at 4K tokens, each backend."""


@dataclass
class PhaseEstimate:
    name: str
    share: float
    expected: float
    chosen: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.expected <= self.share


def base(mode: Mode, gpu: Gpu) -> sweep.Candidate | None:
    order = sweep.ordered(mode, gpu)
    return order[0] if order else None


def phases(mode: Mode, gpu: Gpu, budget: float) -> list[PhaseEstimate]:
    """Each phase's expected seconds and content on ``gpu``."""
    shares = {s.name: s.seconds for s in mode.phase_shares(budget)}
    start = mode.start_up
    calibration = sweep.Calibration(start)
    steps = mode.warmup_steps + mode.measured_steps
    chosen, left = sweep.fill(
        sweep.ordered(mode, gpu), shares["sweep"], lambda c: calibration.seconds(c, steps)
    )
    out = [
        PhaseEstimate("setup", shares["setup"], SETUP_SECONDS, ["GPU found, carried wheels installed, plan"])
    ]
    out.append(PhaseEstimate("sweep", shares["sweep"], sum(need for _, need in chosen),
                             sweep.describe_all(chosen), sweep.describe_all(left)))  # fmt: skip
    first = base(mode, gpu)
    step = first.step_seconds if first else 0.0
    skip, active = mode.profile_steps
    compile_again = start.compile / 3 if first is not None and first.compiled else 0.0
    profile = start.worker + compile_again + (skip + active + 2) * step
    out.append(PhaseEstimate("profile", shares["profile"], profile,
                             [f"{first.describe() if first else '-'}: {skip + active + 2} steps, {active} recorded"]))  # fmt: skip
    out.append(titan(mode, shares["torchtitan"], step, first))
    out.append(numerics(mode, shares["numerics"]))
    out.append(
        PhaseEstimate(
            "report", shares["report"], REPORT_SECONDS, ["report.md, rows.csv, records.json, 3 charts"]
        )
    )
    return out


def titan(mode: Mode, share: float, step: float, first: sweep.Candidate | None) -> PhaseEstimate:
    warmup, measured = mode.titan_steps
    estimate = PhaseEstimate("torchtitan", share, 0.0)
    for compiled in (True, False):
        if compiled and "true" not in mode.compile_values:
            continue
        need = mode.start_up.titan + (mode.start_up.compile if compiled else 0.0) + (warmup + measured) * step
        what = f"compile {'on' if compiled else 'off'}, {warmup + measured} steps: ~{need:.0f} s"
        if estimate.expected + need <= share:
            estimate.expected += need
            estimate.chosen.append(what)
        else:
            estimate.left_out.append(what)
    if first is None:
        estimate.left_out.append("no base candidate fits")
    return estimate


def numerics(mode: Mode, share: float) -> PhaseEstimate:
    """The kernel checks, then the fp32 and bf16 convergence runs of the numerics model at the plan's step times."""
    estimate = PhaseEstimate("numerics", share, mode.start_up.worker + KERNEL_CHECK_SECONDS,
                             ["kernel checks: chunked loss, every SDPA backend"])  # fmt: skip
    for precision in ("fp32", "bf16"):
        made = plan_estimate.make_plan(sweep.request(mode, {"precision": precision}, mode.numerics_model))
        need = mode.start_up.trial + mode.numerics_steps * made.timing.step_seconds
        estimate.expected += need
        estimate.chosen.append(f"convergence {precision}: {mode.numerics_steps} steps at {made.timing.step_seconds:.3f} s"
                               f" (plan): ~{need:.0f} s")  # fmt: skip
    return estimate


def render(mode: Mode, gpu: Gpu, budget: float) -> tuple[str, bool]:
    """The dry run's text for ``gpu`` and whether it fits."""
    rows = phases(mode, gpu, budget)
    total = sum(r.expected for r in rows)
    lines = [f"{gpu.name} ({gpu.memory_gb:g} GB), mode {mode.name}, budget {budget:.0f} s from the process's start",
             f"{'phase':<11} {'share s':>8} {'expected s':>11}  what",]  # fmt: skip
    for row in rows:
        lines.append(
            f"{row.name:<11} {row.share:>8.0f} {row.expected:>11.0f}  "
            + (row.chosen[0] if row.chosen else "-")
        )
        lines += [f"{'':<33}{item}" for item in row.chosen[1:]]
        lines += [f"{'':<33}if time allows: {item}" for item in row.left_out[:3]]
        if len(row.left_out) > 3:
            lines.append(f"{'':<33}... and {len(row.left_out) - 3} more if time allows")
    reserve = budget - sum(r.share for r in rows)
    lines.append(f"{'reserve':<11} {reserve:>8.0f} {'-':>11}  slack for kills at a phase's end")
    lines.append(
        f"{'total':<11} {budget:>8.0f} {total:>11.0f}  expected {total / 60:.1f} min of {budget / 60:.1f}"
    )
    fits = total <= budget and all(r.fits for r in rows)
    return "\n".join(lines), fits
