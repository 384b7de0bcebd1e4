"""The recorded corpus (``tests/request_corpus.py``): every execution input of it, run again through the Lambda's
decision (S3 in moto, SageMaker stubbed) and the CLI's offline validate, plan and tuning plan (and, for some, the CLI
with the deployed rules and S3), gives exactly the decisions and messages recorded before the request was read into
one typed value."""

from __future__ import annotations

import json
import re

from tests import request_corpus
from training.contract import settings_table
from training.request import fields

_LIST = re.compile(r"allowed: ((?:[a-z0-9_]+, )+[a-z0-9_]+)")


def _tables() -> dict[str, set[str]]:
    """The tables whose names a refusal lists in full, by the token that stands for such a list."""
    return {
        "<the contract's trainer settings>": set(settings_table.HYPERPARAMETERS_BY_NAME),
        "<the input fields>": set(fields.INPUT_FIELDS),
    }


def _settings_lists_as_named(text: str) -> str:
    """``text`` with every list ("allowed: a, b, ...") that names only today's trainer settings, or only today's
    input fields, replaced by one token: a setting or a field added since the record lengthens those lists in every
    refusal that prints them, which is a new field, not a changed decision. A list naming a setting or a field
    that is gone stays as it is (and differs)."""
    tables = _tables()

    def one(match: re.Match) -> str:
        names = set(match.group(1).split(", "))
        named = [token for token, known in tables.items() if len(names) > 10 and names <= known]
        return f"allowed: {named[0]}" if named else match.group(0)

    return _LIST.sub(one, text)


def _recorded_fields(record: dict) -> set[str]:
    """The input fields when the corpus was recorded: the decided config of the empty input names every one."""
    return set(record["answers"]["empty"]["decide"]["result"]["config"])


def _without_new_fields(answer: object, new: dict[str, object]) -> object:
    """``answer`` with every input field added since the record (``new``: each with its default) left out of each
    decided ``config`` where it has its default: an input that does not set a new field gets its default, which
    is a new field, not a changed decision (set otherwise, it stays and differs)."""
    if isinstance(answer, list):
        return [_without_new_fields(item, new) for item in answer]
    if not isinstance(answer, dict):
        return answer
    out = {key: _without_new_fields(value, new) for key, value in answer.items()}
    if isinstance(out.get("config"), dict):
        out["config"] = {k: v for k, v in out["config"].items() if k not in new or v != new[k]}
    return out


def _record() -> dict:
    return json.loads(request_corpus.RECORD.read_text())


def test_the_corpus_is_large_and_has_good_and_bad_inputs():
    record = _record()
    decided = [answers["decide"]["result"] for answers in record["answers"].values()]
    valid = sum(1 for d in decided if d["valid"])
    assert len(record["cases"]) >= 100 and valid >= 50 and len(decided) - valid >= 100
    assert sorted(c["name"] for c in record["cases"]) == sorted(record["answers"])


def test_every_recorded_input_is_decided_as_recorded():
    record = _record()
    cases = [(c["name"], c["input"], c["options"]) for c in record["cases"]]
    added = {
        name: fields.DEFAULT_INPUT[name]
        for name in fields.INPUT_FIELDS
        if name not in _recorded_fields(record)
    }
    again = _without_new_fields(request_corpus.canonical(request_corpus.run_all(cases)), added)
    changed = {  # compared as text: the order of every mapping (fields, settings, plan parts) is kept too
        f"{name} {path}": {"recorded": recorded[path], "now": again[name].get(path)}
        for name, recorded in record["answers"].items()
        for path in recorded
        if _settings_lists_as_named(json.dumps(again[name].get(path)))
        != _settings_lists_as_named(json.dumps(recorded[path]))
    }
    assert not changed, f"{len(changed)} answers differ from the record:\n" + "\n".join(
        f"{key}:\n  recorded {json.dumps(value['recorded'])[:600]}\n  now      {json.dumps(value['now'])[:600]}"
        for key, value in list(changed.items())[:10]
    )
    assert set(again) == set(record["answers"])


def test_a_settings_list_counts_as_named_only_when_it_names_todays_settings():
    today = ", ".join(settings_table.HYPERPARAMETERS_BY_NAME)
    older = ", ".join(list(settings_table.HYPERPARAMETERS_BY_NAME)[:-1])
    assert _settings_lists_as_named(f"x; allowed: {older}") == _settings_lists_as_named(
        f"x; allowed: {today}"
    )
    gone = f"x; allowed: {older}, a_setting_removed_since"
    assert _settings_lists_as_named(gone) == gone
    assert _settings_lists_as_named("allowed: bf16, fp8") == "allowed: bf16, fp8"


def test_a_fields_list_counts_as_named_only_when_it_names_todays_fields():
    today = ", ".join(fields.INPUT_FIELDS)
    older = ", ".join(f for f in fields.INPUT_FIELDS if f != "tune")
    assert _settings_lists_as_named(f"x; allowed: {older}") == _settings_lists_as_named(
        f"x; allowed: {today}"
    )
    assert _settings_lists_as_named(f"x; allowed: {today}") == "x; allowed: <the input fields>"
    gone = f"x; allowed: {older}, a_field_removed_since"
    assert _settings_lists_as_named(gone) == gone


def test_a_new_field_at_its_default_is_left_out_of_the_decided_config_only():
    new = {"data_format": "tokens"}
    decided = {
        "decide": {"result": {"config": {"precision": "bf16", "data_format": "tokens"}, "plan": {"a": 1}}}
    }
    assert _without_new_fields(decided, new) == {
        "decide": {"result": {"config": {"precision": "bf16"}, "plan": {"a": 1}}}
    }
    changed = {"result": {"config": {"precision": "bf16", "data_format": "chat"}}}
    assert _without_new_fields(changed, new) == changed
    assert _recorded_fields(_record()) >= {"precision", "hyperparameters", "tune"}


SKIPPED_EXPLAINS = {
    "the data sources' bucket": ("train_data_uri:", "init_from:", "evaluate.task_data_uri:"),
    "init_from: the model folder's config.json": ("init_from:", "hyperparameters", "num_layers:", "memory:",
                                                  "max_runtime_seconds:", "tune", "evaluate", "input:",
                                                  "train_data_uri:", "seq_length:", "batch_size:"),
    "train_data_uri: its metadata.json": ("train_data_uri:", "seq_length:", "batch_size:"),
    "the plan's throughput": ("max_runtime_seconds: the plan expects one optimizer step", "tune.max_cost_usd:"),
    "the run's name": ("execution name:",),
    "train_data_uri: that it holds": ("train_data_uri:",),
    "resume_from: that run's": ("resume_from:", "hyperparameters.max_steps: must be greater than the step of the "
                                "checkpoint resumed from"),
    "evaluate: the task folder's": ("evaluate",),
    "training_plan_arn: that the plan": ("training_plan_arn: ", "instance_type: the training plan ",
                                         "evaluate.instance_type: the training plan ",
                                         "instance_count: the training plan "),
}  # fmt: skip
"""Each check offline validation says it skipped, and the problems only the workflow can then find."""


def test_validate_and_the_workflow_agree_on_every_input_that_needs_no_s3():
    """The corpus through the workflow's Lambda (S3 in moto, SageMaker stubbed, each case's execution name) and
    through the CLI's offline validation under the same deployed rules: validation's problems are the workflow's, in
    order, and every other problem of the workflow's comes from a check validation said it skipped (it needs S3,
    SageMaker or the run's name). And the workflow's state is never larger than the size estimate offline validation
    bounds it by (``bounds.estimated_state_bytes``)."""
    from constructs_lib.cli.request import check_offline
    from constructs_lib.workflow.request_check import decide
    from training.request import bounds
    from training.request.decision import decide_request
    from training.request.reads import Reads

    rules = request_corpus.rules_variants()
    disagreements, unexplained, checked_equal, oversized = [], [], 0, []
    with request_corpus.world() as s3:
        for name, raw, options in request_corpus.CASES:
            deployed = rules[options.get("rules", "base")]
            execution = options.get("execution", request_corpus.EXECUTION)
            event = {"input": raw, "rules": deployed.to_json(), "execution": execution}
            workflow: list[str] = []
            state = decide(request_corpus._copy(event), s3=s3, sagemaker=request_corpus.SageMakerStub(),
                           problems=workflow)  # fmt: skip
            offline = check_offline(request_corpus._copy(raw), deployed)
            explains = tuple(p for line in offline.skipped for key, ps in SKIPPED_EXPLAINS.items()
                             if line.startswith(key) for p in ps)  # fmt: skip
            if any(not line.startswith(tuple(SKIPPED_EXPLAINS)) for line in offline.skipped):
                unexplained.append((name, offline.skipped))
            only_workflow = [p for p in workflow if p not in offline.problems]
            unexplained += [(name, p) for p in only_workflow if not p.startswith(explains)]
            if [p for p in workflow if p not in only_workflow] != offline.problems:
                disagreements.append((name, offline.problems, workflow))
            checked_equal += not only_workflow
            if state["valid"]:
                decision = decide_request(request_corpus._copy(raw), deployed, execution=execution,
                                          reads=Reads(s3, request_corpus.SageMakerStub(), before_launch=True))  # fmt: skip
                estimate = bounds.estimated_state_bytes(decision.request, decision.fields, deployed)
                if len(json.dumps(state)) > estimate:
                    oversized.append((name, len(json.dumps(state)), estimate))
    assert not disagreements, "\n".join(
        f"{n}:\n  validate {o}\n  workflow {w}" for n, o, w in disagreements[:10]
    )
    assert not unexplained, unexplained[:10]
    assert not oversized, oversized[:10]
    print(f"{checked_equal} of {len(request_corpus.CASES)} inputs: the same problems, none explained away")
    assert checked_equal >= 250  # most inputs' problems need no S3 at all: the same, problem for problem
