"""Numerics of two kernels the trainer chooses between, on this machine's device, against a higher-precision
reference on fresh random inputs (never zeros):

* the loss: the chunked linear cross-entropy (``training.trainer.loss``, ``loss_chunk_tokens``) against the unchunked
  one, value and gradients (of the hidden states and of the head), both in bf16, and each against the unchunked
  loss on fp32 copies of the same inputs;
* attention: every SDPA backend (cuDNN, Flash, memory-efficient, math), pinned alone, on the block's own call
  (``model.causal_attention``: causal, grouped-query) in bf16, output and gradients against math on fp32 copies; a
  backend that cannot run the inputs is named with torch's reason.

Errors are relative: ||x - ref|| / ||ref|| (METHOD: bf16 operands land between 1e-3 and 1e-2; NaN never passes).

    python -m training.measure.gpu_report.kernel_checks --json OUT.json --tokens 8192 --hidden 2048 --vocab 128256 \\
        --chunk 2048 --batch 1 --heads 32 --kv-heads 8 --seq 4096 --head-dim 64
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BF16_LIMIT = 2e-2
"""A bf16 result within this relative error of the fp32 reference passes (bf16 keeps 8 bits of mantissa: ~4e-3 per
rounding; sums of thousands of terms land between 1e-3 and 1e-2)."""


def relative(x, ref) -> float:
    import torch

    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return float("nan")
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def passes(errors: dict[str, float]) -> bool:
    """Every relative error within ``BF16_LIMIT``; a NaN (a non-finite output or gradient) fails wherever it is
    (``max`` would skip a NaN that is not first: every comparison with it is false)."""
    return all(e == e and e <= BF16_LIMIT for e in errors.values())


def loss_check(device, tokens: int, hidden: int, vocab: int, chunk: int) -> dict[str, Any]:
    import torch

    from training.trainer import loss

    generator = torch.Generator(device="cpu").manual_seed(7)
    h = (torch.randn(tokens, hidden, generator=generator) * 1.0).to(device)
    w = (torch.randn(vocab, hidden, generator=generator) * 0.02).to(device)
    t = torch.randint(0, vocab, (tokens,), generator=generator).to(device)

    def run(dtype, chunk_tokens: int):
        hx = h.detach().to(dtype, copy=True).requires_grad_()
        wx = w.detach().to(dtype, copy=True).requires_grad_()
        value = loss.linear_cross_entropy(hx, wx, t, chunk_tokens)
        value.backward()
        return value.detach(), hx.grad, wx.grad

    reference = run(torch.float32, 0)
    unchunked, chunked = run(torch.bfloat16, 0), run(torch.bfloat16, chunk)
    names = ("loss", "hidden_grad", "head_grad")
    return {
        "shape": {"tokens": tokens, "hidden": hidden, "vocab": vocab, "chunk": chunk},
        "chunked_vs_unchunked": {n: relative(a, b) for n, a, b in zip(names, chunked, unchunked, strict=True)},
        "chunked_vs_fp32": {n: relative(a, b) for n, a, b in zip(names, chunked, reference, strict=True)},
        "unchunked_vs_fp32": {n: relative(a, b) for n, a, b in zip(names, unchunked, reference, strict=True)},
        "values": {"fp32": float(reference[0]), "bf16_unchunked": float(unchunked[0]), "bf16_chunked": float(chunked[0])},
    }  # fmt: skip


def sdpa_check(
    device, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int
) -> list[dict[str, Any]]:
    import torch
    from torch.nn.attention import sdpa_kernel

    from training.trainer.model import attention, decoder

    generator = torch.Generator(device="cpu").manual_seed(11)
    q = torch.randn(batch, heads, seq, head_dim, generator=generator).to(device)
    k = torch.randn(batch, kv_heads, seq, head_dim, generator=generator).to(device)
    v = torch.randn(batch, kv_heads, seq, head_dim, generator=generator).to(device)
    g = torch.randn(batch, heads, seq, head_dim, generator=generator).to(device)

    def run(dtype, backend):
        inputs = [x.detach().to(dtype, copy=True).requires_grad_() for x in (q, k, v)]
        with sdpa_kernel([backend]):
            out = decoder.causal_attention(*inputs)
        out.backward(g.to(dtype))
        return [out.detach(), *(x.grad for x in inputs)]

    reference = run(torch.float32, attention.BACKENDS["math"])
    rows = []
    for name, backend in attention.BACKENDS.items():
        try:
            got = run(torch.bfloat16, backend)
        except RuntimeError as error:  # torch: "No available kernel", or the backend's own refusal
            rows.append({"backend": name, "ran": False, "why": " ".join(str(error).split())[:300]})
            continue
        errors = {
            n: relative(a, b) for n, a, b in zip(("out", "dq", "dk", "dv"), got, reference, strict=True)
        }
        rows.append({"backend": name, "ran": True, "errors": errors, "passed": passes(errors)})
    return rows


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.measure.gpu_report.kernel_checks")
    parser.add_argument("--json", required=True)
    for name, default in (("tokens", 256), ("hidden", 64), ("vocab", 256), ("chunk", 64), ("batch", 1),
                          ("heads", 4), ("kv-heads", 2), ("seq", 64), ("head-dim", 16)):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=default)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "bf16_limit": BF16_LIMIT,
    }
    result["loss"] = loss_check(device, args.tokens, args.hidden, args.vocab, args.chunk)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    result["sdpa"] = sdpa_check(device, args.batch, args.heads, args.kv_heads, args.seq, args.head_dim)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    for row in result["sdpa"]:
        print(
            f"sdpa {row['backend']}: "
            + (json.dumps(row["errors"]) if row["ran"] else f"did not run: {row['why']}")
        )
    print(f"loss chunked vs unchunked: {json.dumps(result['loss']['chunked_vs_unchunked'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
