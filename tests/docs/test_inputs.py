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
"""

from __future__ import annotations

import io
import json
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


def input_problems(pages: list[Page], rules: Any) -> list[str]:
    problems = []
    for page in pages:
        blocks = page.blocks
        for index, block in enumerate(blocks):
            where = block.where()
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


def test_a_refusal_shown_as_printed_passes(tmp_path):
    printed = refusal_text(validate({"batch_size": 0}, rules()))
    wrapped = printed.replace(" got", "\n    got").replace(" must", "\n  must")
    page = Page.parse(
        f'```json refused\n{{"batch_size": 0}}\n```\n\n```text\n{wrapped}```\n', tmp_path / "p.md", "p.md"
    )
    assert input_problems([page], rules()) == []
