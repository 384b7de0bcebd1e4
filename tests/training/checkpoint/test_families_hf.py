"""Every family in and out of Hugging Face on the trainer's own path: a tiny random model of each family (its
distinguishing features on) imported by ``init_from`` (``loop.build``: FSDP2-sharded, the weights read from its
safetensors), saved and exported without training gives back every tensor bit for bit, its own config.json, chat
template, tokenizer files and generation config, and a folder transformers loads as the family's class with the
same logits; with LoRA adapters on the family's module names, ``peft`` loads the exported adapter onto the
transformers model and gives the trainer's logits, as the merged export does."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.training.checkpoint.test_export_hf import exported_by_the_trainer
from tests.training.hf_models import TOKENIZER_FILES
from tests.training.model.test_decoder_families import _hf_model
from tests.training.runner import losses, run_single
from training.models import registry
from training.trainer import config
from training.trainer.checkpoint import export_hf, export_peft, model_file
from training.trainer.model import decoder, lora

FAMILIES = list(registry.FAMILIES)
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
GENERATION = {"eos_token_id": [5, 7], "temperature": 0.6, "top_p": 0.9, "do_sample": True}


def _source(folder: Path, family: str) -> torch.nn.Module:
    """A Hugging Face folder of ``family``'s tiny random model with a tokenizer, a chat template and a generation
    config of its own."""
    hf = _hf_model(family, seed=3)
    hf.save_pretrained(folder)
    for name, text in TOKENIZER_FILES.items():
        (folder / name).write_text(text)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (folder / "generation_config.json").write_text(json.dumps(GENERATION))
    return hf


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    return {name: t for shard in folder.glob("*.safetensors") for name, t in load_file(shard).items()}


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("family", FAMILIES)
def test_import_then_export_without_training_is_bit_identical_and_loads_as_its_class(
    tmp_path, process_group, family
):
    source = tmp_path / "source"
    reference = _source(source, family)
    cfg = config.config_from_mapping(
        {"init_from": str(source), "precision": "fp32", "seq_length": "16", "model_dir": str(tmp_path / "m")}
    )
    imported = registry.read_hf_config(reference.config.to_dict())
    assert cfg.shape.family == family
    assert replace(cfg.shape, max_position_embeddings=None) == replace(imported, max_position_embeddings=None)
    _, out, line = exported_by_the_trainer(cfg, process_group)
    assert line.startswith(f"Hugging Face model (float32) exported to {out}: "), line
    exported, original = _tensors(out), _tensors(source)
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[name], original[name]) for name in original)  # every tensor, bit for bit
    assert json.loads((out / "config.json").read_text()) == json.loads((source / "config.json").read_text())
    for name in (*TOKENIZER_FILES, "chat_template.jinja", "generation_config.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    loaded = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(loaded).__name__ == registry.family(family).architecture
    assert loaded.generation_config.temperature == 0.6 and loaded.generation_config.eos_token_id == [5, 7]
    with torch.no_grad():
        assert torch.equal(loaded(_ids()).logits, reference(_ids()).logits)
    assert registry.family(family).architecture in (out / "README.md").read_text()


def _trainer_model(model_file: Path) -> decoder.Transformer:
    """The trainer's own model of ``model.pt`` (torch blocks with their adapters, CPU, fp32)."""
    saved = torch.load(model_file, weights_only=True)
    shape = export_hf.shape_of(saved["config"])
    with torch.device("meta"):
        net = decoder.Transformer(shape, [decoder.TorchBlock(shape) for _ in range(shape.num_layers)])
    lora.apply(net, lora.LoraSettings.of(saved["config"]))
    net.load_state_dict(saved["state_dict"], assign=True)
    return net.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_adapters_load_in_peft_and_give_the_merged_exports_logits(tmp_path, process_group, family):
    from peft import PeftModel

    source = tmp_path / "source"
    _source(source, family)
    cfg = config.config_from_mapping(
        {
            "init_from": str(source),
            "precision": "fp32",
            "seq_length": "16",
            "model_dir": str(tmp_path / "m"),
            "lora_rank": "4",
            "lora_targets": "q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj",
        }  # fmt: skip
    )
    from training.trainer import loop
    from training.trainer.distributed import precision

    net = loop.build(
        cfg, process_group, precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    )
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, param in lora.adapters(net):  # as after training: B no longer zero
            local = param.to_local() if hasattr(param, "to_local") else param
            local.copy_(torch.randn(local.shape, generator=generator) * 0.1)
    net.unshard() if hasattr(net, "unshard") else None
    with torch.no_grad():
        ours = net.logits(_ids().to(process_group.device)).cpu()
    saved = model_file.save_model(
        net, cfg.model_dir, 0, cfg.as_dict(), process_group.rank, export_hf.data_info(cfg)
    )
    merged_line = export_hf.export_after_training(saved, cfg)
    peft_line = export_peft.export_after_training(saved, cfg)
    assert "error" not in merged_line and "error" not in peft_line, (merged_line, peft_line)
    adapter = json.loads((saved.parent / export_peft.PEFT_DIR / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]
    )
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        before = base(_ids()).logits
        through_peft = (
            PeftModel.from_pretrained(base, saved.parent / export_peft.PEFT_DIR).eval()(_ids()).logits
        )
        merged = AutoModelForCausalLM.from_pretrained(
            saved.parent / export_hf.HF_DIR, dtype=torch.float32
        ).eval()
        through_merged = merged(_ids()).logits
    peft_diff = (through_peft - ours).abs().max().item()
    merged_diff = (through_merged - ours).abs().max().item()
    print(
        f"{family}: max |logit difference| fp32: peft vs trainer {peft_diff:.3g}, merged vs trainer {merged_diff:.3g}"
    )
    assert peft_diff <= 1e-4 and merged_diff <= 1e-4  # fp32, the bound (W + BA merged vs two GEMMs)
    assert (ours - before).abs().max().item() > 1e-2  # the adapters change the model


@pytest.mark.slow
def test_a_gemma3_model_trains_and_exports_on_the_trainers_own_command(tmp_path):
    """The whole trainer (one process) on the family furthest from Llama: a tiny Gemma 3 (four (1 + w) norms, GeGLU,
    query/key norm, local sliding-window and global layers, scaled embedding, tied) imported by ``init_from``,
    trained 4 steps on synthetic tokens past its window, checkpointed with its model_config, exported as
    ``Gemma3ForCausalLM``; and fp8 refused for it before anything runs, in one line."""
    source = tmp_path / "source"
    _source(source, "gemma3")
    settings = {"init_from": str(source), "precision": "fp32", "seq_length": "16", "batch_size": "2",
                "max_steps": "4", "learning_rate": "0.01", "lr_warmup_steps": "0", "log_interval": "1",
                "throughput_warmup_steps": "1", "checkpoint_interval": "2", "checkpoint_dir": str(tmp_path / "ckpt"),
                "model_dir": str(tmp_path / "model")}  # fmt: skip
    status, output = run_single(settings, timeout=600)
    assert status == 0, output
    assert "model_family=gemma3" in next(line for line in output.splitlines() if line.startswith("config "))
    steps = losses(output)
    assert len(steps) == 4 and all(float(loss) == float(loss) for loss in steps.values())  # finite
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model" / export_hf.HF_DIR, dtype=torch.float32)
    assert type(loaded).__name__ == "Gemma3ForCausalLM"
    marker = json.loads(next((tmp_path / "ckpt").glob("step_*/COMPLETE")).read_text())
    assert marker["model_shape"]["model_config"]["family"] == "gemma3"
    status, output = run_single(
        {**settings, "precision": "fp8", "model_dir": str(tmp_path / "fp8")}, timeout=300
    )
    refusal = next(
        line for line in output.splitlines() if line.startswith("error: invalid setting precision: ")
    )
    assert status == 2 and "fp8 runs the model on Transformer Engine's TransformerLayer" in refusal, output
    assert "the norms after attention and after the MLP" in refusal
