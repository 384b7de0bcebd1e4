"""The objective a run trains, decided before anything is built (``training.trainer.objective.check``, the
preflight's; the request check refuses the same before launch: tests/request/test_preference_request.py): auto by the
data (preference pairs train DPO), an explicit objective that does not fit its data, and a ``dpo_*`` setting on a
next-token run, each refused naming the setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.chat_models import model_folder
from training.contract import settings_table
from training.prepare import chat
from training.prepare import pairs as prepare_pairs
from training.trainer import config, objective


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("objective")
    model_folder(root / "model", "llama3.1")
    pairs = [{"prompt": f"q{i}", "chosen": f"yes {i}", "rejected": f"no {i}"} for i in range(6)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    prepare_pairs.prepare_pairs(
        [root / "pairs.jsonl"], str(root / "pairs"), str(root / "model"), validation_fraction=0
    )
    chats = [{"prompt": f"q{i}", "completion": f"a {i}"} for i in range(6)]
    (root / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    chat.prepare_chat([root / "chats.jsonl"], str(root / "chats"), str(root / "model"), validation_fraction=0)
    return {"pairs": root / "pairs", "chats": root / "chats"}


def cfg(folder: Path | None, **settings: str):
    channel = {"dataset": "channel", "data_dir": str(folder)} if folder else {"dataset": "synthetic"}
    return config.config_from_mapping({**channel, **settings})


def test_auto_trains_dpo_on_pairs_and_the_next_token_loss_on_other_data(data):
    assert objective.check(cfg(data["pairs"])) == "dpo"
    assert objective.check(cfg(data["pairs"], objective="dpo", dpo_beta="0.3", dpo_loss="ipo")) == "dpo"
    assert objective.check(cfg(data["chats"])) == "next_token"
    assert objective.check(cfg(None)) == "next_token"


@pytest.mark.parametrize(
    ("folder", "settings", "field", "fragment"),
    [
        ("chats", {"objective": "dpo"}, "objective", "dpo trains on preference data"),
        (None, {"objective": "dpo"}, "objective", "synthetic data is not; got dpo"),
        ("pairs", {"objective": "next_token"}, "objective", "next_token cannot train on preference data"),
        ("chats", {"dpo_beta": "0.5"}, "dpo_beta", "only for preference tuning"),
        (None, {"dpo_sft_weight": "1"}, "dpo_sft_weight", "next-token loss on synthetic data; got 1.0"),
    ],
)
def test_an_objective_or_dpo_setting_that_does_not_fit_the_data_is_refused_naming_it(
    data, folder, settings, field, fragment
):
    with pytest.raises(settings_table.ContractError) as refused:
        objective.check(cfg(data[folder] if folder else None, **settings))
    assert refused.value.field == field and fragment in str(refused.value)
