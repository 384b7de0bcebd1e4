"""Preference tuning as the training loop runs it (``objective`` dpo): the data (``data.pairs``), the reference's
log-probabilities (``prepare``), one optimizer step's micro-batches of whole pairs and each one's loss, the step
line's and the validation line's fields.

The loss of a step is the mean over **every pair of the step**, across ranks and micro-batches: each micro-batch's
loss is the sum of its pairs' losses (``losses.pair_losses``) x world size / the step's pairs over every rank
(counted on the host and summed in one all-reduce before the forwards, as the next-token loss counts its targets),
and FSDP2's reduce-scatter averages the ranks' gradients, so the gradient is that of the mean over the global
step's pairs whatever the split into ranks and micro-batches (a pair a step holds twice, across an epoch boundary,
counts twice wherever its copies land: ``batches``). The optional SFT term (``dpo_sft_weight``) is the
mean next-token loss over the step's chosen answers' trained tokens, weighted the same way by tokens.

The reference: ``precomputed`` (full fine-tuning's default) reads each answer's log-probability from the arrays
``reference`` computed before step 1; ``adapter_off`` (LoRA's) runs the same model once more per micro-batch,
without gradients and with its adapters switched off (``lora.adapters_off``), before the policy's forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from training.trainer import optimizer_step
from training.trainer.data import pairs, token_files
from training.trainer.loss import IGNORE_INDEX
from training.trainer.model import lora
from training.trainer.preference import losses, reference
from training.trainer.preference.batches import MicroPairs, answer_log_probs, micro_pairs

VALIDATION_FIELDS = ("val_loss", "val_reward_accuracy", "val_reward_margin")


class Dpo:
    """The DPO objective of a run (see the module doc)."""

    name = "dpo"

    def __init__(self, cfg: Any, env: Any):
        self.cfg, self.env = cfg, env
        self.settings = losses.DpoSettings.of(cfg)
        self.reference: dict[str, torch.Tensor] | None = None
        self._sums = torch.zeros(len(losses.STATISTICS), dtype=torch.float32, device=env.device)

    def make_dataset(
        self, cfg: Any, rank: int, world_size: int, grad_accum_steps: int = 1
    ) -> pairs.PreferencePairs:
        return pairs.make(cfg, "train", rank, world_size, grad_accum_steps=grad_accum_steps)

    def make_validation(self, cfg: Any, rank: int, world_size: int) -> pairs.PreferencePairs | None:
        return pairs.make_validation(cfg, rank, world_size)

    def describe(self) -> str:
        """The ``objective`` line: what this run minimizes and where its reference comes from."""
        s = self.settings
        return (
            f"objective dpo loss={s.loss} beta={s.beta:g} sft_weight={s.sft_weight:g} reference={s.reference}"
        )

    def prepare(
        self, net: Any, step: int, build: Callable[[], Any], plan: Any, say: Callable[[str], None]
    ) -> None:
        """The precomputed reference's log-probabilities, before step 1: read from the checkpoint folder, or
        computed with the initial model (``net`` at step 0, else a fresh one from ``build``) and stored there."""
        if self.settings.reference != "precomputed":
            return
        held = (token_files.read_metadata(token_files.channel_dir(self.cfg)) or {}).get("splits") or {}
        splits = {name: pairs.make(self.cfg, name, self.env.rank, self.env.world_size, shuffle=False)
                  for name in ("train", "validation") if name in held}  # fmt: skip
        wanted = reference.identity(self.cfg, {name: split.sequences for name, split in splits.items()})
        self.reference = reference.load(self.cfg, self.env, wanted)
        if self.reference is not None:
            say(f"reference log-probabilities: read from {reference.folder(self.cfg)} (computed before step 1 of this "
                "run; not computed again)")  # fmt: skip
            return
        started, model = time.perf_counter(), net if step == 0 else build()
        arrays = {name: reference.compute(model, split, self.env, plan) for name, split in splits.items()}
        if model is not net:
            del model
        where = reference.store(self.cfg, self.env, wanted, arrays)
        self.reference = arrays
        answers = sum(len(array) for array in arrays.values())
        say(f"reference log-probabilities: {answers} answers ({', '.join(splits)}) scored by the initial model in "
            f"{time.perf_counter() - started:.1f} s, stored in {where}")  # fmt: skip

    def micro_batches(
        self, dataset: pairs.PreferencePairs, count: int, device: torch.device, group: Any = None
    ) -> tuple[list[MicroPairs], optimizer_step.Shares]:
        """One optimizer step's batch cut into ``count`` micro-batches of whole pairs, each one weighted (in
        ``_loss``) by the step's pairs and chosen tokens over every rank (one all-reduce of the host's counts,
        with ``group``). The shares ``train_step`` multiplies by are 1: each micro-batch's loss is weighted
        already; they carry the step's trained tokens and padding for the step line."""
        tokens, targets, ids, sequences = dataset.next_batch()
        micro = [micro_pairs(*parts, device) for parts in
                 zip(*(t.chunk(count) for t in (tokens, targets, ids, sequences)), strict=True)]  # fmt: skip
        totals = torch.tensor(
            [sum(m.pairs for m in micro), sum(m.chosen_tokens for m in micro),
             int((targets != IGNORE_INDEX).sum()), int((ids == 0).sum()), ids.numel()],
            dtype=torch.float64,
        )  # fmt: skip
        world = 1
        if group is not None:
            torch.distributed.all_reduce(totals, group=group)
            world = torch.distributed.get_world_size(group)
        for item in micro:
            item.pair_weight = world / max(float(totals[0]), 1.0)
            item.chosen_weight = world / max(float(totals[1]), 1.0)
            if self.reference is not None:
                item.reference = self._reference_of("train", item)
        shares = optimizer_step.Shares([1.0] * count)
        shares.step_tokens, shares.padding = int(totals[2]), float(totals[3] / totals[4])
        return micro, shares

    def _reference_of(self, split: str, item: MicroPairs) -> torch.Tensor:
        assert self.reference is not None
        return self.reference[split][torch.from_numpy(item.sequences)].view(-1, 2).to(item.tokens.device)

    def train_step(self, net: Any, optimizer: Any, scaler: Any, plan: Any, micro: list[MicroPairs],
                   shares: list[float], params: list, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """``optimizer_step.train_step`` with each micro-batch's DPO loss (``_loss``)."""
        return optimizer_step.train_step(net, optimizer, scaler, plan, micro, shares, params, max_norm,
                                         forward=lambda item: self._loss(net, item))  # fmt: skip

    def _scores(self, net: Any, item: MicroPairs) -> tuple[losses.PairScores, torch.Tensor, torch.Tensor]:
        """The pairs' scores, the policy's per-token and per-answer log-probabilities."""
        ref = item.reference
        if ref is None:  # adapter_off: the same model without its adapters, no gradient
            with torch.no_grad(), lora.adapters_off(net):
                ref = answer_log_probs(net(item.tokens, item.targets, item.documents, log_probs=True), item)
        per_token = net(item.tokens, item.targets, item.documents, log_probs=True)
        policy = answer_log_probs(per_token, item)
        s = self.settings
        return losses.pair_losses(policy, ref, item.answer_tokens, s.beta, s.loss), per_token, policy

    def _loss(self, net: Any, item: MicroPairs) -> torch.Tensor:
        """The micro-batch's share of the step's loss (see the module doc); its statistics are added up."""
        scores, per_token, policy = self._scores(net, item)
        loss = scores.loss.sum() * item.pair_weight
        if self.settings.sft_weight:
            nll = -(per_token.reshape(-1) * item.chosen.reshape(-1)).sum()
            loss = loss + self.settings.sft_weight * nll * item.chosen_weight
        self._sums += losses.statistics(scores, policy)
        return loss

    def step_fields(self) -> dict[str, float]:
        """The step line's DPO fields: the means over every pair trained since the last call (every rank's: a
        collective, at each logged step), then counting starts again."""
        sums = self._sums.clone()
        torch.distributed.all_reduce(sums)
        self._sums.zero_()
        means = losses.means(sums.cpu())
        return {name: means[name] for name in losses.STATISTICS[2:]}

    def evaluate(self, net: Any, batches: list, env: Any, plan: Any, packed: bool = True) -> dict[str, float]:
        """The validation split's DPO loss (the SFT term included), reward accuracy and margin: means over every
        held-out pair of this rank's ``batches`` and every rank's (a collective). ``packed``: unused (every window
        of pairs holds several documents)."""
        net.eval()
        sums = torch.zeros(len(losses.STATISTICS), device=env.device)
        nll = torch.zeros(2, device=env.device)
        with torch.no_grad(), plan.autocast():
            for batch in batches:
                item = micro_pairs(*batch, env.device)
                if self.reference is not None:
                    item.reference = self._reference_of("validation", item)
                scores, per_token, policy = self._scores(net, item)
                sums += losses.statistics(scores, policy)
                nll += torch.stack([-(per_token.reshape(-1) * item.chosen.reshape(-1)).sum(),
                                    item.answer_tokens[:, 0].sum()])  # fmt: skip
        net.train()
        torch.distributed.all_reduce(sums)
        torch.distributed.all_reduce(nll)
        means = losses.means(sums.cpu())
        sft = float(nll[0] / nll[1].clamp(min=1)) * self.settings.sft_weight
        return {"val_loss": means["loss"] + sft, "val_reward_accuracy": means["reward_accuracy"],
                "val_reward_margin": means["reward_margin"]}  # fmt: skip
