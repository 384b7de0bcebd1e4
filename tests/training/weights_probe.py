"""Run under torchrun with the trainer's own options: ``python -m torch.distributed.run --nproc-per-node=N
tests/training/weights_probe.py OUT.pt --init_from ...``. Every rank builds the trainer's model (``loop.build``:
sharded by FSDP2, initialized or imported by ``weights``), runs the sharded forward on fixed tokens (loss, then the
logits with the root unsharded) and gathers the full state dict; rank 0 saves ``{"state", "logits", "loss",
"tokens"}`` to OUT.pt."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from training.trainer import config, loop
from training.trainer.__main__ import exit_now
from training.trainer.distributed import parallel, precision

PROBE_SEQ = 40


def main(out: str, argv: list[str]) -> None:
    cfg, _ = config.parse_args(argv)
    env = parallel.init_distributed()
    loop.set_determinism(cfg)
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = loop.build(cfg, env, plan)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (2, PROBE_SEQ + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        loss = net(inputs, targets)
        net.unshard()
        logits = net.logits(inputs)
        net.reshard()
    state = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main:
        torch.save({"state": state, "logits": logits, "loss": loss, "tokens": tokens}, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
    # Leave as the trainer does (training/trainer/__main__.py): without interpreter finalization, which can abort
    # with "terminate called without an active exception" while gloo's threads are torn down.
    exit_now(0)
