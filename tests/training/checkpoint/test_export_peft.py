"""The peft adapter folder as a user loads it (issue 53 item 13): ``adapter_config.json`` the same bytes in every
process (peft keeps ``target_modules`` as a set), the base model named so that peft's ``AutoPeftModelForCausalLM``
finds it (an absolute path locally, ``init_from_source`` when given: a job's ``init_from`` S3 URI, or a Hub model
id), and a rank no projection can use said before training. One process; the export itself in two more."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.hf_models import tiny_llama, tokens
from tests.training.llama import llama
from tests.training.runner import ROOT, env
from training.trainer import config, loop
from training.trainer.checkpoint import export_hf, export_peft, model_file
from training.trainer.distributed import parallel, precision
from training.trainer.model import lora

RUN = {"precision": "fp32", "seq_length": "32", "lora_rank": "4", "lora_targets": "all-linear"}


def saved_lora_model(folder: Path, **extra: str) -> Path:
    """A LoRA run's ``model.pt`` on the tiny Llama ``folder.parent / "base"`` (its adapters as initialized),
    ``init_from`` given relative to the working folder, as a user types it."""
    cfg = config.config_from_mapping({**RUN, "init_from": "base", "model_dir": str(folder), **extra})
    net = loop.build(cfg, _ENV[0], precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init))
    with (
        torch.no_grad()
    ):  # B starts at zero: give the adapters values, so that the adapter changes the logits
        for _, param in lora.adapters(net):
            param.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    saved = model_file.save_model(net, cfg.model_dir, 3, cfg.as_dict(), 0, export_hf.data_info(cfg))
    assert saved is not None
    return saved


_ENV: list = []


def in_a_process_group(tmp: Path, build) -> None:
    """``build()`` with this process as a world of one, in ``tmp``."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
        }.items():
            patch.setenv(key, value)
        patch.setenv("MASTER_PORT", str(parallel._free_port()))
        patch.chdir(tmp)
        _ENV[:] = [parallel.init_distributed()]
        try:
            build()
        finally:
            torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The working folder of a LoRA run: ``base/`` (a tiny Llama) and ``model/model.pt``."""
    tmp = tmp_path_factory.mktemp("peft")
    tiny_llama(tmp / "base", tied=False)
    in_a_process_group(tmp, lambda: saved_lora_model(tmp / "model"))
    return tmp


@pytest.fixture(scope="module")
def named(run) -> Path:
    """``named/model.pt``: the same run with ``init_from_source`` a Hub model id."""
    in_a_process_group(run, lambda: saved_lora_model(run / "named", init_from_source="org/tiny-llama"))
    return run / "named" / "model.pt"


def export_in_a_process(model: Path, out: Path, hash_seed: str) -> bytes:
    program = (
        "import sys; from training.trainer.checkpoint import export_peft; export_peft.export(*sys.argv[1:])"
    )
    subprocess.run([sys.executable, "-c", program, str(model), str(out)], env={**env(), "PYTHONHASHSEED": hash_seed},
                   cwd=ROOT, check=True, timeout=300)  # fmt: skip
    return (out / export_peft.ADAPTER_CONFIG).read_bytes()


def test_adapter_config_is_the_same_bytes_in_every_process_with_target_modules_in_block_order(run, tmp_path):
    first = export_in_a_process(run / "model" / "model.pt", tmp_path / "a", "1")
    second = export_in_a_process(run / "model" / "model.pt", tmp_path / "b", "2")
    assert first == second
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert json.loads(first)["target_modules"] == modules


def test_the_adapter_names_its_base_by_absolute_path_and_auto_peft_loads_it_from_anywhere(run, tmp_path):
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import LlamaForCausalLM

    files = export_peft.export(run / "model" / "model.pt", tmp_path / "adapter")
    assert export_peft.ADAPTER_CONFIG in files
    written = json.loads((tmp_path / "adapter" / export_peft.ADAPTER_CONFIG).read_text())
    assert written["base_model_name_or_path"] == str(run / "base")
    readme = (tmp_path / "adapter" / "README.md").read_text()
    assert f'AutoPeftModelForCausalLM.from_pretrained("{tmp_path / "adapter"}")' not in readme  # no own path
    assert f"`{run / 'base'}`" in readme and "AutoPeftModelForCausalLM" in readme
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)  # another folder than the run's: the base is found by its absolute path
        auto = AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "adapter")).eval()
        by_hand = PeftModel.from_pretrained(
            LlamaForCausalLM.from_pretrained(run / "base"), str(tmp_path / "adapter")
        ).eval()
    with torch.no_grad():
        ids = tokens()
        torch.testing.assert_close(auto(ids).logits, by_hand(ids).logits, rtol=0, atol=0)
        plain = LlamaForCausalLM.from_pretrained(run / "base").eval()(ids).logits
        assert not torch.equal(auto(ids).logits, plain)  # the adapter is applied


def test_init_from_source_is_the_base_the_adapter_and_the_merged_models_card_name(named, tmp_path):
    export_peft.export(named, tmp_path / "adapter")
    written = json.loads((tmp_path / "adapter" / export_peft.ADAPTER_CONFIG).read_text())
    assert written["base_model_name_or_path"] == "org/tiny-llama"
    assert "`org/tiny-llama`" in (tmp_path / "adapter" / "README.md").read_text()
    export_hf.export(named, tmp_path / "hf")
    assert "`init_from` org/tiny-llama" in (tmp_path / "hf" / "README.md").read_text()


def test_init_from_source_is_a_setting_only_with_init_from():
    from training.contract import settings_table

    with pytest.raises(settings_table.ContractError) as info:
        config.config_from_mapping({"init_from_source": "org/model"})
    assert str(info.value).startswith("init_from_source: only with init_from")


def test_a_lora_rank_no_targeted_projection_can_use_is_said_before_training():
    shape = llama(2, 64, 4, 128, 256, num_kv_heads=2)
    assert lora.rank_note(shape, lora.LoraSettings(16, 32.0, 0.0, ("q_proj", "k_proj"))) is None
    note = lora.rank_note(shape, lora.LoraSettings(48, 96.0, 0.0, ("q_proj", "k_proj", "v_proj")))
    assert note == (
        "note: lora_rank 48 is above what k_proj (32 x 64) and v_proj (32 x 64) can use: an adapter's B A has rank "
        "at most the smaller side of its weight, so the rank beyond adds parameters and memory but nothing to learn; "
        "lower lora_rank to 32, or leave them out of lora_targets"
    )
    note = lora.rank_note(shape, lora.LoraSettings(80, 160.0, 0.0, ("q_proj", "up_proj")))
    assert note is not None and note.startswith(
        "note: lora_rank 80 is above the hidden size 64 and what q_proj (64 x 64) and up_proj (128 x 64) can use: "
    )
