"""Throughput benchmark: our trainer next to a bare FSDP2 loop on the same model and an external one, over a grid,
then each speed lever's effect.

    python -m training.measure.benchmark                      # CPU: a tiny model, fp32, 5 alternating runs (about a minute)
    python -m training.measure.benchmark --preset 1b          # GPU default: the 1B preset at seq 8192
    torchrun --nproc-per-node 8 -m training.measure.benchmark --preset 1b --seq-length 4096 --batch-sizes 1,4,16

Grid: batch size x activation checkpointing x precision (GPU: bf16 and fp16, plus fp8/mxfp8/nvfp4 when
Transformer Engine is installed and the GPU supports them; CPU: fp32). For each cell it prints tokens/s per GPU,
TFLOP/s per GPU, MFU and peak memory for the trainer (``training.trainer.loop.run``: logging, stop-flag
agreement, LR schedule) and for a bare loop (forward, backward, clip, AdamW step; nothing else), and the
trainer's overhead against both: the bare loop shares our model, so only ``external``
(``training.measure.external_baseline``, a loop written from torchtitan's recipe with its own model) can show an
overhead in the model itself. Then, for each lever (``LEVER_CASES``), the trainer's tokens/s with each of its
values, alternating, with the median and the spread (min to max) of the repeats and the effect against the first
value. It prints numbers and asserts nothing about speed. A cell that runs out of GPU memory prints ``OOM`` and
the grid goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from training.contract import hardware, settings_parse, settings_table, shapes
from training.measure import external_baseline
from training.trainer import config, loop
from training.trainer.data import token_files
from training.trainer.distributed import compile as compiling
from training.trainer.distributed import parallel, precision
from training.trainer.observe import metrics

TINY = {"model_preset": "custom", "num_layers": 2, "hidden_size": 128, "num_heads": 4, "ffn_hidden_size": 256,
        "vocab_size": 512}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--preset",
        choices=tuple(shapes.MODEL_PRESETS),
        default="1b" if gpu else None,
        help="Model preset (default: 1b on a GPU, a tiny custom model on CPU).",
    )
    parser.add_argument("--seq-length", type=int, default=8192 if gpu else 64)
    parser.add_argument("--batch-sizes", default="1,2" if gpu else "1,4", help="Comma-separated.")
    parser.add_argument(
        "--precisions", default=None, help="Comma-separated (default: what this machine runs)."
    )
    parser.add_argument(
        "--steps", type=int, default=10 if gpu else 30, help="Steps per cell, warm-up included."
    )
    parser.add_argument("--warmup", type=int, default=3, help="Warm-up steps left out of the figures.")
    parser.add_argument(
        "--loss-chunk-tokens",
        type=int,
        default=settings_table.LOSS_CHUNK_TOKENS_DEFAULT,
        help="Tokens per chunk of the LM head and loss (0: unchunked). Default: the contract's.",
    )
    parser.add_argument(
        "--lever-repeats", type=int, default=3, help="Runs of each lever value (0: skip the levers)."
    )
    parser.add_argument(
        "--levers",
        default=None,
        help="Comma-separated lever names to measure (default: every one of LEVER_CASES).",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3 if gpu else 5,
        help="Runs of each loop per cell, trainer and bare alternating; the median run is reported.",
    )
    return parser.parse_args(argv)  # fmt: skip


def default_precisions(device: torch.device) -> list[str]:
    if device.type != "cuda":
        return ["fp32"]
    capability = torch.cuda.get_device_capability(device)
    runnable = ["bf16", "fp16"]
    if precision.te_available():
        runnable += [p for p in ("fp8", "mxfp8", "nvfp4") if hardware.precision_supported_on(p, capability)]
    return runnable


def make_config(
    args: argparse.Namespace, prec: str, batch: int, ac: bool, workdir: str, **levers: str
) -> config.TrainConfig:
    shape = {"model_preset": args.preset} if args.preset else TINY
    return config.config_from_mapping(
        {
            **shape,
            "precision": prec,
            "seq_length": args.seq_length,
            "batch_size": batch,
            "activation_checkpointing": ac,
            "loss_chunk_tokens": args.loss_chunk_tokens,
            "max_steps": args.steps,
            "throughput_warmup_steps": args.warmup,
            "log_interval": args.steps,
            "lr_warmup_steps": 1,
            "checkpoint_interval": 0,
            "checkpoint_dir": f"{workdir}/checkpoints",
            "model_dir": f"{workdir}/model",
            **levers,
        }
    )


@contextlib.contextmanager
def shared_workdir(env: parallel.DistEnv) -> Iterator[str]:
    """One temporary folder for every rank of a run: made by rank 0, its path broadcast, removed by rank 0 once
    every rank is done with it. The trainer's ranks write one checkpoint folder together (rank 0 makes it, each
    rank writes its files into it), so a folder of each rank's own would leave the others' files nowhere."""
    made = [tempfile.mkdtemp(prefix="benchmark-") if env.rank == 0 else None]
    dist.broadcast_object_list(made, src=0, group=env.cpu_group)
    try:
        yield str(made[0])
    finally:
        dist.barrier(group=env.cpu_group)
        if env.rank == 0:
            shutil.rmtree(str(made[0]), ignore_errors=True)


def bare_loop(cfg: config.TrainConfig, env: parallel.DistEnv) -> dict[str, float]:
    """The minimal FSDP2 training loop on the trainer's model: the baseline the trainer is compared with."""
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = loop.build(cfg, env, plan)
    optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scaler = plan.grad_scaler()
    dataset = token_files.SyntheticTokens(
        cfg.vocab_size, cfg.seq_length, cfg.batch_size, cfg.seed, env.rank, env.world_size
    )
    start = 0.0
    for step in range(cfg.max_steps):
        if step == cfg.throughput_warmup_steps:
            _sync(env.device)
            start = time.perf_counter()
        tokens, targets = token_files.to_device(
            *dataset.next_batch(), env.device
        )  # as the trainer copies them
        with plan.autocast():
            loss = net(tokens, targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(env.device)
    seconds = time.perf_counter() - start
    tokens = (cfg.max_steps - cfg.throughput_warmup_steps) * cfg.batch_size * cfg.seq_length
    meter = metrics.Throughput(
        cfg.shape,
        cfg.seq_length,
        0,
        0,
        env.device,
        cfg.precision,
        settings_parse.lora_parameters(cfg.as_dict()),
    )
    return {**meter.rates(tokens, seconds), "peak_mem_gb": metrics.peak_memory_gb(env.device)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn, env: parallel.DistEnv) -> dict[str, float] | None:
    """Run one measurement with fresh peak-memory statistics; None if it ran out of GPU memory."""
    gc.collect()
    if env.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(env.device)
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        gc.collect()
        if env.device.type == "cuda":
            torch.cuda.empty_cache()


def median_run(runs: list[dict[str, float] | None]) -> dict[str, float] | None:
    """The run with the median tokens/s (None if any run ran out of memory)."""
    if any(run is None for run in runs):
        return None
    ordered = sorted(runs, key=lambda run: run["tokens_per_sec"])  # type: ignore[index]
    return ordered[len(ordered) // 2]


def external_loop(cfg: config.TrainConfig, env: parallel.DistEnv) -> dict[str, float]:
    """``external_baseline.train`` on this cell's architecture (grouped-query attention and tying included, so
    its FLOPs are the ones counted), batch and precision (no activation checkpointing)."""
    shape = {
        name: getattr(cfg, name)
        for name in (*settings_table.ARCHITECTURE_NAMES, "rope_theta", "rms_norm_eps")
    }
    tokens_per_sec = external_baseline.train(
        shape, cfg.seq_length, cfg.batch_size, cfg.max_steps, cfg.throughput_warmup_steps, env.mesh,
        precision.compute_dtype(cfg.precision),
    )  # fmt: skip
    meter = metrics.Throughput(
        cfg.shape,
        cfg.seq_length,
        0,
        0,
        env.device,
        cfg.precision,
        settings_parse.lora_parameters(cfg.as_dict()),
    )
    return {**meter.rates(int(tokens_per_sec), 1.0), "peak_mem_gb": metrics.peak_memory_gb(env.device)}


LEVER_CASES: tuple[tuple[str, tuple[tuple[str, dict[str, str]], ...]], ...] = (
    ("grad_accum_steps", (("1 x batch 4", {"batch_size": "4"}),
                          ("4 x batch 1", {"batch_size": "1", "grad_accum_steps": "4"}))),
    ("activation_checkpointing", (("none", {}), ("full", {"activation_checkpointing": "full"}),
                                  ("selective", {"activation_checkpointing": "selective"}),
                                  ("full every 2", {"activation_checkpointing": "full",
                                                    "activation_checkpointing_interval": "2"}))),
    ("compile", (("false", {"compile": "false"}), ("true", {"compile": "true"}))),
    ("attention_backend", (("math", {"attention_backend": "math"}), ("flash", {"attention_backend": "flash"}))),
    ("adamw_impl", (("foreach", {"adamw_impl": "foreach"}), ("fused", {"adamw_impl": "fused"}))),
    ("gc_interval", (("0 (automatic)", {"gc_interval": "0"}), ("50", {"gc_interval": "50"}))),
    ("async_checkpoint", (("false, save every 5", {"async_checkpoint": "false", "checkpoint_interval": "5"}),
                          ("true, save every 5", {"async_checkpoint": "true", "checkpoint_interval": "5"}))),
)  # fmt: skip
"""Each lever and its values; the first is the reference of the effect column. Checkpoint saves are left out of
the trainer's tokens/s, so ``async_checkpoint`` is timed by wall clock over the whole run (saves included)."""


def lever_effects(args: argparse.Namespace, env: parallel.DistEnv, prec: str, say) -> None:
    """Print each lever's tokens/s per value: median and spread of ``--lever-repeats`` alternating runs."""
    say(f"levers ({prec}, batch {args.batch_sizes.split(',')[0]} unless set, median of {args.lever_repeats} "
        "alternating runs, spread = min..max):")  # fmt: skip
    say(f"{'lever':>24} {'value':>22} {'tokens/s/GPU':>13} {'spread':>17} {'effect':>8}")
    batch = int(args.batch_sizes.split(",")[0])
    chosen = args.levers.split(",") if args.levers else [lever for lever, _ in LEVER_CASES]
    for lever, values in LEVER_CASES:
        if lever not in chosen:
            continue
        wall = lever == "async_checkpoint"
        runs: dict[str, list[float]] = {label: [] for label, _ in values}
        for _ in range(args.lever_repeats):
            for label, overrides in values:
                with shared_workdir(env) as workdir:
                    cfg = make_config(args, prec, batch, False, workdir, **overrides)
                    runs[label].append(_lever_run(cfg, env, wall))
        reference = statistics.median(runs[values[0][0]])
        for label, _ in values:
            median = statistics.median(runs[label])
            spread = f"{min(runs[label]):.0f}..{max(runs[label]):.0f}"
            say(
                f"{lever:>24} {label:>22} {median:>13.0f} {spread:>17} {100 * (median / reference - 1):>+7.1f}%"
            )


def _lever_run(cfg: config.TrainConfig, env: parallel.DistEnv, wall: bool) -> float:
    compiling.reset()
    started = time.perf_counter()
    summary = measure(lambda: loop.run(cfg, env, emit=lambda _: None, final_save=False), env)
    if summary is None:
        return float("nan")
    if wall:  # every step and every save, from the first step on
        return (
            cfg.max_steps
            * cfg.batch_size
            * cfg.grad_accum_steps
            * cfg.seq_length
            / (time.perf_counter() - started)
        )
    return summary["tokens_per_sec"]


def row(cells: list[str]) -> str:
    widths = (9, 6, 4, 8, 13, 12, 7, 11, 9)
    return " ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = parallel.init_distributed()
    say = print if env.is_main else (lambda *_: None)
    precisions = args.precisions.split(",") if args.precisions else default_precisions(env.device)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    gpu = metrics.gpu_name(env.device) or (
        torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "cpu"
    )
    shape = make_config(args, precisions[0], 1, False, "/unused").shape
    say(
        f"benchmark: {args.preset or 'tiny custom'} model ({shape.parameter_count() / 1e6:.1f}M parameters), "
        f"seq {args.seq_length}, {args.steps} steps ({args.warmup} warm-up), median of {args.repeats} alternating "
        f"runs, world size {env.world_size}, {gpu}, loss_chunk_tokens {args.loss_chunk_tokens}"
    )
    say(
        "flops/token = 6*N + 12*layers*hidden*seq (N without the input embedding); MFU vs hardware.PEAK_TFLOPS "
        "(fp8/mxfp8/nvfp4: own peak/bf16 peak)"
    )
    say(
        row(
            [
                "precision",
                "batch",
                "ac",
                "loop",
                "tokens/s/GPU",
                "TFLOP/s/GPU",
                "MFU",
                "peak mem GB",
                "overhead",
            ]
        )
    )
    for prec in precisions:
        for batch in batch_sizes:
            for ac in (False, True):
                ours_runs, bare_runs, external_runs = [], [], []
                for _ in range(args.repeats):  # alternating, so drift and noise hit every loop alike
                    with shared_workdir(env) as workdir:
                        cfg = make_config(args, prec, batch, ac, workdir)
                        ours_runs.append(
                            measure(
                                lambda cfg=cfg: loop.run(cfg, env, emit=lambda _: None, final_save=False), env
                            )
                        )
                        bare_runs.append(measure(lambda cfg=cfg: bare_loop(cfg, env), env))
                        if not ac:
                            external_runs.append(measure(lambda cfg=cfg: external_loop(cfg, env), env))
                ours, bare = median_run(ours_runs), median_run(bare_runs)
                external = median_run(external_runs) if external_runs else None
                spread = _spread(ours_runs)
                cells = [("trainer", ours), ("bare", bare)] + (
                    [("external", external)] if external_runs else []
                )
                for name, result in cells:
                    head = [prec, str(batch), "on" if ac else "off", name]
                    if result is None:
                        say(row([*head, "OOM", "", "", "", ""]))
                        continue
                    overhead = ""
                    if name == "trainer" and bare:
                        overhead = f"{100 * (1 - result['tokens_per_sec'] / bare['tokens_per_sec']):+.1f}%"
                        if external:
                            overhead += f" {100 * (1 - result['tokens_per_sec'] / external['tokens_per_sec']):+.1f}%ext"
                        overhead += f" {spread}"
                    say(row([*head, f"{result['tokens_per_sec']:.0f}", f"{result['tflops_per_gpu']:.3f}",
                             mfu_cell(result), f"{result['peak_mem_gb']:.2f}", overhead]))  # fmt: skip
    if args.lever_repeats:
        lever_effects(args, env, precisions[0], say)
    say("the levers' effects on a GPU are still to be measured (docs/performance.md)")
    dist.destroy_process_group()
    return 0


def mfu_cell(result: dict[str, float]) -> str:
    """MFU against the precision's own peak; a low precision's bf16-equivalent MFU after a slash."""
    if "mfu" not in result:
        return "n/a"
    return f"{result['mfu']:.3f}" + (f"/{result['mfu_bf16']:.3f}" if "mfu_bf16" in result else "")


def _spread(runs: list[dict[str, float] | None]) -> str:
    """``[min..max]`` tokens/s of the repeats."""
    values = [run["tokens_per_sec"] for run in runs if run is not None]
    return f"[{min(values):.0f}..{max(values):.0f}]" if values else ""


if __name__ == "__main__":
    sys.exit(main())
