"""Every JSON execution input shown in README.md and docs/*.md is accepted by the workflow's own check, offline and
under this project's ``cdk.json`` (what ``blackwell-training validate`` does), or is marked as a refusal and is
refused with exactly the error shown.

How a page marks its JSON blocks (the words after the language are invisible on GitHub):

* ```` ```json input ````: an execution input; it must be valid.
* ```` ```json refused ````: an execution input the check refuses; the next block (```` ```text ````) shows
  ``blackwell-training validate``'s output, and it must be exactly that (whitespace may wrap differently).
* ```` ```json output ````: not an input (an output, a ``cdk.json`` fragment, ...): not checked.

An untagged ``json`` block fails (so a new example cannot escape the check). Inputs inside shell lines are checked
too: ``aws stepfunctions start-execution --input '{...}'`` and each ``Detail`` of ``aws events put-events``.

So are the inputs of ```` ```python ```` blocks: the first argument of a call that submits one (``runs.submit``,
``launch_direct``, ``model_trainer``, ``direct_request``; boto3's ``start_execution(input=json.dumps(...))``) must
be accepted; that of a call that checks one (``runs.check``, ``validate_request``, ``validate``) is accepted, or is
refused with exactly what it returns shown in a ``# [...]`` comment on the line after the call (``...`` there stands
for any text). The argument is a dict literal or a name the block binds to one, read with ``ast.literal_eval``
(nothing is run).
"""

from __future__ import annotations

import ast
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from constructs_lib.cli.render import print_problems
from constructs_lib.cli.request import Project, validate
from tests.docs.pages import ROOT, Block, Page
from tests.docs.test_commands import SHELL_LANGUAGES, _logical_lines, _tokens

TAGS = ("input", "refused", "output")


def rules() -> Any:
    """The rules ``blackwell-training validate`` uses offline: this project's cdk.json."""
    return Project.find(ROOT).rules()


def refusal_text(problems: list[str]) -> str:
    """What ``blackwell-training validate`` prints for these problems."""
    out = io.StringIO()
    print_problems(problems, Console(file=out, width=10_000, highlight=False), None)
    return out.getvalue()


def _same(shown: str, printed: str) -> bool:
    return shown.split() == printed.split()


def shell_inputs(block: Block) -> Iterator[tuple[int, Any]]:
    """``(line, input)`` of the execution inputs in a shell block's AWS CLI lines."""
    for offset, text in _logical_lines(block.text):
        tokens = _tokens(text) or []
        line = block.line + 1 + offset
        if "start-execution" in tokens and "--input" in tokens:
            value = tokens[tokens.index("--input") + 1]
            if not value.startswith("file://"):
                yield line, json.loads(value)
        if "put-events" in tokens and "--entries" in tokens:
            for entry in json.loads(tokens[tokens.index("--entries") + 1]):
                yield line, json.loads(entry["Detail"])


SUBMITTING = {"submit", "launch_direct", "model_trainer", "direct_request", "start_execution"}
"""Calls whose input must be accepted (their first argument, or ``input=json.dumps(...)``)."""
CHECKING = {"check", "validate", "validate_request"}
"""Calls that show a check's answer: the input may be refused, with the answer shown after the call."""


def _literal(node: ast.expr | None, bound: dict[str, ast.expr]) -> tuple[bool, Any]:
    """``(found, value)`` of a dict literal, ``json.dumps(<literal>)``, or a name bound to one in the block."""
    if isinstance(node, ast.Name) and node.id in bound:
        node = bound[node.id]
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "dumps" and node.args:
        node = node.args[0]
    if not isinstance(node, ast.Dict):
        return False, None
    try:
        return True, ast.literal_eval(node)
    except ValueError:
        return False, None


def python_inputs(block: Block) -> Iterator[tuple[int, str, Any, str | None]]:
    """``(line, call, input, comment shown after the call)`` of each input a python block submits or checks."""
    try:
        tree = ast.parse(block.text)
    except SyntaxError as error:
        yield block.line + (error.lineno or 0), "<not Python>", str(error), None
        return
    bound = {
        target.id: node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    lines = block.text.splitlines()
    calls = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)
    )
    for node in calls:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called not in SUBMITTING | CHECKING:
            continue
        keyword = next((k.value for k in node.keywords if k.arg in ("request", "input")), None)
        found, value = _literal(node.args[0] if node.args else keyword, bound)
        if found:
            yield (
                block.line + node.lineno,
                called,
                value,
                _comment_after(lines, node.end_lineno or node.lineno),
            )


def _comment_after(lines: list[str], last: int) -> str | None:
    """The ``# ...`` lines right after line ``last`` (1-based) of the block, joined; None when there are none."""
    shown = []
    for text in lines[last:]:
        if not text.lstrip().startswith("#"):
            break
        shown.append(text.lstrip()[1:].strip())
    return " ".join(shown) or None


def _shows(comment: str | None, answer: list[str]) -> bool:
    """The comment shows ``answer`` as Python prints it (whitespace may wrap differently; ``...`` elides)."""
    if comment is None or not comment.startswith("["):
        return False
    pattern = ".*".join(re.escape("".join(part.split())) for part in comment.split("..."))
    return re.fullmatch(pattern, "".join(repr(answer).split()), re.DOTALL) is not None


def python_problems(page: Page, block: Block, rules: Any) -> list[str]:
    problems = []
    for line, called, value, comment in python_inputs(block):
        where = f"{page.name}:{line}"
        if called == "<not Python>":
            problems.append(f"{where}: a python block that does not parse ({value})")
            continue
        found = validate(value, rules)
        if called in SUBMITTING and found:
            problems.append(f"{where}: {called}() of an input the check refuses: " + "; ".join(found))
        elif found and not _shows(comment, found):
            problems.append(
                f"{where}: {called}() refuses this input; show what it returns on the line after it: # {found!r}"
            )
    return problems


def input_problems(pages: list[Page], rules: Any) -> list[str]:
    problems = []
    for page in pages:
        blocks = page.blocks
        for index, block in enumerate(blocks):
            where = block.where()
            if block.language == "python":
                problems += python_problems(page, block, rules)
                continue
            if block.language in SHELL_LANGUAGES:
                for line, value in shell_inputs(block):
                    found = validate(value, rules)
                    if found:
                        problems.append(
                            f"{page.name}:{line}: an input the check refuses: " + "; ".join(found)
                        )
                continue
            if block.language != "json":
                continue
            tags = [t for t in TAGS if t in block.flags]
            if len(tags) != 1:
                problems.append(
                    f"{where}: a json block must say what it is: ```json input, ```json refused or ```json output"
                )
                continue
            if tags[0] == "output":
                continue
            try:
                value = json.loads(block.text)
            except ValueError as error:
                problems.append(f"{where}: not JSON ({error})")
                continue
            found = validate(value, rules)
            if tags[0] == "input" and found:
                problems.append(f"{where}: an input the check refuses: " + "; ".join(found))
            elif tags[0] == "refused":
                problems += _refusal_problems(
                    where, found, blocks[index + 1] if index + 1 < len(blocks) else None
                )
    return problems


def _refusal_problems(where: str, found: list[str], shown: Block | None) -> list[str]:
    if not found:
        return [f"{where}: marked refused, but the check accepts it"]
    printed = refusal_text(found)
    if shown is None or shown.language != "text" or not _same(shown.text, printed):
        return [
            f"{where}: the refusal shown after it (a ```text block) must be what validate prints:\n{printed}"
        ]
    return []


def test_every_input_shown_is_valid_or_refused_as_shown(pages):
    problems = input_problems(pages, rules())
    assert not problems, "execution inputs in the docs (fix the example, or what it shows):\n" + "\n".join(
        problems
    )


def test_the_pages_show_inputs_of_each_kind(pages):
    """Valid inputs, refusals and AWS CLI inputs are there to check (an empty reading cannot pass the test above)."""
    blocks = [b for page in pages for b in page.blocks]
    assert sum("input" in b.flags for b in blocks) >= 4
    assert sum("refused" in b.flags for b in blocks) >= 2
    assert sum(len(list(shell_inputs(b))) for b in blocks if b.language in SHELL_LANGUAGES) >= 3
    python = [found for b in blocks if b.language == "python" for found in python_inputs(b)]
    assert {"submit", "check", "validate_request", "launch_direct", "direct_request"} <= {
        c for _, c, _, _ in python
    }


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ('```json input\n{"precison": "bf16"}\n```\n', "unknown input field (did you mean precision?)"),
        ('```json\n{"precision": "bf16"}\n```\n', "a json block must say what it is"),
        ('```json refused\n{"precision": "bf16"}\n```\n', "marked refused, but the check accepts it"),
        (
            '```json refused\n{"batch_size": 0}\n```\n\n```text\ninvalid request (1 problem):\n  - batch_size: wrong\n```\n',
            "the refusal shown after it",
        ),
        (
            '```bash\naws stepfunctions start-execution --state-machine-arn "$ARN" \\\n'
            '  --input \'{"use_spot": "yes"}\'\n```\n',
            "page.md:2: an input the check refuses: use_spot: must be true or false",
        ),
    ],
)
def test_an_invalid_example_is_found(tmp_path, markdown, expected):
    page = Page.parse(markdown, tmp_path / "page.md", "page.md")
    problems = input_problems([page], rules())
    assert len(problems) == 1 and expected in problems[0], problems


PYTHON_CASES = [
    (
        'runs.submit({"precison": "bf16"})\n',
        "submit() of an input the check refuses: precison: unknown input",
    ),
    (
        'request = {"use_spot": "yes"}\nruns.launch_direct(request, name="x")\n',
        "page.md:3: launch_direct() of an input the check refuses: use_spot: must be true or false",
    ),
    (
        'sfn.start_execution(stateMachineArn=arn, input=json.dumps({"batch_size": 0}))\n',
        "start_execution() of an input the check refuses: batch_size",
    ),
    ('print(runs.check({"batch_size": 0}))\n', "check() refuses this input; show what it returns"),
    (
        "print(validate_request({\"batch_size\": 0}, rules))\n# ['batch_size: must be 2']\n",
        "validate_request() refuses this input",
    ),
    ("runs.submit({'precision': \n", "a python block that does not parse"),
]


@pytest.mark.parametrize(("code", "expected"), PYTHON_CASES)
def test_an_invalid_python_input_is_found(tmp_path, code, expected):
    page = Page.parse(f"```python\n{code}```\n", tmp_path / "page.md", "page.md")
    problems = input_problems([page], rules())
    assert len(problems) == 1 and expected in problems[0], problems


def test_python_inputs_accepted_or_shown_refused_pass(tmp_path):
    shown = repr(validate({"instance_count": 99}, rules()))
    code = (
        'runs.submit({"precision": "mxfp8"}, name="ok")\n'
        'request = {"use_spot": True}\nruns.direct_request(request)\n'
        f'print(runs.check({{"instance_count": 99}}))\n# {shown[:30]}\n#   ...{shown[-10:]}\n'
        "runs.submit(json.load(open('run.json')))  # not a literal: not read\n"
    )
    page = Page.parse(f"```python\n{code}```\n", tmp_path / "page.md", "page.md")
    assert [c for _, c, _, _ in python_inputs(page.blocks[0])] == ["submit", "direct_request", "check"]
    assert input_problems([page], rules()) == []


def test_a_refusal_shown_as_printed_passes(tmp_path):
    printed = refusal_text(validate({"batch_size": 0}, rules()))
    wrapped = printed.replace(" got", "\n    got").replace(" must", "\n  must")
    page = Page.parse(
        f'```json refused\n{{"batch_size": 0}}\n```\n\n```text\n{wrapped}```\n', tmp_path / "p.md", "p.md"
    )
    assert input_problems([page], rules()) == []
