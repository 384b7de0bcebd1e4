"""Run under torchrun with the trainer's own options: ``python -m torch.distributed.run --nproc-per-node=N
tests/training/lora_probe.py OUT_DIR --lora_rank ...``. Every rank builds the trainer's LoRA model (``loop.build``:
sharded by FSDP2, the base imported or generated, the adapters initialized), then writes into its own shard of
every adapter values that name the rank and the row (``1000 x (rank + 1) + local row + column / 1000``: B's zeros
and A's seeded values would hide a slice taken from the wrong rank), gathers each adapter's full tensor
(``DTensor.full_tensor``, an all-gather independent of the save path), and then saves as the trainer does
(``model_file.save_model``: ``model.pt``) and exports the peft folder (``export_peft.export``). Rank 0 saves the
gathered tensors and each rank's local row counts to OUT_DIR/gathered.pt."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from training.trainer import config, loop
from training.trainer.__main__ import exit_now
from training.trainer.checkpoint import export_peft, model_file
from training.trainer.distributed import parallel, precision
from training.trainer.model import lora


def main(out: str, argv: list[str]) -> None:
    cfg, _ = config.parse_args(argv)
    env = parallel.init_distributed()
    loop.set_determinism(cfg)
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = loop.build(cfg, env, plan)
    gathered, rows = {}, {}
    with torch.no_grad():
        for name, param in lora.adapters(net):
            local = param.to_local()
            r, c = local.shape
            value = torch.arange(r, dtype=torch.float32).unsqueeze(1) + torch.arange(c) / 1000.0
            local.copy_(value + 1000.0 * (env.rank + 1))
            rows[name] = r
            gathered[lora.peft_key(name)] = param.full_tensor()
    all_rows: list = [None] * env.world_size
    dist.all_gather_object(all_rows, rows)
    saved = model_file.save_model(net, cfg.model_dir, 0, cfg.as_dict(), env.rank)
    if env.is_main:
        assert saved is not None
        export_peft.export(saved, Path(out) / "adapter")
        torch.save({"gathered": gathered, "rows": all_rows}, Path(out) / "gathered.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
    exit_now(0)  # as the trainer leaves (training/trainer/__main__.py)
