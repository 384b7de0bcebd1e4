"""Measure one FSDP2 training step's per-GPU memory on a CPU machine, without a GPU: the measured reference for
memory estimates.

    python -m training.measure.memory_trace --preset 1b --seq 8192 --batch 4 --ac --world 8 --json
    python -m training.measure.memory_trace --preset 1b --seq 8192 --batch 2 --ac selective --accum 4
    python -m training.measure.memory_trace --request run.json    # an execution input, as `plan` reads it

The trainer's own model code (the torch path: ``model.build_model``, ``parallel.shard_model``, the trainer's AdamW
and gradient clipping) runs one step for rank 0 of ``world`` ranks, on fake tensors (``FakeTensorMode``: shapes and
dtypes, no data, no memory) and a fake process group (collectives do nothing), with
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` counting every live tensor by category. One warm-up
step runs first, outside the tracker: DTensor's first sharding propagation allocates full-size tensors once.

CPU kernels save different tensors than CUDA's, so two are swapped for what CUDA runs: attention uses the flash
kernel (``SDPBackend.FLASH_ATTENTION``: CPU flash saves output and log-sum-exp, like CUDA flash; with
``attention_backend`` math the math kernel, whose composite of matmuls and softmax is the same on both), and RMSNorm
uses ``FusedRMSNormStandIn``, which allocates what CUDA's fused RMSNorm kernel allocates (output and fp32 rstd in
forward, saving input and rstd; input and weight gradients in backward). On fake tensors only outputs are
allocated, never a kernel's internal workspace.

Not counted (the tracker sees live tensors only): the CUDA context, cuBLAS/cuDNN/TE workspaces, NCCL buffers and
the caching allocator's fragmentation. Transformer Engine precisions cannot be traced here (TE needs a GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from training.contract import hardware, settings_parse, settings_table, shapes
from training.models import settings as model_settings
from training.plan import inputs
from training.plan.memory_terms import GIB

PARTS: Mapping[str, str] = {
    "Sharded Param": "sharded_parameters",
    "Unsharded Param": "unsharded_parameters",
    "Buffer": "buffers",
    "Sharded Grad": "sharded_gradients",
    "Unsharded Grad": "unsharded_gradients",
    "OptState": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "All Gather": "all_gather_buffers",
    "Reduce Scatter": "reduce_scatter_buffers",
    "Inputs": "inputs",
}
"""FSDPMemTracker's categories (``_FSDPRefType`` values) -> the names in this module's output."""


class FusedRMSNormStandIn(torch.autograd.Function):
    """What CUDA's fused RMSNorm (``torch._fused_rms_norm``) allocates and saves: forward returns the output (input
    dtype) and saves the input and the fp32 rstd (one per row); backward returns the input and weight gradients.

    On real tensors it computes RMSNorm exactly (fp32 internally, like ``F.rms_norm``); on fake tensors it only
    allocates those outputs, as the CUDA kernel does (the CPU math's fp32 temporaries would otherwise be counted).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        if _is_fake(x):
            rstd = x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)
            out = torch.empty_like(x)
        else:
            rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
            out = (x.float() * rstd * weight.float()).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        if _is_fake(x):
            return torch.empty_like(x), torch.empty_like(weight), None
        normed = x.float() * rstd
        grad_weight = (grad_out.float() * normed).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        grad_normed = grad_out.float() * weight.float()
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


def _is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def use_fused_rms_norm(net: nn.Module) -> None:
    """Make every ``nn.RMSNorm`` in ``net`` run ``FusedRMSNormStandIn`` (its forward, per instance)."""
    for module in net.modules():
        if isinstance(module, nn.RMSNorm):
            module.forward = _fused_forward(module)  # type: ignore[method-assign]


def _fused_forward(norm: nn.RMSNorm):
    eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps

    def forward(x: torch.Tensor) -> torch.Tensor:
        return FusedRMSNormStandIn.apply(x, norm.weight, eps)

    return forward


def trace_settings(
    hyperparameters: Mapping[str, Any], architecture: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The contract's checked settings (``settings_parse.parse_hyperparameters``; ``architecture``: an
    ``init_from`` model's settings, ``training.plan.inputs.trimmed_architecture``), refusing what cannot be traced
    here."""
    values = settings_parse.parse_hyperparameters(hyperparameters, architecture)
    if values["precision"] in hardware.TE_PRECISIONS:
        raise settings_table.ContractError(
            "precision",
            f"{values['precision']} runs through Transformer Engine, which cannot be traced without a GPU; "
            "trace with one of fp32, fp16, bf16 (--precision bf16 traces a request's bf16 twin)",
        )
    return values


def trace_step(
    hyperparameters: Mapping[str, Any], *, world_size: int, architecture: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Peak memory of rank 0 in one training step (forward, backward, gradient clipping, AdamW step) with
    ``world_size`` ranks, and its parts, for the trainer settings ``hyperparameters`` (contract names; model
    dims from ``model_preset`` unless given).

    Returns ``{"peak_gib", "parts_gib": {part: GiB at the peak}, "peak_by_module_gib": {module: GiB},
    "settings", "world_size", "trace_seconds"}``. Raises ``settings_table.ContractError`` on a bad setting, before
    anything is built.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or not 1 <= world_size <= 1_000_000:
        raise settings_table.ContractError(
            "world_size", f"must be an integer in [1, 1000000]; got {world_size!r}"
        )
    values = trace_settings(hyperparameters, architecture)
    if dist.is_initialized():
        raise RuntimeError(
            "memory_trace: a process group is already initialized in this process; trace in a fresh process"
        )
    started = time.perf_counter()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        snapshot, modules = _traced_step(values, world_size)
    finally:
        dist.destroy_process_group()
    parts = {PARTS.get(key, key): value / GIB for key, value in snapshot.items() if key != "Total"}
    return {
        "peak_gib": snapshot["Total"] / GIB,
        "parts_gib": parts,
        "peak_by_module_gib": modules,
        "settings": {key: values[key] for key in _REPORTED if key in values},
        "world_size": world_size,
        "trace_seconds": time.perf_counter() - started,
    }


def trace_request(
    request: Mapping[str, Any], architecture: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """:func:`trace_step` for an execution input (the workflow's fields, as ``training.plan`` reads them),
    with the GPUs its states are sharded over (its instance type and count; with hybrid sharding one replica's:
    a rank of a replicas x shards mesh holds what a rank of a 1-D mesh of the shards holds): the measured reference
    of that request's plan."""
    shards = inputs.setup_from_request(request, architecture).shard_size
    return trace_step(inputs.trainer_settings(request), world_size=shards, architecture=architecture)


_REPORTED = (
    "model_preset",
    *settings_table.ARCHITECTURE_NAMES,
    "seq_length",
    "batch_size",
    "activation_checkpointing",
    "activation_checkpointing_interval",
    "grad_accum_steps",
    "precision",
    "loss_chunk_tokens",
    "position_encoding",
    "lora_rank",
    "attention_backend",
)


def _traced_step(values: Mapping[str, Any], world_size: int) -> tuple[dict[str, int], dict[str, float]]:
    """Build, shard, warm up and trace one step on fake tensors; the tracker's peak snapshot (bytes by category)
    and each module's peak (GiB)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from training.trainer.distributed import activation_checkpoint, levers, parallel, precision
    from training.trainer.model import decoder, lora

    shape = model_settings.model_config(values)  # as the trainer's loop builds it (TrainConfig.shape)
    mesh = init_device_mesh("cpu", (world_size,))
    device = torch.device("cpu")
    # the kernel CUDA runs: Flash (what auto pins first among those that save the same), or math when asked for
    kernel = SDPBackend.MATH if values["attention_backend"] == "math" else SDPBackend.FLASH_ATTENTION
    with FakeTensorMode(), sdpa_kernel(kernel):
        net = decoder.build_model(
            shape,
            use_te=False,
            te_params_dtype=torch.float32,
            loss_chunk_tokens=values["loss_chunk_tokens"],
        )
        adapters = lora.LoraSettings.of(values)
        if adapters is not None:  # as loop.build: adapters on the blocks' linear layers, the rest frozen
            lora.apply(net, adapters)
        activation_checkpoint.apply(
            net.layers, values["activation_checkpointing"], values["activation_checkpointing_interval"]
        )
        use_fused_rms_norm(net)
        dtype = precision.compute_dtype(values["precision"])
        parallel.shard_model(net, mesh, parallel.mixed_precision(dtype), device)
        # The trainer's optimizer on a GPU (loop._fresh_state): adamw_impl auto is the fused kernel on CUDA.
        impl = levers.adamw_impl(values["adamw_impl"], torch.device("cuda"))
        optimizer = levers.build_optimizer(
            [p for p in net.parameters() if p.requires_grad],
            impl,
            values["learning_rate"],
            values["weight_decay"],
        )
        batch = (values["batch_size"] * values["grad_accum_steps"], values["seq_length"])
        tokens = torch.randint(0, shape.vocab_size, batch, device=device)
        targets = torch.randint(0, shape.vocab_size, batch, device=device)
        max_norm = values["grad_clip"] if values["grad_clip"] > 0 else math.inf
        micro = values["grad_accum_steps"]
        _step(net, optimizer, tokens, targets, max_norm, micro)  # warm-up, outside the tracker
        tracker = FSDPMemTracker(net, optimizer)
        tracker.track_inputs((tokens, targets))
        with tracker:
            _step(net, optimizer, tokens, targets, max_norm, micro, tracker)
        peak = tracker.get_tracker_snapshot("peak")
        modules = _module_peaks(tracker)
    return dict(next(iter(peak.values()))), modules


def _step(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    max_norm: float,
    micro_batches: int = 1,
    tracker: Any = None,
) -> None:
    """One training step as ``optimizer_step.train_step`` runs it (no loss scaler: fp16 is traced as bf16's memory): each
    micro-batch's forward and backward, gradients reduced on the last only, then clipping and AdamW. The
    tracker's per-module statistics are reset between micro-batches (it follows one forward per module); its
    peak covers them all."""
    pieces = list(zip(tokens.chunk(micro_batches), targets.chunk(micro_batches), strict=True))
    for index, (x, y) in enumerate(pieces):
        if micro_batches > 1:
            net.set_requires_gradient_sync(index == micro_batches - 1)
        if index and tracker is not None:
            tracker.reset_mod_stats()
        (net(x, y) / micro_batches).backward()
    torch.nn.utils.clip_grad_norm_([p for p in net.parameters() if p.requires_grad], max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _module_peaks(tracker: Any) -> dict[str, float]:
    """Each tracked module's local peak (GiB on rank 0's device), by fully qualified name."""
    peaks: dict[str, float] = {}
    for stats in tracker.memory_tracking.values():
        if stats.local_peak:
            peaks[stats.mod_fqn] = max(stats.local_peak.values()) / GIB
    return peaks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.memory_trace", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--preset", default="1b", help=f"One of {', '.join(shapes.MODEL_PRESET_NAMES)}.")
    parser.add_argument("--layers", type=int, default=None, help="num_layers (default: the preset's).")
    parser.add_argument("--vocab", type=int, default=None, help="vocab_size (default: the preset's).")
    parser.add_argument("--seq", type=int, default=8192, help="seq_length.")
    parser.add_argument("--batch", type=int, default=1, help="Micro-batch size per GPU.")
    parser.add_argument(
        "--ac",
        nargs="?",
        const="full",
        default=None,
        help="Activation checkpointing: full (bare --ac) or selective.",
    )
    parser.add_argument("--ac-interval", type=int, default=None, help="Checkpoint every k-th block.")
    parser.add_argument("--accum", type=int, default=None, help="grad_accum_steps (micro-batches per step).")
    parser.add_argument("--world", type=int, default=8, help="World size (GPUs in all).")
    parser.add_argument(
        "--precision",
        help="fp32, fp16 or bf16 (default bf16; with --request, the request's: this replaces it, e.g. bf16 for the "
        "twin of an fp8, mxfp8 or nvfp4 request, which needs a GPU).",
    )
    parser.add_argument(
        "--loss-chunk-tokens",
        type=int,
        default=None,
        help="Tokens per loss chunk (0: unchunked; default: the contract's).",
    )
    parser.add_argument(
        "--request",
        metavar="FILE",
        help="Trace an execution input (a JSON file, as `plan` reads it) instead of the options above.",
    )
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings: dict[str, Any] = {
        "model_preset": args.preset,
        "num_layers": args.layers,
        "vocab_size": args.vocab,
        "seq_length": args.seq,
        "batch_size": args.batch,
        "activation_checkpointing": args.ac,
        "activation_checkpointing_interval": args.ac_interval,
        "grad_accum_steps": args.accum,
        "precision": args.precision or "bf16",
        "loss_chunk_tokens": args.loss_chunk_tokens,
    }
    settings = {key: value for key, value in settings.items() if value is not None}
    try:
        architecture = inputs.trimmed_architecture(args.preset, args.layers, args.vocab)
        if (
            architecture is not None
        ):  # another family's named size: its layers and vocabulary are not settings
            settings = {
                k: v for k, v in settings.items() if k not in ("model_preset", "num_layers", "vocab_size")
            }
        if args.request:
            request = json.loads(Path(args.request).read_text(encoding="utf-8"))
            if not isinstance(request, dict):
                raise settings_table.ContractError("request", "the execution input must be a JSON object")
            result = trace_request({**request, "precision": args.precision} if args.precision else request)
        else:
            result = trace_step(settings, world_size=args.world, architecture=architecture)
    except (settings_table.ContractError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    print(f"peak {result['peak_gib']:.3f} GiB per GPU (rank 0 of {result['world_size']}), traced in "
          f"{result['trace_seconds']:.1f} s")  # fmt: skip
    for part, gib in sorted(result["parts_gib"].items(), key=lambda item: -item[1]):
        print(f"  {part:<24} {gib:8.3f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
