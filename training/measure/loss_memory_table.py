"""Print the chunked-loss table of docs/measurements.md: the traced per-GPU peak memory of one training step with the
loss unchunked and chunked (``training.measure.memory_trace``), next to the memory plan's closed form
(``training.plan``), over micro-batch sizes and vocabularies.

    python -m training.measure.loss_memory_table                  # 1b, seq 8192, AC, world 8, micro-batch 1/4/16
    python -m training.measure.loss_memory_table --layers 4       # a shallower model, where tracing takes too long

Each traced cell is one trace (about 2-15 s on a 2-core CPU); nothing is asserted, numbers are printed. The closed
form needs no torch (:func:`closed_form_gib`; the docs test recomputes that column).
"""

from __future__ import annotations

import argparse
from typing import Any

from training.contract import settings_table, shapes
from training.plan import inputs, memory


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.loss_memory_table", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--preset", default="1b", choices=tuple(shapes.MODEL_PRESETS))
    parser.add_argument("--layers", type=int, default=None, help="num_layers (default: the preset's).")
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batches", default="1,4,16", help="Comma-separated micro-batch sizes.")
    parser.add_argument("--vocabs", default="32000,128256", help="Comma-separated vocabulary sizes.")
    parser.add_argument(
        "--world", type=int, default=8, help="World size: a multiple of 8 (ml.p6-b200.48xlarge)."
    )
    parser.add_argument("--no-ac", action="store_true", help="Activation checkpointing off.")
    parser.add_argument(
        "--chunks", default=f"0,{settings_table.LOSS_CHUNK_TOKENS_DEFAULT}", help="loss_chunk_tokens values."
    )
    return parser.parse_args(argv)


def settings(args: argparse.Namespace, vocab: int, batch: int, chunk: int) -> dict[str, Any]:
    """The trainer settings of one cell."""
    values: dict[str, Any] = {
        "model_preset": args.preset,
        "vocab_size": vocab,
        "seq_length": args.seq,
        "batch_size": batch,
        "activation_checkpointing": not args.no_ac,
        "precision": "bf16",
        "loss_chunk_tokens": chunk,
    }
    if args.layers:
        values["num_layers"] = args.layers
    return values


def closed_form_gib(args: argparse.Namespace, vocab: int, batch: int, chunk: int) -> float:
    """The plan's live tensors (no allowance, which no tracer sees) for one cell, on ml.p6-b200.48xlarge."""
    values = settings(args, vocab, batch, chunk)
    top = {name: values.pop(name) for name in settings_table.TOP_LEVEL_SETTINGS if name in values}
    request = {**top, "instance_count": args.world // 8, "hyperparameters": values}
    return memory.estimate_memory(inputs.setup_from_request(request)).tensors_gib


def header(args: argparse.Namespace, chunks: list[int]) -> list[str]:
    columns = [f"loss_chunk_tokens={c} {kind}" for c in chunks for kind in ("traced", "closed form")]
    return [
        "| vocabulary | micro-batch | " + " | ".join(columns) + " |",
        "|---:|---:|" + "---:|" * len(columns),
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from training.measure import memory_trace  # torch: only to trace

    chunks = [int(c) for c in args.chunks.split(",")]
    print(f"{args.preset} preset{f' ({args.layers} layers)' if args.layers else ''}, seq {args.seq}, "
          f"AC {'off' if args.no_ac else 'on'}, world {args.world}, bf16; peak GiB per GPU (live tensors)")  # fmt: skip
    print("\n".join(header(args, chunks)))
    for vocab in (int(v) for v in args.vocabs.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            cells = []
            for chunk in chunks:
                traced = memory_trace.trace_step(settings(args, vocab, batch, chunk), world_size=args.world)
                cells += [f"{traced['peak_gib']:.2f}", f"{closed_form_gib(args, vocab, batch, chunk):.2f}"]
            print(f"| {vocab} | {batch} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
