"""How two trainer runs that must train alike are compared when fp32 round-off may differ between them (another
summation order: loss chunks, micro-batches): their printed losses and gradient norms, and their final weights
within bounds tied to the learning rate.

Why these numbers. Measured on CPU in 2026-11 (tiny model of ``runner.TINY``: 115,008 weights; 12 AdamW steps,
peak learning rate 0.003): 48-token loss chunks and 2 accumulated micro-batches of 2 against the one-batch
reference, seeds 1234 (the default), 1, 2, 3, 7 and 11, after 1, 3 and 12 steps (36 comparisons).

- Step 1 starts from the same weights: its loss and gradient norm differ only by the summation order, ~1e-7
  relative, so as printed (6 significant digits) they agree to the digit, or one unit apart where the true values
  straddle a rounding boundary (``last_digit``).
- Every later step starts from weights that differ a little (below), and the differences compound: the worst
  printed loss was one unit of its last digit apart (1.8e-6 relative), the worst gradient norm 9.9e-6 relative
  (seed 2, chunked, step 11). ``LOSS_RTOL`` and ``GRAD_NORM_RTOL`` allow about 10x those.
- The weights: AdamW moves each weight by ``lr * m / (sqrt(v) + eps)`` with ``|m / sqrt(v)| <= 1`` (bias-corrected,
  betas 0.9/0.95), so by at most about ``lr`` per step however large its gradient. A weight whose gradient is near
  zero (a cancellation) carries a large relative round-off, and AdamW's division by the gradient's own running
  scale turns it into a fraction of ``lr``: up to 7.2e-5 (2.4% of lr) after one step, and, compounded, 2.0e-4
  (6.6% of lr, seed 2, chunked, on ``embed.weight``) after 12. No weight may be further off than one step's
  largest move, ``lr`` (15x the worst seen). The bulk agrees far closer: at most 14 of the 115,008 weights (seed 2,
  chunked; 0 to 3 in every other run) were more than 1e-5 off; ``MAX_SHARE_ABOVE`` allows 0.1% (115).
- A real bug fails every one of these checks by far: the last micro-batch of each step counted twice prints a
  step-1 loss of 8.35 against 5.56 and leaves 114,263 of the 115,008 weights more than 1e-5 off, the worst by
  0.030 (10x lr); the last micro-batch dropped (weight 0) prints 2.77 and leaves 114,823 more than 1e-5 off, the
  worst by 0.032 (checked by hand: ``optimizer_step._micro_batches``'s last share doubled, then zeroed, against the same
  reference, seed 1234).
"""

from __future__ import annotations

import math

import torch

from tests.training.runner import fields, step_lines

LOSS_RTOL = 2e-5
GRAD_NORM_RTOL = 1e-4
WEIGHT_ROUND_OFF = 1e-5
MAX_SHARE_ABOVE = 1e-3  # of the weights more than WEIGHT_ROUND_OFF off


def last_digit(printed: str) -> float:
    """One unit of the last digit of a number printed with 6 significant digits (``metric_lines._fmt_metric``)."""
    value = abs(float(printed))
    return 10.0 ** (math.floor(math.log10(value)) - 5) if value else 0.0


def assert_same_printed(output: str, reference: str) -> None:
    """Every step of ``output`` logs ``reference``'s loss and gradient norm: step 1 to the last printed digit (one
    unit apart at most), every step within ``LOSS_RTOL`` and ``GRAD_NORM_RTOL``."""
    ours, theirs = step_lines(output), step_lines(reference)
    assert ours.keys() == theirs.keys()
    for step, line in ours.items():
        for key, rtol in (("loss", LOSS_RTOL), ("grad_norm", GRAD_NORM_RTOL)):
            got, want = fields(line)[key], fields(theirs[step])[key]
            allowed = 1.001 * last_digit(want) if step == 1 else rtol * abs(float(want))
            assert abs(float(got) - float(want)) <= allowed, (step, key, got, want)


def weight_differences(weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> torch.Tensor:
    assert weights.keys() == reference.keys()
    return torch.cat([(weights[name] - reference[name]).abs().flatten() for name in reference])


def assert_same_weights(
    weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], learning_rate: float
) -> None:
    """No weight further from the reference's than the peak ``learning_rate`` (one AdamW step's largest move), and
    at most ``MAX_SHARE_ABOVE`` of them further than ``WEIGHT_ROUND_OFF``."""
    diff = weight_differences(weights, reference)
    worst, above = float(diff.max()), int((diff > WEIGHT_ROUND_OFF).sum())
    assert worst <= learning_rate, f"a weight {worst:.3g} off (learning rate {learning_rate})"
    assert above <= MAX_SHARE_ABOVE * diff.numel(), (
        f"{above} of {diff.numel()} weights more than {WEIGHT_ROUND_OFF} off"
    )
