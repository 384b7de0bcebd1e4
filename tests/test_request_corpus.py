"""The recorded corpus (``tests/request_corpus.py``): every execution input of it, run again through the Lambda's
decision (S3 in moto, SageMaker stubbed) and the CLI's offline validate, plan and tuning plan (and, for some, the CLI
with the deployed rules and S3), gives exactly the decisions and messages recorded before the request was read into
one typed value."""

from __future__ import annotations

import json
import re

from tests import request_corpus
from training.request import contract, fields

_LIST = re.compile(r"allowed: ((?:[a-z0-9_]+, )+[a-z0-9_]+)")


def _tables() -> dict[str, set[str]]:
    """The tables whose names a refusal lists in full, by the token that stands for such a list."""
    return {
        "<the contract's trainer settings>": set(contract.HYPERPARAMETERS_BY_NAME),
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
    today = ", ".join(contract.HYPERPARAMETERS_BY_NAME)
    older = ", ".join(list(contract.HYPERPARAMETERS_BY_NAME)[:-1])
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
