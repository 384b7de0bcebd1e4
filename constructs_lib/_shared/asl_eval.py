"""Evaluate the Amazon States Language (JSONPath) that a deployed state machine's ``Pass`` and ``Choice`` states use.

Its one job: given a state machine definition, a state's data and the context object (``$$``), compute what Step
Functions would compute for payload templates (``"key.$"`` paths and intrinsic functions), ``Choice`` rules and
``Pass`` states (``InputPath``, ``Parameters``/``Result``, ``ResultPath``, ``OutputPath``), so that a request the
workflow builds in its states can be rendered outside Step Functions from the deployed definition itself. Anything
outside that subset (another state type, a JSONata state, an unknown intrinsic or comparator) raises
:class:`AslUnsupported` naming it, never a guess. Pure Python; no AWS call.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

_MISSING = object()
_RAISE = object()


class AslUnsupported(ValueError):
    """The definition uses something this evaluator does not implement (named in the message)."""


class AslPathError(ValueError):
    """A path names nothing in the data (Step Functions fails such a state with ``States.Runtime``)."""


# ---- paths ------------------------------------------------------------------------------------------------------

_SEGMENT = re.compile(r"\.([A-Za-z0-9_@-]+)|\['([^']*)'\]|\[(\d+)\]")


def _segments(path: str) -> tuple[bool, list[str | int]]:
    """(context object?, segments) of ``$.a.b[0]`` / ``$$.Execution.Name``."""
    context = path.startswith("$$")
    rest = path[2:] if context else path[1:]
    if not path.startswith("$"):
        raise AslUnsupported(f"path {path!r}: must start with $ or $$")
    segments: list[str | int] = []
    position = 0
    while position < len(rest):
        match = _SEGMENT.match(rest, position)
        if match is None:
            raise AslUnsupported(f"path {path!r}: only .name, ['name'] and [index] are supported")
        name, quoted, index = match.groups()
        segments.append(int(index) if index is not None else (name if name is not None else quoted))
        position = match.end()
    return context, segments


def read_path(path: str, data: Any, context: Mapping[str, Any], default: Any = _RAISE) -> Any:
    """The value at ``path`` in ``data`` (``$``) or ``context`` (``$$``); ``default`` (else :class:`AslPathError`)
    when there is none."""
    is_context, segments = _segments(path)
    node: Any = context if is_context else data
    for segment in segments:
        in_list = isinstance(segment, int) and isinstance(node, list) and segment < len(node)
        if not in_list and not (isinstance(segment, str) and isinstance(node, Mapping) and segment in node):
            if default is not _RAISE:
                return default
            raise AslPathError(f"path {path}: nothing there")
        node = node[segment]
    return node


def write_path(path: str | None, data: Any, value: Any) -> Any:
    """``data`` with ``value`` placed at ``ResultPath`` ``path`` (``$``: replaced; None: ``data`` unchanged)."""
    if path is None:
        return data
    is_context, segments = _segments(path)
    if is_context or any(isinstance(s, int) for s in segments):
        raise AslUnsupported(f"ResultPath {path!r}: only $ and $.name.name... are supported")
    if not segments:
        return value
    result = copy.deepcopy(data) if isinstance(data, dict) else {}
    node = result
    for segment in segments[:-1]:
        if not isinstance(node.get(segment), dict):
            node[segment] = {}
        node = node[segment]
    node[segments[-1]] = value
    return result


# ---- intrinsic functions ----------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^'\\]|\\.)*')|(?P<call>States\.[A-Za-z0-9]+\()|(?P<close>\))|(?P<comma>,)"
    r"|(?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)|(?P<literal>true|false|null)\b"
    r"|(?P<path>\$\$?(?:\.[A-Za-z0-9_@-]+|\['[^']*'\]|\[\d+\])*))"
)


def _format(template: str, *args: Any) -> str:
    pieces = re.split(r"(?<!\\)\{\}", template)
    if len(pieces) - 1 != len(args):
        raise AslPathError(f"States.Format: {len(pieces) - 1} placeholders, {len(args)} arguments")
    # The template's escapes (\\, \', \{, \}: ``asl.literal``) are undone piece by piece, never in the values.
    text = _unescape(pieces[0])
    for arg, piece in zip(args, pieces[1:], strict=True):
        text += (arg if isinstance(arg, str) else json.dumps(arg, separators=(",", ":"))) + _unescape(piece)
    return text


def _unescape(piece: str) -> str:
    return re.sub(r"\\([\\'{}])", r"\1", piece)


def _merge(left: Any, right: Any, deep: bool) -> Any:
    if deep:
        raise AslUnsupported("States.JsonMerge: deep merge (true) is not supported")
    return {**left, **right}


INTRINSICS: dict[str, Callable[..., Any]] = {
    "States.Format": _format,
    "States.StringToJson": lambda text: json.loads(text),
    "States.JsonToString": lambda value: json.dumps(value, separators=(",", ":")),
    "States.JsonMerge": _merge,
    "States.MathAdd": lambda a, b: a + b,
    "States.UUID": lambda: str(uuid.uuid4()),
    "States.Array": lambda *items: list(items),
    "States.ArrayGetItem": lambda items, index: items[index],
    "States.ArrayLength": lambda items: len(items),
    "States.ArrayContains": lambda items, value: value in items,
    "States.StringSplit": lambda text, separators: [
        p for p in re.split(f"[{re.escape(separators)}]", text) if p
    ],
}
"""The intrinsic functions implemented, by name (the others raise :class:`AslUnsupported`)."""


def evaluate_intrinsic(text: str, data: Any, context: Mapping[str, Any]) -> Any:
    """The value of an intrinsic-function expression such as ``States.Format('{}-x', $.a)``."""
    tokens = [(m.lastgroup, m.group(m.lastgroup or 0)) for m in _TOKEN.finditer(text)]
    if "".join(t[1] for t in tokens).replace(" ", "") != text.replace(" ", ""):
        raise AslUnsupported(f"intrinsic {text!r}: cannot read it")
    position = 0

    def argument() -> Any:
        nonlocal position
        kind, value = tokens[position]
        position += 1
        if kind == "string":
            return value[1:-1].replace("\\'", "'")
        if kind == "number":
            return json.loads(value)
        if kind == "literal":
            return {"true": True, "false": False, "null": None}[value]
        if kind == "path":
            return read_path(value, data, context)
        if kind != "call":
            raise AslUnsupported(f"intrinsic {text!r}: unexpected {value!r}")
        name = value[:-1]
        function = INTRINSICS.get(name)
        if function is None:
            raise AslUnsupported(f"intrinsic {name}: not supported; supported: {', '.join(INTRINSICS)}")
        args: list[Any] = []
        while tokens[position][0] != "close":
            args.append(argument())
            if tokens[position][0] == "comma":
                position += 1
        position += 1
        return function(*args)

    result = argument()
    if position != len(tokens):
        raise AslUnsupported(f"intrinsic {text!r}: text after the call")
    return result


def evaluate_payload(template: Any, data: Any, context: Mapping[str, Any]) -> Any:
    """A payload template (``Parameters``, ``ResultSelector``) rendered: ``"key.$"`` values read a path or call an
    intrinsic function and become ``key``; objects inside objects and lists are rendered too."""
    if isinstance(template, list):
        return [evaluate_payload(item, data, context) for item in template]
    if not isinstance(template, Mapping):
        return template
    rendered: dict[str, Any] = {}
    for key, value in template.items():
        if key.endswith(".$"):
            if not isinstance(value, str):
                raise AslUnsupported(f"{key}: must be a path or an intrinsic function; got {value!r}")
            rendered[key[:-2]] = (
                evaluate_intrinsic(value, data, context)
                if value.startswith("States.")
                else copy.deepcopy(read_path(value, data, context))
            )
        else:
            rendered[key] = evaluate_payload(value, data, context)
    return rendered


# ---- Choice rules -----------------------------------------------------------------------------------------------

_NUMBER = (int, float)


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


_COMPARATORS: dict[str, Callable[[Any, Any], bool]] = {
    "StringEquals": lambda a, b: isinstance(a, str) and a == b,
    "StringLessThan": lambda a, b: isinstance(a, str) and a < b,
    "StringGreaterThan": lambda a, b: isinstance(a, str) and a > b,
    "StringLessThanEquals": lambda a, b: isinstance(a, str) and a <= b,
    "StringGreaterThanEquals": lambda a, b: isinstance(a, str) and a >= b,
    "StringMatches": lambda a, b: (
        isinstance(a, str) and fnmatch.fnmatchcase(a, re.sub(r"([\[\]?])", r"[\1]", b))
    ),
    "NumericEquals": lambda a, b: _is_number(a) and a == b,
    "NumericLessThan": lambda a, b: _is_number(a) and a < b,
    "NumericGreaterThan": lambda a, b: _is_number(a) and a > b,
    "NumericLessThanEquals": lambda a, b: _is_number(a) and a <= b,
    "NumericGreaterThanEquals": lambda a, b: _is_number(a) and a >= b,
    "BooleanEquals": lambda a, b: isinstance(a, bool) and a is b,
    "IsNull": lambda a, b: (a is None) is b,
    "IsString": lambda a, b: isinstance(a, str) is b,
    "IsNumeric": lambda a, b: _is_number(a) is b,
    "IsBoolean": lambda a, b: isinstance(a, bool) is b,
}


def choice_matches(rule: Mapping[str, Any], data: Any, context: Mapping[str, Any]) -> bool:
    """Whether a ``Choice`` rule (``And``/``Or``/``Not`` or ``Variable`` with one comparator) holds."""
    if "And" in rule:
        return all(choice_matches(r, data, context) for r in rule["And"])
    if "Or" in rule:
        return any(choice_matches(r, data, context) for r in rule["Or"])
    if "Not" in rule:
        return not choice_matches(rule["Not"], data, context)
    (comparator,) = [k for k in rule if k not in ("Variable", "Next")]
    value = read_path(rule["Variable"], data, context, default=_MISSING)
    if comparator == "IsPresent":
        return (value is not _MISSING) is rule[comparator]
    expected = rule[comparator]
    name = comparator
    if comparator.endswith("Path") and comparator != "Path":
        name, expected = comparator[:-4], read_path(expected, data, context, default=_MISSING)
    check = _COMPARATORS.get(name)
    if check is None:
        raise AslUnsupported(f"Choice comparator {comparator}: not supported")
    if value is _MISSING:
        raise AslPathError(f"Choice variable {rule['Variable']}: nothing there")
    return expected is not _MISSING and check(value, expected)


# ---- states -----------------------------------------------------------------------------------------------------


def _input(state: Mapping[str, Any], data: Any, context: Mapping[str, Any]) -> Any:
    path = state.get("InputPath", "$")
    return {} if path is None else read_path(path, data, context)


def _output(state: Mapping[str, Any], data: Any, context: Mapping[str, Any]) -> Any:
    path = state.get("OutputPath", "$")
    return {} if path is None else read_path(path, data, context)


def run_pass(state: Mapping[str, Any], data: Any, context: Mapping[str, Any]) -> Any:
    """The output of a ``Pass`` state for ``data``."""
    effective = _input(state, data, context)
    if "Parameters" in state:
        result = evaluate_payload(state["Parameters"], effective, context)
    else:
        result = copy.deepcopy(state["Result"]) if "Result" in state else effective
    return _output(state, write_path(state.get("ResultPath", "$"), data, result), context)


def run_choice(state: Mapping[str, Any], data: Any, context: Mapping[str, Any]) -> tuple[str, Any]:
    """(next state, output) of a ``Choice`` state for ``data``."""
    effective = _input(state, data, context)
    for rule in state["Choices"]:
        if choice_matches(rule, effective, context):
            return rule["Next"], _output(state, effective, context)
    if "Default" not in state:
        raise AslPathError(f"Choice: no rule matched and no Default ({state.get('Comment', '')})")
    return state["Default"], _output(state, effective, context)


def walk(
    definition: Mapping[str, Any],
    start: str,
    data: Any,
    context: Mapping[str, Any],
    stop: Callable[[str, Mapping[str, Any]], bool],
    max_states: int = 200,
) -> tuple[str, Any]:
    """Run ``Pass`` and ``Choice`` states from ``start`` until ``stop(name, state)`` holds; returns (that state's
    name, its input). Any other state on the way raises :class:`AslUnsupported` naming it."""
    if definition.get("QueryLanguage", "JSONPath") != "JSONPath":
        raise AslUnsupported("definition: JSONata state machines are not supported (QueryLanguage)")
    states = definition["States"]
    name = start
    for _ in range(max_states):
        state = states[name]
        if state.get("QueryLanguage", "JSONPath") != "JSONPath":
            raise AslUnsupported(f"state {name!r}: JSONata states are not supported")
        if stop(name, state):
            return name, data
        if state["Type"] == "Pass":
            data = run_pass(state, data, context)
            if state.get("End"):
                raise AslPathError(f"state {name!r} ends the execution before the state looked for")
            name = state["Next"]
        elif state["Type"] == "Choice":
            name, data = run_choice(state, data, context)
        else:
            raise AslUnsupported(f"state {name!r}: a {state['Type']} state is not evaluated here")
    raise AslPathError(f"more than {max_states} states from {start!r} (a loop?)")
