"""Advice for a request that does not fit: the smallest single changes (activation checkpointing, a smaller
batch, more instances, another instance type) under which the memory estimate fits, each with its estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from training.contract import hardware
from training.plan.memory import Setup, estimate_memory
from training.plan.memory_terms import Memory


def advice(s: Setup, *, max_instance_count: int = 64, instance_types: Sequence[str] = ()) -> list[str]:
    """The smallest single changes (or AC plus a batch size) under which ``s`` fits, each with its estimate."""
    out: list[str] = []

    def fits(candidate: Setup) -> Memory | None:
        memory = estimate_memory(candidate)
        return memory if memory.fits else None

    ac_alone = not s.ac_on and fits(replace(s, activation_checkpointing="full"))
    if ac_alone:
        out.append(f"activation_checkpointing true ({ac_alone.peak_gib:.1f} GiB)")
    for ac in dict.fromkeys((s.activation_checkpointing, "full")):
        batch = next(
            (
                b
                for b in range(s.batch_size - 1, 0, -1)
                if fits(replace(s, batch_size=b, activation_checkpointing=ac))
            ),
            None,
        )
        if batch is not None:
            m = estimate_memory(replace(s, batch_size=batch, activation_checkpointing=ac))
            with_ac = " with activation_checkpointing true" if ac == "full" and not s.ac_on else ""
            out.append(f"batch_size {batch}{with_ac} ({m.peak_gib:.1f} GiB)")
            break
    for ac in dict.fromkeys((s.activation_checkpointing, "full")):
        if ac == "full" and ac_alone:
            break  # more instances on top of a change that already fits is not a smallest change
        more = replace(s, activation_checkpointing=ac)
        count = next(
            (
                k
                for k in range(s.instance_count + 1, max_instance_count + 1)
                if fits(replace(more, instance_count=k))
            ),
            None,
        )
        if count is not None:
            m = estimate_memory(replace(more, instance_count=count))
            with_ac = " with activation_checkpointing true" if ac == "full" and not s.ac_on else ""
            out.append(f"instance_count {count}{with_ac} ({m.peak_gib:.1f} GiB)")
            break
    bigger = [
        t
        for t in instance_types
        if t != s.instance_type
        and hardware.GPU_INSTANCE_TYPES[t].supports(s.precision)
        and fits(replace(s, instance_type=t))
    ]
    if bigger:
        out.append("instance_type " + " or ".join(bigger))
    return out
