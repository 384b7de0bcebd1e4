"""The ASL evaluator behind the SDK path's request (``constructs_lib._shared.asl_eval``): paths, intrinsic
functions, Choice rules and Pass states as Step Functions evaluates them, and a clear refusal of what it does not
implement. The agreement with moto's real ASL engine on the whole workflow is in ``test_requests.py``."""

from __future__ import annotations

import pytest

from constructs_lib._shared.asl_eval import (
    AslPathError,
    AslUnsupported,
    choice_matches,
    evaluate_intrinsic,
    evaluate_payload,
    read_path,
    run_choice,
    run_pass,
    walk,
)

DATA = {"config": {"prefix": "job", "count": 2, "plan": None, "spot": True}, "channels": [], "a b": {"x": 1}}
CONTEXT = {"Execution": {"Name": "run-1", "Id": "arn:aws:states:us-west-2:1:execution:sm:run-1"}}


def test_paths_read_data_and_context_and_refuse_what_is_not_there():
    assert read_path("$", DATA, CONTEXT) is DATA
    assert read_path("$.config.count", DATA, CONTEXT) == 2
    assert read_path("$['a b'].x", DATA, CONTEXT) == 1
    assert read_path("$$.Execution.Name", DATA, CONTEXT) == "run-1"
    assert read_path("$.channels[0]", DATA, CONTEXT, default=None) is None
    with pytest.raises(AslPathError, match=r"\$.config.nope: nothing there"):
        read_path("$.config.nope", DATA, CONTEXT)
    with pytest.raises(AslUnsupported, match="only .name"):
        read_path("$.config[*]", DATA, CONTEXT)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("States.Format('{}-{}', $.config.prefix, $$.Execution.Name)", "job-run-1"),
        ("States.Format('s3://b/\\{x\\}/{}/', $.config.count)", "s3://b/{x}/2/"),
        ("States.Format('{} it\\'s', $.config.spot)", "true it's"),
        ("States.StringToJson('null')", None),
        (
            "States.JsonMerge($.config, States.StringToJson('{\"count\": 3}'), false)",
            {**DATA["config"], "count": 3},
        ),
        ("States.MathAdd($.config.count, 1)", 3),
        ("States.ArrayGetItem(States.StringSplit($$.Execution.Id, ':'), 3)", "us-west-2"),
        ("States.ArrayLength(States.Array(1, 'a', null))", 3),
    ],
)
def test_intrinsic_functions(expression, expected):
    assert evaluate_intrinsic(expression, DATA, CONTEXT) == expected


def test_uuid_is_fresh_and_unknown_functions_are_refused():
    first, second = (evaluate_intrinsic("States.UUID()", DATA, CONTEXT) for _ in range(2))
    assert len(first) == 36 and first != second
    with pytest.raises(AslUnsupported, match="intrinsic States.Hash: not supported"):
        evaluate_intrinsic("States.Hash($.config.prefix, 'SHA-256')", DATA, CONTEXT)


def test_payload_templates_render_nested_objects_and_lists():
    template = {
        "Name.$": "$.config.prefix",
        "Tags": [{"Key": "run", "Value.$": "$$.Execution.Name"}, {"Key": "fixed", "Value": "x"}],
        "Nested": {"Count.$": "$.config.count", "Literal": "$.not.a.path"},
    }
    assert evaluate_payload(template, DATA, CONTEXT) == {
        "Name": "job",
        "Tags": [{"Key": "run", "Value": "run-1"}, {"Key": "fixed", "Value": "x"}],
        "Nested": {"Count": 2, "Literal": "$.not.a.path"},
    }


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"Variable": "$.config.count", "NumericGreaterThan": 1}, True),
        ({"Variable": "$.config.prefix", "NumericGreaterThan": 1}, False),  # a string is not a number
        ({"Not": {"Variable": "$.config.plan", "IsNull": True}}, False),
        ({"Variable": "$.config.spot", "BooleanEquals": True}, True),
        ({"Variable": "$.channels[0]", "IsPresent": True}, False),
        ({"Variable": "$.config.prefix", "StringMatches": "j*"}, True),
        ({"Variable": "$.config.prefix", "StringEqualsPath": "$$.Execution.Name"}, False),
        (
            {
                "And": [
                    {"Variable": "$.config.spot", "BooleanEquals": True},
                    {
                        "Or": [
                            {"Variable": "$.config.count", "NumericEquals": 1},
                            {"Variable": "$['a b']", "IsPresent": True},
                        ]
                    },
                ]
            },
            True,
        ),
    ],
)
def test_choice_rules(rule, expected):
    assert choice_matches(rule, DATA, CONTEXT) is expected


def test_choice_refuses_a_missing_variable_and_an_unknown_comparator():
    with pytest.raises(AslPathError):
        choice_matches({"Variable": "$.nope", "BooleanEquals": True}, DATA, CONTEXT)
    with pytest.raises(AslUnsupported, match="TimestampEquals"):
        choice_matches({"Variable": "$.config.prefix", "TimestampEquals": "2026"}, DATA, CONTEXT)


def test_pass_and_choice_states():
    state = {"Type": "Pass", "Parameters": {"n.$": "$.config.count"}, "ResultPath": "$.launch.first"}
    assert run_pass(state, DATA, CONTEXT)["launch"] == {"first": {"n": 2}}
    assert run_pass({"Type": "Pass", "Result": True, "ResultPath": "$.flag"}, {}, CONTEXT) == {"flag": True}
    assert run_pass({"Type": "Pass", "InputPath": "$.config", "OutputPath": "$.count"}, DATA, CONTEXT) == 2
    assert run_pass({"Type": "Pass", "Result": 1, "ResultPath": None}, DATA, CONTEXT) == DATA
    choice = {
        "Type": "Choice",
        "Choices": [{"Variable": "$.x", "IsPresent": True, "Next": "A"}],
        "Default": "B",
    }
    assert run_choice(choice, {}, CONTEXT) == ("B", {})
    with pytest.raises(AslPathError, match="no rule matched"):
        run_choice({"Type": "Choice", "Choices": choice["Choices"]}, {}, CONTEXT)


def test_walk_stops_at_the_state_asked_for_and_refuses_other_state_types():
    definition = {
        "States": {
            "Start": {"Type": "Pass", "Result": 1, "ResultPath": "$.one", "Next": "Pick"},
            "Pick": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.one", "NumericEquals": 1, "Next": "Wait"}],
            },
            "Wait": {"Type": "Wait", "Seconds": 1, "Next": "Task"},
            "Task": {"Type": "Task", "Resource": "x", "End": True},
        }
    }
    assert walk(definition, "Start", {}, CONTEXT, lambda name, _s: name == "Wait") == ("Wait", {"one": 1})
    with pytest.raises(AslUnsupported, match="'Wait': a Wait state is not evaluated here"):
        walk(definition, "Start", {}, CONTEXT, lambda name, _s: name == "Task")
    with pytest.raises(AslUnsupported, match="JSONata"):
        walk({**definition, "QueryLanguage": "JSONata"}, "Start", {}, CONTEXT, lambda *_: True)


def test_format_undoes_the_templates_escapes_but_never_those_in_a_value():
    from constructs_lib._shared.asl import format_intrinsic

    expression = format_intrinsic("lit{x}'s-{}", "$.a")
    assert evaluate_intrinsic(expression, {"a": "x\\{y"}, {}) == "lit{x}'s-x\\{y"
