"""The LM head and next-token cross-entropy, in chunks of tokens, recomputed in backward: the loss's memory is
bounded by the chunk, not by the micro-batch.

Unchunked (``loss_chunk_tokens=0``), ``F.cross_entropy(head(x).float(), targets)`` keeps fp32 vocabulary-sized
tensors for every token of the micro-batch: the saved fp32 log-softmax, and in backward its fp32 gradient and the
gradient cast to the compute dtype. ``linear_cross_entropy`` saves only the head's input, one fp32 log-sum-exp
per token and the targets; forward and backward each compute the head's logits one chunk of ``chunk_tokens``
tokens at a time (the fp32 logits of one chunk, then its softmax in place, then its gradient in the compute dtype),
so the vocabulary-sized memory is about 6 bytes x chunk_tokens x vocab_size whatever the micro-batch.

The price is the logits again in backward for every chunk but the last (whose softmax forward keeps, alive only
until backward has used it, when the activations are alive anyway): 2 x hidden x vocab FLOPs per token outside
the last chunk, none when the micro-batch fits in one chunk. The head's
weight is used directly (no module call per chunk), so FSDP2's hooks and its one all-gather of the root's
parameters are untouched, and autograd accumulates one weight gradient (in the weight's dtype) as it does for
``nn.Linear``. With 16-bit weights the head's gradient is summed over the chunks in fp32 and cast once at the end:
the backward holds 6 bytes x vocab_size x hidden_size for it (fp32 sum plus one chunk's 16-bit product, or plus
the final cast) where ``nn.Linear``'s one GEMM holds 2. Gradients are scaled by the incoming gradient in backward, so fp16 loss scaling works unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
"""Targets with this value are left out of the mean (``F.cross_entropy``'s default ``ignore_index``)."""


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` (logits in fp32) against ``targets`` over the tokens whose
    target is not ``IGNORE_INDEX``; ``chunk_tokens`` 0 computes it unchunked with ``F.cross_entropy``.

    ``hidden``: (..., hidden_size); ``weight``: (vocab_size, hidden_size); ``targets``: hidden's leading shape.
    When every target is ignored the result is 0 with zero gradients, not 0/0 = NaN (``F.cross_entropy``'s mean):
    such a micro-batch (reachable with conversation data, whose prompts are not trained) contributes nothing.
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    if chunk_tokens < 0:
        raise ValueError(f"loss_chunk_tokens: must be an integer >= 0; got {chunk_tokens}")
    if chunk_tokens == 0:
        logits = F.linear(hidden, weight).float()
        total = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
        return total / (targets != IGNORE_INDEX).sum().clamp(min=1)
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, chunk_tokens)


@torch.no_grad()
def token_statistics(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """For validation: ``[loss sum, correct, counted]`` (fp32) over the targets that are not ``IGNORE_INDEX``: the
    summed cross-entropy, how many the logits' argmax predicts exactly (token accuracy) and how many count; the
    logits made ``chunk_tokens`` tokens at a time (0: all at once). Sums, so that batches and ranks add up to a
    mean over every counted token."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    stats = torch.zeros(3, dtype=torch.float32, device=hidden.device)
    step = chunk_tokens or hidden.shape[0]
    for start in range(0, hidden.shape[0], step):
        chunk_targets = targets[start : start + step]
        logits = _chunk_logits(hidden[start : start + step], weight)
        valid = chunk_targets != IGNORE_INDEX
        stats[0] += F.cross_entropy(logits, chunk_targets, ignore_index=IGNORE_INDEX, reduction="sum")
        stats[1] += ((logits.argmax(dim=1) == chunk_targets) & valid).sum()
        stats[2] += valid.sum()
    return stats


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 logits of one chunk, a fresh tensor this code may overwrite in place."""
    logits = F.linear(hidden, weight)
    return logits.float() if logits.dtype != torch.float32 else logits


def chunk_forward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, keep_softmax: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunk's forward body: each token's fp32 log-sum-exp and target logit, and (``keep_softmax``) the
    chunk's softmax. ``compile.apply`` may replace it with its compiled version (``set_chunk_functions``)."""
    logits = _chunk_logits(hidden, weight)
    target_logit = logits.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)
    row_max = logits.amax(dim=1, keepdim=True)
    exp = logits.sub_(row_max).exp_()
    row_sum = exp.sum(dim=1)
    lse = row_sum.log().add_(row_max.squeeze(1))
    return lse, target_logit, exp.div_(row_sum.unsqueeze(1)) if keep_softmax else None


def chunk_gradient(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    log_sum_exp: torch.Tensor,
    row_scale: torch.Tensor,
    softmax: torch.Tensor | None,
) -> torch.Tensor:
    """One chunk's d loss / d logits in the compute dtype: (softmax - one_hot(target)) x ``row_scale``, the softmax
    recomputed from the saved log-sum-exp unless given."""
    grad_logits = softmax
    if grad_logits is None:
        grad_logits = _chunk_logits(hidden, weight)
        grad_logits.sub_(log_sum_exp.unsqueeze(1)).exp_()
    target = targets.clamp(min=0).unsqueeze(1)
    grad_logits.scatter_add_(1, target, torch.full_like(target, -1, dtype=grad_logits.dtype))
    grad_logits.mul_(row_scale.unsqueeze(1))
    return grad_logits.to(hidden.dtype)


_CHUNK_FUNCTIONS: dict[str, Any] = {"forward": chunk_forward, "gradient": chunk_gradient}


def set_chunk_functions(forward: Any, gradient: Any) -> None:
    """The per-chunk bodies the chunked loss calls (``chunk_forward``/``chunk_gradient`` or compiled versions)."""
    _CHUNK_FUNCTIONS.update(forward=forward, gradient=gradient)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``linear_cross_entropy`` for ``chunk_tokens`` > 0 (see the module docstring)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        log_sum_exp = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        valid = targets != IGNORE_INDEX
        starts = range(0, tokens, chunk_tokens)
        forward = _CHUNK_FUNCTIONS["forward"]
        for start in starts:
            end = min(start + chunk_tokens, tokens)
            # The last chunk's softmax is what backward starts from: kept, not recomputed. It is alive only
            # until backward has used it, when the activations are alive anyway (same peak as recomputing).
            keep = start == starts[-1] and any(ctx.needs_input_grad[:2])
            lse, target_logit, softmax = forward(hidden[start:end], weight, targets[start:end], keep)
            log_sum_exp[start:end] = lse
            total += ((lse - target_logit) * valid[start:end]).sum()
            if keep:
                ctx.last_softmax = softmax
            del softmax
        count = valid.sum().clamp(min=1)  # no counted target: 0 / 1, not NaN
        ctx.chunk_tokens = chunk_tokens
        ctx.save_for_backward(hidden, weight, targets, log_sum_exp, count)
        return total / count

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, targets, log_sum_exp, count = ctx.saved_tensors
        # d loss / d logit = (softmax - one_hot(target)) * grad_loss / count, zero for ignored tokens.
        row_scale = (targets != IGNORE_INDEX) * (grad_loss.float() / count)
        kept = [getattr(ctx, "last_softmax", None)]  # handed over, not held here: freed after its chunk
        if kept[0] is not None:
            del ctx.last_softmax
        grad_hidden, grad_weight = _backward_chunks(
            hidden, weight, targets, log_sum_exp, row_scale, ctx.chunk_tokens, ctx.needs_input_grad[:2], kept
        )
        return grad_hidden, grad_weight, None, None


def _backward_chunks(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    log_sum_exp: torch.Tensor,
    row_scale: torch.Tensor,
    chunk: int,
    needs: tuple[bool, ...],
    kept: list[torch.Tensor | None],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The head's input and weight gradients of ``sum(row_scale x (log_sum_exp - target logit))``, chunk by chunk:
    d/d logits = (softmax - one_hot(target)) x ``row_scale``. The last chunk first: ``kept``'s one item, when not
    None, is its softmax, taken out of the list so that it is freed once that chunk is done. ``needs``: whether the
    hidden states and the weight want a gradient."""
    need_hidden, need_weight = needs
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    # The head's gradient is a sum over chunks: accumulated in fp32 (one 16-bit rounding per chunk's product, as
    # one GEMM rounds once), not in the weight's 16-bit dtype, whose rounding per addition grows with the chunk
    # count (bf16, 128 chunks: 1.9% error in norm against 0.24% unchunked; see tests/training/test_loss.py).
    # The first chunk's GEMM writes it (no zero fill), the others add into it.
    grad_weight: torch.Tensor | None = None
    gradient = _CHUNK_FUNCTIONS["gradient"]
    softmax = kept.pop()
    for start in reversed(range(0, hidden.shape[0], chunk)):  # the last chunk first: its softmax may be kept
        end = min(start + chunk, hidden.shape[0])
        grad_logits = gradient(
            hidden[start:end],
            weight,
            targets[start:end],
            log_sum_exp[start:end],
            row_scale[start:end],
            softmax,
        )
        softmax = None
        if grad_hidden is not None:
            torch.mm(grad_logits, weight, out=grad_hidden[start:end])
        if need_weight and grad_weight is None:
            grad_weight = torch.mm(grad_logits.t(), hidden[start:end]).to(_accumulation_dtype(weight.dtype))
        elif grad_weight is not None and grad_weight.dtype == grad_logits.dtype:
            grad_weight.addmm_(grad_logits.t(), hidden[start:end])
        elif grad_weight is not None:
            grad_weight.add_(torch.mm(grad_logits.t(), hidden[start:end]))
        del grad_logits
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)
    return grad_hidden, grad_weight


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16-bit weights, the weight's own dtype otherwise."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def token_log_probs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Each token's log-probability of its target under ``hidden @ weight.T`` (fp32 logits), 0 where the target is
    ``IGNORE_INDEX``: what preference tuning sums per answer (``training/trainer/preference``). One per target, in
    ``targets``' flattened order (a fresh tensor, not a view); differentiable. ``chunk_tokens`` > 0: the logits
    made that many tokens at a time in forward and again in backward (``_ChunkedTokenLogProbs``), so the
    vocabulary-sized memory is bounded by the chunk as for the loss; 0: all at once with ``F.log_softmax``."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    if chunk_tokens < 0:
        raise ValueError(f"loss_chunk_tokens: must be an integer >= 0; got {chunk_tokens}")
    if chunk_tokens == 0:
        logits = F.linear(hidden, weight).float()
        picked = logits.log_softmax(dim=-1).gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)
        return picked * (targets != IGNORE_INDEX)
    return _ChunkedTokenLogProbs.apply(hidden, weight, targets, chunk_tokens)


class _ChunkedTokenLogProbs(torch.autograd.Function):
    """``token_log_probs`` for ``chunk_tokens`` > 0: saves the head's input, the targets and one fp32 log-sum-exp per
    token; backward recomputes each chunk's logits (d log p / d logits = one_hot(target) - softmax, times the
    incoming gradient: the loss's backward with ``row_scale`` = - that gradient)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        log_sum_exp = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
        out = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
        valid = targets != IGNORE_INDEX
        forward = _CHUNK_FUNCTIONS["forward"]
        for start in range(0, tokens, chunk_tokens):
            end = min(start + chunk_tokens, tokens)
            lse, target_logit, _ = forward(hidden[start:end], weight, targets[start:end], False)
            log_sum_exp[start:end] = lse
            out[start:end] = (target_logit - lse) * valid[start:end]
        ctx.chunk_tokens = chunk_tokens
        ctx.save_for_backward(hidden, weight, targets, log_sum_exp)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, targets, log_sum_exp = ctx.saved_tensors
        row_scale = (targets != IGNORE_INDEX) * -grad_out.float()
        grad_hidden, grad_weight = _backward_chunks(
            hidden,
            weight,
            targets,
            log_sum_exp,
            row_scale,
            ctx.chunk_tokens,
            ctx.needs_input_grad[:2],
            [None],
        )
        return grad_hidden, grad_weight, None, None
