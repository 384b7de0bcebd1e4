"""One optimizer step of conversation data (optimizer_step._micro_batches, optimizer_step.train_step) in a world of one: a micro-batch
whose targets are all ignored contributes nothing (no NaN), is counted and said in the log; a step with no trained
target anywhere leaves the weights and the optimizer as they were."""

from __future__ import annotations

import torch

from tests.training.runner import TINY
from training.trainer import config, loop, optimizer_step
from training.trainer.distributed import levers, precision
from training.trainer.loss import IGNORE_INDEX


class Fixed:
    packing = True

    def __init__(self, batch):
        self.batch = batch

    def next_batch(self):
        return self.batch


def batch(trained_rows: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 256, (len(trained_rows), 32), generator=generator)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    for row, trained in enumerate(trained_rows):
        if trained:
            targets[row, 10:20] = tokens[row, 11:21]
    ids = torch.ones_like(tokens, dtype=torch.int32)
    ids[:, 24:] = 0  # padding at the end of each window
    return tokens, targets, ids


def test_an_all_ignored_micro_batch_contributes_nothing_and_an_empty_step_changes_nothing(process_group):
    cfg = config.config_from_mapping({**TINY, "grad_accum_steps": "2", "batch_size": "1"})
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = loop.build(cfg, process_group, plan, packed=True)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = levers.build_optimizer(params, "foreach", 0.01, 0.1)
    before = [p.detach().full_tensor().clone() for p in params]
    micro, shares = optimizer_step._micro_batches(
        Fixed(batch([False, True])), 2, process_group.device, process_group.cpu_group
    )
    assert list(shares) == [0.0, 1.0] and shares.empty == 1 and shares.step_tokens == 10
    assert shares.padding == 16 / 64
    loss, grad_norm = optimizer_step.train_step(
        net, optimizer, None, plan, micro, shares, params, float("inf")
    )
    assert torch.isfinite(loss) and torch.isfinite(grad_norm) and grad_norm > 0
    after = [p.detach().full_tensor().clone() for p in params]
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))  # the step trained
    micro, shares = optimizer_step._micro_batches(
        Fixed(batch([False, False])), 2, process_group.device, process_group.cpu_group
    )
    assert shares.step_tokens == 0 and shares.empty == 2
    state = {k: v.clone() if torch.is_tensor(v) else v for k, v in optimizer.state_dict()["state"][0].items()}
    loss, _ = optimizer_step.train_step(net, optimizer, None, plan, micro, shares, params, float("inf"))
    assert loss.item() == 0.0
    assert all(torch.equal(p.detach().full_tensor(), a) for p, a in zip(params, after, strict=True))
    assert all(
        torch.equal(optimizer.state_dict()["state"][0][k], v) for k, v in state.items() if torch.is_tensor(v)
    )


def test_the_log_says_how_many_micro_batches_had_nothing_to_train():
    lines = []
    empty = optimizer_step._EmptyMicroBatches(lines.append)
    empty.add(0)
    empty.report(10)
    empty.add(2)
    empty.report(20)
    empty.report(30)
    assert lines == [
        "note: 2 micro-batch(es) up to step 20 had no trained target (every target ignored): each contributed nothing "
        "to its step (2 in this run so far)"
    ]
    assert empty.total == 2
