"""The training loop: build, shard, resume, train (AdamW, warm-up + cosine LR, grad clipping), log, checkpoint,
stop on SIGTERM, save the model."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from training import contract
from training.trainer import checkpoint, data, metrics, model, parallel, precision
from training.trainer.config import TrainConfig

MIN_LR_RATIO = 0.1


def lr_factor(step: int, warmup_steps: int, max_steps: int) -> float:
    """Multiplier of the peak LR at ``step`` (0-based): linear warm-up, then cosine decay to MIN_LR_RATIO."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def set_determinism(cfg: TrainConfig) -> None:
    torch.manual_seed(cfg.seed)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def build(cfg: TrainConfig, env: parallel.DistEnv, plan: precision.PrecisionPlan) -> model.Transformer:
    """The sharded, initialized model for ``cfg`` (shared with the benchmark's bare loop)."""
    with plan.init_context():
        net = model.build_model(
            cfg.shape,
            use_te=plan.recipe is not None,
            activation_checkpointing=cfg.activation_checkpointing,
            te_params_dtype=torch.bfloat16 if plan.quantized_init else torch.float32,
        )
    policy = parallel.mixed_precision(plan.dtype)
    parallel.shard_model(net, env.mesh, policy, env.device)
    model.init_weights(net, cfg.seed)
    return net


def _value(tensor: torch.Tensor) -> float:
    return float((tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).item())


def run(
    cfg: TrainConfig, env: parallel.DistEnv, emit: Callable[[str], None] = print, final_save: bool = True
) -> dict[str, Any]:
    """Train to ``cfg.max_steps`` (or until SIGTERM); rank 0 emits the config, step and summary lines.

    ``final_save=False`` (the benchmark) skips the end-of-run checkpoint and model file. Returns the summary
    metrics (on every rank)."""
    set_determinism(cfg)
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = build(cfg, env, plan)
    optimizer = torch.optim.AdamW(
        net.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, cfg.lr_warmup_steps, cfg.max_steps)
    )
    scaler = plan.grad_scaler()
    dataset = data.make_dataset(cfg, env.rank, env.world_size)
    manager = checkpoint.CheckpointManager(
        cfg.checkpoint_dir, cfg.keep_checkpoints, env, resume_dir=checkpoint.resume_channel_dir()
    )
    say = emit if env.is_main else (lambda _line: None)
    say(
        contract.format_config_line(
            {
                **cfg.as_dict(),
                "world_size": env.world_size,
                "device": env.device.type,
                "gpu": metrics.gpu_name(env.device) or "none",
                "compute_dtype": str(plan.dtype).removeprefix("torch."),
                "parameters": cfg.shape.parameter_count(),
            }
        )
    )

    step = 0
    resumed = manager.load_latest(net, optimizer)
    if resumed is not None:
        step = int(resumed["step"])
        dataset.load_state_dict(resumed["data"])
        scheduler.load_state_dict(resumed["scheduler"])
        if scaler is not None and resumed.get("scaler"):
            scaler.load_state_dict(resumed["scaler"])
        say(f"resumed from {resumed['path']} at step {step}")

    def save() -> None:
        state = {"step": step, "data": dataset.state_dict(), "scheduler": scheduler.state_dict()}
        if scaler is not None:
            state["scaler"] = scaler.state_dict()
        say(f"checkpoint saved to {manager.save(step, net, optimizer, state)}")

    stop = checkpoint.StopFlag(env.cpu_group)
    meter = metrics.Throughput(
        cfg.shape,
        cfg.seq_length,
        cfg.batch_size * cfg.seq_length,
        cfg.throughput_warmup_steps,
        env.device,
        cfg.precision,
    )
    params = [p for p in net.parameters() if p.requires_grad]
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
    last_saved, logged_loss, stopped = (step if resumed else -1), float("nan"), False
    meter.start()
    while step < cfg.max_steps:
        tokens, targets = dataset.next_batch()
        tokens = tokens.to(env.device, non_blocking=True)
        targets = targets.to(env.device, non_blocking=True)
        lr = scheduler.get_last_lr()[0]
        with plan.autocast():
            loss = net(tokens, targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        meter.step_done()

        if step % cfg.log_interval == 0 or step == cfg.max_steps:
            mean_loss = loss.detach().float().clone()
            dist.all_reduce(mean_loss)  # SUM: gloo has no AVG
            logged_loss = _value(mean_loss) / env.world_size
            line = {"loss": logged_loss, "lr": lr, "grad_norm": _value(grad_norm), **meter.interval()}
            line["peak_mem_gb"] = metrics.peak_memory_gb(env.device)
            say(contract.format_step_line(step, line))

        stopped = stop.agreed()
        if stopped or (cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0):
            save()
            last_saved = step
            meter.reset_interval()
        if stopped:
            say(f"stopping at step {step}: SIGTERM received, checkpoint saved")
            break

    if not stopped and final_save:
        if last_saved != step:
            save()
        saved = checkpoint.save_model(net, cfg.model_dir, step, cfg.as_dict(), env.rank)
        if saved is not None:
            say(f"model saved to {saved}")
    summary = {
        "steps": step,
        "final_loss": logged_loss,
        **meter.summary(),
        "peak_mem_gb": metrics.peak_memory_gb(env.device),
        "train_seconds": meter.measured_seconds,
    }
    say(contract.format_summary_line(summary))
    return summary
