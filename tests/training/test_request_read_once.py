"""The request is read once: the trainer settings of an execution input are parsed from text in exactly one function
(``value.read_settings``), called from exactly one place (``value.read_request``), and nothing else on the decision
path parses them again, by the source (every call, read with ``ast``) and by a count of the calls a decision makes;
every caller decides through the one function, ``decision.decide_request``."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from training.request import contract
from training.request.decision import decide_request
from training.request.rules import RequestRules

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "constructs_lib").rglob("*.py"), *(ROOT / "training").rglob("*.py")])
DECISION_PATH = [
    *sorted((ROOT / "training" / "request").glob("*.py")),
    ROOT / "constructs_lib" / "workflow" / "request_check.py",
    *(ROOT / "constructs_lib" / "cli" / name for name in ("request.py", "tuning.py", "api.py", "direct.py")),
]
"""What decides a request (``training/request/``), the Lambda's entry point and the CLI's and SDK path's callers."""


def calls(name: str, paths: list[Path]) -> Counter[tuple[str, str]]:
    """Each call of a function ``name`` (``name(...)`` or ``x.name(...)``) in ``paths``, by (file, the function
    whose body makes it)."""
    found: Counter[tuple[str, str]] = Counter()
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            inner = {id(n) for f in ast.walk(function) if f is not function and isinstance(f, ast.FunctionDef)
                     for n in ast.walk(f)}  # fmt: skip
            for node in ast.walk(function):
                if id(node) in inner or not isinstance(node, ast.Call):
                    continue
                callee = node.func
                called = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", None)
                if called == name:
                    found[(path.relative_to(ROOT).as_posix(), function.name)] += 1
    return found


def test_the_requests_trainer_settings_are_parsed_in_one_function_called_once():
    assert calls("read_settings", SOURCES) == {("training/request/value.py", "read_request"): 1}
    assert calls("_each_setting", SOURCES) == {("training/request/value.py", "read_settings"): 1}
    assert calls("read_request", DECISION_PATH) == {("training/request/decision.py", "decide_request"): 1}


def test_nothing_else_on_the_decision_path_parses_trainer_settings():
    """``contract.parse_hyperparameters`` on the decision path: the request's settings (``read_settings``), a
    finished training job's ``HyperParameters`` (an evaluation-only request: another job's settings, not this
    request's) and a plain execution input (``plan.parse_request``: ``python -m training.request.plan``, the tuning
    report in the image, and a stored measurement's configuration that the plan checks its memory against)."""
    assert calls("parse_hyperparameters", DECISION_PATH) == {
        ("training/request/value.py", "read_settings"): 1,
        ("training/request/evaluate_block.py", "trained_parameters"): 1,
        ("training/request/plan.py", "parse_request"): 1,
    }
    # a plain input's parse is never made for the request on the decision path: only for a stored record
    assert calls("parse_request", DECISION_PATH) == {
        ("training/request/plan.py", "setup_from_request"): 1,
        ("training/request/plan.py", "make_plan"): 1,
    }
    assert calls("setup_from_request", DECISION_PATH) == {("training/request/plan.py", "memory_check"): 1}
    assert calls("make_plan", DECISION_PATH) == {("training/request/plan.py", "main"): 1}  # python -m ...plan
    assert calls("trainer_settings", DECISION_PATH) == {("training/request/plan.py", "parse_request"): 1}
    # the names that parsed the request's settings again before it was read once are gone
    for gone in ("hyperparameter_map", "setting_problems", "_trained_parameters", "init_from_architecture"):
        assert calls(gone, DECISION_PATH) == Counter(), gone


def test_every_caller_decides_through_the_one_function():
    """The Lambda, the CLI's validate, plan and tuning plan, its deployed check and the SDK path."""
    callers = {where for where in calls("decide_request", SOURCES)}
    assert {
        ("constructs_lib/workflow/request_check.py", "decide"),
        ("constructs_lib/cli/request.py", "plan_request"),
        ("constructs_lib/cli/tuning.py", "tune_plan"),
        ("constructs_lib/cli/api.py", "decide"),
        ("constructs_lib/cli/request.py", "check_offline"),
        ("constructs_lib/cli/direct.py", "direct_request"),
        ("training/request/decision.py", "validate_request"),
        ("training/request/decision.py", "prepare_request"),
    } == callers
    assert calls("check_offline", [ROOT / "constructs_lib" / "cli" / "request.py"]) == {
        ("constructs_lib/cli/request.py", "validate"): 1
    }


@pytest.fixture
def parses(monkeypatch) -> Counter[str]:
    """Every call of ``contract.parse_hyperparameters`` while the test runs, counted by its first argument's kind."""
    counted: Counter[str] = Counter()
    real = contract.parse_hyperparameters

    def counting(raw, architecture=None, *, sm=None):
        counted["calls"] += 1
        return real(raw, architecture, sm=sm)

    monkeypatch.setattr(contract, "parse_hyperparameters", counting)
    return counted


def test_a_decision_parses_the_settings_once(parses):
    rules = RequestRules(region="us-west-2").with_limits()
    seed = {"precision": "mxfp8", "batch_size": 16, "activation_checkpointing": True,
            "hyperparameters": {"max_steps": "2000", "learning-rate": "3e-4"}}  # fmt: skip
    decision = decide_request(seed, rules)
    assert decision.valid and decision.plan is not None and decision.plan["fits"]
    assert parses["calls"] == 1
    tuned = decide_request(
        {**seed, "batch_size": 64, "tune": {"search_space": {"batch_size": [4, 8, 16]}}}, rules
    )
    assert tuned.valid and tuned.tune is not None and len(tuned.tune["plan"]["trials"]) >= 2
    assert parses["calls"] == 2  # its candidates are the parsed settings with their own, never parsed again
    refused = decide_request({**seed, "hyperparameters": {"model_preset": "8b"}, "batch_size": 64}, rules)
    assert refused.problems[0].startswith("memory: ") and parses["calls"] == 3


def test_a_new_trainer_setting_flows_through_the_value_with_no_other_edit(monkeypatch):
    """A row added to the contract's table is parsed, checked, rendered into ``HyperParameters`` and kept in the
    parsed settings the plan and the candidates read."""
    spec = contract.Hyperparameter("val_interval", "int", 0, "Validation loss every N steps.", 0, 1000)
    monkeypatch.setitem(contract.HYPERPARAMETERS_BY_NAME, spec.name, spec)
    monkeypatch.setattr(contract, "HYPERPARAMETERS", (*contract.HYPERPARAMETERS, spec))
    rules = RequestRules(region="us-west-2").with_limits()
    decision = decide_request({"hyperparameters": {"val-interval": "50"}}, rules)
    assert decision.valid and decision.hyperparameters["val_interval"] == "50"
    assert decision.request is not None and decision.request.settings.values["val_interval"] == 50
    assert decide_request({"hyperparameters": {"val_interval": "5000"}}, rules).problems == [
        "hyperparameters.val_interval: must be an integer in [0, 1000]; got '5000'"
    ]


NEW_FIELD = """
import json
from training.request import fields

row = fields.InputField("data_format", "tokens", "What train_data_uri holds.", lambda v, r: v in ("tokens", "chat"),
                        lambda r: "one of tokens, chat")
fields.FIELDS = (*fields.FIELDS, row)
fields.FIELDS_BY_NAME = {**fields.FIELDS_BY_NAME, row.name: row}
fields.DEFAULT_INPUT = {**fields.DEFAULT_INPUT, row.name: row.default}
fields.INPUT_FIELDS = (*fields.INPUT_FIELDS, row.name)

from training.request.decision import decide_request  # what reads the table, imported after the row is added
from training.request.rules import RequestRules

rules = RequestRules()
chat, default, bad = (decide_request(raw, rules) for raw in ({"data_format": "chat"}, {}, {"data_format": "x"}))
print(json.dumps([chat.request.fields.data_format, chat.config["data_format"], chat.problems,
                  default.request.fields.data_format, bad.problems]))
"""


def test_a_new_input_field_flows_through_the_value_with_no_other_edit():
    """A row added to the fields' table (before the decision is imported, as a row in the file is) is an attribute
    of the request's fields, with its default and its check, and part of the decided config."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", NEW_FIELD], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        "chat",
        "chat",
        [],
        "tokens",
        ['data_format: must be one of tokens, chat; got "x"'],
    ]
