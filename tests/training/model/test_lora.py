"""LoRA (``lora_rank`` > 0): the settings and their refusals, the adapters' arithmetic and names, their start
(the same for every world size), training with every activation checkpointing mode and ``compile``, the peft and
merged outputs against the trainer's own logits, adapter-only checkpoints and their bit-exact resume, and every
rank's slice of every adapter in what is saved (2 and 4 gloo ranks)."""

from __future__ import annotations

import json
import math
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from tests.training.checkpoint.test_weights import CPU, fake_rank
from tests.training.hf_models import tiny_llama, tokens
from tests.training.llama import llama
from tests.training.runner import ROOT, cli_args, env, fields, losses, run_trainer, step_lines
from training.contract import settings_checks, settings_parse, settings_table, shapes
from training.contract import tuning as contract_tuning
from training.trainer import config
from training.trainer.checkpoint import export_hf, export_peft, names, weights
from training.trainer.checkpoint import folder as checkpoint_folder
from training.trainer.checkpoint import identity as checkpoint_identity
from training.trainer.distributed import parallel
from training.trainer.model import decoder, lora, rotary


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread for this module's in-process models (tiny: threads gain nothing). On a loaded 2-core
    machine torch's default two threads wait on each other: the activation checkpointing test took 1 s with one
    thread and 10 to 50 s with two, on the same machine within minutes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TINY_LLAMA = {"precision": "fp32", "seq_length": "32", "log_interval": "1", "throughput_warmup_steps": "1",
              "deterministic": "true", "learning_rate": "0.01", "lr_warmup_steps": "0"}  # fmt: skip
"""Settings of a run on ``hf_models.tiny_llama`` (its shape comes from the folder's config.json)."""


# ---------------------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------------------


def test_lora_alpha_defaults_to_twice_the_rank_and_targets_take_short_or_hugging_face_names():
    values = settings_parse.parse_hyperparameters({"lora_rank": "16"})
    assert (values["lora_alpha"], values["lora_dropout"], values["lora_targets"]) == (32.0, 0.0, "all-linear")
    assert settings_checks.lora_target_modules("all-linear") == (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )  # fmt: skip
    assert settings_checks.lora_target_modules("v, Q_PROJ,down") == ("q_proj", "v_proj", "down_proj")
    assert settings_parse.parse_hyperparameters({})["lora_alpha"] is None  # no LoRA: nothing filled in
    assert config.config_from_mapping({"lora-rank": "8", "lora_alpha": "4"}).lora_alpha == 4.0


@pytest.mark.parametrize(
    ("settings", "field", "fragment"),
    [
        ({"lora_rank": "8", "precision": "fp8"}, "precision", "fp8 cannot train LoRA adapters"),
        ({"lora_rank": "8", "precision": "mxfp8"}, "precision", "not Transformer Engine's"),
        ({"lora_rank": "8", "precision": "fp8", "quantized_model_init": "true"}, "quantized_model_init",
         "must be false with LoRA"),
        ({"lora_rank": "8", "lora_targets": "q,lm_head"}, "lora_targets", "'lm_head', which a decoder block (every family here) has no projection of"),
        ({"lora_rank": "8", "lora_targets": "q,,v"}, "lora_targets", "an empty entry"),
        ({"lora_rank": "8", "lora_targets": "q,q_proj"}, "lora_targets", "names q twice"),
        ({"lora_alpha": "16"}, "lora_alpha", "only with lora_rank > 0"),
        ({"lora_targets": "q,v"}, "lora_targets", "only with lora_rank > 0"),
        ({"lora_dropout": "0.1"}, "lora_dropout", "only with lora_rank > 0"),
        ({"lora_rank": "513"}, "lora_rank", "an integer in [0, 512]"),
        ({"lora_rank": "8", "lora_dropout": "1"}, "lora_dropout", "a number in [0, 0.9]"),
    ],
)  # fmt: skip
def test_impossible_lora_settings_are_refused_naming_the_field(settings, field, fragment):
    """By the contract's one check, which the request check and the trainer's parser both run."""
    with pytest.raises(settings_table.ContractError) as refused:
        settings_parse.parse_hyperparameters(settings)
    assert refused.value.field == field and fragment in str(refused.value), str(refused.value)
    with pytest.raises(SystemExit) as exited:
        config.parse_args(cli_args(settings))
    assert exited.value.code == 2


# ---------------------------------------------------------------------------------------------------------------
# The adapters
# ---------------------------------------------------------------------------------------------------------------

SHAPE = llama(2, 32, 4, 48, 42, num_kv_heads=2)


def filled_block(settings: lora.LoraSettings, seed: int = 0) -> decoder.TorchBlock:
    block = decoder.TorchBlock(SHAPE)
    lora.apply_to_block(block, SHAPE, settings)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return block


def test_a_fused_linear_adds_each_targeted_projections_scaled_b_a_in_its_own_rows_only():
    settings = lora.LoraSettings(rank=3, alpha=6.0, dropout=0.0, targets=("q_proj", "v_proj", "down_proj"))
    block = filled_block(settings)
    assert isinstance(block.qkv, lora.LoRALinear) and isinstance(block.down, lora.LoRALinear)
    assert not isinstance(block.gate_up, lora.LoRALinear) and not isinstance(block.out_proj, lora.LoRALinear)
    x = torch.randn(2, 5, 32)
    qkv = block.qkv
    out = qkv(x)
    plain = x @ qkv.weight.T
    q_rows, kv_rows = 32, 16  # 4 heads of 8; 2 key/value heads of 8
    q_delta = 2.0 * x @ qkv.lora_a_q_proj.T @ qkv.lora_b_q_proj.T
    v_delta = 2.0 * x @ qkv.lora_a_v_proj.T @ qkv.lora_b_v_proj.T
    torch.testing.assert_close(out[..., :q_rows], plain[..., :q_rows] + q_delta)
    torch.testing.assert_close(out[..., q_rows : q_rows + kv_rows], plain[..., q_rows : q_rows + kv_rows])
    torch.testing.assert_close(out[..., q_rows + kv_rows :], plain[..., q_rows + kv_rows :] + v_delta)
    assert not hasattr(qkv, "lora_a_k_proj")
    trainable = {name for name, p in block.named_parameters() if p.requires_grad}
    assert trainable == {"qkv.lora_a_q_proj", "qkv.lora_b_q_proj", "qkv.lora_a_v_proj", "qkv.lora_b_v_proj",
                         "down.lora_a_down_proj", "down.lora_b_down_proj"}  # fmt: skip
    # merging gives a plain linear layer of the same outputs
    state = {f"layers.0.{k}": v for k, v in block.state_dict().items()}
    merged = lora.merged_state(state, settings, llama(1, 32, 4, 48, 42, num_kv_heads=2))
    assert not any(lora.is_adapter(name) for name in merged)
    torch.testing.assert_close(x @ merged["layers.0.qkv.weight"].T, out)
    torch.testing.assert_close(merged["layers.0.gate_up.weight"], state["layers.0.gate_up.weight"])


def test_each_projection_of_a_fused_layer_draws_its_own_dropout_mask_as_pefts_own_layers_do():
    """peft gives q_proj, k_proj and v_proj a dropout module each: independent masks of the same input. The fused
    layer draws one per targeted projection, in row order, and none in evaluation."""
    settings = lora.LoraSettings(rank=3, alpha=6.0, dropout=0.5, targets=("q_proj", "v_proj", "down_proj"))
    qkv = filled_block(settings).qkv
    x = torch.randn(2, 5, 32)
    torch.manual_seed(1)
    out = qkv(x)
    torch.manual_seed(1)
    dropped_q, dropped_v = F.dropout(x, 0.5), F.dropout(x, 0.5)
    assert not torch.equal(dropped_q, dropped_v)
    plain = x @ qkv.weight.T
    q_delta = 2.0 * dropped_q @ qkv.lora_a_q_proj.T @ qkv.lora_b_q_proj.T
    v_delta = 2.0 * dropped_v @ qkv.lora_a_v_proj.T @ qkv.lora_b_v_proj.T
    torch.testing.assert_close(out[..., :32], plain[..., :32] + q_delta)
    torch.testing.assert_close(out[..., 32:48], plain[..., 32:48])
    torch.testing.assert_close(out[..., 48:], plain[..., 48:] + v_delta)
    qkv.eval()
    undropped = x @ qkv.lora_a_q_proj.T @ qkv.lora_b_q_proj.T
    torch.testing.assert_close(qkv(x)[..., :32], plain[..., :32] + 2.0 * undropped)


def test_adapters_carry_pefts_names_for_llama():
    assert (
        lora.peft_key("layers.3.qkv.lora_a_k_proj")
        == "base_model.model.model.layers.3.self_attn.k_proj.lora_A.weight"
    )
    assert (
        lora.peft_key("layers.0.gate_up.lora_b_up_proj")
        == "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"
    )
    assert lora.peft_key("layers.12.out_proj.lora_a_o_proj").endswith(
        "layers.12.self_attn.o_proj.lora_A.weight"
    )
    assert lora.is_adapter("layers.1.down.lora_b_down_proj") and not lora.is_adapter("layers.1.down.weight")
    with pytest.raises(ValueError):
        lora.peft_key("layers.1.down.weight")


def lora_torch_model(settings: lora.LoraSettings, rank: int = 2) -> decoder.Transformer:
    with torch.device("meta"):
        blocks = [decoder.TorchBlock(SHAPE) for _ in range(SHAPE.num_layers)]
        net = decoder.Transformer(SHAPE, blocks)
    lora.apply(net, settings)
    return net


def test_the_adapters_start_the_same_for_world_sizes_1_2_and_4_and_only_they_train():
    """Rank 2 over 4 ranks: two ranks hold no row of an A matrix (uneven shards) and the start is still the same."""
    settings = lora.LoraSettings(
        rank=2, alpha=4.0, dropout=0.0, targets=settings_checks.lora_target_modules("all-linear")
    )
    gathered: dict[int, dict[str, torch.Tensor]] = {}
    for world in (1, 2, 4):
        pieces = defaultdict(list)
        for rank in range(world):
            with fake_rank(rank, world) as mesh:
                net = lora_torch_model(settings)
                parallel.shard_model(net, mesh, parallel.mixed_precision(torch.float32), CPU)
                weights.initialize(net, seed=7, skip=lora.is_adapter)
                lora.initialize(net, seed=7)
                for name, param in net.named_parameters():
                    local = param.to_local() if isinstance(param, DTensor) else param
                    pieces[name].append(local.detach().clone())
                    assert param.requires_grad is lora.is_adapter(name), name
        gathered[world] = {name: torch.cat(parts) for name, parts in pieces.items()}
    one = gathered[1]
    for world in (2, 4):
        assert all(torch.equal(gathered[world][name], value) for name, value in one.items()), world
    a, b = one["layers.0.qkv.lora_a_q_proj"], one["layers.0.qkv.lora_b_q_proj"]
    assert a.shape == (2, 32) and b.shape == (32, 2) and torch.equal(b, torch.zeros_like(b))
    assert a.abs().max() <= 1 / math.sqrt(32) and a.std() > 0.05  # peft's Kaiming-uniform bound 1/sqrt(in)
    assert not torch.equal(a, one["layers.0.qkv.lora_a_k_proj"]) and not torch.equal(
        a, one["layers.1.qkv.lora_a_q_proj"]
    )
    assert sum(1 for name in one if lora.is_adapter(name)) == 2 * 7 * SHAPE.num_layers


# ---------------------------------------------------------------------------------------------------------------
# Training: every activation checkpointing mode, accumulation, compile (one process)
# ---------------------------------------------------------------------------------------------------------------

LORA_TINY = {"lora_rank": "4", "lora_dropout": "0.1", "lora_targets": "q,v,o,gate,down"}


def test_lora_trains_the_adapters_alone_alike_under_every_activation_checkpointing_mode(process_group):
    """Two steps per mode, dropout on, no weight decay: step 1 moves B alone (A's gradient is zero while B is),
    step 2 moves A by its gradient, so the adapters after step 2 hold both matrices' gradients; they are
    bit-identical under every mode (the recompute draws the forward's dropout masks) and the base has not moved."""
    from tests.training.distributed.test_levers import SETTINGS, fresh, full_state, train

    torch.use_deterministic_algorithms(True)
    try:
        runs, after = {}, {}
        for mode in settings_table.AC_MODES:
            cfg = config.config_from_mapping(
                {**SETTINGS, **LORA_TINY, "weight_decay": "0", "activation_checkpointing": mode}
            )
            built = fresh(cfg, process_group)
            start = full_state(built[0])
            runs[mode], net = train(cfg, process_group, 2, built=built)
            after[mode] = full_state(net)
    finally:
        torch.use_deterministic_algorithms(False)
    assert runs["full"] == runs["none"] == runs["selective"], runs
    for name, value in start.items():
        assert lora.is_adapter(name) is not torch.equal(after["none"][name], value), (
            name
        )  # only adapters moved
        assert torch.equal(after["full"][name], after["none"][name]), name
        assert torch.equal(after["selective"][name], after["none"][name]), name


@pytest.mark.slow
def test_compiled_lora_blocks_train_like_eager_ones_with_every_graph_compiled_in_the_warm_up(process_group):
    """LoRA's compiled blocks under selective activation checkpointing (the recompute inside the compiled graph), two
    micro-batches a step, the chunked loss on a frozen LM head: 3 steps give eager's losses, and the warm-up compiled
    every graph the model then runs: the first block's (its frozen embedding gives its input no gradient) and the
    second's, each forward and backward, and the loss chunk's. The fewest graphs that prove it: every block
    checkpointed (one variant) and chunks of one size (48 of 64 tokens would compile each loss graph twice, the
    second time with a dynamic size); a mix of variants and a shorter last chunk are test_levers.py's compiled test."""
    from torch._dynamo.utils import counters

    from tests.training.distributed.test_levers import SETTINGS, fresh, train
    from training.trainer.distributed import compile as compiling

    base = {**SETTINGS, **LORA_TINY, "lora_dropout": "0", "loss_chunk_tokens": "32",
            "activation_checkpointing": "selective", "activation_checkpointing_interval": "1",
            "grad_accum_steps": "2", "batch_size": "2"}  # fmt: skip
    torch.use_deterministic_algorithms(True)
    try:
        eager, _ = train(config.config_from_mapping({**base, "compile": "false"}), process_group, 3)
        torch._dynamo.reset()
        cfg = config.config_from_mapping({**base, "compile": "true"})
        built = fresh(cfg, process_group)  # loop.build: compiles, then warms up forward and backward
        warmed_up = dict(counters["stats"]), dict(counters["aot_autograd"])
        compiled, _ = train(cfg, process_group, 3, built=built)
        assert compiling.failure() is None
    finally:
        torch.use_deterministic_algorithms(False)
        compiling.reset()
    assert warmed_up[0]["unique_graphs"] > 0
    assert compiled == pytest.approx(eager, rel=1e-5)
    assert (dict(counters["stats"]), dict(counters["aot_autograd"])) == warmed_up  # nothing new at step 1


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints: only what trains, and a reference to the frozen base
# ---------------------------------------------------------------------------------------------------------------


def marker(folder: Path, identity: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / names.MARKER).write_text(json.dumps({"model_shape": identity, "files": {}}))
    return folder


def test_a_checkpoint_of_other_adapters_another_base_or_full_fine_tuning_is_refused_naming_both(tmp_path):
    source = tmp_path / "source"
    tiny_llama(source, tied=False)
    cfg = config.config_from_mapping({**TINY_LLAMA, "init_from": str(source), **LORA_TINY})
    ours = checkpoint_identity.model_identity(cfg)
    assert ours["lora"] == {"lora_rank": 4, "lora_alpha": 8.0, "lora_targets": "q_proj,v_proj,o_proj,gate_proj,down_proj",
                            "base": {"init_from": str(source), "sha256": lora.fingerprint(source)}}  # fmt: skip
    same = marker(tmp_path / "same", ours)
    assert checkpoint_folder.shape_mismatch(same, ours) is None
    full = {key: value for key, value in ours.items() if key != "lora"}
    message = checkpoint_folder.shape_mismatch(marker(tmp_path / "full", full), ours)
    assert "holds a full fine-tuning run (every weight), but this run trains LoRA adapters" in message
    message = checkpoint_folder.shape_mismatch(same, full)
    assert "holds LoRA adapters (lora_rank > 0), but this run is full fine-tuning (lora_rank=0)" in message
    other_rank = {**ours, "lora": {**ours["lora"], "lora_rank": 8}}
    message = checkpoint_folder.shape_mismatch(marker(tmp_path / "rank", other_rank), ours)
    assert (
        "holds LoRA adapters of lora_rank=8, lora_alpha=8.0" in message
        and "this run has lora_rank=4" in message
    )
    base = ours["lora"]["base"]
    moved = {**ours, "lora": {**ours["lora"], "base": {**base, "init_from": "/elsewhere/llama"}}}
    assert (
        checkpoint_folder.shape_mismatch(marker(tmp_path / "moved", moved), ours) is None
    )  # the same files elsewhere
    changed = {**ours, "lora": {**ours["lora"], "base": {**base, "sha256": "0" * 64}}}
    message = checkpoint_folder.shape_mismatch(marker(tmp_path / "changed", changed), ours)
    assert "another frozen base (init_from=" in message and "sampled SHA-256 0000000000000000" in message
    other_base = {**ours, "lora": {**ours["lora"], "base": {"seed": 1234}}}
    message = checkpoint_folder.shape_mismatch(marker(tmp_path / "base", other_base), ours)
    assert (
        "trained on another frozen base (a generated base of seed=1234) than this run's (init_from="
        in message
    )


def test_the_base_fingerprint_changes_with_a_sampled_byte_or_the_config_and_not_with_the_path(tmp_path):
    source = tmp_path / "source"
    tiny_llama(source, tied=False)
    before = lora.fingerprint(source)
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in source.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    assert lora.fingerprint(copy) == before
    shard = sorted(copy.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the last sampled block ends at the file's end
    shard.write_bytes(bytes(data))
    assert lora.fingerprint(copy) != before
    (source / "config.json").write_text((source / "config.json").read_text().replace("1e-05", "1e-06"))
    assert lora.fingerprint(source) != before
    assert lora.fingerprint(tmp_path / "gone").startswith("unreadable: ")


# ---------------------------------------------------------------------------------------------------------------
# End to end on 2 gloo ranks: peft and merged outputs, adapter-only checkpoints, SIGTERM and a bit-exact resume
# ---------------------------------------------------------------------------------------------------------------


def trainer_model(model_file: Path) -> decoder.Transformer:
    """The trainer's own model (torch blocks with their adapters, CPU, fp32) with the saved weights."""
    saved = torch.load(model_file, weights_only=True)
    cfg = saved["config"]
    shape = export_hf.shape_of(cfg)
    rope = rotary.Rope(shape.head_dim, cfg["rope_theta"], rotary.Llama3Scaling.from_settings(cfg))
    with torch.device("meta"):
        blocks = [decoder.TorchBlock(shape) for _ in range(shape.num_layers)]
        net = decoder.Transformer(shape, blocks, rope=rope)
    lora.apply(net, lora.LoraSettings.of(cfg))
    net.load_state_dict(saved["state_dict"], assign=True)
    return net.eval()


def lora_run_settings(tmp: Path, name: str, source: Path) -> dict[str, str]:
    """8 steps of 2 micro-batches per rank, LoRA on five of the seven projections with dropout."""
    return {**TINY_LLAMA, **LORA_TINY, "init_from": str(source), "batch_size": "1", "grad_accum_steps": "2",
            "max_steps": "8", "checkpoint_interval": "0", "checkpoint_dir": str(tmp / f"ckpt_{name}"),
            "model_dir": str(tmp / f"model_{name}")}  # fmt: skip


@pytest.fixture(scope="module")
def lora_reference(tmp_path_factory) -> tuple[Path, Path, str]:
    """The tiny Llama (``source/``) and an uninterrupted LoRA run on it: (tmp folder, source, output)."""
    tmp = tmp_path_factory.mktemp("lora")
    tiny_llama(tmp / "source", tied=False)
    return tmp, tmp / "source", run_trainer(lora_run_settings(tmp, "ref", tmp / "source"))


@pytest.mark.slow
def test_peft_and_the_merged_folder_give_the_trainers_logits(lora_reference):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    tmp, source, output = lora_reference
    model_dir = tmp / "model_ref"
    assert f"peft LoRA adapter exported to {model_dir / 'adapter'}: README.md, adapter_config.json, " \
        "adapter_model.safetensors" in output  # fmt: skip
    assert "trainable_parameters=" in output and "targets=q_proj,v_proj,o_proj,gate_proj,down_proj" in output
    saved_config = torch.load(model_dir / "model.pt", weights_only=True)["config"]
    summary = fields(next(line for line in output.splitlines() if line.startswith("summary ")))
    flops = float(summary["tflops_per_gpu"]) * 1e12 / float(summary["tokens_per_sec"])
    lora_flops = shapes.flops_per_token(
        settings_parse.model_shape(saved_config), 32, settings_parse.lora_parameters(saved_config)
    )
    assert flops == pytest.approx(lora_flops, rel=1e-4)  # the trainer's TFLOP/s: what a LoRA step computes
    adapter_config = json.loads((model_dir / "adapter" / "adapter_config.json").read_text())
    assert {k: adapter_config[k] for k in ("peft_type", "task_type", "r", "lora_alpha", "bias", "use_dora")} == {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8.0, "bias": "none", "use_dora": False,
    }  # fmt: skip
    assert sorted(adapter_config["target_modules"]) == sorted(
        ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]
    )
    assert adapter_config["modules_to_save"] is None  # vLLM refuses any
    ids = tokens()
    with torch.no_grad():
        ours = trainer_model(model_dir / "model.pt").logits(ids)
        base = LlamaForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        before = base(ids).logits
        peft = PeftModel.from_pretrained(base, model_dir / "adapter").eval()
        through_peft = peft(ids).logits
        merged = LlamaForCausalLM.from_pretrained(model_dir / "hf", dtype=torch.float32).eval()
        through_merged = merged(ids).logits
    peft_diff = (through_peft - ours).abs().max().item()
    merged_diff = (through_merged - ours).abs().max().item()
    print(
        f"max |logit difference| fp32: peft-loaded vs trainer {peft_diff:.3g}, merged vs trainer {merged_diff:.3g}"
    )
    assert peft_diff <= 1e-5 and merged_diff <= 1e-5
    assert (ours - before).abs().max() > 1e-2  # the adapters trained: not the base model's logits
    assert "merged into the frozen base weights" in (model_dir / "hf" / "README.md").read_text()
    from training.evaluate import model_folder

    # the evaluation job takes the merged model
    assert model_folder.locate(model_dir, tmp / "work") == model_dir / "hf"


@pytest.mark.slow
def test_a_lora_checkpoint_holds_only_adapters_and_a_sigterm_then_resume_is_bit_identical(lora_reference):
    import torch.distributed.checkpoint as dcp

    from tests.training.test_distributed import run_until_sigterm

    tmp, source, ref_output = lora_reference
    cfg = lora_run_settings(tmp, "term", source)
    first = run_until_sigterm({**cfg, "activation_checkpointing": "full"}, after_step_seen=3)
    assert "stopping at step" in first, first
    stopped_at = max(step_lines(first))
    ((step, folder),) = checkpoint_folder.complete_checkpoints(cfg["checkpoint_dir"])
    assert step == stopped_at < 8
    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    model_keys = {k.removeprefix("model.") for k in saved if k.startswith("model.")}
    assert model_keys and all(lora.is_adapter(k) for k in model_keys), sorted(model_keys)[:5]
    assert len(model_keys) == 2 * 5 * 2  # 5 projections x 2 layers, A and B
    identity = json.loads((folder / names.MARKER).read_text())["model_shape"]["lora"]
    assert identity["base"] == {"init_from": str(source), "sha256": lora.fingerprint(source)}
    second = run_trainer({**cfg, "activation_checkpointing": "selective"})
    assert f"at step {stopped_at}" in second
    keys = ("loss", "lr", "grad_norm")
    for step in range(stopped_at + 1, 9):
        assert [fields(step_lines(second)[step])[k] for k in keys] == [
            fields(step_lines(ref_output)[step])[k] for k in keys
        ], step
    resumed = torch.load(tmp / "model_term" / "model.pt", weights_only=True)["state_dict"]
    uninterrupted = torch.load(tmp / "model_ref" / "model.pt", weights_only=True)["state_dict"]
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[name], uninterrupted[name]) for name in resumed)
    first_losses = {s: v for s, v in losses(first).items()}
    assert first_losses == {s: v for s, v in losses(ref_output).items() if s <= stopped_at}


@pytest.mark.slow
def test_a_peft_adapter_export_interrupted_by_sigkill_is_completed_by_a_rerun(lora_reference):
    """A LoRA job killed while it exported its peft adapter (model.pt and hf/ written, adapter.partial/ half
    written): the rerun finds the run complete and makes the adapter folder, the same adapter an uninterrupted run
    made; the merged hf/ is left as it is."""
    import shutil

    tmp, source, _ = lora_reference
    shutil.copytree(tmp / "ckpt_ref", tmp / "ckpt_rerun")
    shutil.copytree(tmp / "model_ref", tmp / "model_rerun", ignore=shutil.ignore_patterns("adapter"))
    partial = tmp / "model_rerun" / "adapter.partial"
    partial.mkdir()
    (partial / "adapter_model.safetensors").write_bytes(b"half a file")
    output = run_trainer(lora_run_settings(tmp, "rerun", source))
    model_dir = tmp / "model_rerun"
    assert (
        f"run already complete: the newest checkpoint is at step 8 and max_steps=8; {model_dir / 'model.pt'} has "
        f"no peft adapter folder (one was interrupted: adapter.partial): peft LoRA adapter exported to "
        f"{model_dir / 'adapter'}"
    ) in output, output
    assert "has no Hugging Face export" not in output and not partial.exists()
    made, reference = model_dir / "adapter", tmp / "model_ref" / "adapter"
    weights = "adapter_model.safetensors"
    assert (made / weights).read_bytes() == (reference / weights).read_bytes()

    def config(folder: Path) -> dict:
        """peft keeps target_modules as a set: its order varies between processes."""
        loaded = json.loads((folder / "adapter_config.json").read_text())
        return {**loaded, "target_modules": sorted(loaded["target_modules"])}

    assert config(made) == config(reference)


@pytest.mark.slow
def test_every_ranks_slice_of_every_adapter_is_in_the_saved_adapter(tmp_path):
    """The defect class of FSDP2 + peft saving rank 0's slice only: each rank writes values naming itself into its
    shard; the peft file holds exactly the gathered full tensors, with rows of every rank. Rank 2 on 4 ranks:
    two ranks hold no row of an A matrix (2 ranks, a row each, add nothing over it)."""
    nproc = 4
    settings = {**TINY_LLAMA, "init_from": str(tmp_path / "source"), "lora_rank": "2",
                "model_dir": str(tmp_path / "model"), "checkpoint_dir": str(tmp_path / "ckpt")}  # fmt: skip
    tiny_llama(tmp_path / "source", tied=True)
    command = ["torchrun", "--standalone", f"--nproc-per-node={nproc}",
               str(ROOT / "tests" / "training" / "lora_probe.py"), str(tmp_path), *cli_args(settings)]  # fmt: skip
    proc = subprocess.run(command, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    probe = torch.load(tmp_path / "gathered.pt", weights_only=True)
    written = load_file(tmp_path / "adapter" / export_peft.ADAPTER_WEIGHTS)
    assert written.keys() == probe["gathered"].keys() and len(written) == 2 * 7 * 2
    for key, full in probe["gathered"].items():
        assert torch.equal(written[key], full), key
    owners = {int(value) // 1000 for full in written.values() for value in full[:, 0].tolist()}
    assert owners == set(range(1, nproc + 1))  # rows written by every rank
    a_rows = [rows["layers.0.qkv.lora_a_q_proj"] for rows in probe["rows"]]
    assert sum(a_rows) == 2 and 0 in a_rows


# ---------------------------------------------------------------------------------------------------------------
# The plan and tuning
# ---------------------------------------------------------------------------------------------------------------


def test_a_lora_runs_model_flops_leave_out_the_frozen_weights_gradient_gemms():
    """The frozen base's weights run their forward and input-gradient GEMMs only (4 FLOPs per weight and token),
    the adapters all three (6), attention's matmuls are unchanged: the trainer's TFLOP/s and MFU, the plan's and
    the tuning report's, count what a LoRA step computes (Megatron-Bridge's LoRA TFLOP/s fix: 2/3 of full)."""
    from training.plan import inputs, memory, timing
    from training.trainer.observe import metrics

    settings = lora.LoraSettings(rank=3, alpha=6.0, dropout=0.0, targets=("q_proj", "v_proj", "down_proj"))
    adapters = lora.counts(lora_torch_model(settings))[0]
    assert (
        settings_parse.lora_parameters({"lora_rank": 3, "lora_targets": "q,v,down", **SHAPE_VALUES})
        == adapters
    )
    assert settings_parse.lora_parameters({"lora_rank": 0, "lora_targets": "all-linear", **SHAPE_VALUES}) == 0
    attention = 12.0 * SHAPE.num_layers * SHAPE.hidden_size * 32
    weights_ = (shapes.flops_per_token(SHAPE, 32) - attention) / 6
    expected = 4 * weights_ + 6 * adapters + attention
    assert shapes.flops_per_token(SHAPE, 32, lora_parameters=adapters) == pytest.approx(expected)
    meter = metrics.Throughput(SHAPE, 32, 128, 0, torch.device("cpu"), "fp32", lora_parameters=adapters)
    assert meter.rates(10**9, 1.0)["tflops_per_gpu"] == pytest.approx(1e9 * expected / 1e12)
    full, adapted = (inputs.setup_from_request(lora_request("llama3.1-70b", rank)) for rank in (0, 16))
    full_time, adapted_time = timing.estimate_time(full), timing.estimate_time(adapted)
    # The plan's step time counts the same FLOPs (at the same reference MFU): a LoRA token costs about 2/3 of a
    # full fine-tuning one, so its tokens/s is about 1.44x, and the MFU the run would report is the same.
    lora_flops = shapes.flops_per_token(
        adapted.shape, adapted.seq_length, memory.lora_block_parameters(adapted) * adapted.shape.num_layers
    )
    flops_ratio = shapes.flops_per_token(full.shape, full.seq_length) / lora_flops
    speed_ratio = adapted_time.tokens_per_sec_per_gpu / full_time.tokens_per_sec_per_gpu
    assert 1.40 < flops_ratio < 1.50, flops_ratio
    assert speed_ratio == pytest.approx(flops_ratio, rel=0.01), (speed_ratio, flops_ratio)
    assert adapted_time.mfu_bf16 == pytest.approx(full_time.mfu_bf16, rel=0.01)


SHAPE_VALUES = {"num_layers": 2, "hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 48,
                "vocab_size": 42}  # fmt: skip
"""``SHAPE`` as settings."""


def lora_request(model_preset: str, rank: int, **settings) -> dict:
    hyperparameters = {"model_preset": model_preset, "precision": "bf16", "seq_length": 4096, "batch_size": 1,
                       "activation_checkpointing": "full", "lora_rank": rank, **settings}  # fmt: skip
    return {"instance_type": "ml.p6-b200.48xlarge", "instance_count": 1, "hyperparameters": hyperparameters}


def test_the_plan_counts_the_adapters_parameters_as_the_trainer_makes_them():
    from training.plan import inputs, memory

    for targets in ("all-linear", "q,v", "gate,down"):
        cfg = config.config_from_mapping({"model_preset": "custom", "num_layers": "2", "hidden_size": "32",
                                          "num_heads": "4", "num_kv_heads": "2", "ffn_hidden_size": "48",
                                          "vocab_size": "42", "lora_rank": "3", "lora_targets": targets})  # fmt: skip
        net = lora_torch_model(lora.LoraSettings.of(cfg))
        setup = inputs.setup_from_request({"hyperparameters": {k: v for k, v in cfg.as_dict().items()
                                                             if k in settings_table.HYPERPARAMETERS_BY_NAME}})  # fmt: skip
        assert memory.lora_block_parameters(setup) * 2 == lora.counts(net)[0], targets


def test_the_plan_gives_a_frozen_base_no_gradient_and_no_optimizer_state_and_the_adapters_both():
    from training.plan import inputs, memory

    full = memory.estimate_memory(inputs.setup_from_request(lora_request("llama3.1-70b", 0)))
    setup = inputs.setup_from_request(lora_request("llama3.1-70b", 16))
    adapted = memory.estimate_memory(setup)
    adapters = memory.lora_block_parameters(setup) * 80
    assert adapters == 16 * 80 * (2 * (8192 + 8192) + 2 * (1024 + 8192) + 3 * (28672 + 8192))
    moments = memory.lora_memory(setup, memory._moments(setup))
    step = moments["optimizer step"]
    assert step["AdamW state"] == 8 * adapters / 8 and step["gradients (sharded)"] == 4 * adapters / 8
    assert step["sharded parameters"] == pytest.approx(4 * (setup.shape.parameter_count() + adapters) / 8)
    assert all(
        m.get("head gradient", 0) == 0 and m.get("root gradients (unsharded)", 0) == 0
        for m in moments.values()
    )
    assert full.fits and adapted.fits and adapted.peak_gib < full.peak_gib / 2
    dropout = inputs.setup_from_request(lora_request("llama3.1-8b", 16, lora_dropout=0.1))
    assert memory.lora_activation_bytes(dropout) > memory.lora_activation_bytes(
        inputs.setup_from_request(lora_request("llama3.1-8b", 16))
    )


def test_tuning_candidates_keep_the_requests_lora_settings_and_low_precisions_are_refused_for_it():
    from training.plan import inputs
    from training.request import tuning

    request = lora_request("llama3.1-8b", 16, lora_targets="q,k,v,o", batch_size=8)
    found = tuning.candidates(
        *inputs.parse_request(request), {"batch_size": (1, 2, 4, 8), "precision": ("bf16", "fp8")}
    )
    assert found.ranked and all(c.plan.setup.lora_rank == 16 for c in found.ranked)
    assert all(c.plan.setup.lora_targets == ("q_proj", "k_proj", "v_proj", "o_proj") for c in found.ranked)
    assert all(not any(name.startswith("lora") for name in c.overrides) for c in found.ranked)
    assert {c.overrides["precision"] for c in found.ranked} == {"bf16"}
    assert len(found.refused) == 4 and all("fp8 cannot train LoRA adapters" in r for r in found.refused)
    # a LoRA run's measurement never stands for a full fine-tuning run's
    assert "lora_rank" in contract_tuning.measurement_key_settings()
