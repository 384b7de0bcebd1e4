"""training.trainer.checkpoint.export_hf: a trained model -> a Hugging Face LlamaForCausalLM folder that gives the trainer's
own logits; sharding, refusals, Transformer Engine's parameter layout, the data's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from tests.prepare.test_prepare import DOCS, tiny_tokenizer_json, write_inputs
from tests.training.hf_models import TOKENIZER_FILES, tiny_llama, tokens
from tests.training.llama import llama
from tests.training.runner import TINY, fields, run_single, run_trainer, step_lines
from training.contract import settings_table, shapes
from training.prepare import corpus
from training.trainer import config, loop
from training.trainer.checkpoint import export_hf
from training.trainer.checkpoint import model_file as checkpoint_model_file
from training.trainer.data import token_files as data
from training.trainer.distributed import parallel, precision
from training.trainer.model import decoder, rotary

SETTINGS = {
    **TINY,
    "max_steps": "8",
    "learning_rate": "0.01",
    "checkpoint_interval": "0",
    "rope_theta": "5000",
}
TOKENS = torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    """A finished 8-step single-process run of the tiny model with RoPE: (its model folder, its output)."""
    tmp = tmp_path_factory.mktemp("export")
    status, output = run_single(
        {**SETTINGS, "checkpoint_dir": str(tmp / "ckpt"), "model_dir": str(tmp / "model")}
    )
    assert status == 0, output
    return tmp / "model", output


def trainer_model(model_file: Path) -> decoder.Transformer:
    """The trainer's own model (torch blocks, CPU, fp32) with the saved weights."""
    saved = torch.load(model_file, weights_only=True)
    config = saved["config"]
    shape = export_hf.shape_of(config)
    rope = rotary.Rope(shape.head_dim, config["rope_theta"], rotary.Llama3Scaling.from_settings(config))
    blocks = [decoder.TorchBlock(shape) for _ in range(shape.num_layers)]
    net = decoder.Transformer(shape, blocks, rope=rope)
    net.load_state_dict(saved["state_dict"])
    return net.eval()


@pytest.mark.slow
def test_a_finished_run_holds_the_hf_folder_and_transformers_gives_the_trainers_logits(trained):
    model_dir, output = trained
    hf_dir = model_dir / export_hf.HF_DIR
    assert f"Hugging Face model (float32) exported to {hf_dir}" in output
    assert sorted(p.name for p in hf_dir.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "model.safetensors"
    ]  # fmt: skip
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 4
    assert (config["intermediate_size"], config["rope_theta"], config["tie_word_embeddings"]) == (
        128,
        5000.0,
        False,
    )
    ours = trainer_model(model_dir / "model.pt")
    hf = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    assert hf.config.rope_parameters["rope_theta"] == 5000.0 and hf.config.rms_norm_eps == shapes.NORM_EPS
    targets = TOKENS.roll(-1, dims=1)
    with torch.no_grad():
        our_logits = ours.logits(TOKENS)
        their = hf(TOKENS)
        assert (our_logits - their.logits).abs().max() <= 1e-4
        their_loss = F.cross_entropy(their.logits.view(-1, 256), targets.reshape(-1))
        torch.testing.assert_close(ours(TOKENS, targets), their_loss, rtol=0, atol=1e-5)
        assert their.logits.std() > 0.1  # trained weights, not near-zero initial ones
        # The comparison can fail: the same weights without rotary embeddings give other logits.
        ours.rope = None
        assert (ours.logits(TOKENS) - their.logits).abs().max() > 1e-2


def test_the_cli_exports_bfloat16_shards_with_an_index_under_a_size_limit(trained, tmp_path, capsys):
    out = tmp_path / "sharded"
    assert export_hf.main([str(trained[0]), str(out), "--max-shard-size", "60KB", "--dtype", "bfloat16"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"].values()) == set(shards)
    tensors = {name: t for shard in shards for name, t in load_file(out / shard).items()}
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert all((out / shard).stat().st_size <= 60_000 + 2_000 for shard in shards)  # + safetensors header
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in tensors.values())
    hf = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert set(index["weight_map"]) == set(hf.state_dict())
    full = LlamaForCausalLM.from_pretrained(trained[0] / export_hf.HF_DIR, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (hf(TOKENS).logits - full(TOKENS).logits).abs().max() < 0.05  # bfloat16 weights
    assert "exported to" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16),
                             ("mxfp8", torch.bfloat16)]
)  # fmt: skip
def test_by_hand_the_export_keeps_the_runs_precision_unless_told(trained, tmp_path, capsys, precision, dtype):
    """As every finished run's own export: an fp32 run's weights stay float32 (not bfloat16), an fp16 run's
    float16, the others bfloat16; ``--dtype`` chooses another; the help says so."""
    path = resaved(trained[0], tmp_path, precision=precision)
    assert export_hf.main([str(path), str(tmp_path / "kept")]) == 0
    assert {t.dtype for t in load_file(tmp_path / "kept" / "model.safetensors").values()} == {dtype}
    assert f"`{str(dtype).removeprefix('torch.')}`" in (tmp_path / "kept" / "README.md").read_text()
    assert export_hf.main([str(path), str(tmp_path / "told"), "--dtype", "float16"]) == 0
    assert {t.dtype for t in load_file(tmp_path / "told" / "model.safetensors").values()} == {torch.float16}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        export_hf.main(["--help"])
    assert "default: the run's precision" in " ".join(capsys.readouterr().out.split())


def resaved(trained_dir: Path, tmp_path: Path, **config_changes) -> Path:
    saved = torch.load(trained_dir / "model.pt", weights_only=True)
    config = {k: v for k, v in saved["config"].items() if config_changes.get(k, "") is not None}
    config.update({k: v for k, v in config_changes.items() if v is not None})
    path = tmp_path / "model.pt"
    torch.save({**saved, "config": config}, path)
    return path


@pytest.mark.parametrize("change", [{"position_encoding": "none"}, {"position_encoding": None}])
def test_a_model_without_rotary_embeddings_is_refused_with_the_reason(trained, tmp_path, capsys, change):
    """A NoPE model (and one saved before position_encoding existed, which was NoPE) has no Llama equivalent."""
    path = resaved(trained[0], tmp_path, **change)
    assert export_hf.main([str(path), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: position_encoding: {path} was trained with position_encoding=none")
    assert "every supported Hugging Face class applies rotary embeddings" in error and "\n" not in error
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_nope_run_says_the_export_was_skipped():
    cfg = type("Cfg", (), {"position_encoding": "none"})()
    line = export_hf.export_after_training(Path("/nonexistent/model.pt"), cfg)
    assert line.startswith("Hugging Face export skipped: position_encoding=none")


def test_nothing_is_overwritten(trained, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert export_hf.main([str(trained[0]), str(out)]) == 2
    assert "out_dir: " in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and (out / "mine.txt").read_text() == "keep"
    assert export_hf.main([str(trained[0]), str(tmp_path / "x"), "--dtype", "int8"]) == 2
    assert "dtype: must be one of bfloat16, float16, float32; got 'int8'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# Transformer Engine's layout (names and shapes of TE 2.11's TransformerLayer, fuse_qkv_params=True)
# ---------------------------------------------------------------------------------------------------------------

SHAPE = llama(num_layers=2, hidden_size=32, num_heads=4, ffn_hidden_size=48, vocab_size=40)


def te_state_dict(generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A state dict with the names and shapes a model of TE blocks has (random values)."""
    h, f = SHAPE.hidden_size, SHAPE.ffn_hidden_size
    state = {
        "embed.weight": torch.randn(SHAPE.vocab_size, h, generator=generator),
        "norm.weight": torch.rand(h, generator=generator) + 0.5,
        "head.weight": torch.randn(SHAPE.vocab_size, h, generator=generator),
    }
    for i in range(SHAPE.num_layers):
        p = f"layers.{i}."
        state |= {
            p + "self_attention.layernorm_qkv.layer_norm_weight": torch.rand(h, generator=generator) + 0.5,
            p + "self_attention.layernorm_qkv.weight": torch.randn(3 * h, h, generator=generator) / h**0.5,
            p + "self_attention.layernorm_qkv._extra_state": torch.zeros(0, dtype=torch.uint8),
            p + "self_attention.core_attention._extra_state": torch.zeros(0, dtype=torch.uint8),
            p + "self_attention.proj.weight": torch.randn(h, h, generator=generator) / h**0.5,
            p + "self_attention.proj._extra_state": torch.zeros(0, dtype=torch.uint8),
            p + "layernorm_mlp.layer_norm_weight": torch.rand(h, generator=generator) + 0.5,
            p + "layernorm_mlp.fc1_weight": torch.randn(2 * f, h, generator=generator) / h**0.5,
            p + "layernorm_mlp.fc2_weight": torch.randn(h, f, generator=generator) / f**0.5,
            p + "layernorm_mlp._extra_state": torch.zeros(0, dtype=torch.uint8),
        }
    return state


def te_attention_inputs(qkv_weight: torch.Tensor, x: torch.Tensor):
    """Query, key, value as TE 2.11's MultiheadAttention.forward makes them from the fused projection
    (qkv_weight_interleaved=True): ``[.., ng * (np/ng + 2) * hn] -> [.., ng, (np/ng + 2), hn]``, split
    ``(np/ng, 1, 1)`` along dim -2 (here ng = np: no grouped-query attention)."""
    heads, head_dim = SHAPE.num_heads, SHAPE.hidden_size // SHAPE.num_heads
    mixed = (x @ qkv_weight.T).view(*x.shape[:-1], heads, 3, head_dim)
    q, k, v = mixed.split((1, 1, 1), dim=-2)
    return q.squeeze(-2), k.squeeze(-2), v.squeeze(-2)


def te_swiglu(fc1_weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """TE's swiglu: SiLU gates the FIRST half of fc1's output (ops/basic/activation.py, SwiGLU)."""
    a, b = (x @ fc1_weight.T).chunk(2, dim=-1)
    return F.silu(a) * b


def test_transformer_engine_parameters_map_onto_llamas_projections():
    state = te_state_dict(torch.Generator().manual_seed(1))
    hf = export_hf.to_hf_state_dict(state, SHAPE)
    x = torch.randn(5, SHAPE.hidden_size)
    heads, head_dim = SHAPE.num_heads, SHAPE.hidden_size // SHAPE.num_heads
    for i in range(SHAPE.num_layers):
        te, ours = f"layers.{i}.", f"model.layers.{i}."
        q, k, v = te_attention_inputs(state[te + "self_attention.layernorm_qkv.weight"], x)
        for name, expected in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            got = (x @ hf[f"{ours}self_attn.{name}.weight"].T).view(5, heads, head_dim)  # Llama's head split
            torch.testing.assert_close(got, expected)
        mlp = F.silu(x @ hf[ours + "mlp.gate_proj.weight"].T) * (x @ hf[ours + "mlp.up_proj.weight"].T)
        torch.testing.assert_close(mlp, te_swiglu(state[te + "layernorm_mlp.fc1_weight"], x))
        for hf_name, te_name in {
            "input_layernorm.weight": "self_attention.layernorm_qkv.layer_norm_weight",
            "post_attention_layernorm.weight": "layernorm_mlp.layer_norm_weight",
            "self_attn.o_proj.weight": "self_attention.proj.weight",
            "mlp.down_proj.weight": "layernorm_mlp.fc2_weight",
        }.items():
            assert torch.equal(hf[ours + hf_name], state[te + te_name])
    assert torch.equal(hf["lm_head.weight"], state["head.weight"])
    assert len(hf) == 3 + 9 * SHAPE.num_layers  # every Llama tensor, nothing else
    llama = LlamaForCausalLM._from_config(
        __import__("transformers").LlamaConfig(**export_hf.hf_config_json(_config(), "float32", None))
    )
    assert set(hf) == set(llama.state_dict())
    assert {k: tuple(v.shape) for k, v in hf.items()} == {
        k: tuple(v.shape) for k, v in llama.state_dict().items()
    }


def _config() -> dict:
    return {**{name: getattr(SHAPE, name) for name in settings_table.MODEL_DIM_NAMES}, "seq_length": 64,
            "rope_theta": 10000.0, "position_encoding": "rope"}  # fmt: skip


def test_an_unexpected_entry_or_shape_is_an_error_not_a_silent_drop():
    state = te_state_dict(torch.Generator().manual_seed(2))
    with pytest.raises(export_hf.ExportError, match=r"no Llama counterpart: layers\.0\.extra\.weight"):
        export_hf.to_hf_state_dict({**state, "layers.0.extra.weight": torch.zeros(1)}, SHAPE)
    state["layers.1.layernorm_mlp.fc1_weight"] = torch.zeros(48, 32)
    with pytest.raises(export_hf.ExportError, match=r"fc1_weight has shape \(48, 32\); expected \(96, 32\)"):
        export_hf.to_hf_state_dict(state, SHAPE)


# ---------------------------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_datas_tokenizer_json_goes_into_the_folder_and_loads_with_transformers(tmp_path):
    tokenizer_path = tiny_tokenizer_json(tmp_path)
    data = tmp_path / "data"
    meta = corpus.prepare([str(write_inputs(tmp_path))], str(data), tokenizer=tokenizer_path,
                           validation_fraction=0, block_tokens=16)  # fmt: skip
    assert meta["tokenizer"]["file"] == "tokenizer.json" and (data / "tokenizer.json").is_file()
    Path(tokenizer_path).unlink()  # the trainer must find it next to the data (as in a SageMaker channel)
    settings = {**SETTINGS, "seq_length": "8", "batch_size": "2", "max_steps": "2", "dataset": "channel",
                "data_dir": str(data), "checkpoint_dir": str(tmp_path / "ckpt"),
                "model_dir": str(tmp_path / "model")}  # fmt: skip
    status, output = run_single(settings)
    assert status == 0, output
    out = tmp_path / "model" / export_hf.HF_DIR
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    original = Tokenizer.from_file(str(data / "tokenizer.json"))
    loaded = PreTrainedTokenizerFast.from_pretrained(out)
    assert (
        loaded.encode(DOCS[0], add_special_tokens=False)
        == original.encode(DOCS[0], add_special_tokens=False).ids
    )
    eos = original.token_to_id("</s>")
    assert loaded.eos_token == "</s>" and loaded.eos_token_id == eos
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == eos
    assert "The data's Hugging Face tokenizer `tokenizer.json`" in (out / "README.md").read_text()


def test_a_byte_level_model_says_so_and_has_no_tokenizer_files(tmp_path):
    data = {"dataset": "channel", "tokenizer": {"name": "bytes", "kind": "byte-level UTF-8", "eos_id": 256}}
    text = export_hf.write_tokenizer(data, tmp_path, 64)
    assert text.startswith("Byte-level: token ids 0-255 are the bytes of UTF-8 text, 256 ends a document")
    assert list(tmp_path.iterdir()) == []
    assert export_hf.write_tokenizer(None, tmp_path, 64).startswith("Unknown")
    missing = {
        "dataset": "channel",
        "tokenizer": {"name": "t.json", "kind": "tokenizers"},
        "tokenizer_json": None,
    }
    assert "copy that `tokenizer.json` into this folder" in export_hf.write_tokenizer(missing, tmp_path, 64)


@pytest.mark.parametrize("travelled", [False, True], ids=["no tokenizer files", "its tokenizer files"])
def test_a_model_imported_then_trained_on_synthetic_tokens_has_a_truthful_card(tmp_path, travelled):
    """It learnt its language before this run: the card says where it came from, that this run's tokens were
    synthetic, and which tokenizer it reads."""
    files = {"tokenizer_config.json": b"{}"} if travelled else {}
    data = {"dataset": "synthetic", "init_from": {"path": "/models/llama", "config": {}, "files": files}}
    written = export_hf.write_source_files(data, tmp_path)
    text = export_hf.write_tokenizer(data, tmp_path, 64)
    assert "learnt no language" not in text
    assert "`init_from` /models/llama" in text
    assert "This run trained it on synthetic tokens (`dataset=synthetic`" in text
    if travelled:
        assert written == ["tokenizer_config.json"] and "`tokenizer_config.json` are here" in text
    else:
        assert written == [] and "the tokenizer of the model it started from" in text


# ---------------------------------------------------------------------------------------------------------------
# A run that started from a Hugging Face model (init_from): grouped-query attention, tying, llama3 RoPE scaling
# ---------------------------------------------------------------------------------------------------------------


def exported_by_the_trainer(cfg: config.TrainConfig, env: parallel.DistEnv) -> tuple[Path, Path, str]:
    """What a run of 0 steps does at its end, on its real path: ``loop.build`` (FSDP2-sharded, the weights
    imported or generated), ``checkpoint_model_file.save_model`` (the full state dict gathered, ``model.pt`` with the data's
    info, as ``loop`` saves it), then ``export_hf.export_after_training`` into ``hf/`` next to it. Returns the
    model file, the Hugging Face folder and the line the run prints."""
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = loop.build(cfg, env, plan)
    saved = checkpoint_model_file.save_model(
        net, cfg.model_dir, 0, cfg.as_dict(), env.rank, export_hf.data_info(cfg)
    )
    assert saved is not None
    return saved, saved.parent / export_hf.HF_DIR, export_hf.export_after_training(saved, cfg)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_import_then_export_gives_the_same_tensors_config_and_tokenizer_files(tmp_path, process_group, tied):
    source = tmp_path / "source"
    reference = tiny_llama(source, tied=tied)
    cfg = config.config_from_mapping(
        {"init_from": str(source), "precision": "fp32", "seq_length": "32", "model_dir": str(tmp_path / "m")}
    )
    _, out, line = exported_by_the_trainer(cfg, process_group)
    assert line.startswith(f"Hugging Face model (float32) exported to {out}: ")
    files = [p.name for p in out.iterdir()]
    assert set(TOKENIZER_FILES) | {"generation_config.json"} <= set(files)
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    exported = {name: t for shard in out.glob("*.safetensors") for name, t in load_file(shard).items()}
    original = {name: t for shard in source.glob("*.safetensors") for name, t in load_file(shard).items()}
    assert exported.keys() == original.keys() and ("lm_head.weight" in exported) is not tied
    assert all(torch.equal(exported[name], original[name]) for name in original)
    assert json.loads((out / "config.json").read_text()) == json.loads((source / "config.json").read_text())
    loaded = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert loaded.config.num_key_value_heads == 2 and loaded.config.tie_word_embeddings is tied
    assert loaded.config.rope_parameters["rope_type"] == "llama3"
    with torch.no_grad():
        ids = tokens()
        torch.testing.assert_close(loaded(ids).logits, reference(ids).logits, rtol=0, atol=0)
    gone = export_hf.source_info(str(tmp_path / "gone"))  # at the end of a run: never raises on rank 0 alone
    assert gone["config"] is None and gone["files"] == {} and "is not a folder" in gone["unreadable"]
    readme_text = (out / "README.md").read_text()
    assert "2 key/value heads (grouped-query attention)" in readme_text and "llama3 scaling" in readme_text
    assert f"{'tied' if tied else 'untied'} input and output embeddings" in readme_text


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_model_of_our_own_with_grouped_query_attention_exports_what_transformers_computes_alike(
    tmp_path, process_group, tied
):
    """No init_from: the export writes its own config.json (key/value heads, tying, llama3 RoPE scaling, the
    RMSNorm epsilon), and transformers' model of that folder gives the saved model's logits."""
    settings = {**TINY, "num_kv_heads": "2", "tie_embeddings": str(tied).lower(), "rope_theta": "500000",
                "rope_scaling": "llama3", "rope_scaling_factor": "8", "rope_low_freq_factor": "1",
                "rope_high_freq_factor": "4", "rope_original_max_position_embeddings": "16",
                "rms_norm_eps": "1e-6", "model_dir": str(tmp_path / "m")}  # fmt: skip
    model_file, out, _ = exported_by_the_trainer(config.config_from_mapping(settings), process_group)
    written = json.loads((out / "config.json").read_text())
    assert (written["num_key_value_heads"], written["tie_word_embeddings"], written["rms_norm_eps"]) == (
        2,
        tied,
        1e-6,
    )
    theirs = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert ("lm_head.weight" in {k for f in out.glob("*.safetensors") for k in load_file(f)}) is not tied
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(3))  # past the original 16
    with torch.no_grad():
        ours = trainer_model(model_file).logits(ids)
        assert ours.std() > 0.05
        torch.testing.assert_close(theirs(ids).logits, ours, rtol=0, atol=1e-5)


def test_a_model_of_our_own_with_grouped_query_attention_and_tying_exports_its_architecture(
    trained, tmp_path
):
    saved = torch.load(trained[0] / "model.pt", weights_only=True)
    config = {
        **saved["config"],
        **dict.fromkeys(("num_kv_heads", "tie_embeddings")),
    }  # as saved before they existed
    assert export_hf.hf_config_json(config, "float32", None)["num_key_value_heads"] == 4
    settings = {**saved["config"], "num_kv_heads": 2, "tie_embeddings": True, "rope_scaling": "llama3",
                "rope_scaling_factor": 8.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
                "rope_original_max_position_embeddings": 16}  # fmt: skip
    written = export_hf.hf_config_json(settings, "bfloat16", 3)
    assert (written["num_key_value_heads"], written["tie_word_embeddings"], written["eos_token_id"]) == (
        2,
        True,
        3,
    )
    assert written["rope_scaling"]["rope_type"] == "llama3" and written["rope_parameters"]["factor"] == 8.0
    assert written["max_position_embeddings"] == int(saved["config"]["seq_length"])


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_import_train_on_two_ranks_export_and_from_pretrained_reproduces_the_trainers_logits(tmp_path, tied):
    """The step-1 line's loss (the imported model's, before any update) is transformers' on both ranks' first
    batches; after 3 steps the exported folder gives the trainer's logits past the original context."""
    reference = tiny_llama(tmp_path / "source", tied=tied)
    settings = {"init_from": str(tmp_path / "source"), "precision": "fp32", "seq_length": "32",
                "batch_size": "2", "max_steps": "3", "learning_rate": "0.01", "lr_warmup_steps": "0",
                "log_interval": "1", "throughput_warmup_steps": "1", "checkpoint_interval": "0",
                "deterministic": "true", "checkpoint_dir": str(tmp_path / "ckpt"),
                "model_dir": str(tmp_path / "model")}  # fmt: skip
    output = run_trainer(settings)
    first = [data.SyntheticTokens(96, 32, 2, 1234, rank, 2).next_batch() for rank in range(2)]
    with torch.no_grad():
        losses = [F.cross_entropy(reference(t).logits.reshape(-1, 96), y.reshape(-1)) for t, y in first]
    printed = float(fields(step_lines(output)[1])["loss"])
    assert abs(printed - float(sum(losses) / 2)) < 2e-5, (printed, losses)
    hf_dir = tmp_path / "model" / export_hf.HF_DIR
    assert {"tokenizer_config.json", "special_tokens_map.json"} <= {p.name for p in hf_dir.iterdir()}
    ours = trainer_model(tmp_path / "model" / "model.pt")
    theirs = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    assert theirs.config.num_key_value_heads == 2 and theirs.config.tie_word_embeddings is tied
    ids = tokens()
    with torch.no_grad():
        trained = ours.logits(ids)
        torch.testing.assert_close(theirs(ids).logits, trained, rtol=0, atol=1e-5)
        assert (trained - reference(ids).logits).abs().max() > 1e-3  # it trained: not the imported weights


# ---------------------------------------------------------------------------------------------------------------
# A rerun completes an export that never started (issue 53 item 11)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lora_rank", ["0", "4"], ids=["full", "lora"])
def test_after_a_raised_max_steps_a_model_file_whose_export_never_started_is_exported_by_the_rerun(
    tmp_path, process_group, lora_rank
):
    """A run of 12 steps wrote model.pt and its hf/ (a LoRA run also adapter/); max_steps raised to 15, the next
    run wrote model_step_00000015.pt and was killed before its export began. The rerun finds the run complete and
    exports that file into hf_step_00000015/ (and adapter_step_00000015/), leaving the older folders as they
    are; a third run writes nothing."""
    from types import SimpleNamespace

    from training.trainer.checkpoint import export_peft

    settings = {**TINY, "model_dir": str(tmp_path / "model"), "lora_rank": lora_rank}
    cfg = config.config_from_mapping({**settings, "max_steps": "15"})
    net = loop.build(
        cfg, process_group, precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    )
    first = checkpoint_model_file.save_model(net, cfg.model_dir, 12, cfg.as_dict(), 0)
    lines = [export_hf.export_after_training(first, cfg)]
    if cfg.lora_rank:
        lines.append(export_peft.export_after_training(first, cfg))
    assert all(" exported to " in line for line in lines), lines
    raised = checkpoint_model_file.save_model(
        net, cfg.model_dir, 15, cfg.as_dict(), 0
    )  # killed before its export
    assert raised == tmp_path / "model" / "model_step_00000015.pt"
    before = {
        p.name: sorted(q.name for q in p.iterdir()) for p in (tmp_path / "model").iterdir() if p.is_dir()
    }
    said: list[str] = []
    loop._finished_already(cfg, SimpleNamespace(is_main=True), SimpleNamespace(step=15), said.append)
    done = "run already complete: the newest checkpoint is at step 15 and max_steps=15"
    hf = tmp_path / "model" / "hf_step_00000015"
    assert said[0] == (
        f"{done}; {raised} has no Hugging Face export (none was made): Hugging Face model (float32) exported to "
        f"{hf}: README.md, config.json, generation_config.json, model.safetensors"
    )
    if cfg.lora_rank:
        adapter = tmp_path / "model" / "adapter_step_00000015"
        assert (
            said[1].startswith(f"{done}; {raised} has no peft adapter folder (none was made): ")
            and str(adapter) in said[1]
        ), said
        assert (adapter / "adapter_model.safetensors").is_file()
    assert len(said) == (2 if cfg.lora_rank else 1) and (hf / "model.safetensors").is_file()
    for name, files in before.items():
        assert sorted(q.name for q in (tmp_path / "model" / name).iterdir()) == files
    said.clear()
    loop._finished_already(cfg, SimpleNamespace(is_main=True), SimpleNamespace(step=15), said.append)
    assert said == [f"{done}; the model is in {cfg.model_dir}; nothing trained, nothing written"]
