"""Entry point: ``python -m training.trainer --num_layers 2 ...`` (under torchrun, or alone as one process).

Settings are validated, and the precision checked against this machine, before any process group starts.
``--check-only`` stops there (``train.sh`` runs it before starting torchrun).
"""

from __future__ import annotations

import sys

import torch.distributed as dist

from training import contract
from training.trainer import config, loop, parallel, precision


def main(argv: list[str] | None = None) -> int:
    cfg, check_only = config.parse_args(argv)
    try:
        precision.check_this_machine(cfg.precision)
    except contract.ContractError as err:
        print(f"error: invalid setting {err}", file=sys.stderr)
        return 2
    if check_only:
        print("settings ok: " + contract.format_config_line(cfg.as_dict()).removeprefix("config "))
        return 0
    env = parallel.init_distributed()
    try:
        loop.run(cfg, env)
        # Leave together: a rank that tears gloo down while a peer is still in its last collective (the
        # final model gather) makes that peer abort at exit ("terminate called without an active exception").
        dist.barrier(group=env.cpu_group)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
