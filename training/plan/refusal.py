"""The refusal text: one line refusing a plan that does not fit (the estimate by part, the limit, the
changes that fit).
"""

from __future__ import annotations

from training.plan.estimate import Plan
from training.plan.memory_terms import HEADROOM


def refusal(plan: Plan) -> str | None:
    """One line refusing ``plan`` when it does not fit (estimate by part, the limit, the changes that fit)."""
    m = plan.memory
    if m.fits:
        return None
    ranked = sorted(m.parts.items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{k} {v:.1f}" for k, v in ranked[:5])
    if len(ranked) > 5:
        parts += f", other {sum(v for _, v in ranked[5:]):.1f}"
    fixes = (
        "; ".join(plan.advice)
        if plan.advice
        else "no change of activation checkpointing, batch size or instance count fits"
    )
    return (
        f"memory: estimated peak {m.peak_gib:.1f} GiB per GPU ({parts}, allowance {m.allowance_gib:.1f}; at "
        f"{m.moment}) exceeds {m.limit_gib:.1f} GiB ({HEADROOM:.0%} of {plan.setup.instance_type}'s "
        f"{m.gpu_gib:.1f} GiB); fits with: {fixes}; or set ignore_memory_estimate true to launch anyway"
    )
