"""The speed levers change no number they must not: gradient accumulation against one larger batch, each
activation checkpointing mode against none, compiled blocks against eager ones, async checkpoint saves against
synchronous ones. One process (world size 1, FSDP2 on gloo) unless marked slow."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from tests.training.agreement import assert_same_printed, assert_same_weights
from tests.training.llama import llama
from tests.training.runner import TINY, losses, reference_settings, run_trainer, step_lines
from training.trainer import config, loop, optimizer_step
from training.trainer.checkpoint import folder as checkpoint_folder
from training.trainer.checkpoint import manager as checkpoint_manager
from training.trainer.checkpoint import names
from training.trainer.distributed import activation_checkpoint, levers, parallel, precision
from training.trainer.distributed import compile as compiling
from training.trainer.model import attention, decoder, rotary

SETTINGS = {**TINY, "max_steps": "4", "learning_rate": "0.01"}


@pytest.fixture
def env(process_group):
    torch.use_deterministic_algorithms(True)
    yield process_group
    torch.use_deterministic_algorithms(False)
    compiling.reset()


def fresh(cfg: config.TrainConfig, env: parallel.DistEnv):
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    torch.manual_seed(cfg.seed)
    net = loop.build(cfg, env, plan)
    optimizer = levers.build_optimizer(net.parameters(), "foreach", cfg.learning_rate, cfg.weight_decay)
    return net, optimizer, plan


def train(
    cfg: config.TrainConfig,
    env: parallel.DistEnv,
    steps: int,
    manager: checkpoint_manager.CheckpointManager | None = None,
    save_at: int | None = None,
    built: tuple | None = None,
) -> tuple[list[float], decoder.Transformer]:
    """``steps`` optimizer steps of ``optimizer_step.train_step`` on the synthetic data (one data batch per step, cut into
    ``grad_accum_steps`` micro-batches, as ``loop.run`` does). With ``manager``: resumed from its newest checkpoint
    (model, optimizer, data position) if it has one, and a checkpoint saved after step ``save_at``."""
    from training.trainer.data import token_files

    net, optimizer, plan = built or fresh(cfg, env)
    dataset = token_files.make_dataset(
        dataclasses.replace(cfg, batch_size=cfg.batch_size * cfg.grad_accum_steps), env.rank, env.world_size
    )
    done = 0
    resumed = manager.load_latest(net, optimizer) if manager is not None else None
    if resumed is not None:
        dataset.load_state_dict(resumed["data"])
        done = resumed["step"]
    params = [p for p in net.parameters() if p.requires_grad]
    out = []
    for step in range(done + 1, done + steps + 1):
        micro, shares = optimizer_step._micro_batches(dataset, cfg.grad_accum_steps, env.device)
        loss, _ = optimizer_step.train_step(net, optimizer, None, plan, micro, shares, params, 1.0)
        out.append(float(loss))
        if manager is not None and step == save_at:
            manager.save(step, net, optimizer, {"step": step, "data": dataset.state_dict()})
    return out, net


def full_state(net: decoder.Transformer) -> dict[str, torch.Tensor]:
    return {name: p.full_tensor().detach().clone() for name, p in net.named_parameters()}


def step_gradients(
    cfg: config.TrainConfig, env: parallel.DistEnv, dataset=None, shares: list[float] | None = None
) -> dict[str, torch.Tensor]:
    """The gradients ``optimizer_step.train_step`` has made when it calls the optimizer (which does nothing here), for one
    step of ``dataset`` (default: the run's data); ``shares`` replace the micro-batches' own."""
    from types import SimpleNamespace

    from training.trainer.data import token_files

    net, _, plan = fresh(cfg, env)
    idle = SimpleNamespace(step=lambda: None, zero_grad=lambda set_to_none: None)
    step_batch = dataclasses.replace(cfg, batch_size=cfg.batch_size * cfg.grad_accum_steps)
    dataset = dataset or token_files.make_dataset(step_batch, 0, 1)
    micro, own = optimizer_step._micro_batches(dataset, cfg.grad_accum_steps, env.device)
    optimizer_step.train_step(
        net, idle, None, plan, micro, shares or own, list(net.parameters()), float("inf")
    )
    return {name: p.grad.full_tensor() for name, p in net.named_parameters()}


def test_micro_batch_losses_are_weighted_per_token_over_the_step_not_per_micro_batch(env):
    """Micro-batches that count different numbers of targets (some ``IGNORE_INDEX``): the accumulated gradient is
    the one larger batch's (the mean over every counted target of the step), and the mean of the micro-batch means
    is not."""
    from types import SimpleNamespace

    from training.trainer import loss as loss_module

    tokens = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(11))
    targets = tokens.roll(-1, dims=1)
    targets[1, 4:] = loss_module.IGNORE_INDEX  # micro-batch 1 counts 4 targets, the others 32
    targets[2, ::2] = loss_module.IGNORE_INDEX  # micro-batch 2 counts 16

    def batch():
        return SimpleNamespace(next_batch=lambda: (tokens.clone(), targets.clone()))

    larger = config.config_from_mapping({**SETTINGS, "batch_size": "4"})
    micro = config.config_from_mapping({**SETTINGS, "batch_size": "1", "grad_accum_steps": "4"})
    assert optimizer_step._micro_batches(batch(), 4, env.device)[1] == [32 / 84, 4 / 84, 16 / 84, 32 / 84]
    one, four = step_gradients(larger, env, batch()), step_gradients(micro, env, batch())
    for name, grad in one.items():
        torch.testing.assert_close(four[name], grad, rtol=1e-6, atol=1e-6)
    per_micro_batch = step_gradients(micro, env, batch(), shares=[0.25] * 4)
    assert max((per_micro_batch[n] - g).abs().max() / g.abs().max() for n, g in one.items()) > 0.01


def test_accumulating_micro_batches_equals_one_larger_batch_also_after_a_resume(env, tmp_path):
    larger = config.config_from_mapping({**SETTINGS, "batch_size": "4"})
    micro = config.config_from_mapping({**SETTINGS, "batch_size": "1", "grad_accum_steps": "4"})
    one, four = step_gradients(larger, env), step_gradients(micro, env)
    for name, grad in one.items():
        torch.testing.assert_close(four[name], grad, rtol=1e-6, atol=1e-6)
    # every optimizer step's loss, over a run resumed from a checkpoint in its middle (weights, AdamW state and the
    # data position), equals the uninterrupted larger batch's. The weights after several AdamW steps differ by
    # more (AdamW divides the round-off of near-zero gradients by their own running scale): the slow end-to-end
    # test compares them as tests/training/agreement.py says.
    reference, _ = train(larger, env, 6)
    first, _ = train(micro, env, 3, checkpoint_manager.CheckpointManager(str(tmp_path), 2, env), save_at=3)
    second, _ = train(micro, env, 3, checkpoint_manager.CheckpointManager(str(tmp_path), 2, env))
    assert first + second == pytest.approx(reference, rel=1e-6)
    assert second != pytest.approx(first, rel=1e-3)  # it went on from step 3, not from the start


@pytest.mark.parametrize(("mode", "interval"), [("full", 1), ("selective", 1), ("full", 2), ("selective", 2)])
def test_each_activation_checkpointing_mode_gives_the_gradients_of_none(env, mode, interval):
    def gradients(ac: str, every: int) -> dict[str, torch.Tensor]:
        cfg = config.config_from_mapping(
            {**SETTINGS, "num_layers": "3", "activation_checkpointing": ac,
             "activation_checkpointing_interval": str(every)}
        )  # fmt: skip
        net, _, _ = fresh(cfg, env)
        tokens = torch.randint(
            0, cfg.vocab_size, (2, cfg.seq_length), generator=torch.Generator().manual_seed(5)
        )
        net(tokens, tokens.roll(-1, 1)).backward()
        return {name: p.grad.full_tensor() for name, p in net.named_parameters()}

    reference, checkpointed = gradients("none", 1), gradients(mode, interval)
    assert checkpointed.keys() == reference.keys()
    for name, grad in reference.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-6, atol=1e-7)


def test_selective_keeps_matmul_and_attention_outputs_and_recomputes_the_rest():
    saved = activation_checkpoint.save_ops()
    assert torch.ops.aten.mm.default in saved
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in saved
    assert torch.ops.aten.mul.Tensor not in saved
    assert activation_checkpoint.checkpointed_blocks(7, "full", 3) == [0, 3, 6]
    assert activation_checkpoint.checkpointed_blocks(7, "none", 1) == []


def test_the_attention_kernel_is_pinned_per_gpu_generation_and_the_one_in_effect_is_probed():
    assert attention.priority("auto", (10, 0)) == ["cudnn", "flash", "efficient", "math"]  # Blackwell
    assert attention.priority("auto", (9, 0), deterministic=True) == ["flash", "efficient", "math"]
    assert (
        attention.priority("auto", (8, 0))
        == attention.priority("auto", (8, 6), True)
        == ["flash", "efficient", "math"]
    )
    assert attention.priority("auto", None) is None  # CPU: torch's own choice
    assert attention.priority("cudnn", (9, 0)) == ["cudnn", "math"] and attention.priority("math", None) == [
        "math"
    ]
    cpu = torch.device("cpu")
    probe = (llama(2, 64, 4, 128, num_kv_heads=2), 2, 32, torch.float32, cpu)
    assert attention.plan("auto", cpu).in_effect(*probe) == "flash"  # torch's CPU flash kernel, GQA included
    assert attention.plan("math", cpu).in_effect(*probe) == "math"  # sdpa_kernel(set_priority=True) applied
    with attention.plan("math", cpu).context():
        assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()  # restored on exit


def sdpa_calls(monkeypatch, name: str, owner) -> list[dict]:
    """Record every call of ``owner.name`` (then make it): what each argument is, never its values."""
    calls, real = [], getattr(owner, name)

    def recording(q, k, v, *args, **kwargs):
        described = {
            key: (tuple(x.shape), x.stride(), x.dtype, x.requires_grad)
            for key, x in zip("qkv", (q, k, v), strict=True)
        }
        calls.append({"args": args, "kwargs": kwargs, **described})
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return calls


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_the_kernel_probe_asks_sdpa_about_exactly_the_inputs_the_block_gives_it(monkeypatch, kv_heads):
    """Shapes (grouped-query attention's fewer key/value heads and ``enable_gqa``), strides (the fused QKV
    output's views, the rotated query and key), dtype, causality and grad: each backend's rules read all of them."""
    cfg = config.config_from_mapping({**SETTINGS, "num_kv_heads": str(kv_heads), "batch_size": "3"})
    block = decoder.TorchBlock(cfg.shape).to(torch.bfloat16)
    freqs = rotary.Rope.from_settings(cfg.as_dict())
    x = torch.randn(3, cfg.seq_length, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    ran = sdpa_calls(monkeypatch, "scaled_dot_product_attention", decoder.F)
    block(x, freqs(cfg.seq_length, x.device))
    probed = sdpa_calls(monkeypatch, "_fused_sdp_choice", torch)
    attention.plan("auto", x.device).in_effect(cfg.shape, 3, cfg.seq_length, torch.bfloat16, x.device, freqs)
    assert len(ran) == len(probed) == 1 and probed == ran
    assert ran[0]["k"][0] == (3, kv_heads, cfg.seq_length, cfg.hidden_size // cfg.num_heads)
    assert ran[0]["kwargs"] == {"is_causal": True, "enable_gqa": kv_heads != cfg.num_heads}


def test_a_named_kernel_torch_cannot_run_for_the_model_is_refused_on_every_rank(env):
    shape_settings = {**SETTINGS, "num_kv_heads": "2"}
    cfg = config.config_from_mapping({**shape_settings, "attention_backend": "flash"})
    chosen_plan, kernel = attention.resolve(cfg, env.device, torch.float32, env.cpu_group)
    assert kernel == "flash" and chosen_plan.order == ["flash", "math"]  # torch's CPU flash takes GQA
    cfg = config.config_from_mapping({**shape_settings, "attention_backend": "efficient"})  # no CPU kernel
    with pytest.raises(attention.BackendUnavailable) as refused:
        attention.resolve(cfg, env.device, torch.float32, env.cpu_group)
    assert str(refused.value).startswith(
        "attention_backend: efficient cannot run this model's attention on CPU with torch "
    )
    assert "(4 query heads, 2 key/value heads (grouped-query attention), head_dim 16, seq_length 32, float32): " \
        "SDPA would run math instead; use attention_backend auto" in str(refused.value)  # fmt: skip
    assert attention.unavailable("auto", "math", cfg.shape, 32, torch.float32, env.device) is None


def test_the_levers_line_says_what_each_lever_resolved_to_here(env):
    cfg = config.config_from_mapping({**SETTINGS, "grad_accum_steps": "2", "activation_checkpointing": "full",
                                      "activation_checkpointing_interval": "2", "attention_backend": "math"})  # fmt: skip
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    sdpa = attention.resolve(cfg, env.device, plan.dtype, env.cpu_group)
    line = loop.levers_line(cfg, env, plan, levers.configure_allocator(True, env.device), sdpa)
    fields = dict(item.split("=", 1) for item in line.split()[1:])
    assert line.startswith("levers ") and fields == {
        "activation_checkpointing": "full", "checkpointed_blocks": "1", "grad_accum_steps": "2",
        "tokens_per_optimizer_step": str(2 * cfg.batch_size * cfg.seq_length), "compile": "false",
        "adamw": "foreach", "master_weights": "none", "allocator": "n/a_(cpu)", "gc": "every_50_steps",
        "async_checkpoint": "true", "data_parallel": "shard_1", "attention": "math", "attention_priority": "math",
    }  # fmt: skip
    assert compiling.resolve("auto", torch.device("cuda"), use_te=False)  # a GPU compiles by default ...
    assert not compiling.resolve("auto", torch.device("cuda"), use_te=True)  # ... but not TE's layers
    assert levers.adamw_impl("auto", torch.device("cuda")) == "fused"


def test_the_garbage_collector_runs_on_schedule_and_is_given_back(monkeypatch):
    import gc

    collected = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: collected.append(generation) or 0)
    collector = levers.GarbageCollection(3)
    try:
        assert not gc.isenabled() and collected == [1]  # off, after one collection at start
        for step in range(1, 8):
            collector.step(step)
        assert collected == [1, 1, 1]  # steps 3 and 6
    finally:
        collector.close()
    assert gc.isenabled()
    levers.GarbageCollection(0).close()
    assert gc.isenabled() and collected == [1, 1, 1]  # 0: Python's own, untouched


def test_a_compile_error_runs_eagerly_with_one_warning_and_any_other_error_is_raised(capsys):
    from torch._inductor.exc import InvalidCxxCompiler

    compiling.reset()

    def broken(*args, **kwargs):
        raise InvalidCxxCompiler()

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(torch.OutOfMemoryError):  # not a compile error: raised, never hidden behind eager
        compiling.guarded(out_of_memory, lambda x: x + 1, "f")(1)
    with pytest.raises(ValueError, match="a bug"):
        compiling.guarded(lambda x: (_ for _ in ()).throw(ValueError("a bug")), lambda x: x + 1, "f")(1)
    assert compiling.failure() is None
    calls = compiling.guarded(broken, lambda x: x + 1, "a block's forward")
    assert calls(1) == 2 and calls(2) == 3
    err = capsys.readouterr().err
    assert err.count("warning: torch.compile failed compiling a block's forward (InvalidCxxCompiler: No working "
                     "C++ compiler found in torch._inductor.config.cpp.cxx") == 1  # fmt: skip
    assert "every block and loss chunk runs eagerly" in err
    compiling.reset()


def test_a_compile_error_in_the_backward_pass_shows_in_the_warm_up_and_the_run_goes_on_eagerly(
    env, monkeypatch, capsys
):
    """Real Inductor: the forward graphs compile, then the C++ compiler is gone when AOTAutograd compiles the
    backward graph, lazily, at the first backward pass: the warm-up's, not the first training step's."""
    backward = torch.Tensor.backward

    def backward_without_a_compiler(self, *args, **kwargs):
        with torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/c++",)}):
            return backward(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", backward_without_a_compiler)
    base = {**SETTINGS, "loss_chunk_tokens": "0", "activation_checkpointing": "full"}  # only blocks compile
    torch._dynamo.reset()  # no graph compiled by another test; nothing from Inductor's or AOTAutograd's disk caches
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        fell_back, _ = train(config.config_from_mapping({**base, "compile": "true"}), env, 2)
    failure = compiling.failure()
    assert failure is not None and "No working C++ compiler" in failure, failure
    err = capsys.readouterr().err
    assert err.count("warning: torch.compile failed compiling a block's backward (full activation "
                     "checkpointing) in the warm-up (") == 1, err  # fmt: skip
    eager, _ = train(config.config_from_mapping({**base, "compile": "false"}), env, 2)
    assert fell_back == eager  # both eager: the same numbers


@pytest.mark.slow
def test_compiled_blocks_and_loss_chunks_train_like_eager_ones_with_every_graph_compiled_in_the_warm_up(env):
    from torch._dynamo.utils import counters

    base = {**SETTINGS, "loss_chunk_tokens": "48", "activation_checkpointing": "selective",
            "activation_checkpointing_interval": "2", "num_layers": "3"}  # fmt: skip
    eager, _ = train(config.config_from_mapping({**base, "compile": "false"}), env, 3)
    torch._dynamo.reset()
    cfg = config.config_from_mapping({**base, "compile": "true"})
    net, optimizer, plan = fresh(cfg, env)  # loop.build: compiles, then warms up forward and backward
    warmed_up = dict(counters["stats"]), dict(counters["aot_autograd"])
    assert warmed_up[0]["unique_graphs"] > 0
    compiled, _ = train(cfg, env, 3, built=(net, optimizer, plan))
    assert compiling.failure() is None
    assert compiled == pytest.approx(eager, rel=1e-5)
    # the model's blocks (selective and plain) and loss chunks found every graph in Dynamo's cache
    assert (dict(counters["stats"]), dict(counters["aot_autograd"])) == warmed_up


@pytest.mark.slow
def test_compiled_blocks_run_the_pinned_attention_kernel_whatever_was_compiled_before(
    env, monkeypatch, tmp_path
):
    """Tracing bakes SDPA's kernel choice into the compiled graph, and neither Dynamo's guards nor AOTAutograd's
    cache key hold the enabled backends: the warm-up must trace under the run's pinned order, and a model pinned to
    another kernel must not load a graph traced under the first. On a CPU: ``flash`` runs torch's CPU Flash kernel,
    ``math`` must not."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # no graph from another session

    def kernels(backend: str) -> set[str]:
        torch._dynamo.reset()  # a fresh process's Dynamo; the on-disk caches stay, as between two runs
        cfg = config.config_from_mapping({**SETTINGS, "compile": "true", "attention_backend": backend})
        net, _, plan = fresh(cfg, env)
        # the run's own micro-batch shape: another would make Dynamo trace again, here, under the pinned order
        tokens = torch.randint(
            0, 256, (cfg.batch_size, cfg.seq_length), generator=torch.Generator().manual_seed(3)
        )
        with (
            attention.plan(backend, env.device).context(),
            profile(activities=[ProfilerActivity.CPU]) as prof,
        ):
            with plan.autocast():
                loss = net(tokens, tokens.roll(-1, dims=1))
            loss.backward()
        assert compiling.failure() is None
        return {e.name for e in prof.events() if "flash_attention" in e.name}

    assert kernels("flash")  # the CPU Flash kernel, forward and backward, in the compiled graph
    assert kernels("math") == set()


def digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file but DCP's ``.metadata`` (it records a fresh save id each time) and the marker."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.name not in (".metadata", names.MARKER)
    }


def test_an_async_save_writes_the_files_a_synchronous_one_does(env, tmp_path):
    cfg = config.config_from_mapping(SETTINGS)
    _, net = train(cfg, env, 2)
    optimizer = levers.build_optimizer(net.parameters(), "foreach", cfg.learning_rate, cfg.weight_decay)
    state = {"step": 2}
    folders = {}
    for name, background in (("sync", False), ("async", True)):
        manager = checkpoint_manager.CheckpointManager(str(tmp_path / name), 3, env)
        torch.manual_seed(0)  # the RNG state each rank file records
        started = manager.save(2, net, optimizer, state, background=background)
        assert manager.pending == background
        if background:  # training goes on while the files are written: the save holds its own copy
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(1.0)
            started = manager.seal_pending()[0]
            with torch.no_grad():
                for p in net.parameters():
                    p.sub_(1.0)
        folders[name] = started
        assert checkpoint_folder.size_problem(started) is None
    assert folders["async"].name == folders["sync"].name == "step_00000002"
    assert digests(folders["async"]) == digests(folders["sync"])
    assert sorted(p.name for p in folders["async"].iterdir()) == sorted(
        p.name for p in folders["sync"].iterdir()
    )


@pytest.mark.slow
def test_accumulation_resumed_mid_run_and_async_saves_after_sigterm_match_the_reference(reference, tmp_path):
    """The session's reference is batch 4 per rank; 2 micro-batches of 2 give its training within the fp32
    round-off of summing two micro-batches (its printed losses and gradient norms, and its weights after 12 AdamW
    steps: agreement's docstring says how close), and a resume from step 6 of that run continues it bit for bit."""
    ref_dir, ref_output = reference
    accumulated = run_trainer(reference_settings(tmp_path, "acc", batch_size="2", grad_accum_steps="2"))
    assert "grad_accum_steps=2" in accumulated
    assert_same_printed(accumulated, ref_output)
    weights = torch.load(tmp_path / "model_acc" / "model.pt", weights_only=False)["state_dict"]
    uninterrupted = torch.load(ref_dir / "model_ref" / "model.pt", weights_only=False)["state_dict"]
    assert_same_weights(weights, uninterrupted, float(TINY["learning_rate"]))
    (tmp_path / "ckpt_resumed").mkdir()
    shutil.copytree(tmp_path / "ckpt_acc" / "step_00000006", tmp_path / "ckpt_resumed" / "step_00000006")
    resumed = run_trainer(reference_settings(tmp_path, "resumed", batch_size="2", grad_accum_steps="2"))
    assert "at step 6" in resumed and sorted(step_lines(resumed)) == list(range(7, 13))
    assert losses(resumed) == {s: v for s, v in losses(accumulated).items() if s > 6}
    again = torch.load(tmp_path / "model_resumed" / "model.pt", weights_only=False)["state_dict"]
    assert all(torch.equal(again[name], tensor) for name, tensor in weights.items())


@pytest.mark.slow
def test_sigterm_during_async_saves_ends_sealed_and_the_resume_continues_bit_for_bit(reference, tmp_path):
    from tests.training.test_distributed import run_until_sigterm

    _, ref_output = reference
    cfg = reference_settings(tmp_path, "term", checkpoint_interval="2")  # async_checkpoint is the default
    first = run_until_sigterm(cfg, after_step_seen=3)
    assert "stopping at step" in first, first
    stopped_at = max(step_lines(first))
    assert (
        max(step for step, _ in checkpoint_folder.complete_checkpoints(cfg["checkpoint_dir"])) == stopped_at
    )
    assert not list(Path(cfg["checkpoint_dir"]).glob("*.tmp"))
    second = run_trainer(cfg)
    assert f"at step {stopped_at}" in second
    assert losses(second) == {s: v for s, v in losses(ref_output).items() if s > stopped_at}
