"""One optimizer step: a step's batch cut into micro-batches with each one's weight in the step's loss
(``_micro_batches``, ``Shares``), their forward and backward, clipping and the optimizer's step (``train_step``), the
step boundary's agreement across ranks (``_boundary``) and the count of micro-batches with nothing to train
(``_EmptyMicroBatches``, which also fails a run whose every step trained nothing). The loop (``loop``) runs one
per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from training.trainer import guard, refusal
from training.trainer import loss as loss_module
from training.trainer.checkpoint import stop as stop_flag
from training.trainer.data import token_files
from training.trainer.model import doc_mask


class Shares(list):
    """Each micro-batch's weight in its optimizer step's loss (a list of floats), with what the step counted over
    every rank: ``step_tokens`` (targets that count), ``empty`` (micro-batches with none) and ``padding`` (the share
    of window positions that are padding)."""

    step_tokens: int = 0
    empty: int = 0
    padding: float = 0.0


def _micro_batches(
    dataset: Any, count: int, device: torch.device, group: Any = None
) -> tuple[list[tuple[torch.Tensor, torch.Tensor, doc_mask.Documents | None]], Shares]:
    """One optimizer step's batch cut into ``count`` micro-batches ``(tokens, targets, documents)`` on ``device``,
    and each one's weight (``train_step`` says how the weights make the step's loss). The counts are taken on the
    host before the copy and, with ``group`` (the host-side gloo group), summed over the ranks in one all-reduce:
    weight ``i`` = its counted targets x world size / the step's counted targets over every rank. Without ``group``:
    its targets over this rank's (one process). The batch goes to the device in one copy (``data.to_device``:
    pinned memory and a non-blocking copy on a GPU); ``documents`` (packed conversation data) is the layout of
    the micro-batch's examples (``doc_mask.Documents``), None otherwise."""
    batch = dataset.next_batch()
    tokens, targets = batch[0], batch[1]
    ids = batch[2] if len(batch) > 2 else None
    counted = [int((piece != loss_module.IGNORE_INDEX).sum()) for piece in targets.chunk(count)]
    padding = int((ids == 0).sum()) if ids is not None else 0
    totals = torch.tensor([sum(counted), counted.count(0), padding, tokens.numel()], dtype=torch.float64)
    world = 1
    if group is not None:
        torch.distributed.all_reduce(totals, group=group)
        world = torch.distributed.get_world_size(group)
    shares = Shares(c * world / max(int(totals[0]), 1) for c in counted)
    shares.step_tokens, shares.empty = int(totals[0]), int(totals[1])
    shares.padding = float(totals[2] / totals[3])
    documents: list[doc_mask.Documents | None] = [None] * count
    if ids is not None and getattr(dataset, "packing", False):
        documents = [doc_mask.Documents.from_ids(piece, device) for piece in ids.chunk(count)]
    tokens, targets = token_files.to_device(tokens, targets, device)
    on_device = list(zip(tokens.chunk(count), targets.chunk(count), documents, strict=True))
    return on_device, shares


def train_step(net: Any, optimizer: Any, scaler: Any, plan: Any, micro: list, shares: list[float], params: list,
               max_norm: float, forward: Callable[[Any], torch.Tensor] | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Forward and backward of every micro-batch (gradients reduced only on the last: FSDP2's
    ``set_requires_gradient_sync``), then clip and step. Returns the step's loss and gradient norm as device
    tensors (nothing here waits on the device).

    How the losses are weighted: per counted target over the whole optimizer step, on every rank together, not per
    micro-batch or per rank (a per-micro-batch or per-rank mean weighs each token of a smaller one by more).
    ``net`` returns a micro-batch's mean cross-entropy over its counted targets (not ``IGNORE_INDEX``); it is
    multiplied by ``shares[i]`` = that micro-batch's counted targets x world size / the step's over every rank
    (``_micro_batches``). FSDP2's reduce-scatter averages the ranks' gradients (divides their sum by the world
    size), so the gradient is that of the mean over every counted target of the global step: the same as one
    process running the whole global batch. The returned loss is this rank's weighted sum, whose mean over the
    ranks (``Progress``) is that global mean. A micro-batch with no counted target has loss 0 and weight 0
    (``loss.linear_cross_entropy``): it contributes nothing (it still runs: FSDP2's collectives need every rank).
    A step with no counted target on any rank (``shares.step_tokens`` 0) leaves the weights and the optimizer's
    state as they were. ``forward``: what gives a micro-batch's loss instead of the model's next-token loss
    (``net(tokens, targets, documents)``): another objective's (``preference.dpo``)."""
    step_loss = torch.zeros((), device=micro[0][0].device if forward is None else micro[0].tokens.device)
    last = len(micro) - 1
    for index, (item, share) in enumerate(zip(micro, shares, strict=True)):
        if last:
            net.set_requires_gradient_sync(index == last)
        with plan.autocast():
            loss = (net(*item) if forward is None else forward(item)) * share
        (scaler.scale(loss) if scaler is not None else loss).backward()
        step_loss += loss.detach().float()
    if getattr(shares, "step_tokens", 1) == 0:  # nothing counted anywhere: no update (weight decay included)
        optimizer.zero_grad(set_to_none=True)
        return step_loss, torch.zeros((), device=step_loss.device)
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return step_loss, grad_norm


def _boundary(
    stop: stop_flag.StopFlag, manager: Any, watch: guard.Guard, read: bool, last: bool
) -> tuple[bool, bool, list]:
    """The step boundary's agreement (``StopFlag.agreed``): (SIGTERM stop, background save written, every rank's
    problem). ``read``: the loop waits for the device here anyway (a log line, a checkpoint), so the loss and
    gradient norm are read; when something is to be saved or reported without that (a stop), they are read and
    agreed on first (a second all-reduce, on that path only). ``last``: no next batch to check."""
    stopped, written, problems = stop.agreed(
        manager.pending_written(), watch.problem(read_values=read, next_batch=not last)
    )
    if (stopped or problems) and not read:
        problems += stop.agreed(None, watch.problem(read_values=True, next_batch=False))[2]
    return stopped, written, problems


class _EmptyMicroBatches:
    """Counts the micro-batches with no target to count (every one ``IGNORE_INDEX``; summed over the ranks by
    ``_micro_batches``), says how many at each step line that follows some, and gives the run's total to the
    summary: each contributed nothing and the run went on."""

    def __init__(self, say: Callable[[str], None]):
        self.say, self.total, self.reported, self.steps, self.trained = say, 0, 0, 0, 0

    def add(self, count: int, trained: int = 1) -> None:
        """A step done: ``count`` micro-batches without a target, ``trained`` targets counted over every rank."""
        self.total += count
        self.steps, self.trained = self.steps + 1, self.trained + trained

    def nothing_trained(self) -> bool:
        """Whether every step of this run counted no target over every rank (so each skipped its update and the
        model is unchanged): the same answer on every rank."""
        return bool(self.steps) and not self.trained

    def failure(self) -> refusal.TrainingFailure:
        """The failure of a run that trained nothing, raised before the model is saved or exported."""
        return refusal.TrainingFailure(
            f"every step of this run trained nothing ({self.steps} steps, 0 trained tokens: every target of the "
            "windows it read is masked out), so no model is saved: check the data's masks (prepare the data again)"
        )

    def report(self, step: int) -> None:
        if self.total > self.reported:
            self.say(
                f"note: {self.total - self.reported} micro-batch(es) up to step {step} had no trained target (every "
                f"target ignored): each contributed nothing to its step ({self.total} in this run so far)"
            )
            self.reported = self.total
