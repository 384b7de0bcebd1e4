"""Print the chunked loss's throughput table of docs/measurements.md: the trainer's tokens/s with the loss unchunked
(``loss_chunk_tokens`` 0) and chunked, in alternating rounds of ``make bench``'s runs (the benchmark's tiny model on
a CPU), so that drift on a shared machine hits both alike.

    python -m training.measure.loss_throughput              # 3 rounds, chunk = the contract's default
    python -m training.measure.loss_throughput --rounds 5 --chunk 1024

Per cell (batch size x activation checkpointing): the median tokens/s of each, the change, and how far the runs of
each spread (largest / smallest). One thread (as ``OMP_NUM_THREADS=1``): on a shared 2-core machine a second thread
per process only contends. Wall-clock figures still move with the machine's load, which the spread column shows;
``python -m training.measure.loss_step_time`` times the same steps by CPU time instead.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence

import torch
import torch.distributed as dist

from training.contract import settings_table
from training.measure import benchmark
from training.trainer import loop
from training.trainer.distributed import parallel


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.loss_throughput", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds (default 3).")
    parser.add_argument(
        "--chunk",
        type=int,
        default=settings_table.LOSS_CHUNK_TOKENS_DEFAULT,
        help="The chunked run's loss_chunk_tokens.",
    )
    parser.add_argument("--batch-sizes", default="1,4", help="Comma-separated (default 1,4).")
    return parser.parse_args(argv)


def tokens_per_sec(env: parallel.DistEnv, batch: int, ac: bool, chunk: int) -> float:
    """One run of the trainer's loop on the benchmark's tiny model (its CPU defaults)."""
    args = benchmark.parse_args(["--loss-chunk-tokens", str(chunk)])
    with tempfile.TemporaryDirectory() as workdir:
        cfg = benchmark.make_config(args, "fp32", batch, ac, workdir)
        result = benchmark.measure(lambda: loop.run(cfg, env, emit=lambda _: None, final_save=False), env)
    assert result is not None  # a CPU run does not run out of GPU memory
    return result["tokens_per_sec"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    env = parallel.init_distributed()
    print(
        f"benchmark's tiny model, fp32, CPU, 1 thread; trainer tokens/s, median of {args.rounds} alternating rounds "
        f"(loss_chunk_tokens 0, then {args.chunk})"
    )
    print(
        f"| batch | AC | unchunked | chunked ({args.chunk}) | change | spread of the runs (unchunked / chunked) |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        for ac in (False, True):
            runs: dict[int, list[float]] = {0: [], args.chunk: []}
            for _ in range(args.rounds):
                for chunk in runs:
                    runs[chunk].append(tokens_per_sec(env, batch, ac, chunk))
            before, after = (statistics.median(runs[c]) for c in (0, args.chunk))
            spread = " / ".join(f"{max(v) / min(v):.1f}x" for v in runs.values())
            print(
                f"| {batch} | {'on' if ac else 'off'} | {before:,.0f} | {after:,.0f} | "
                f"{100 * (after / before - 1):+.1f}% | {spread} |",
                flush=True,
            )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
