"""A preference-tuned run's export evaluated as a fine-tuned run's is (issue 54 item 7): a tiny Llama trained three
DPO steps with LoRA (its reference the adapters switched off), in this process; its Hugging Face folder (merged) is
scored by the evaluation job's entry point (``training.evaluate``, offline, lm-eval) from the ``model.tar.gz``
SageMaker packs, and its peft adapter on its base gives the logits of the folder that was scored. (A full DPO run
writes its folder with the export every full run uses, ``export_hf``.)"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch

from tests.evaluate.test_evaluate_run import _task
from tests.training.chat_models import model_folder
from tests.training.preference.test_trl_agreement import records as pair_records
from training.contract import container
from training.evaluate import run
from training.prepare import pairs as prepare_pairs
from training.trainer import config, loop
from training.trainer.distributed import parallel

ITEMS = 24


def _train(root: Path, name: str, **more: str) -> tuple[Path, list[str]]:
    """Three DPO steps of the tiny model on the pairs, in this process (a world of one); the model folder and the
    run's lines."""
    settings = {"dataset": "channel", "data_dir": str(root / "data"), "init_from": str(root / "model"),
                "seq_length": "512", "batch_size": "4", "max_steps": "3", "precision": "fp32",
                "learning_rate": "0.01", "lr_warmup_steps": "0", "log_interval": "1", "deterministic": "true",
                "checkpoint_dir": str(root / name / "checkpoints"), "model_dir": str(root / name / "model"), **more}  # fmt: skip
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
        }.items():
            patch.setenv(key, value)
        patch.setenv("MASTER_PORT", str(parallel._free_port()))
        env = parallel.init_distributed()
        try:
            loop.run(config.config_from_mapping(settings), env, emit=lines.append)
        finally:
            torch.distributed.destroy_process_group()
    return root / name / "model", lines


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("evaluate_dpo")
    model_folder(root / "model", "llama3.1", with_weights=True, layers=2, hidden=64)
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pair_records()))
    prepare_pairs.prepare_pairs(
        [root / "pairs.jsonl"], str(root / "data"), str(root / "model"), validation_fraction=0
    )
    lora, lines = _train(root, "lora", lora_rank="4")
    assert any("reference=adapter_off" in line for line in lines)
    channel = root / "channel"
    channel.mkdir()
    with tarfile.open(channel / "model.tar.gz", "w:gz") as tar:  # as SageMaker packs /opt/ml/model
        for path in sorted(lora.iterdir()):
            tar.add(path, arcname=path.name)
    tasks = root / "tasks"
    tasks.mkdir()
    _task(tasks, "colours", [i % 4 for i in range(ITEMS)])
    return {"root": root, "lora": lora, "channel": channel, "tasks": tasks}


def test_a_lora_dpo_runs_model_archive_is_scored_by_the_evaluation_entry_point(
    runs, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for name, value in run.OFFLINE.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    status = run.main(["--tasks", "colours", "--model_dir", str(runs["channel"]), "--tasks_dir", str(runs["tasks"]),
                       "--output_dir", str(out), "--batch_size", "8"])  # fmt: skip
    assert status == 0, capsys.readouterr()
    scores = json.loads((out / "scores.json").read_text())["colours"]
    assert scores["samples"] == ITEMS and 0.0 <= scores["acc"] <= 1.0
    evaluated = json.loads((out / "evaluation.json").read_text())
    assert Path(evaluated["model"]).name == container.HF_EXPORT_DIR


def test_the_lora_dpo_runs_adapter_on_its_base_is_the_merged_folder_that_was_scored(runs):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(runs["root"] / "model", dtype=torch.float32).eval()
    ids = torch.arange(1, 33).reshape(2, 16)
    with torch.no_grad():
        untrained = base(ids).logits
        adapted = PeftModel.from_pretrained(base, runs["lora"] / "adapter").eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(
            runs["lora"] / container.HF_EXPORT_DIR, dtype=torch.float32
        )
        scored = merged.eval()(ids).logits
    torch.testing.assert_close(adapted, scored, rtol=0, atol=1e-5)
    assert (
        float((scored - untrained).abs().max()) > 1e-4
    )  # the three DPO steps moved the model that was scored
