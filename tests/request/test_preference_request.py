"""Preference tuning decided before launch (training.request.fine_tuning through decide_request): prepared pairs
are read as conversation data is (their metadata.json against the init_from model, seq_length against the longest
pair, the windows per global batch), ``objective`` auto becomes dpo on them, an objective or a dpo_* setting that
does not fit the data is refused by name, and the plan is a DPO run's (``training.plan.preference``): the
reference's pass over the data's windows (precomputed) or the adapters switched off at every step (LoRA)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.request.test_fine_tuning_request import MODEL, REQUEST, RULES, weightless
from training.plan import preference
from training.plan.timing import estimate_time, work_flops_per_token
from training.prepare import chat
from training.prepare import pairs as prepare_pairs
from training.request.decision import decide_request
from training.request.reads import Reads

PAIRS, CHATS = "s3://b/data/pairs/", "s3://b/data/chats/"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("preference_request")
    model = weightless(root / "model")
    rng = random.Random(0)
    lines = [{"prompt": [{"role": "user", "content": "q" * rng.randint(1, 60)}],
              "chosen": [{"role": "assistant", "content": "y" * rng.randint(1, 30)}],
              "rejected": [{"role": "assistant", "content": "n" * rng.randint(1, 30)}]} for _ in range(120)]  # fmt: skip
    (root / "pairs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    prepare_pairs.prepare_pairs(
        [root / "pairs.jsonl"], str(root / "pairs"), str(model), validation_fraction=0.1
    )
    chats = [{"prompt": "x" * rng.randint(1, 80), "completion": "y" * rng.randint(1, 40)} for _ in range(100)]
    (root / "chats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in chats))
    chat.prepare_chat([root / "chats.jsonl"], str(root / "chats"), str(model), validation_fraction=0.1)
    return {"model": model, PAIRS: root / "pairs", CHATS: root / "chats"}


def decide(folders: dict[str, Path], data: str | None = PAIRS, **hyperparameters: str):
    raw = {
        **REQUEST,
        "train_data_uri": data,
        "seq_length": 512,
        "hyperparameters": {"max_steps": "100", **hyperparameters},
    }
    if data is None:
        del raw["train_data_uri"]
    local = folders[data] if data is not None else None
    return decide_request(raw, RULES, reads=Reads(local_init_from=folders["model"], local_train_data=local))


def test_a_dpo_request_on_pairs_is_valid_and_its_plan_adds_the_reference_pass_over_every_window(folders):
    decision = decide(folders)
    assert decision.problems == []
    plan, data = decision.plan, decision.plan["data"]
    meta = json.loads((folders[PAIRS] / "metadata.json").read_text())
    chat_data = decision.request.chat
    assert data["kind"] == "preference" and data["examples"] == meta["splits"]["train"]["examples"]
    assert f"{data['examples']} training pairs in " in data["summary"]
    part = plan["preference"]
    windows = sum(chat_data.windows(split, 512, True)[0] for split in ("train", "validation"))
    answers = 2 * (meta["splits"]["train"]["examples"] + meta["splits"]["validation"]["examples"])
    assert (part["objective"], part["reference"], part["step_factor"]) == ("dpo", "precomputed", 1.0)
    assert (part["reference_windows"], part["stored_reference_bytes"]) == (windows, 4 * answers)
    s = decision.estimate.setup
    next_token = estimate_time(s)
    share = preference.forward_flops_per_token(s) / work_flops_per_token(s)
    expected_pass = windows * next_token.step_seconds / (s.batch_size * s.world_size) * share
    assert part["reference_pass_seconds"] == pytest.approx(expected_pass, rel=1e-3) and expected_pass > 0
    assert decision.estimate.timing.step_seconds == pytest.approx(next_token.step_seconds)
    assert decision.estimate.timing.run_seconds == pytest.approx(
        next_token.step_seconds * 100 + expected_pass
    )
    assert "no second model held" in part["summary"] and part["kept_copy_avoided_gib"] > 0


def test_lora_dpo_switches_the_adapters_off_every_step_at_the_base_forwards_cost(folders):
    decision = decide(folders, lora_rank="8")
    assert decision.problems == []
    part, s = decision.plan["preference"], decision.estimate.setup
    factor = 1 + preference.forward_flops_per_token(s) / work_flops_per_token(s)
    assert (part["reference"], part["reference_pass_seconds"], part["stored_reference_bytes"]) == (
        "adapter_off", None, None
    )  # fmt: skip
    assert (
        part["step_factor"] == pytest.approx(factor, abs=1e-3) and 1.3 < factor < 1.6
    )  # the tiny model's head and attention: 70B's is 1.48
    assert decision.estimate.timing.step_seconds == pytest.approx(estimate_time(s).step_seconds * factor)


@pytest.mark.parametrize(
    ("data", "settings", "expected"),
    [
        (CHATS, {"objective": "dpo"}, f"hyperparameters.objective: dpo trains on preference data (pairs of a chosen and a rejected "
         f"answer, prepared with python -m training.prepare PAIRS.jsonl --init-from MODEL); the data in {CHATS} "
         "(chat) is not; got dpo"),
        (None, {"objective": "dpo"}, "hyperparameters.objective: dpo trains on preference data"),
        (PAIRS, {"objective": "next_token"}, f"hyperparameters.objective: next_token cannot train on preference data ({PAIRS} holds "
         "pairs of chosen and rejected answers): use objective dpo (or auto); got next_token"),
        (CHATS, {"dpo_beta": "0.5"}, f"hyperparameters.dpo_beta: only for preference tuning (objective dpo, or auto on preference "
         f"data); this run trains the next-token loss on {CHATS}; got '0.5'"),
        (PAIRS, {"dpo_reference": "adapter_off"}, "hyperparameters.dpo_reference: adapter_off needs LoRA adapters"),
        (PAIRS, {"objective": "next_token", "dpo_loss": "ipo"}, "hyperparameters.dpo_loss: only with objective dpo"),
    ],
)  # fmt: skip
def test_an_objective_or_dpo_setting_that_does_not_fit_the_data_is_refused_by_name(folders, data, settings,
                                                                                 expected):  # fmt: skip
    problems = decide(folders, data, **settings).problems
    assert any(problem.startswith(expected) for problem in problems), problems
    assert all("\n" not in problem for problem in problems)


def test_a_seq_length_below_the_longest_pair_is_refused_naming_pairs(folders):
    longest = json.loads((folders[PAIRS] / "metadata.json").read_text())["max_example_tokens"]
    seq = (longest - 1) // 8 * 8
    raw = {**REQUEST, "train_data_uri": PAIRS, "seq_length": seq, "hyperparameters": {"max_steps": "10"}}
    problems = decide_request(
        raw, RULES, reads=Reads(local_init_from=folders["model"], local_train_data=folders[PAIRS])
    ).problems
    assert any(p.startswith(f"seq_length: must be at least {longest}, the longest pair of the preference data in {PAIRS}") and
               "pairs are never cut at training" in p for p in problems), problems  # fmt: skip


def test_offline_a_dpo_objective_on_unread_data_is_not_refused_and_auto_plans_next_token():
    raw = {**REQUEST, "train_data_uri": PAIRS, "init_from": MODEL, "hyperparameters": {"max_steps": "10"}}
    decision = decide_request(raw, RULES)
    assert not any(p.startswith("hyperparameters.objective") for p in decision.problems)
    assert "preference" not in (decision.plan or {})
