"""The request is read once: the trainer settings of an execution input are parsed from text in exactly one function
(``value.read_settings``), called from exactly one place (``value.read_request``), and nothing else on the decision
path parses them again, by the source (every call, read with ``ast``), by a count of the calls a decision makes and
by whose frame every single setting's parse runs in; a tuning candidate made from the parsed settings is what a
parse of the request with its values gives; every caller decides through the one function,
``decision.decide_request``."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from training.contract import hardware, settings_parse, settings_table, tuning
from training.plan import estimate, measured
from training.request import value
from training.request.decision import decide_request, prepare_request
from training.request.rules import RequestRules

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "constructs_lib").rglob("*.py"), *(ROOT / "training").rglob("*.py")])
DECISION_PATH = [
    *(
        path
        for part in ("request", "plan", "contract")
        for path in sorted((ROOT / "training" / part).glob("*.py"))
    ),
    ROOT / "constructs_lib" / "workflow" / "request_check.py",
    *(ROOT / "constructs_lib" / "cli" / name for name in ("request.py", "tuning.py", "api.py", "direct.py")),
]
"""What decides a request (``training/request/``, ``training/plan/``, ``training/contract/``), the Lambda's entry point and the CLI's and SDK path's callers."""


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
    """``settings_parse.parse_hyperparameters`` on the decision path: the request's settings (``read_settings``), a
    finished training job's ``HyperParameters`` (an evaluation-only request: another job's settings, not this
    request's) and a plain execution input (``inputs.parse_request``: ``python -m training.plan``, the tuning
    report in the image, and a stored measurement's configuration that the plan checks its memory against)."""
    assert calls("parse_hyperparameters", DECISION_PATH) == {
        ("training/request/value.py", "read_settings"): 1,
        ("training/request/evaluate_block.py", "trained_parameters"): 1,
        ("training/plan/inputs.py", "parse_request"): 1,
    }
    # a plain input's parse is never made for the request on the decision path: only for a stored record
    assert calls("parse_request", DECISION_PATH) == {
        ("training/plan/inputs.py", "setup_from_request"): 1,
        ("training/plan/estimate.py", "make_plan"): 1,
        ("training/plan/layouts.py", "compare"): 1,  # python -m training.plan.layouts (docs' tables)
    }
    assert calls("setup_from_request", DECISION_PATH) == {("training/plan/estimate.py", "memory_check"): 1}
    assert calls("make_plan", DECISION_PATH) == {("training/plan/report.py", "main"): 1}  # python -m ...plan
    assert calls("trainer_settings", DECISION_PATH) == {("training/plan/inputs.py", "parse_request"): 1}
    # the names that parsed the request's settings again before it was read once are gone
    for gone in ("hyperparameter_map", "setting_problems", "_trained_parameters", "init_from_architecture"):
        assert calls(gone, DECISION_PATH) == Counter(), gone


def test_every_caller_decides_through_the_one_function():
    """The Lambda, the CLI's validate, plan and tuning plan, its deployed check and the SDK path."""
    callers = {where for where in calls("decide_request", SOURCES)}
    assert {
        ("constructs_lib/workflow/request_check.py", "decide"),
        ("constructs_lib/cli/request.py", "decide"),  # the CLI's validate, plan and tuning plan, below
        ("constructs_lib/cli/request.py", "plan_request"),  # its plan again without ignore_memory_estimate
        ("constructs_lib/cli/api.py", "decide"),
        ("constructs_lib/cli/direct.py", "direct_request"),
        ("training/request/decision.py", "validate_request"),
        ("training/request/decision.py", "prepare_request"),
        ("training/measure/request_check_memory.py", "child"),  # the Lambda's decision, its memory measured
    } == callers
    cli = [ROOT / "constructs_lib" / "cli" / name for name in ("request.py", "tuning.py")]
    assert calls("decide", cli) == {
        ("constructs_lib/cli/request.py", "check_offline"): 1,
        ("constructs_lib/cli/request.py", "plan_request"): 1,
        ("constructs_lib/cli/tuning.py", "tune_plan"): 1,
    }
    assert calls("check_offline", [ROOT / "constructs_lib" / "cli" / "request.py"]) == {
        ("constructs_lib/cli/request.py", "validate"): 1
    }


@pytest.fixture
def parses(monkeypatch) -> Counter[str]:
    """Every call of ``settings_parse.parse_hyperparameters`` while the test runs, counted by its first argument's kind."""
    counted: Counter[str] = Counter()
    real = settings_parse.parse_hyperparameters

    def counting(raw, architecture=None, **keywords):
        counted["calls"] += 1
        return real(raw, architecture, **keywords)

    monkeypatch.setattr(settings_parse, "parse_hyperparameters", counting)
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


IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/blackwell-training:abc123"
SEED = {"precision": "mxfp8", "batch_size": 16, "activation_checkpointing": True,
        "hyperparameters": {"max-steps": "2000", "learning_rate": "3e-4", "position-encoding": "rope"}}  # fmt: skip


def _stored_record() -> dict:
    """A stored tuning measurement of the image of :data:`IMAGE` (its settings as the tuning job stores them)."""
    values = settings_parse.parse_hyperparameters({"precision": "bf16", "batch_size": 4, "seq_length": 8192})
    key = measured.make_key(values, instance_type="ml.p6-b200.48xlarge", instance_count=1, image_tag="abc123",
                            torch_version="2.9.0", te_version="2.11.0")  # fmt: skip
    figures = {"status": "ok", "tokens_per_sec_per_gpu": 30_000.0, "max_allocated_gb": 60.0,
               "step_seconds": {"steps": 20, "median": 1.0, "p10": 0.98, "p90": 1.03}}  # fmt: skip
    where = {"device": "cuda", "gpu": "B200", "world_size": 8, "job": "t", "measured_at": "2026-11-20T10:00"}
    return measured.make_record(key, figures, where)


def test_every_setting_parse_a_decision_makes_is_the_request_read_once_or_another_value(monkeypatch):
    """Every parse of a trainer setting's text (``Hyperparameter.parse``, the parse under every other) that a
    decision makes, by whose frame it runs in: the request read once (``value.read_request``: its settings and its
    ``tune`` block), a tuning candidate's values (``settings_parse.override_settings``: the tune block's, set over the
    parsed settings), or another value than the request (a stored measurement's settings, ``plan.memory_check``).
    A check, the plan, the candidates or the job's request parsing the request's settings again fails here."""
    owners = {
        value.read_request.__code__: "the request read once",
        settings_parse.override_settings.__code__: "a candidate's values",
        estimate.memory_check.__code__: "a stored measurement",
    }
    seen: Counter[str] = Counter()
    real, record = settings_table.Hyperparameter.parse, _stored_record()

    def attributed(spec, raw):
        if settings_table.HYPERPARAMETERS_BY_NAME.get(spec.name) is spec:
            frame, owner = sys._getframe(1), None
            while frame is not None and owner is None:
                owner, frame = owners.get(frame.f_code), frame.f_back
            seen[owner or f"{spec.name}: parsed outside the request read once"] += 1
        return real(spec, raw)

    monkeypatch.setattr(settings_table.Hyperparameter, "parse", attributed)
    rules = RequestRules(region="us-west-2", image_uri=IMAGE).with_limits()
    architecture = {"num_layers": 16, "hidden_size": 2048, "num_heads": 32, "num_kv_heads": 8,
                    "ffn_hidden_size": 8192, "vocab_size": 128256, "tie_embeddings": True}  # fmt: skip
    decisions = [
        decide_request(SEED, rules),
        decide_request({**SEED, "batch_size": 64, "tune": {"search_space": {"batch-size": [4, 8, 16],
                                                                          "compile": ["true", "false"]}}}, rules),
        decide_request({**SEED, "train_data_uri": "s3://b/data/", "evaluate": {"task_data_uri": "s3://b/data/t/"}},
                       replace(rules, data_sources=("s3://b/data/",))),
        decide_request({**SEED, "hyperparameters": {"model_preset": "8b"}, "batch_size": 64}, rules),
        prepare_request({"precision": "bf16", "batch_size": 4, "seq_length": 8192}, rules,
                        measurements=[record]),
        prepare_request({"init_from": "s3://b/data/llama/", "batch_size": 2}, replace(rules, data_sources=("data/",),
                        bucket_name="b"), architecture),
    ]  # fmt: skip
    assert [bool(d.plan or d.tune) for d in decisions] == [True] * 6, [d.problems for d in decisions]
    assert decisions[2].valid and decisions[3].problems[0].startswith("memory: ")
    assert decisions[4].plan is not None and decisions[4].plan["memory_check"]["records"] == 1
    assert set(seen) == {"the request read once", "a candidate's values", "a stored measurement"}, seen


def test_a_tuning_decision_replans_each_stored_record_once_not_once_per_candidate(parses):
    """The stored records' settings are another value than the request: the request's own plan re-plans each record
    of its instance and image once to check its memory estimate; its candidates, whose plans show no such check,
    never do (once per candidate was most of a tuning decision's time with a few dozen records)."""
    record = _stored_record()
    parses.clear()
    rules = RequestRules(region="us-west-2", image_uri=IMAGE).with_limits()
    tuned = prepare_request(
        {**SEED, "batch_size": 64, "tune": {"search_space": {"batch_size": [4, 8, 16, 32]}}},
        rules,
        measurements=[record, record],
    )
    assert tuned.valid and tuned.tune is not None and len(tuned.tune["plan"]["trials"]) >= 3
    assert tuned.estimate is not None and tuned.estimate.memory_check is not None
    assert tuned.estimate.memory_check["records"] == 2
    assert parses["calls"] == 1 + 2  # the request's settings once; each record once, for the request's plan


TUNED_BASES = (
    {},
    {"model_preset": "8b", "seq_length": "8192"},
    {"precision": "fp8", "fp8_recipe": "current", "quantized_model_init": "true"},
    {"grad_accum_steps": "4", "compile": "false", "loss_chunk_tokens": "0"},
    {"lora_rank": "8", "lora_targets": "q,v"},
)


def _sample(spec: settings_table.Hyperparameter) -> list:
    """A few values of a setting as a search space gives them: each choice and alias, both booleans, an integer's
    bounds, default and a middle value."""
    if spec.kind == "choice":
        return [*spec.choices, *(spec.aliases or {})]
    if spec.kind == "bool":
        return ["true", "false", True]
    low = spec.minimum or 0
    high = spec.maximum if spec.maximum is not None else 2 * low + 8192
    middle = (low + high) // 2 if spec.kind == "int" else (low + high) / 2
    return [v for v in (low, spec.default, middle, high) if v is not None]


@pytest.mark.parametrize("base", TUNED_BASES, ids=lambda b: ",".join(b) or "defaults")
def test_a_candidate_from_parsed_settings_is_the_request_parsed_with_its_values(base):
    """A tuning candidate is the request's parsed settings with its own (``settings_parse.override_settings``), never a
    parse of the request again: that is only right while it equals what parsing the request with the candidate's
    values gives, the same settings or the same refusal. A tunable setting whose default another setting derives
    (as ``lora_alpha`` from ``lora_rank``) would break it, and fails here."""
    sm = hardware.GPU_INSTANCE_TYPES["ml.p6-b200.48xlarge"].sm
    values = settings_parse.parse_hyperparameters(base, sm=sm)
    for name in tuning.trial_settings():
        for raw in _sample(settings_table.HYPERPARAMETERS_BY_NAME[name]):
            try:
                expected: object = settings_parse.parse_hyperparameters({**base, name: raw}, sm=sm)
            except settings_table.ContractError as error:
                expected = str(error)
            try:
                got: object = settings_parse.override_settings(values, {name: raw}, sm=sm)
            except settings_table.ContractError as error:
                got = str(error)
            assert got == expected, (name, raw)


def test_a_new_trainer_setting_flows_through_the_value_with_no_other_edit(monkeypatch):
    """A row added to the contract's table is parsed, checked, rendered into ``HyperParameters`` and kept in the
    parsed settings the plan and the candidates read."""
    spec = settings_table.Hyperparameter("val_interval", "int", 0, "Validation loss every N steps.", 0, 1000)
    monkeypatch.setitem(settings_table.HYPERPARAMETERS_BY_NAME, spec.name, spec)
    monkeypatch.setattr(settings_table, "HYPERPARAMETERS", (*settings_table.HYPERPARAMETERS, spec))
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
