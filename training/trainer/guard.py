"""What stops a run on every rank together before anything bad is saved: a token id the check before training did not
read (in the batch the next step reads) and a non-finite loss or gradient norm.

One rank finds the problem; every rank learns it at the step boundary, in the all-reduce that already carries the
SIGTERM flag (``checkpoint.StopFlag.agreed``), and the loop ends with ``refusal.TrainingFailure`` on every rank: one
``error:`` line, exit status 1, never a traceback per rank or a rank left waiting in a collective.

* **The next batch** is read at the boundary (the data source's ``check_next``, which keeps it for the step that
  uses it), so a bad token id stops the run after a step whose state is good: that state is checkpointed first
  (unless it just was) and the save sealed, so a rerun resumes there, and the line names the file and the position.
* **The loss and the gradient norm** stay on the device: each step folds their finiteness into a device tensor (the
  first non-finite step and its values; no host sync), which is read where the loop waits for the device anyway: a
  log line, a checkpoint, the end of the run, a stop. A non-finite state is never saved: no checkpoint, model file
  or Hugging Face export after it. Every checkpoint written before it is kept (a save is only started after a read
  that found nothing, so one still being written is good, and is sealed). With a gradient scaler (fp16) an
  infinite gradient norm is the scaler's business (it skips that step and lowers its scale): only the loss counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

DATA = "data"
"""A problem with the batch the next step would read: the state of the step just done is good."""
VALUES = "values"
"""A non-finite loss or gradient norm: the state is not good from that step on."""


@dataclass(frozen=True)
class Problem:
    """One rank's reason to stop: ``kind`` (``DATA`` or ``VALUES``) and the words for it."""

    kind: str
    text: str


class Guard:
    """This rank's watch over the next batch and the finiteness of each step's loss and gradient norm."""

    def __init__(self, dataset: Any, device: torch.device, start_step: int, check_grad_norm: bool, rank: int):
        """``dataset``: the run's data source (its ``check_next``); ``check_grad_norm``: False with a gradient
        scaler."""
        self.dataset, self.check_grad_norm, self.rank = dataset, check_grad_norm, rank
        self._step = torch.full((), float(start_step), dtype=torch.float64, device=device)
        self._first = torch.zeros(
            3, dtype=torch.float64, device=device
        )  # (step, loss, grad norm); step 0: none

    def step_done(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Fold one optimizer step's loss and gradient norm in (device tensors; nothing waits on the device)."""
        norm = grad_norm.to_local() if isinstance(grad_norm, DTensor) else grad_norm
        loss, norm = loss.detach().double().reshape(()), norm.detach().double().reshape(())
        self._step += 1
        finite = torch.isfinite(loss) & torch.isfinite(norm) if self.check_grad_norm else torch.isfinite(loss)
        first = ~finite & (self._first[0] == 0)
        self._first = torch.where(first, torch.stack((self._step, loss, norm)), self._first)

    def problem(self, *, read_values: bool, next_batch: bool) -> Problem | None:
        """This rank's reason to stop at a step boundary, or None: with ``read_values``, the first non-finite step
        (a device sync); with ``next_batch``, what is wrong with the batch the next step reads."""
        if read_values:
            step, loss, norm = self._first.tolist()
            if step:
                what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {norm}"
                return Problem(
                    VALUES, f"non-finite training: step {int(step)} gave {what} (rank {self.rank})"
                )
        if next_batch:
            text = self.dataset.check_next()
            if text is not None:
                return Problem(DATA, text)
        return None


def failure_message(problems: list[Problem], step: int, newest: Any) -> str:
    """The one line of a run stopped at the boundary after ``step`` for ``problems`` (every rank's); ``newest``: the
    newest complete checkpoint (a path), or None."""
    values = [p for p in problems if p.kind == VALUES]
    if values:
        kept = (
            f"every checkpoint written before it is kept (the newest: {newest})"
            if newest is not None
            else "no checkpoint had been written"
        )
        return (
            f"{values[0].text}; stopped before saving anything from that step on: {kept}; lower learning_rate (or "
            "raise lr_warmup_steps), or train in another precision"
        )
    kept = (
        f"the newest checkpoint, {newest}, is kept"
        if newest is not None
        else "no checkpoint had been written"
    )
    return (
        f"{problems[0].text}, in the batch of step {step + 1}: the check before training reads a sample of large "
        f"data; stopped after step {step}: {kept}; fix or remove that file, then run again to continue from there"
    )
