"""Run under torchrun (2 gloo ranks) with the trainer's own options: ``python -m torch.distributed.run
--nproc-per-node=2 tests/training/sft_probe.py OUT.pt --num_layers 2 ...``. Every rank builds the trainer's model
for packed documents (``loop.build(packed=True)``: sharded by FSDP2) and:

* runs its own packed windows (``packed_windows``), and each example alone, through the sharded model (root
  unsharded for the logits): the largest difference between an example's logits in the pack and alone;
* runs one optimizer step's micro-batches through the trainer's own ``optimizer_step._micro_batches`` and ``optimizer_step.train_step``
  (targets counted over both ranks in one all-reduce), with deliberately unequal trained-token counts per rank and
  micro-batch (rank 1's first micro-batch has none at all), an optimizer that records the reduced gradients instead
  of stepping.

Rank 0 also computes the reference on one process: the unsharded model on every rank's windows, the summed
cross-entropy of every trained target divided by their count, backward. It saves ``{"logits_diff", "grad_diff",
"naive_diff", "shares", "empty"}`` to OUT.pt (``naive_diff``: against the mean of micro-batch means, which the
step must not equal)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from training.trainer import config, loop, optimizer_step
from training.trainer.__main__ import exit_now
from training.trainer.distributed import parallel, precision
from training.trainer.loss import IGNORE_INDEX
from training.trainer.model import decoder, doc_mask, rotary

LAYOUTS = {  # per rank: micro-batches of windows, each window the lengths of its examples (the rest padding)
    0: [[[5, 9, 3, 12], [30]], [[7, 7, 7], [2, 20]]],
    1: [[[16, 16], [4, 25]], [[31], [1, 6, 6, 6]]],
}
DENSITY = {0: [0.9, 0.2], 1: [0.0, 0.6]}
"""Per rank and micro-batch: the share of targets trained (rank 1's first micro-batch: none)."""


def packed_windows(rank: int, seq: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """Rank ``rank``'s windows (both micro-batches stacked): tokens, targets, document ids and the examples'
    (row, start, length); the same on every rank for a given ``rank`` (seeded)."""
    generator = torch.Generator().manual_seed(100 + rank)
    rows = [window for micro in LAYOUTS[rank] for window in micro]
    tokens = torch.randint(0, vocab, (len(rows), seq), generator=generator)
    targets = torch.full((len(rows), seq), IGNORE_INDEX)
    ids = torch.zeros((len(rows), seq), dtype=torch.int32)
    examples = []
    for row, lengths in enumerate(rows):
        density = DENSITY[rank][row // 2]
        at = 0
        for number, length in enumerate(lengths, 1):
            ids[row, at : at + length] = number
            trained = torch.rand(length - 1, generator=generator) < density
            targets[row, at : at + length - 1] = torch.where(
                trained, tokens[row, at + 1 : at + length], IGNORE_INDEX
            )
            examples.append((row, at, length))
            at += length
    return tokens, targets, ids, examples


class Fixed:
    """A dataset whose one batch is given (conversation data: document ids, packed)."""

    packing = True

    def __init__(self, batch: tuple):
        self.batch = batch

    def next_batch(self) -> tuple:
        return self.batch


class Recorder:
    """An optimizer that keeps the reduced full gradients instead of stepping."""

    def __init__(self, named: list):
        self.named, self.grads = named, {}

    def step(self) -> None:
        self.grads = {name: p.grad.full_tensor().clone() for name, p in self.named}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self.named:
            p.grad = None


def logits_difference(net: decoder.Transformer, env: parallel.DistEnv, cfg) -> float:
    tokens, _, ids, examples = packed_windows(env.rank, cfg.seq_length, cfg.vocab_size)
    worst = 0.0
    with torch.no_grad():
        net.unshard()
        packed = net.logits(tokens, doc_mask.Documents.from_ids(ids))
        calls = max(sum(len(window) for micro in layout for window in micro) for layout in LAYOUTS.values())
        for row, start, length in examples + examples[-1:] * (
            calls - len(examples)
        ):  # FSDP2: as many calls on each rank
            alone = net.logits(tokens[row : row + 1, start : start + length])
            worst = max(worst, (packed[row, start : start + length] - alone[0]).abs().max().item())
        net.reshard()
    return worst


def reference_gradients(state: dict, cfg, naive: bool = False) -> dict[str, torch.Tensor]:
    """One process, no FSDP: the mean cross-entropy over every trained target of both ranks' windows; ``naive``:
    the mean of each micro-batch's mean instead (micro-batches with no trained target left out), what a per-micro-
    batch loss gives."""
    shape = cfg.shape
    rope = rotary.Rope.from_settings(cfg.as_dict())
    net = decoder.Transformer(shape, [decoder.TorchBlock(shape) for _ in range(shape.num_layers)], rope=rope)
    net.load_state_dict(state)
    sums, counts = [], []
    for rank in LAYOUTS:
        tokens, targets, ids, _ = packed_windows(rank, cfg.seq_length, cfg.vocab_size)
        for part in range(2):
            rows = slice(2 * part, 2 * part + 2)
            logits = net.logits(tokens[rows], doc_mask.Documents.from_ids(ids[rows]))
            sums.append(F.cross_entropy(logits.flatten(0, 1), targets[rows].flatten(), ignore_index=IGNORE_INDEX,
                                        reduction="sum"))  # fmt: skip
            counts.append(int((targets[rows] != IGNORE_INDEX).sum()))
    if naive:
        means = [total / count for total, count in zip(sums, counts, strict=True) if count]
        loss = torch.stack(means).mean()
    else:
        loss = torch.stack(sums).sum() / sum(counts)
    loss.backward()
    return {name: p.grad for name, p in net.named_parameters()}


def _difference(got: dict, expected: dict) -> float:
    return max((got[name] - grad).abs().max().item() for name, grad in expected.items())


def main(out: str, argv: list[str]) -> None:
    cfg, _ = config.parse_args(argv)
    env = parallel.init_distributed()
    loop.set_determinism(cfg)
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = loop.build(cfg, env, plan, packed=True)
    state = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tokens, targets, ids, _ = packed_windows(env.rank, cfg.seq_length, cfg.vocab_size)
    micro, shares = optimizer_step._micro_batches(Fixed((tokens, targets, ids)), 2, env.device, env.cpu_group)
    recorder = Recorder(list(net.named_parameters()))
    optimizer_step.train_step(
        net, recorder, None, plan, micro, shares, [p for _, p in recorder.named], float("inf")
    )
    worst = torch.tensor([logits_difference(net, env, cfg)])  # FSDP2: the root's forward has run first
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if env.is_main:
        grad_diff = _difference(recorder.grads, reference_gradients(state, cfg))
        naive_diff = _difference(recorder.grads, reference_gradients(state, cfg, naive=True))
        torch.save({"logits_diff": worst.item(), "grad_diff": grad_diff, "naive_diff": naive_diff, "shares": list(shares),
                    "empty": shares.empty, "step_tokens": shares.step_tokens}, out)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
    exit_now(0)  # as the trainer leaves (training/trainer/__main__.py)
