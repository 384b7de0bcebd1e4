"""What a run minimizes (``objective``), and the parts of the training loop that differ by it: its data, what it does
before step 1, an optimizer step's micro-batches and their losses, the step line's own fields and the validation.

* ``NextToken``: the next-token cross-entropy over every counted target (pretraining on token streams, and
  conversations on their assistant turns; ``optimizer_step``);
* ``preference.dpo.Dpo``: direct preference optimization on pairs of a chosen and a rejected answer.

``objective`` auto is decided by the data: preference data (``kind: preference``) trains DPO, any other data the
next-token loss; an objective named explicitly must match its data (a refusal before anything is built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from training.contract import settings_table
from training.trainer import optimizer_step
from training.trainer.data import packing, pairs
from training.trainer.model import doc_mask
from training.trainer.preference.dpo import Dpo


class NextToken:
    """The next-token loss (see the module doc)."""

    name = "next_token"

    def make_dataset(self, cfg: Any, rank: int, world_size: int, grad_accum_steps: int = 1) -> Any:
        return packing.make_dataset(cfg, rank, world_size, grad_accum_steps=grad_accum_steps)

    def make_validation(self, cfg: Any, rank: int, world_size: int) -> Any:
        return packing.make_validation(cfg, rank, world_size)

    def describe(self) -> str | None:
        return None

    def prepare(
        self, net: Any, step: int, build: Callable[[], Any], plan: Any, say: Callable[[str], None]
    ) -> None:
        """Nothing to do before step 1."""

    micro_batches = staticmethod(optimizer_step._micro_batches)
    train_step = staticmethod(optimizer_step.train_step)

    def step_fields(self) -> dict[str, float]:
        return {}

    def evaluate(
        self, net: Any, batches: list, env: Any, plan: Any, packed: bool = False
    ) -> dict[str, float]:
        loss, accuracy = evaluate(net, batches, env, plan, packed)
        return {"val_loss": loss, "val_accuracy": accuracy}


def evaluate(net: Any, batches: list, env: Any, plan: Any, packed: bool = False) -> tuple[float, float]:
    """The loss and token accuracy over every counted target of this rank's validation ``batches`` and every
    rank's (a collective): summed per token (``Transformer.forward(statistics=True)``), then divided once, so a
    batch with more counted targets weighs more, as in training. ``packed``: the batches carry document ids."""
    net.eval()
    total = torch.zeros(3, device=env.device)
    with torch.no_grad(), plan.autocast():
        for batch in batches:
            documents = doc_mask.Documents.from_ids(batch[2], env.device) if packed else None
            tokens, targets = batch[0].to(env.device), batch[1].to(env.device)
            total += net(tokens, targets, documents, statistics=True).float()
    net.train()
    torch.distributed.all_reduce(total)
    loss_sum, correct, counted = (float(value) for value in total.tolist())
    return loss_sum / max(counted, 1.0), correct / max(counted, 1.0)


def of(cfg: Any, env: Any) -> NextToken | Dpo:
    """The run's objective: ``cfg.objective``, auto decided by its data (see the module doc). Raises
    ``settings_table.ContractError`` naming ``objective`` when it does not fit the data."""
    return Dpo(cfg, env) if check(cfg) == "dpo" else NextToken()


def check(cfg: Any) -> str:
    """The objective ``cfg`` trains (``next_token`` or ``dpo``), or ``settings_table.ContractError`` naming
    ``objective`` when it does not fit the data, or the ``dpo_*`` setting given to a next-token run (the
    preflight's check, before any process starts; the request check's is ``training.request.fine_tuning``)."""
    preference = pairs.preference_data(cfg)
    if cfg.objective == "dpo" and not preference:
        raise settings_table.ContractError(
            "objective",
            "dpo trains on preference data (pairs of a chosen and a rejected answer, prepared with python -m "
            f"training.prepare PAIRS.jsonl --init-from MODEL); {_data(cfg)} is not; got dpo",
        )
    if cfg.objective == "next_token" and preference:
        raise settings_table.ContractError(
            "objective",
            f"next_token cannot train on preference data ({_data(cfg)} holds pairs of chosen and rejected answers): "
            "use objective dpo (or auto); got next_token",
        )
    if not preference:
        for name in settings_table.DPO_SETTINGS:
            value = getattr(cfg, name)
            if value != settings_table.HYPERPARAMETERS_BY_NAME[name].default:
                raise settings_table.ContractError(
                    name,
                    f"only for preference tuning (objective dpo, or auto on preference data); this run trains the "
                    f"next-token loss on {_data(cfg)}; got {value!r}",
                )
    return "dpo" if preference else "next_token"


def _data(cfg: Any) -> str:
    return (
        "synthetic data"
        if cfg.dataset == "synthetic"
        else f"the data in {cfg.data_dir or 'the train channel'}"
    )
