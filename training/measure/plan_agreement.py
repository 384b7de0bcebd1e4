"""The memory plan's closed form (``training.plan``) against traced FSDP2 steps (``training.measure.memory_trace``):
the agreement table of docs/measurements.md (a docs test recomputes its configurations and closed-form column).

``python -m training.measure.plan_agreement [--json] [--rows N,M] [--presets A,B]`` traces each configuration of :data:`ROWS` on this CPU
(a few seconds each) and prints the closed form's live tensors next to the traced peak (both without the
allowance, which no tracer sees) and their difference. Layer counts are shrunk where noted (``layers``): the
trace's time grows with the layers, the agreement does not depend on them (every per-layer term is traced in
each row). Transformer Engine precisions cannot be traced without a GPU: their rows show the closed form only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from training.contract import hardware, settings_table, shapes
from training.plan import inputs, memory

TOLERANCE = 0.05
"""The closed form must be within 5% of every traced row."""


@dataclass(frozen=True)
class Row:
    preset: str
    layers: int
    vocab: int
    batch: int
    ac: bool | str
    world: int
    seq: int = 8192
    precision: str = "bf16"
    loss_chunk_tokens: int | None = None
    position_encoding: str | None = None
    ac_interval: int = 1
    accum: int = 1
    attention: str | None = None

    def architecture(self) -> dict[str, Any] | None:
        """For a named size of another family than the flat settings' (whose layers and vocabulary are not
        settings): the ``init_from``-style settings of its first ``layers`` blocks with ``vocab`` entries
        (``inputs.trimmed_architecture``); None for a Llama preset."""
        return inputs.trimmed_architecture(self.preset, self.layers, self.vocab)

    def request(self) -> dict[str, Any]:
        """The execution input of this row (on ml.p6-b200.48xlarge: 8 GPUs per instance); with
        :meth:`architecture` for a family's named size."""
        hyperparameters: dict[str, Any] = {"model_preset": self.preset, "vocab_size": self.vocab}
        if (
            self.architecture() is not None
        ):  # the model comes from the architecture, as from an init_from folder
            hyperparameters = {}
        if self.world > 8:  # the trace shards over every rank (a 1-D mesh), whatever auto would choose
            hyperparameters["data_parallel_replicate"] = 1
        if self.loss_chunk_tokens is not None:
            hyperparameters["loss_chunk_tokens"] = self.loss_chunk_tokens
        if self.position_encoding is not None:
            hyperparameters["position_encoding"] = self.position_encoding
        if self.ac_interval != 1:
            hyperparameters["activation_checkpointing_interval"] = self.ac_interval
        if self.accum != 1:
            hyperparameters["grad_accum_steps"] = self.accum
        if self.attention is not None:
            hyperparameters["attention_backend"] = self.attention
        return {
            "precision": self.precision,
            "num_layers": self.layers,
            "batch_size": self.batch,
            "seq_length": self.seq,
            "activation_checkpointing": self.ac,
            "instance_type": hardware.DEFAULT_INSTANCE_TYPE,
            "instance_count": self.world // 8,
            "hyperparameters": hyperparameters,
        }

    @property
    def traceable(self) -> bool:
        return self.precision not in hardware.TE_PRECISIONS

    def label(self) -> str:
        full = shapes.MODEL_PRESETS[self.preset].num_layers
        layers = f"{self.layers}/{full}" if self.layers != full else str(full)
        tokens = self.loss_chunk_tokens
        if tokens is None:
            tokens = settings_table.HYPERPARAMETERS_BY_NAME["loss_chunk_tokens"].default
        chunk = " loss unchunked" if tokens == 0 else f" loss chunk {tokens}"
        position = "" if self.position_encoding in (None, "rope") else f" {self.position_encoding} position"
        ac = {True: "AC", False: "no AC", "full": "AC", "none": "no AC"}.get(self.ac, f"{self.ac} AC")
        if self.ac_interval != 1:
            ac += f" every {self.ac_interval}"
        accum = f" accum {self.accum}" if self.accum != 1 else ""
        attention = f" {self.attention} attention" if self.attention else ""
        seq = f" seq {self.seq}" if self.seq != 8192 else ""
        return (
            f"{self.preset} L{layers} V{self.vocab} mb{self.batch}{seq} {ac} "
            f"W{self.world} {self.precision}{chunk}{position}{accum}{attention}"
        )


ROWS: tuple[Row, ...] = (
    Row("1b", 16, 32_000, 1, False, 8),
    Row("1b", 16, 32_000, 4, True, 8),
    Row("1b", 16, 32_000, 1, True, 16),
    Row("1b", 16, 32_000, 4, False, 16),
    Row("1b", 16, 128_256, 1, False, 8),
    Row("1b", 16, 128_256, 4, True, 16),
    Row("1b", 4, 128_256, 1, True, 8),
    Row("8b", 4, 32_000, 1, False, 8),
    Row("8b", 4, 32_000, 1, True, 8),
    Row("8b", 4, 32_000, 4, True, 16),
    Row("8b", 4, 32_000, 4, False, 8),
    Row("8b", 4, 128_256, 1, True, 16),
    Row("8b", 4, 128_256, 4, False, 16),
    Row("8b", 8, 128_256, 1, False, 8),
    Row("1b", 16, 32_000, 4, True, 8, loss_chunk_tokens=0),
    Row("8b", 4, 128_256, 1, False, 16, loss_chunk_tokens=0),
    Row("1b", 4, 32_000, 2, True, 8, precision="fp32"),
    Row("8b", 2, 128_256, 1, False, 16, precision="fp32"),
    Row("1b", 16, 32_000, 1, False, 8, position_encoding="none"),
    Row("llama3.1-8b", 4, 128_256, 1, False, 8),
    Row("llama3.1-8b", 4, 128_256, 1, True, 16),
    Row("llama3.1-70b", 2, 128_256, 1, True, 16),
    Row("llama3.2-1b", 16, 128_256, 1, False, 8),
    Row("llama3.2-1b", 16, 128_256, 4, True, 16),
    Row("llama3.2-3b", 4, 128_256, 2, False, 8),
    Row("1b", 16, 32_000, 2, "selective", 8),
    Row("8b", 4, 128_256, 1, "selective", 16),
    Row("llama3.1-8b", 4, 128_256, 1, "selective", 16),
    Row("llama3.2-1b", 16, 128_256, 2, "selective", 8),
    Row("1b", 16, 32_000, 2, "full", 8, ac_interval=2),
    Row("8b", 4, 32_000, 1, "full", 8, ac_interval=3),
    Row("1b", 8, 32_000, 2, "selective", 8, ac_interval=2),
    Row("1b", 16, 32_000, 1, False, 8, accum=4),
    Row("1b", 16, 32_000, 2, "full", 8, accum=2),
    Row("8b", 4, 128_256, 1, "selective", 16, accum=2),
    Row("1b", 2, 32_000, 2, False, 8, seq=2048, attention="math"),
    Row("1b", 2, 32_000, 2, True, 8, seq=2048, attention="math"),
    Row("llama3.2-1b", 2, 32_000, 2, False, 8, seq=2048, attention="math"),
    Row("1b", 2, 32_000, 1, True, 8, seq=4096, precision="fp32", attention="math"),
    Row("llama3.2-1b", 4, 32_000, 2, "selective", 8, seq=2048, attention="math"),
    Row("1b", 4, 32_000, 2, "full", 8, seq=4096, ac_interval=2, attention="math"),
    Row("1b", 4, 32_000, 1, False, 8, attention="math"),
    Row("qwen2.5-7b", 2, 32_000, 1, False, 8),
    Row("qwen3-8b", 2, 32_000, 2, True, 8),
    Row("qwen3-32b", 2, 32_000, 1, False, 8),
    Row("mistral-7b-v0.3", 2, 32_000, 2, True, 8),
    Row("gemma3-12b", 2, 32_000, 1, False, 8),
    Row("gemma3-12b", 2, 32_000, 2, True, 8),
    Row("gemma3-27b", 2, 32_000, 1, False, 16),
    Row("1b", 16, 32_000, 1, False, 8, precision="mxfp8"),
    Row("1b", 16, 32_000, 16, True, 8, precision="mxfp8"),
    Row("8b", 32, 128_256, 4, True, 8, precision="fp8"),
)
"""At least 12 traced configurations: presets 1b and 8b, micro-batch 1 and 4, AC on and off, world size 8 and 16,
vocabulary 32000 and 128256 (8b with 4 or 8 of its 32 layers), the loss chunked (the contract's default) and
unchunked, fp32 (activations and gathered weights in 4 bytes), RoPE (the default) and none; the Llama 3.x presets
(grouped-query attention with 8 key/value heads, llama3 RoPE scaling; 3.2 1B and 3B with tied embeddings); each
activation checkpointing mode (selective, also with grouped-query attention; full on every k-th block, selective on
every other block) and gradient
accumulation (without AC, with full AC, with selective AC); ``attention_backend`` math (its fp32 score matrix: without
and with AC, grouped-query attention, fp32, selective, every other block); each other family's named sizes (2 of their blocks, a 32,000 vocabulary: Qwen 2.5's q/k/v
bias, Qwen 3's query/key norms and, for 32B, a query wider than the hidden size, Mistral, Gemma 3's (1 + w) norms
after attention and the MLP, GeGLU, and a sliding-window layer past the window beside a global one); then TE rows
(closed form only)."""


def closed_form_gib(row: Row) -> float:
    return memory.estimate_memory(inputs.setup_from_request(row.request(), row.architecture())).tensors_gib


def evaluate(row: Row) -> dict[str, Any]:
    """The row's closed form, and when traceable its traced peak and the relative difference."""
    estimate = closed_form_gib(row)
    result: dict[str, Any] = {"config": row.label(), "closed_form_gib": round(estimate, 3)}
    if not row.traceable:
        result.update(traced_gib=None, difference=None, note="TE precision: not traceable without a GPU")
        return result
    from training.measure import memory_trace  # torch: only for the traced rows

    traced = memory_trace.trace_request(row.request(), row.architecture())
    result.update(
        traced_gib=round(traced["peak_gib"], 3),
        difference=round(estimate / traced["peak_gib"] - 1, 4),
        trace_seconds=round(traced["trace_seconds"], 1),
    )
    return result


def format_table(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| configuration | closed form (GiB) | traced (GiB) | difference |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        traced = "not traceable (TE)" if r["traced_gib"] is None else f"{r['traced_gib']:.2f}"
        diff = "" if r["difference"] is None else f"{100 * r['difference']:+.1f}%"
        lines.append(f"| {r['config']} | {r['closed_form_gib']:.2f} | {traced} | {diff} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.plan_agreement", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--rows", help="comma-separated row numbers (0-based) to run; default all")
    parser.add_argument("--presets", help="comma-separated model presets: only their rows (e.g. llama3.1-8b)")
    return parser.parse_args(argv)


def selected(args: argparse.Namespace) -> list[Row]:
    """The rows ``--rows`` names (all by default), of the presets ``--presets`` names (all by default)."""
    rows = [ROWS[int(i)] for i in args.rows.split(",")] if args.rows else list(ROWS)
    presets = getattr(args, "presets", None)
    return [row for row in rows if row.preset in presets.split(",")] if presets else rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows = selected(args)
    results = [evaluate(row) for row in rows]
    print(json.dumps(results, indent=2) if args.json else format_table(results))
    worst = max((abs(r["difference"]) for r in results if r["difference"] is not None), default=0.0)
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
