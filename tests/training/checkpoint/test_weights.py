"""training.trainer.checkpoint.weights and layout: one full value per parameter (imported or seeded by its name), then
this rank's shard; the same initial model for world sizes 1, 2 and 4 on the torch path and with Transformer
Engine 2.11's parameter names and shapes; an imported Hugging Face model gives transformers' logits; an unusable
folder is refused before step 1, reading only the safetensors headers.

World sizes are simulated in this one process with PyTorch's fake process group: for each rank of a world size the
real ``fully_shard`` and ``weights.initialize`` run, and the ranks' local shards are put back together (the
collectives do nothing, and none is needed: every rank makes its shard from the full value alone)."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from transformers import LlamaForCausalLM

from tests.training.hf_models import ORIGINAL_MAX_POSITIONS, tiny_llama, tokens
from tests.training.llama import llama as llama_config
from tests.training.runner import ROOT, cli_args, env
from training.contract import settings_parse, settings_table
from training.contract import shapes as contract_shapes
from training.models import settings as model_settings
from training.models.config import ModelConfig
from training.request import hf_config
from training.trainer.checkpoint import export_hf, weights
from training.trainer.distributed import levers, master_weights, parallel
from training.trainer.model import decoder, layout, rotary

SHAPE = llama_config(2, 32, 4, 48, 42, num_kv_heads=2)
"""42 vocabulary rows and 64-row fused QKV: uneven shards at world size 4 (11, 11, 11, 9 rows)."""
CPU = torch.device("cpu")


@contextmanager
def fake_rank(rank: int, world: int):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()


def gathered(build: Callable[[], decoder.Transformer], world: int, **init) -> dict[str, torch.Tensor]:
    """Every parameter's full value after sharding over ``world`` ranks and ``weights.initialize(**init)``: each
    rank's local shard, concatenated in rank order."""
    pieces: dict[str, list[torch.Tensor]] = defaultdict(list)
    for rank in range(world):
        with fake_rank(rank, world) as mesh:
            net = build()
            parallel.shard_model(net, mesh, parallel.mixed_precision(torch.float32), CPU)
            weights.initialize(net, **init)
            for name, param in net.named_parameters():
                assert isinstance(param, DTensor) and not param.is_meta
                pieces[name].append(param.to_local().detach().clone())
    return {name: torch.cat(parts) for name, parts in pieces.items()}


def torch_model(shape: ModelConfig = SHAPE) -> decoder.Transformer:
    return decoder.build_model(shape, use_te=False, te_params_dtype=torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# Modules with Transformer Engine 2.11's parameter names, shapes and reset_parameters
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class InitMeta:
    """TE 2.11 ``module/_common.py`` ``_ParameterInitMeta``: init_fn, get_rng_state_tracker, fp8_meta_index."""

    init_fn: Callable = field(default=lambda w: nn.init.normal_(w, std=0.023))
    get_rng_state_tracker: Callable | None = None
    fp8_meta_index: int | None = None


class FakeTEModule(nn.Module):
    """A TE module's parameter handling as ``module/base.py`` has it at v2.11: one ``param_init_meta`` entry per
    parameter; ``reset_parameters`` takes the DTensor's local tensor (materialized when on meta), calls
    ``init_fn`` on it, and wraps it back into a DTensor of the same global shape and placements.

    ``quantized`` (``quantized_model_init``, ``primary_weights_in_fp8``): weights (not the norms) are then
    quantized after ``init_fn``, their quantizer's usage set as TE sets it, ``rowwise=True,
    columnwise=torch.is_grad_enabled()`` (recorded in ``columnwise``: an MXFP8 weight quantized without
    column-wise usage has no ``_columnwise_data``, which FSDP2's backward all-gather sends). The stand-in for the
    FP8 format: values rounded to E4M3 (``torch.float8_e4m3fn``) held in a bf16 tensor."""

    def __init__(self, quantized: bool = False, **shapes: tuple[int, ...]):
        super().__init__()
        self.param_init_meta: dict[str, InitMeta] = {}
        self.quantized = quantized
        self.columnwise: dict[str, bool] = {}
        dtype = torch.bfloat16 if quantized else torch.float32  # loop.build: te_params_dtype
        for name, dims in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.empty(dims, device="meta", dtype=dtype)))
            self.param_init_meta[name] = InitMeta(fp8_meta_index=None if "norm" in name else 0)

    def reset_parameters(self) -> None:
        for name, param in self.named_parameters(recurse=False):
            local = param._local_tensor if isinstance(param, DTensor) else param
            if local.device == torch.device("meta"):
                local = torch.empty_like(local, device="cpu")
            self.param_init_meta[name].init_fn(local)
            if self.quantized and self.param_init_meta[name].fp8_meta_index is not None:
                self.columnwise[name] = torch.is_grad_enabled()
                local = local.to(torch.float8_e4m3fn).to(local.dtype)
            if isinstance(param, DTensor):
                local = DTensor.from_local(
                    local, param.device_mesh, param.placements, shape=param.size(), stride=param.stride()
                )
            setattr(self, name, nn.Parameter(local))


class FakeTEBlock(nn.Module):
    """``TransformerLayer(fuse_qkv_params=True, normalization="RMSNorm", activation="swiglu", bias=False,
    num_gqa_groups=kv_heads)``'s parameters: ``self_attention.layernorm_qkv.{layer_norm_weight, weight}`` (``hidden
    + 2 * kv_heads * head_dim`` rows), ``self_attention.proj.weight``, ``layernorm_mlp.{layer_norm_weight,
    fc1_weight, fc2_weight}``."""

    def __init__(self, shape: ModelConfig, quantized: bool = False):
        super().__init__()
        h, f, kv = shape.hidden_size, shape.ffn_hidden_size, shape.kv_heads * shape.head_dim
        self.self_attention = nn.Module()
        self.self_attention.layernorm_qkv = FakeTEModule(
            quantized, layer_norm_weight=(h,), weight=(h + 2 * kv, h)
        )
        self.self_attention.proj = FakeTEModule(quantized, weight=(h, h))
        self.layernorm_mlp = FakeTEModule(
            quantized, layer_norm_weight=(h,), fc1_weight=(2 * f, h), fc2_weight=(h, f)
        )


def te_model(shape: ModelConfig = SHAPE, quantized: bool = False) -> decoder.Transformer:
    blocks = [FakeTEBlock(shape, quantized) for _ in range(shape.num_layers)]
    with torch.device("meta"):
        return decoder.Transformer(shape, blocks)


# ---------------------------------------------------------------------------------------------------------------
# Initialization: the same model for every world size, on both paths
# ---------------------------------------------------------------------------------------------------------------


def test_the_torch_models_initial_values_are_the_same_for_world_sizes_1_2_and_4():
    one = gathered(torch_model, 1, seed=7)
    for world in (2, 4):
        other = gathered(torch_model, world, seed=7)
        assert other.keys() == one.keys()
        assert all(torch.equal(other[name], value) for name, value in one.items()), world
    qkv = one["layers.0.qkv.weight"]
    assert not torch.equal(qkv[:32], qkv[32:])  # each rank's rows are its own numbers, not a repeated block
    assert not torch.equal(one["layers.0.qkv.weight"], one["layers.1.qkv.weight"])
    assert not torch.equal(gathered(torch_model, 1, seed=8)["embed.weight"], one["embed.weight"])
    assert torch.equal(one["norm.weight"], torch.ones(32))
    down = one["layers.1.down.weight"]
    assert 0.5 * 0.02 / 2 < down.std() < 1.5 * 0.02 / 2  # output projections scaled by 1/sqrt(2 * layers)


def test_te_named_modules_get_the_same_values_for_world_sizes_1_2_and_4_and_hold_the_torch_models_tensors():
    one = gathered(te_model, 1, seed=7)
    assert "layers.0.self_attention.layernorm_qkv.weight" in one
    for world in (2, 4):
        other = gathered(te_model, world, seed=7)
        assert all(torch.equal(other[name], value) for name, value in one.items()), world
    te_llama = export_hf.to_hf_state_dict(one, SHAPE)
    torch_llama = export_hf.to_hf_state_dict(gathered(torch_model, 2, seed=7), SHAPE)
    assert te_llama.keys() == torch_llama.keys()
    assert all(torch.equal(te_llama[name], torch_llama[name]) for name in te_llama)


def test_without_the_mechanism_te_modules_repeat_each_ranks_rows_and_depend_on_the_world_size():
    """The bug it removes: TE's own init_fn on each rank's shard, from the same RNG state on every rank."""

    def te_default(world: int) -> torch.Tensor:
        parts = []
        for rank in range(world):
            with fake_rank(rank, world) as mesh:
                net = te_model()
                parallel.shard_model(net, mesh, parallel.mixed_precision(torch.float32), CPU)
                torch.manual_seed(7)  # loop.set_determinism: the same seed on every rank
                net.layers[0].layernorm_mlp.reset_parameters()
                parts.append(net.layers[0].layernorm_mlp.fc2_weight.to_local().clone())
        return torch.cat(parts)

    two = te_default(2)
    assert torch.equal(two[:16], two[16:])  # rank 1's rows are rank 0's numbers
    assert not torch.equal(te_default(1), two)


def te_modules(net: nn.Module) -> dict[str, FakeTEModule]:
    return {name: module for name, module in net.named_modules() if isinstance(module, FakeTEModule)}


def test_te_modules_quantize_their_weights_with_grad_mode_on_so_backward_has_their_columnwise_data():
    """TE 2.11 sets a primary FP8/MXFP8 weight's column-wise usage from ``torch.is_grad_enabled()`` while
    ``reset_parameters`` quantizes it: called under no_grad, MXFP8 weights had no column-wise data for the backward
    pass. Whatever the caller's grad mode, every weight is quantized with it on (and nothing records a graph)."""
    with fake_rank(0, 2) as mesh:
        net = te_model(quantized=True)
        parallel.shard_model(net, mesh, parallel.mixed_precision(torch.bfloat16), CPU)
        with torch.no_grad():
            weights.initialize(net, seed=7)
        usages = {name: module.columnwise for name, module in te_modules(net).items()}
        assert len(usages) == 3 * SHAPE.num_layers
        assert all(usage and all(usage.values()) for usage in usages.values()), usages
        assert all(p.grad_fn is None and p.requires_grad for p in net.parameters())


def test_the_masters_of_quantized_weights_start_from_their_values_before_quantization():
    """``quantized_model_init``: the fp32 masters start from the generated (or imported) values, not from their
    FP8 rounding; the kept values are dropped once the masters exist."""
    exact = gathered(te_model, 1, seed=7)
    with fake_rank(0, 1) as mesh:
        net = te_model(quantized=True)
        parallel.shard_model(net, mesh, parallel.mixed_precision(torch.bfloat16), CPU)
        weights.initialize(net, seed=7, keep_master_values=True)
        params = dict(net.named_parameters())
        kept = {name for name, p in params.items() if hasattr(p, master_weights.INITIAL)}
        assert kept == {name for name in params if ".layers." in f".{name}"}  # every bf16 or quantized one
        optimizer = levers.build_optimizer(params.values(), "foreach", 0.0, 0.0, master_weights=True)
        for param in params.values():
            param.grad = torch.zeros_like(param)
        optimizer.step()  # lr 0: the masters are made, nothing moves
        fc2 = "layers.0.layernorm_mlp.fc2_weight"
        assert not torch.equal(params[fc2].to_local().float(), exact[fc2])  # the weight itself is rounded
        for name in kept:
            master = optimizer.state[params[name]][master_weights.MASTER]
            assert master.dtype == torch.float32 and torch.equal(master.to_local(), exact[name]), name
            assert not hasattr(params[name], master_weights.INITIAL)
        weights.initialize(net, seed=7)  # without the setting: nothing kept
        assert not any(hasattr(p, master_weights.INITIAL) for p in net.parameters())


# ---------------------------------------------------------------------------------------------------------------
# Import
# ---------------------------------------------------------------------------------------------------------------


def imported(folder, shape_changes: dict | None = None) -> tuple[decoder.Transformer, dict]:
    """The trainer's model of ``folder`` (one process, no sharding) with its weights."""
    values = settings_parse.parse_hyperparameters(
        {"precision": "fp32", "seq_length": 48}, hf_config.architecture(hf_config.read_local(folder))
    )
    shape = model_settings.model_config(values)  # as the trainer's TrainConfig.shape
    net = decoder.build_model(shape, use_te=False, te_params_dtype=torch.float32)
    net.to_empty(device=CPU)
    weights.initialize(net, seed=0, init_from=str(folder))
    return net.eval(), values


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_an_imported_llama_gives_transformers_logits_past_its_original_context(tmp_path, tied):
    reference = tiny_llama(tmp_path, tied=tied)
    net, values = imported(tmp_path)
    assert (values["num_kv_heads"], values["tie_embeddings"], values["rope_scaling"]) == (2, tied, "llama3")
    assert (net.head is None) == tied
    ids = tokens()
    assert ids.shape[1] > ORIGINAL_MAX_POSITIONS
    with torch.no_grad():
        ours, theirs = net.logits(ids), reference(ids).logits
    assert theirs.std() > 0.5
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    plain = rotary.Rope(16, values["rope_theta"])  # the same weights without llama3 scaling: other logits
    net.rope = plain
    with torch.no_grad():
        assert (net.logits(ids) - theirs).abs().max() > 1e-3


def test_an_imported_llamas_rms_norm_eps_is_its_config_jsons_or_transformers_default(tmp_path):
    """rms_norm_eps 1e-6 written out (Llama 2's) and left out (transformers' LlamaConfig default, 1e-6): the
    trainer's logits are transformers' only with that epsilon in every RMSNorm, not the presets' 1e-5."""
    reference = tiny_llama(tmp_path / "written", tied=False, rms_norm_eps=1e-6)
    reference.save_pretrained(tmp_path / "left_out", max_shard_size="40KB")
    config_file = tmp_path / "left_out" / "config.json"
    config_file.write_text(json.dumps({k: v for k, v in json.loads(config_file.read_text()).items()
                                       if k != "rms_norm_eps"}))  # fmt: skip
    ids = tokens()
    for folder in ("written", "left_out"):
        net, values = imported(tmp_path / folder)
        assert values["rms_norm_eps"] == 1e-6
        with torch.no_grad():
            theirs = (
                LlamaForCausalLM.from_pretrained(tmp_path / folder, dtype=torch.float32).eval()(ids).logits
            )
            torch.testing.assert_close(net.logits(ids), theirs, rtol=0, atol=1e-5)
            for norm in [m for m in net.modules() if isinstance(m, nn.RMSNorm)]:
                norm.eps = contract_shapes.NORM_EPS
            assert (net.logits(ids) - theirs).abs().max() > 1e-4, folder  # the epsilon shows


def test_te_named_modules_import_the_same_tensors_for_world_sizes_1_and_2(tmp_path):
    reference = tiny_llama(tmp_path, tied=False)
    shape = llama_config(2, 64, 4, 96, 96, num_kv_heads=2)
    folder = str(tmp_path)
    for world in (1, 2):
        state = gathered(lambda: te_model(shape), world, seed=0, init_from=folder)
        llama = export_hf.to_hf_state_dict(state, shape)
        assert all(torch.equal(llama[name], value) for name, value in reference.state_dict().items()), world


def test_interleaving_is_what_te_attention_reads_as_query_key_and_value():
    """TE 2.11 MultiheadAttention.forward: ``[.., ng * (np/ng + 2) * hn] -> [.., ng, (np/ng + 2), hn]``, split
    ``(np/ng, 1, 1)``; query head g * np/ng + i must use key/value head g, as Llama's repeat_kv."""
    shape = llama_config(1, 32, 4, 48, 10, num_kv_heads=2)
    q, k, v = torch.randn(32, 32), torch.randn(16, 32), torch.randn(16, 32)
    parts = layout.parts("layers.0.self_attention.layernorm_qkv.weight", shape)
    fused = layout.fuse(parts, [q, k, v], shape)
    x = torch.randn(5, 32)
    mixed = (x @ fused.T).view(5, 2, 4, 8)  # ng = 2 groups of (2 queries + key + value)
    te_q, te_k, te_v = mixed.split((2, 1, 1), dim=2)
    torch.testing.assert_close(te_q.reshape(5, 4, 8), (x @ q.T).view(5, 4, 8))
    torch.testing.assert_close(te_k.reshape(5, 2, 8), (x @ k.T).view(5, 2, 8))
    torch.testing.assert_close(te_v.reshape(5, 2, 8), (x @ v.T).view(5, 2, 8))
    split = layout.split(parts, fused, shape)
    assert all(torch.equal(a, b) for a, b in zip(split.values(), (q, k, v), strict=True))


# ---------------------------------------------------------------------------------------------------------------
# Refusals before step 1 (headers only)
# ---------------------------------------------------------------------------------------------------------------


def folder_cfg(folder):
    from training.trainer import config

    return config.config_from_mapping({"init_from": str(folder), "precision": "fp32", "seq_length": "32"})


def rewrite_index(folder, change: Callable[[dict], None]) -> None:
    index = folder / weights.INDEX_FILE
    data = json.loads(index.read_text())
    change(data["weight_map"])
    index.write_text(json.dumps(data))


def refusal(folder) -> str:
    with pytest.raises(settings_table.ContractError) as info:
        weights.check_init_from(folder_cfg(folder))
    assert info.value.field == "init_from" and "\n" not in str(info.value)
    return str(info.value)


def test_a_complete_folder_passes_and_its_shape_is_the_configs(tmp_path):
    tiny_llama(tmp_path, tied=True)
    cfg = folder_cfg(tmp_path)
    weights.check_init_from(cfg)
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.tie_embeddings, cfg.rope_scaling_factor) == (
        2,
        2,
        True,
        8.0,
    )


def test_a_missing_tensor_a_wrong_shape_a_missing_shard_and_an_extra_tensor_are_refused(tmp_path):
    from safetensors.torch import save_file

    tiny_llama(tmp_path, tied=False)
    key = "model.layers.1.mlp.up_proj.weight"
    rewrite_index(tmp_path, lambda m: m.pop(key))
    assert refusal(tmp_path).endswith(f"has no tensor {key}, which its config.json's model needs")
    save_file({key: torch.zeros(96, 32)}, str(tmp_path / "extra.safetensors"))
    rewrite_index(tmp_path, lambda m: m.update({key: "extra.safetensors"}))
    assert (
        f"{key} in extra.safetensors has shape (96, 32); its config.json's model needs (96, 64)"
        in refusal(tmp_path)
    )
    save_file({key: torch.zeros(96, 64), "model.layers.0.mlp.gate_proj.bias": torch.zeros(96)},
              str(tmp_path / "extra.safetensors"))  # fmt: skip
    rewrite_index(tmp_path, lambda m: m.update({"model.layers.0.mlp.gate_proj.bias": "extra.safetensors"}))
    assert "holds tensors LlamaForCausalLM has no place for: model.layers.0.mlp.gate_proj.bias" in refusal(
        tmp_path
    )
    rewrite_index(tmp_path, lambda m: m.update({key: "gone.safetensors"}))
    assert refusal(tmp_path).endswith(
        f"{weights.INDEX_FILE} names gone.safetensors, which is not in the folder"
    )


def test_a_folder_without_weights_or_config_or_of_another_architecture_is_refused_naming_it(tmp_path):
    for path in tmp_path.iterdir():
        path.unlink()
    with pytest.raises(settings_table.ContractError, match=r"init_from: .*holds no config\.json"):
        folder_cfg(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama_config(model_type="phi3")))
    with pytest.raises(
        settings_table.ContractError, match=r"model_type 'phi3' is not supported; supported: llama"
    ):
        folder_cfg(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama_config()))
    assert "holds no weights" in refusal(tmp_path)


def tiny_llama_config(**changes) -> dict:
    from tests.training.hf_models import tiny_config

    return {**tiny_config(False).to_dict(), **changes}


def test_explicit_settings_that_contradict_the_folder_are_refused_naming_both(tmp_path):
    tiny_llama(tmp_path, tied=True)
    from training.trainer import config

    base = {"init_from": str(tmp_path), "precision": "fp32", "seq_length": "32"}
    with pytest.raises(settings_table.ContractError) as info:
        config.config_from_mapping({**base, "num_kv_heads": "4"})
    assert str(info.value) == (
        "num_kv_heads: must be 2 or left out: the init_from model's config.json has num_kv_heads=2; got 4"
    )
    with pytest.raises(
        settings_table.ContractError, match="model_preset: llama3.2-1b is not the init_from model"
    ):
        config.config_from_mapping({**base, "model_preset": "llama3.2-1b"})
    agreeing = config.config_from_mapping({**base, "hidden_size": "64", "tie_embeddings": "true"})
    assert agreeing.model_preset == "custom" and agreeing.shape.kv_heads == 2


def test_a_sharded_parameter_takes_the_torch_chunk_of_its_rank():
    with fake_rank(3, 4) as mesh:
        net = torch_model()
        parallel.shard_model(net, mesh, parallel.mixed_precision(torch.float32), CPU)
        full = torch.arange(42 * 32, dtype=torch.float32).view(42, 32)
        rows = weights.local_rows(full, net.embed.weight)
        assert torch.equal(rows, full[33:])  # chunks of 11, 11, 11, 9
    assert weights.seed_of(1, "a") != weights.seed_of(1, "b") and weights.seed_of(1, "a") == weights.seed_of(
        1, "a"
    )


# ---------------------------------------------------------------------------------------------------------------
# Under torchrun on gloo: the trainer's own build, sharded forward and gathered state
# ---------------------------------------------------------------------------------------------------------------

PROBE_SETTINGS = {"precision": "fp32", "seq_length": "32", "deterministic": "true"}


def probe(tmp_path, settings: dict[str, str], nproc: int) -> dict:
    """``weights_probe`` under torchrun with ``nproc`` gloo ranks: rank 0's saved state, logits and loss."""
    out = tmp_path / f"probe_{nproc}.pt"
    command = ["torchrun", "--standalone", f"--nproc-per-node={nproc}",
               str(Path(__file__).parent.with_name("weights_probe.py")), str(out), *cli_args(settings)]  # fmt: skip
    proc = subprocess.run(command, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(out, weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_on_two_gloo_ranks_an_imported_llama_gives_transformers_logits_and_loss(tmp_path, tied):
    reference = tiny_llama(tmp_path / "hf", tied=tied)
    result = probe(tmp_path, {**PROBE_SETTINGS, "init_from": str(tmp_path / "hf")}, nproc=2)
    inputs, targets = result["tokens"][:, :-1], result["tokens"][:, 1:]
    assert inputs.shape[1] > ORIGINAL_MAX_POSITIONS
    with torch.no_grad():
        theirs = reference(inputs).logits
        their_loss = torch.nn.functional.cross_entropy(theirs.reshape(-1, 96), targets.reshape(-1))
    torch.testing.assert_close(result["logits"], theirs, rtol=0, atol=1e-5)
    torch.testing.assert_close(result["loss"], their_loss, rtol=0, atol=1e-5)
    llama = export_hf.to_hf_state_dict(result["state"], model_settings.model_config(reference_settings(tied)))
    assert all(
        torch.equal(llama[name], value) for name, value in reference.state_dict().items() if name in llama
    )


def reference_settings(tied: bool) -> dict:
    return {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 96, "vocab_size": 96,
            "num_kv_heads": 2, "tie_embeddings": tied}  # fmt: skip


@pytest.mark.slow
def test_the_gathered_initial_model_is_bit_identical_for_world_sizes_1_and_4(tmp_path):
    """4 ranks: even shards and uneven ones (90 vocabulary rows over 4: 23, 23, 23, 21); 2 ranks, the suite's
    usual world, shard evenly and add nothing over 4."""
    settings = {**PROBE_SETTINGS, **TINY_GQA}
    states = {nproc: probe(tmp_path, settings, nproc)["state"] for nproc in (1, 4)}
    assert states[1].keys() == states[4].keys()
    assert all(torch.equal(states[4][name], value) for name, value in states[1].items())


TINY_GQA = {"model_preset": "custom", "num_layers": "2", "hidden_size": "64", "num_heads": "4", "num_kv_heads": "2",
            "ffn_hidden_size": "96", "vocab_size": "90"}  # fmt: skip
