"""The training loop: build, shard, resume, train (AdamW, warm-up + cosine LR, grad clipping), log progress and
the validation loss, checkpoint, stop on SIGTERM, save the model."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from training.contract import hardware, metric_lines, settings_checks, settings_table
from training.trainer import config, guard, objective, refusal, sagemaker_job
from training.trainer.checkpoint import export_hf, export_peft, folder, identity, model_file, weights
from training.trainer.checkpoint import manager as checkpoint_manager
from training.trainer.checkpoint import stop as stop_flag
from training.trainer.config import TrainConfig
from training.trainer.data import packing, step_counts, token_files
from training.trainer.distributed import activation_checkpoint, levers, parallel, precision
from training.trainer.distributed import compile as compiling
from training.trainer.model import attention, decoder, lora
from training.trainer.observe import metrics
from training.trainer.observe.progress import Progress
from training.trainer.observe.tracking import Tracking
from training.trainer.optimizer_step import _boundary, _EmptyMicroBatches
from training.trainer.schedule import MIN_LR_RATIO, Schedule, lr_factor, warmup_for

__all__ = ["MIN_LR_RATIO", "build", "lr_factor", "run", "set_determinism"]


def set_determinism(cfg: TrainConfig) -> None:
    torch.manual_seed(cfg.seed)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # Transformer Engine picks deterministic attention kernels only when told (TE v2.11
        # attention/dot_product_attention/dot_product_attention.py reads it)
        os.environ.setdefault("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
        torch.use_deterministic_algorithms(True)


def build(
    cfg: TrainConfig, env: parallel.DistEnv, plan: precision.PrecisionPlan, packed: bool = False
) -> decoder.Transformer:
    """The sharded, initialized model for ``cfg`` (shared with the benchmark's bare loop): built on the meta
    device, its blocks wrapped (activation checkpointing, then ``torch.compile``, whose forward and backward graphs
    are compiled here by ``compile.warm_up`` under the run's pinned attention kernel, then NVFP4's bf16 edge
    blocks) before FSDP2 shards it, then given its values: random, or the ``init_from`` model's weights. With LoRA
    (``lora_rank`` > 0) the blocks' linear layers get adapters and everything else is frozen first (``lora.apply``),
    and the adapters get their values last. ``packed``: batches of packed documents (``packing.packs``)."""
    use_te = plan.recipe is not None
    adapters = lora.LoraSettings.of(cfg)
    with plan.init_context():
        net = decoder.build_model(
            cfg.shape,  # the model's ModelConfig: its family, position encoding, RoPE and norm epsilon
            use_te=use_te,
            loss_chunk_tokens=cfg.loss_chunk_tokens,
            te_params_dtype=torch.bfloat16 if plan.quantized_init else torch.float32,
            packed=packed,
        )
    if adapters is not None:
        lora.apply(net, adapters)
    activation_checkpoint.apply(
        net.layers, cfg.activation_checkpointing, cfg.activation_checkpointing_interval, use_te=use_te
    )
    if compiling.resolve(cfg.compile, env.device, use_te):
        compiling.apply(net.layers, loss_chunks=cfg.loss_chunk_tokens > 0)
        variants = activation_checkpoint.variants(
            cfg.num_layers, cfg.activation_checkpointing, cfg.activation_checkpointing_interval
        )
        # Inside the run's pinned SDPA order (``run`` trains in the same one): tracing picks the attention kernel
        # and bakes it into the compiled graph, which neither Dynamo's guards nor its caches check again later.
        with attention.plan(cfg.attention_backend, env.device, cfg.deterministic).context():
            compiling.warm_up(cfg.shape, variants, batch=cfg.batch_size, seq=cfg.seq_length, dtype=plan.dtype,
                              device=env.device, rope=net.rope, loss_chunk_tokens=cfg.loss_chunk_tokens,
                              mesh=env.mesh, policy=parallel.mixed_precision(plan.dtype),
                              adapt=None if adapters is None else functools.partial(
                                  lora.apply_to_block, shape=cfg.shape, settings=adapters))  # fmt: skip
    if cfg.precision == "nvfp4":
        plan.keep_edge_blocks_high_precision(net.layers, cfg.nvfp4_bf16_blocks)
    policy = parallel.mixed_precision(plan.dtype)
    parallel.shard_model(net, env.mesh, policy, env.device)
    found = weights.initialize(net, seed=cfg.seed, init_from=cfg.init_from, keep_master_values=plan.quantized_init,
                               skip=lora.is_adapter if adapters is not None else None)  # fmt: skip
    weights.refuse_nonfinite(found, cfg.init_from, env.cpu_group)  # every rank together, before step 1
    if adapters is not None:
        lora.initialize(net, cfg.seed)
    return net


def _value(tensor: torch.Tensor) -> float:
    return float((tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).item())


@dataclass
class _State:
    """What a step changes: model, optimizer, LR schedule (and its scheduler), grad scaler, steps done."""

    net: decoder.Transformer
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: Any
    step: int = 0


def _fresh_state(cfg: TrainConfig, env: parallel.DistEnv, plan: precision.PrecisionPlan) -> _State:
    net = build(cfg, env, plan, packing.packs(cfg))
    impl = levers.adamw_impl(cfg.adamw_impl, env.device)
    trainable = [p for p in net.parameters() if p.requires_grad]  # LoRA: the adapters only
    optimizer = levers.build_optimizer(
        trainable, impl, cfg.learning_rate, cfg.weight_decay, master_weights=plan.quantized_init
    )
    warmup, _ = warmup_for(cfg.lr_warmup_steps, cfg.max_steps)
    state = _State(net, optimizer, Schedule(cfg.max_steps, warmup), None, plan.grad_scaler())  # type: ignore[arg-type]
    state.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: state.schedule.factor(s))
    return state


def _resume(
    cfg: TrainConfig,
    env: parallel.DistEnv,
    plan: precision.PrecisionPlan,
    manager: checkpoint_manager.CheckpointManager,
    dataset: Any,
    say: Callable[[str], None],
) -> tuple[_State, bool]:
    """The state to train from, and whether the checkpoint already reached ``max_steps`` (nothing to do)."""
    state = _fresh_state(cfg, env, plan)
    resumed = manager.load_latest(state.net, state.optimizer)
    for found, sealed in manager.adopted:
        say(f"checkpoint {found}: every file of its save was written (DCP's .metadata and every file it lists), "
            f"sealed now as {sealed}")  # fmt: skip
    if manager.skipped:
        skipped = "; ".join(f"{name} ({why})" for name, why in manager.skipped)
        if (
            resumed is None and cfg.on_unusable_checkpoints == "fail"
        ):  # the reason first: FailureReason keeps 1024
            raise checkpoint_manager.UnusableCheckpointsError(
                f"on_unusable_checkpoints=fail: no usable checkpoint in {cfg.checkpoint_dir}, "
                f"{len(manager.skipped)} skipped, not training: {skipped}"
            )
        outcome = (
            f"resuming from {resumed['path']}" if resumed else "no usable checkpoint: starting from step 0"
        )
        say(f"checkpoints skipped in {cfg.checkpoint_dir}: {skipped}; {outcome}")
    if resumed is None:
        if manager.touched_model:  # a failed load wrote into them: start from a clean model and optimizer
            state = _fresh_state(cfg, env, plan)
        _, note = warmup_for(cfg.lr_warmup_steps, cfg.max_steps)
        if note:
            say(note)
        return state, False
    state.step = int(resumed["step"])
    saved = resumed.get("schedule")
    saved_schedule = (
        Schedule.from_state_dict(saved) if saved else Schedule(cfg.max_steps, cfg.lr_warmup_steps)
    )
    if state.step >= cfg.max_steps:
        return state, True
    moved = dataset.load_state_dict(resumed["data"])
    state.schedule = saved_schedule.continued_to(cfg.max_steps, state.step)
    state.scheduler.load_state_dict(resumed["scheduler"])
    if state.scaler is not None and resumed.get("scaler"):
        state.scaler.load_state_dict(resumed["scaler"])
    say(f"resumed from {resumed['path']} at step {state.step}")
    say_layout_change(resumed, env, moved, say)
    if state.schedule.max_steps != saved_schedule.max_steps:
        factor = state.schedule.factor(state.step)
        lr, floor = cfg.learning_rate * factor, cfg.learning_rate * MIN_LR_RATIO
        where = (
            f"stays at its floor {floor:.6g} ({MIN_LR_RATIO:g} x peak)"
            if math.isclose(factor, MIN_LR_RATIO)
            else f"continues from {lr:.6g} along a cosine to its floor {floor:.6g} ({MIN_LR_RATIO:g} x peak)"
        )
        say(
            f"max_steps changed from {saved_schedule.max_steps} to {cfg.max_steps} (checkpoint at step {state.step}):"
            f" the learning rate {where} until step {cfg.max_steps}"
        )
    return state, False


def say_layout_change(
    resumed: dict[str, Any], env: parallel.DistEnv, moved: str | None, say: Callable[[str], None]
) -> None:
    """What a resume under another layout (world size, replicas) kept and what it could not: the model and
    optimizer are resharded by DCP; the data continue from the first sample not yet trained on (``moved``); the
    random-number state is per rank and not carried over (nothing random is drawn after initialization)."""
    replicate, shard = resumed.get("layout") or [1, env.world_size]
    if [replicate, shard] == [env.replicate, env.shard]:
        return
    was = f"replicate {replicate} x shard {shard}" if replicate > 1 else f"shard {shard}"
    say(
        f"layout changed: the checkpoint was written by {replicate * shard} ranks ({was}), this run has "
        f"{env.world_size} ({env.describe()}): model and optimizer state resharded on load"
        + ("" if resumed.get("same_world_size") else "; the ranks' random-number states not carried over")
    )
    if moved:
        say(moved)


def _finished_already(
    cfg: TrainConfig, env: parallel.DistEnv, state: _State, say: Callable[[str], None]
) -> None:
    """A checkpoint at or past ``max_steps``: write nothing, except the model file when the model folder has
    none (e.g. a new SageMaker job's empty /opt/ml/model), so that the job's output is not empty, and the Hugging
    Face export of every model file that has none (the run was killed while it exported, or before it began:
    ``export_hf.pending_exports``; rank 0 alone, as at the end of a run), and a LoRA run's peft adapter folder
    likewise."""
    done = (
        f"run already complete: the newest checkpoint is at step {state.step} and max_steps={cfg.max_steps}"
    )
    if model_file.model_files(cfg.model_dir):
        exports = [(export_hf.export_after_training, "Hugging Face export", export_hf.HF_DIR)]
        if cfg.lora_rank:
            exports.append((export_peft.export_after_training, "peft adapter folder", export_peft.PEFT_DIR))
        pending = [
            (export, what, model, how)
            for export, what, prefix in exports
            for model, how in (export_hf.pending_exports(cfg.model_dir, cfg, prefix) if env.is_main else [])
        ]
        if not pending:
            say(f"{done}; the model is in {cfg.model_dir}; nothing trained, nothing written")
        for export, what, model, how in pending:
            say(f"{done}; {model} has no {what} ({how}): {export(model, cfg)}")
        return
    saved = _save_model(cfg, env, state)
    say(
        f"{done}; nothing trained; {cfg.model_dir} held no model, so the checkpoint's model was saved to {saved}"
    )
    if saved is not None:
        _export(saved, cfg, say)


def _export(saved, cfg: TrainConfig, say: Callable[[str], None]) -> None:
    """The Hugging Face folder of the saved model (LoRA: merged) and, for LoRA, the peft adapter folder."""
    say(export_hf.export_after_training(saved, cfg))
    if cfg.lora_rank:
        say(export_peft.export_after_training(saved, cfg))


def _save_model(cfg: TrainConfig, env: parallel.DistEnv, state: _State):
    """``model.pt`` with what the Hugging Face export needs to know about the data (a collective)."""
    data_info = export_hf.data_info(cfg) if env.is_main else None
    return model_file.save_model(state.net, cfg.model_dir, state.step, cfg.as_dict(), env.rank, data_info)


def run(
    cfg: TrainConfig, env: parallel.DistEnv, emit: Callable[[str], None] = print, final_save: bool = True
) -> dict[str, Any]:
    """Train to ``cfg.max_steps`` (or until SIGTERM); rank 0 emits the config, step, validation and summary
    lines. ``final_save=False`` (the benchmark) skips the end-of-run checkpoint and model file. Returns the
    summary metrics (on every rank); an empty dict when the run was already complete."""
    set_determinism(cfg)
    allocator = levers.configure_allocator(cfg.expandable_segments, env.device)
    plan = precision.plan(
        cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init, amax_reduction_group=env.dp_group
    )
    say = emit if env.is_main else (lambda _line: None)
    settings = {**cfg.as_dict(), "world_size": env.world_size, "device": env.device.type}
    settings.update(gpu=metrics.gpu_name(env.device) or "none", parameters=cfg.shape.parameter_count())
    full = {**settings, "compute_dtype": str(plan.dtype).removeprefix("torch.")}
    say(config.config_line(full, config.settings_file(full, cfg.model_dir) if env.is_main else None))
    # The torch path's SDPA kernel, probed on the model's own attention inputs; a named one that cannot run them is
    # refused here, before the model is built (Transformer Engine chooses its own: logged after step 1).
    attention_plan, kernel = (
        (attention.plan(cfg.attention_backend, env.device, cfg.deterministic), None)
        if plan.recipe is not None
        else attention.resolve(cfg, env.device, plan.dtype, env.cpu_group, packing.packs(cfg))
    )
    say(levers_line(cfg, env, plan, allocator, (attention_plan, kernel)))
    if (
        compiling.resolve(cfg.compile, env.device, plan.recipe is not None)
        and not sagemaker_job.in_sagemaker()
    ):
        say(compiling.cache_line())  # a local run's: where a damaged entry an earlier run left would be
    # One data batch per optimizer step, cut into grad_accum_steps micro-batches: the same samples as one batch
    # grad_accum_steps times larger, and the data position saved at step boundaries resumes exactly.
    step_batch = dataclasses.replace(cfg, batch_size=cfg.batch_size * cfg.grad_accum_steps)
    goal = objective.of(cfg, env)  # what the run minimizes: next-token or preference (DPO)
    dataset = goal.make_dataset(step_batch, env.rank, env.world_size, grad_accum_steps=cfg.grad_accum_steps)
    validation = goal.make_validation(cfg, env.rank, env.world_size)
    shape = identity.model_identity(cfg)
    manager = checkpoint_manager.CheckpointManager(
        cfg.checkpoint_dir,
        cfg.keep_checkpoints,
        env,
        shape,
        resume_dir=folder.resume_channel_dir(),
        backend=cfg.checkpoint_backend,
    )
    state, complete = _resume(cfg, env, plan, manager, dataset, say)
    if cfg.lora_rank:
        trainable, total = lora.counts(state.net)
        say(f"lora rank={cfg.lora_rank} alpha={cfg.lora_alpha:g} dropout={cfg.lora_dropout:g} "
            f"targets={','.join(settings_checks.lora_target_modules(cfg.lora_targets))} trainable_parameters={trainable} "
            f"({100.0 * trainable / total:.3g}% of {total}; the base is frozen)")  # fmt: skip
        note = lora.rank_note(cfg.shape, lora.LoraSettings.of(cfg))  # type: ignore[arg-type]
        if note:
            say(note)
    if complete:
        _finished_already(cfg, env, state, say)
        return {}
    if env.is_main:  # what each step holds: its windows, examples and trained tokens, counted from the data
        say(step_counts.step_line(cfg, dataset, env.world_size, state.step))
    if goal.describe():
        say(goal.describe())
    goal.prepare(state.net, state.step, lambda: build(cfg, env, plan, packing.packs(cfg)), plan, say)
    if env.is_main:
        config.write_settings(full, cfg.model_dir)  # the run trains: its settings beside its model
    val_batches = _validation_batches(validation, cfg, env)
    if validation is not None:  # every window is scored unless validation_batches is too low: say so
        left = token_files.validation_note(
            validation.window_count, cfg.validation_batches, cfg.batch_size, env.world_size
        )
        if left:
            say(left)
    tracking = Tracking.open(cfg.tensorboard_dir, settings, env.is_main, say)
    collector = levers.GarbageCollection(cfg.gc_interval)
    try:
        with attention_plan.context():  # forward, recompute and validation all run the pinned kernel
            summary = _train(cfg, env, plan, state, dataset, manager, val_batches, say, final_save, tracking,
                             collector, goal)  # fmt: skip
    except BaseException:
        tracking.close(failed=True)
        raise
    finally:
        collector.close()
        manager.close()
    tracking.close()
    return summary


def _validation_batches(validation: Any, cfg: TrainConfig, env: parallel.DistEnv) -> list:
    """This rank's validation batches, read at the start; a token id the check before training did not read (it
    samples large data) stops every rank together with one line (``refusal.TrainingFailure``)."""
    batches, problem = [], None
    if validation is not None:
        try:
            batches = validation.validation_batches(cfg.validation_batches)
        except settings_table.ContractError as err:
            problem = guard.Problem(guard.DATA, str(err))
    problems: list[Any] = [None] * env.world_size
    torch.distributed.all_gather_object(problems, problem, group=env.cpu_group)
    found = [p for p in problems if p is not None]
    if found:
        raise refusal.TrainingFailure(f"{found[0].text}, in the validation split; nothing trained")
    return batches


def levers_line(
    cfg: TrainConfig,
    env: parallel.DistEnv,
    plan: precision.PrecisionPlan,
    allocator: str,
    sdpa: tuple[attention.AttentionPlan, str | None],
) -> str:
    """``levers key=value ...``: what each speed lever resolved to on this machine (``auto`` values included);
    ``sdpa``: the torch path's attention plan and the kernel in effect (``attention.resolve``)."""
    use_te = plan.recipe is not None
    sm = torch.cuda.get_device_capability(env.device) if env.device.type == "cuda" else None
    resolved: dict[str, Any] = {
        "activation_checkpointing": cfg.activation_checkpointing,
        "checkpointed_blocks": len(
            activation_checkpoint.checkpointed_blocks(
                cfg.num_layers, cfg.activation_checkpointing, cfg.activation_checkpointing_interval
            )
        ),
        "grad_accum_steps": cfg.grad_accum_steps,
        "tokens_per_optimizer_step": cfg.batch_size * cfg.seq_length * cfg.grad_accum_steps * env.world_size,
        "compile": compiling.resolve(cfg.compile, env.device, use_te),
        "adamw": levers.adamw_impl(cfg.adamw_impl, env.device),
        "master_weights": "fp32" if plan.quantized_init else "none",
        "allocator": allocator,
        "gc": levers.GarbageCollection.describe_interval(cfg.gc_interval),
        "async_checkpoint": cfg.async_checkpoint,
        "data_parallel": env.describe(),
    }
    if use_te:
        resolved["recipe"] = type(plan.recipe).__name__
        resolved["attention"] = "transformer_engine (its choice is logged after step 1)"
        if cfg.precision == "fp8":
            resolved["fp8_recipe"] = hardware.fp8_recipe_for(cfg.fp8_recipe, sm)
        if cfg.precision == "nvfp4":
            resolved["bf16_blocks"] = cfg.nvfp4_bf16_blocks
    else:
        resolved["attention"] = sdpa[1]
        resolved["attention_priority"] = ",".join(sdpa[0].order or ["torch_default"])
    return "levers " + " ".join(f"{key}={metric_lines._fmt_config(value)}" for key, value in resolved.items())


def _summary(
    state: _State,
    progress: Progress,
    meter: Any,
    env: parallel.DistEnv,
    manager: Any,
    validated: dict[str, float] | None,
    empty: int,
) -> dict[str, Any]:
    """The summary line's values (a collective: the memory over the ranks)."""
    summary = {
        "steps": state.step,
        "final_loss": progress.last_mean,
        **meter.summary(),
        "peak_mem_gb": metrics.peak_memory_gb(env.device),
        **metrics.memory_over_ranks(env.device, env.cpu_group),
        "train_seconds": meter.total_seconds(),
    }
    summary.update(validated or {})
    if empty:
        summary["empty_micro_batches"] = empty
    if manager.skipped and manager.loaded is None:  # found checkpoints, none usable: restarted from step 0
        summary["unusable_checkpoints"] = len(manager.skipped)
    return summary


def _train(
    cfg,
    env,
    plan,
    state: _State,
    dataset,
    manager,
    val_batches,
    say,
    final_save,
    tracking: Tracking,
    collector,
    goal: Any,
) -> dict[str, Any]:
    """The step loop from ``state.step`` to ``cfg.max_steps`` (or SIGTERM), then the final save and summary."""
    warmup = cfg.throughput_warmup_steps
    if warmup >= cfg.max_steps - state.step:
        warmup = max(0, cfg.max_steps - state.step - 1)
        say(f"note: throughput_warmup_steps={cfg.throughput_warmup_steps} is not below the {cfg.max_steps - state.step} "
            f"steps this run trains; leaving out {warmup} warm-up steps from the throughput instead")  # fmt: skip
    tokens_per_step = cfg.batch_size * cfg.seq_length * cfg.grad_accum_steps  # per GPU and optimizer step
    adapters = lora.counts(state.net)[0] if cfg.lora_rank else 0  # LoRA: the model FLOPs of what trains
    meter = metrics.Throughput(
        cfg.shape, cfg.seq_length, tokens_per_step, warmup, env.device, cfg.precision, adapters
    )
    progress = Progress(state.step, cfg.max_steps, env.world_size)
    stop = stop_flag.StopFlag(env.cpu_group)
    net, optimizer, scheduler, scaler = state.net, state.optimizer, state.scheduler, state.scaler
    params = [p for p in net.parameters() if p.requires_grad]
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
    last_saved, stopped, validated, empty = state.step, False, None, _EmptyMicroBatches(say)
    watch = guard.Guard(dataset, env.device, state.step, check_grad_norm=scaler is None, rank=env.rank)
    te_attention_unlogged = plan.recipe is not None

    def save() -> None:
        trainer_state = {"step": state.step, "data": dataset.state_dict(), "scheduler": scheduler.state_dict(),
                         "schedule": state.schedule.state_dict()}  # fmt: skip
        if scaler is not None:
            trainer_state["scaler"] = scaler.state_dict()
        sealed(manager.seal_pending())  # an earlier background save is sealed first (and said so)
        started = manager.save(state.step, net, optimizer, trainer_state, background=cfg.async_checkpoint)
        say(f"checkpoint {'started' if manager.pending else 'saved'}: {started}" if cfg.async_checkpoint
            else f"checkpoint saved to {started}")  # fmt: skip

    def sealed(paths: list) -> None:
        for path in paths:
            say(f"checkpoint saved to {path}")

    def stop_for(problems: list) -> None:
        """Every rank: keep what is good (the state, for a bad next batch), seal, and stop with one line."""
        if all(p.kind == guard.DATA for p in problems) and last_saved != state.step:
            save()
        sealed(manager.seal_pending())
        raise refusal.TrainingFailure(guard.failure_message(problems, state.step, manager.newest))

    def validate() -> dict[str, float]:
        found = goal.evaluate(net, val_batches, env, plan, packed=getattr(dataset, "packing", False))
        say(metric_lines.format_validation_line(state.step, cfg.max_steps, **found))
        tracking.validation(state.step, **found)
        return found

    meter.start()
    problems = stop.agreed(None, watch.problem(read_values=False, next_batch=state.step < cfg.max_steps))[2]
    if problems:  # the first batch of this run
        stop_for(problems)
    while state.step < cfg.max_steps:
        lr = scheduler.get_last_lr()[0]
        micro, shares = goal.micro_batches(dataset, cfg.grad_accum_steps, env.device, env.cpu_group)
        loss, grad_norm = goal.train_step(net, optimizer, scaler, plan, micro, shares, params, max_norm)
        watch.step_done(loss, grad_norm)
        scheduler.step()
        state.step += 1
        meter.step_done()
        progress.add(loss)
        empty.add(shares.empty, shares.step_tokens)
        collector.step(state.step)
        step = state.step
        if te_attention_unlogged:
            say(f"attention (Transformer Engine, after the first step): {attention.te_backend()}")
            te_attention_unlogged = False

        logged = step % cfg.log_interval == 0 or step == cfg.max_steps
        if logged:
            line = {
                "loss": progress.mean_loss(),
                "lr": lr,
                "grad_norm": _value(grad_norm),
                **meter.interval(),
            }
            line.update(peak_mem_gb=metrics.peak_memory_gb(env.device), trained_tokens=shares.step_tokens,
                        padding=shares.padding, **goal.step_fields())  # fmt: skip
            empty.report(step)
            elapsed, eta = progress.timing(step)
            say(metric_lines.format_step_line(step, line, cfg.max_steps, elapsed, eta))
            tracking.step(step, line)
        if (
            val_batches
            and cfg.validation_interval
            and step % cfg.validation_interval == 0
            and step < cfg.max_steps
        ):
            validated = validate()
            meter.reset_interval()

        interval = bool(cfg.checkpoint_interval) and step % cfg.checkpoint_interval == 0
        stopped, written, problems = _boundary(
            stop, manager, watch, logged or interval, step == cfg.max_steps
        )
        if written:
            sealed(manager.seal_pending())
        if problems:
            stop_for(problems)
        if stopped or interval:
            save()
            if stopped:  # SIGTERM: the checkpoint is sealed and verified before the process ends
                sealed(manager.seal_pending())
            last_saved = step
            meter.reset_interval()
        if stopped:
            say(f"stopping at step {step}: SIGTERM received, checkpoint saved")
            break

    if progress.pending:  # stopped between two log lines: the loss of the steps since the last one
        progress.mean_loss()
    if val_batches and not stopped:
        validated = validate()
    if not stopped and empty.nothing_trained():
        sealed(manager.seal_pending())  # what was saved stays; no model from a run that changed nothing
        raise empty.failure()
    if not stopped and final_save:
        if last_saved != state.step:
            save()
        sealed(manager.seal_pending())
        saved = _save_model(cfg, env, state)
        if saved is not None:
            say(f"model saved to {saved}")
            _export(saved, cfg, say)
    sealed(manager.seal_pending())  # a save still in flight is waited for and sealed before the summary
    stop.close()
    summary = _summary(state, progress, meter, env, manager, validated, empty.total)
    say(metric_lines.format_summary_line(summary))
    tracking.summary(state.step, summary)
    tracking.stopped = stopped
    return summary
