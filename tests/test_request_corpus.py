"""The recorded corpus (``tests/request_corpus.py``): every execution input of it, run again through the Lambda's
decision (S3 in moto, SageMaker stubbed) and the CLI's offline validate, plan and tuning plan (and, for some, the CLI
with the deployed rules and S3), gives exactly the decisions and messages recorded before the request was read into
one typed value."""

from __future__ import annotations

import json
import re

from tests import request_corpus
from training.request import contract

_LIST = re.compile(r"allowed: ((?:[a-z0-9_]+, )+[a-z0-9_]+)")


def _settings_lists_as_named(text: str) -> str:
    """``text`` with every list of trainer settings ("allowed: a, b, ...") that names only settings of today's
    contract replaced by one token: a setting added since the record lengthens those lists in every refusal that
    prints them, which is a new field, not a changed decision. A list naming a setting the contract no longer has
    stays as it is (and differs)."""
    known = set(contract.HYPERPARAMETERS_BY_NAME)

    def one(match: re.Match) -> str:
        names = match.group(1).split(", ")
        return (
            "allowed: <the contract's trainer settings>"
            if len(names) > 10 and set(names) <= known
            else match.group(0)
        )

    return _LIST.sub(one, text)


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
    again = request_corpus.canonical(request_corpus.run_all(cases))
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
