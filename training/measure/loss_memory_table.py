"""Print the README's chunked-loss table: the traced per-GPU peak memory of one training step with the loss
unchunked and chunked (``training.measure.memory_trace``), over micro-batch sizes and vocabularies.

    python -m training.measure.loss_memory_table                  # 1b, seq 8192, AC, world 8, micro-batch 1/4/16
    python -m training.measure.loss_memory_table --layers 4       # a shallower model, where tracing takes too long

Each row is one trace (about 5-15 s on a 2-core CPU); nothing is asserted, numbers are printed.
"""

from __future__ import annotations

import argparse

from training.measure import memory_trace
from training.request import contract


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1b", choices=tuple(contract.MODEL_PRESETS))
    parser.add_argument("--layers", type=int, default=None, help="num_layers (default: the preset's).")
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batches", default="1,4,16", help="Comma-separated micro-batch sizes.")
    parser.add_argument("--vocabs", default="32000,128256", help="Comma-separated vocabulary sizes.")
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--no-ac", action="store_true", help="Activation checkpointing off.")
    parser.add_argument(
        "--chunks", default=f"0,{contract.LOSS_CHUNK_TOKENS_DEFAULT}", help="loss_chunk_tokens values."
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chunks = [int(c) for c in args.chunks.split(",")]
    print(f"{args.preset} preset{f' ({args.layers} layers)' if args.layers else ''}, seq {args.seq}, "
          f"AC {'off' if args.no_ac else 'on'}, world {args.world}, bf16; peak GiB per GPU by loss_chunk_tokens")  # fmt: skip
    print("| vocab | micro-batch | " + " | ".join(f"loss_chunk_tokens={c}" for c in chunks) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in chunks) + " |")
    for vocab in (int(v) for v in args.vocabs.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            cells = []
            for chunk in chunks:
                settings = {"model_preset": args.preset, "vocab_size": vocab, "seq_length": args.seq,
                            "batch_size": batch, "activation_checkpointing": not args.no_ac,
                            "precision": "bf16", "loss_chunk_tokens": chunk}  # fmt: skip
                if args.layers:
                    settings["num_layers"] = args.layers
                result = memory_trace.trace_step(settings, world_size=args.world)
                cells.append(f"{result['peak_gib']:.2f}")
            print(f"| {vocab} | {batch} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
