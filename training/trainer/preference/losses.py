"""The DPO losses of a batch of pairs, from the policy's and the reference's log-probabilities of each answer (the
sum over its trained tokens), as TRL's ``DPOTrainer`` computes them (``trl/trainer/dpo_trainer.py``, 1.16.0):

* ``sigmoid`` (the DPO paper's): ``-log sigmoid(beta x ((pi_c - ref_c) - (pi_r - ref_r)))``;
* ``ipo``: ``((pi_c - ref_c) / n_c - (pi_r - ref_r) / n_r - 1 / (2 beta))^2``, the log-ratios averaged over each
  answer's trained tokens ``n`` (as TRL does, with the IPO authors' agreement);
* ``sigmoid_norm`` (length-normalised): the sigmoid loss on those per-token averages.

The rewards are ``beta x (pi - ref)`` of each answer (not averaged, for every loss, as TRL logs them); a pair counts
as right (reward accuracy) when its chosen answer's reward is strictly above the rejected one's. When the policy is
the reference (step 1 of a run) every log-ratio is 0 and the sigmoid loss is ln 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

LOSSES = ("sigmoid", "ipo", "sigmoid_norm")


@dataclass(frozen=True)
class DpoSettings:
    """The run's preference settings (``dpo_*``): ``reference`` resolved (``precomputed`` or ``adapter_off``)."""

    beta: float
    loss: str
    sft_weight: float
    reference: str

    @classmethod
    def of(cls, cfg: Any) -> DpoSettings:
        reference = cfg.dpo_reference
        if reference == "auto":
            reference = "adapter_off" if cfg.lora_rank else "precomputed"
        return cls(float(cfg.dpo_beta), str(cfg.dpo_loss), float(cfg.dpo_sft_weight), reference)


@dataclass(frozen=True)
class PairScores:
    """Per pair (1-D tensors of the batch's pairs): the loss, the chosen and rejected answers' rewards."""

    loss: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def pair_losses(
    policy: torch.Tensor,
    reference: torch.Tensor,
    tokens: torch.Tensor,
    beta: float,
    loss: str,
) -> PairScores:
    """The losses and rewards of the pairs whose answers' log-probabilities are ``policy`` and ``reference`` and
    whose answers have ``tokens`` trained tokens: each ``[pairs, 2]`` (chosen, rejected), fp32."""
    if loss not in LOSSES:
        raise ValueError(f"dpo_loss: must be one of {', '.join(LOSSES)}; got {loss!r}")
    ratios = policy - reference
    chosen, rejected = ratios[:, 0], ratios[:, 1]
    if loss == "sigmoid":
        losses = -F.logsigmoid(beta * (chosen - rejected))
    else:
        averaged = ratios / tokens.clamp(min=1)
        delta = averaged[:, 0] - averaged[:, 1]
        losses = (delta - 1 / (2 * beta)) ** 2 if loss == "ipo" else -F.logsigmoid(beta * delta)
    rewards = beta * ratios.detach()
    return PairScores(losses, rewards[:, 0], rewards[:, 1])


def statistics(scores: PairScores, policy: torch.Tensor) -> torch.Tensor:
    """Sums over the pairs, for the metric lines: ``[pairs, loss, chosen reward, rejected reward, right, margin,
    chosen log-probability, rejected log-probability]`` (fp32, no gradient)."""
    chosen, rejected = scores.chosen_rewards, scores.rejected_rewards
    logps = policy.detach()
    return torch.stack(
        [
            torch.tensor(float(len(chosen)), device=chosen.device),
            scores.loss.detach().sum(),
            chosen.sum(),
            rejected.sum(),
            (chosen > rejected).float().sum(),
            (chosen - rejected).sum(),
            logps[:, 0].sum(),
            logps[:, 1].sum(),
        ]
    ).float()


STATISTICS = ("pairs", "loss", "rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin",
              "logps_chosen", "logps_rejected")  # fmt: skip
"""The order of ``statistics``' sums: each but ``pairs`` divided by ``pairs`` is the mean the metric lines print."""


def means(sums: torch.Tensor) -> dict[str, float]:
    """The per-pair means of ``statistics``' sums (added up over micro-batches, steps and ranks)."""
    values = sums.tolist()
    pairs = max(values[0], 1.0)
    return {name: value / pairs for name, value in zip(STATISTICS[1:], values[1:], strict=True)}
