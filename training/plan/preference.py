"""Preference tuning's part of the plan (``objective`` dpo, ``training/trainer/preference``): what a DPO step
computes beyond a next-token step over the same windows, where the reference comes from and what it costs in
time and memory, and the run's time and cost with it.

A DPO step trains the policy over both answers of every pair (the windows hold whole pairs, chosen and rejected
sequences, so the step's tokens are those windows', as a next-token step's): forward and backward as a next-token
step of the same windows. The reference adds:

* ``precomputed`` (full fine-tuning's default): one forward of the initial model over every window of the training
  and validation splits before step 1 (no gradient), stored with the run (4 bytes per answer) and read again by a
  resumed run; the steps themselves compute nothing more. Its time is that forward's FLOPs at the step's
  throughput (the same windows and model: the forward's share, ``forward_flops_per_token`` /
  ``timing.work_flops_per_token``, of a step's time per window).
* ``adapter_off`` (LoRA's default): every micro-batch runs the same model once more, without gradients and with
  its adapters switched off, before the policy's forward: the base model's forward FLOPs per token on top of the
  step's (about 1.5x a LoRA step, whose frozen weights have no weight-gradient GEMM: ``4N`` + adapters).

Memory: no second copy of the model is held (the figure a kept reference would take, the model's weights in the
compute precision sharded as the trained ones, is shown as avoided). The reference's forward saves nothing for a
backward and its per-token log-probabilities are one fp32 value per token, so the step's peak is the next-token
step's over the same windows (``memory.estimate_memory``). A resumed run whose checkpoint folder lost its stored
log-probabilities builds the initial model once more for the pass (its sharded parameters, before the first step's
gradients exist).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from training.contract import hardware, shapes, tuning
from training.plan.memory import Setup
from training.plan.memory_terms import GIB
from training.plan.timing import Timing, work_flops_per_token

REFERENCE_BYTES_PER_ANSWER = 4
"""A stored reference log-probability: one float32 per answer (``training/trainer/preference/reference.py``)."""


def reference_of(values: Mapping[str, Any]) -> str:
    """``dpo_reference`` resolved as the trainer resolves it (``tuning.dpo_reference``)."""
    return tuning.dpo_reference(values)


def forward_flops_per_token(s: Setup) -> float:
    """The base model's forward FLOPs per token (a third of full fine-tuning's ``6N`` + attention): the reference's
    forward, with the adapters switched off or by the initial model."""
    return shapes.flops_per_token(s.shape, s.seq_length) / 3.0


@dataclass(frozen=True)
class PreferencePlan:
    """The DPO part of a plan (see the module doc)."""

    reference: str
    step_factor: float
    """A DPO step's time over a next-token step's of the same windows (1 for ``precomputed``)."""
    reference_pass_seconds: float | None
    """``precomputed``: the forward over every window before step 1 (None where the data's windows are unknown)."""
    reference_windows: int | None
    stored_bytes: int | None
    """``precomputed``: the stored log-probabilities (on disk with the checkpoints, and each rank's host memory)."""
    kept_copy_gib: float
    """Per GPU, what a second model kept as the reference would take (its weights in the compute precision,
    sharded as the trained ones): held by neither reference."""
    loss: str
    beta: float
    step_measured: bool = False
    """Whether the step time the plan started from was measured on a DPO step (a tuning run's record of objective
    dpo, ``measured.dpo_step``): it holds the reference's forward already, so ``step_factor`` is not applied again."""

    def to_dict(self) -> dict[str, Any]:
        note = (
            f"reference {self.reference}: "
            + (
                "the same model with its LoRA adapters switched off, one forward without gradients per "
                f"micro-batch (x{self.step_factor:.2f} a step's time"
                + ("; in the measured DPO step's time already" if self.step_measured else "")
                + "); nothing stored"
                if self.reference == "adapter_off"
                else "one forward of the initial model over "
                + (f"{self.reference_windows} windows" if self.reference_windows is not None else "the data")
                + " before step 1"
                + (
                    f" (about {self.reference_pass_seconds:.3g} s)"
                    if self.reference_pass_seconds is not None
                    else ""
                )
                + ", stored with the checkpoints and read again by a resumed run"
            )
            + f"; no second model held (a kept copy would take {self.kept_copy_gib:.3g} GiB per GPU)"
        )
        return {
            "objective": "dpo",
            "dpo_loss": self.loss,
            "dpo_beta": self.beta,
            "reference": self.reference,
            "step_factor": round(self.step_factor, 3),
            "step_measured": self.step_measured,
            "reference_pass_seconds": None
            if self.reference_pass_seconds is None
            else float(f"{self.reference_pass_seconds:.4g}"),
            "reference_windows": self.reference_windows,
            "stored_reference_bytes": self.stored_bytes,
            "kept_copy_avoided_gib": float(f"{self.kept_copy_gib:.4g}"),
            "summary": note,
        }


def preference_plan(
    s: Setup,
    values: Mapping[str, Any],
    timing: Timing,
    *,
    windows: int | None = None,
    answers: int | None = None,
    step_measured: bool = False,
) -> PreferencePlan:
    """The DPO part for the setup ``s`` of the parsed settings ``values`` at the step's ``timing`` (a next-token
    step's, or with ``step_measured`` a measured DPO step's); ``windows``: the training and validation windows the
    reference pass scores, ``answers``: their answers (two per pair), when the data is known."""
    reference = reference_of(values)
    share = forward_flops_per_token(s) / work_flops_per_token(s)
    factor = 1.0 + share if reference == "adapter_off" else 1.0
    pass_seconds = None
    if reference == "precomputed" and windows is not None:
        per_window = timing.step_seconds / (s.batch_size * s.grad_accum_steps * s.world_size)
        pass_seconds = windows * per_window * share
    params = s.shape.parameter_count()
    return PreferencePlan(
        reference=reference,
        step_factor=factor,
        reference_pass_seconds=pass_seconds,
        reference_windows=windows if reference == "precomputed" else None,
        stored_bytes=None
        if reference != "precomputed" or answers is None
        else answers * REFERENCE_BYTES_PER_ANSWER,
        kept_copy_gib=params * s.compute_bytes / s.shard_size / GIB,
        loss=str(values.get("dpo_loss") or "sigmoid"),
        beta=float(values.get("dpo_beta") or 0.1),
        step_measured=step_measured,
    )


def dpo_timing(s: Setup, timing: Timing, part: PreferencePlan) -> Timing:
    """``timing`` (a next-token step's) for the DPO run: each step ``part.step_factor`` as long (the throughput in
    trained windows' tokens that much lower; not when ``timing`` is a measured DPO step's, ``part.step_measured``,
    which holds it already), the reference pass added to the run once, the cost and the time-limit warning of that
    run."""
    factor = 1.0 if part.step_measured else part.step_factor
    extra = part.reference_pass_seconds or 0.0
    step = timing.step_seconds * factor
    run = step * s.max_steps + extra
    cost = hardware.estimate_cost_usd(s.instance_type, s.instance_count, run)
    warning = timing.warning
    if s.max_runtime_seconds is not None and run > s.max_runtime_seconds:
        reached = max(int((s.max_runtime_seconds - extra) // step), 0)
        warning = (
            f"max_runtime_seconds {s.max_runtime_seconds}: the DPO run needs about {run:.0f} s for max_steps "
            f"{s.max_steps} (the reference pass included); it will stop near step {reached} (raise "
            "max_runtime_seconds, or lower max_steps)"
        )
    spread = timing.spread
    if spread is not None:
        runs = tuple(v * factor + extra for v in spread.run_seconds)
        spread = replace(
            spread,
            tokens_per_sec_per_gpu=tuple(v / factor for v in spread.tokens_per_sec_per_gpu),  # type: ignore[arg-type]
            step_seconds=tuple(v * factor for v in spread.step_seconds),  # type: ignore[arg-type]
            run_seconds=runs,  # type: ignore[arg-type]
            cost_usd=None
            if spread.cost_usd is None
            else tuple(hardware.estimate_cost_usd(s.instance_type, s.instance_count, r) for r in runs),  # type: ignore[arg-type]
            mfu_bf16=tuple(v / factor for v in spread.mfu_bf16),  # type: ignore[arg-type]
        )
    return replace(
        timing,
        tokens_per_sec_per_gpu=timing.tokens_per_sec_per_gpu / factor,
        mfu_bf16=timing.mfu_bf16 / factor,
        step_seconds=step,
        run_seconds=run,
        cost_usd=cost,
        warning=warning,
        spread=spread,
    )
