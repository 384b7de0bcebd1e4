"""Every ``blackwell-training ...`` command line shown in README.md and docs/*.md parses with the CLI's own parser
(``constructs_lib.cli.main.build_parser``): in fenced blocks (continuation lines joined, ``# comments`` and a ``$ ``
prompt left out, several commands on a line split at ``|``, ``&&``, ``;``) and in inline code. An inline usage
synopsis (``[--out FILE.png]``, ``RUN ...``) is not a command line and is left out."""

from __future__ import annotations

import contextlib
import io
import shlex
from collections.abc import Iterator

from constructs_lib.cli.main import build_parser
from tests.docs.pages import Page

PROGRAM = "blackwell-training"
SEPARATORS = {"|", "||", "&&", ";", "(", ")"}
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}


def command_lines(page: Page) -> Iterator[tuple[str, int, list[str]]]:
    """``(where, line, argv after the program name)`` of every ``blackwell-training`` command the page shows."""
    for block in page.blocks:
        if block.language not in SHELL_LANGUAGES:
            continue
        for offset, text in _logical_lines(block.text):
            yield from _commands(text, block.line + 1 + offset, page.name)
    for text, line in page.inline_code:
        if text.startswith(f"{PROGRAM} ") and not any(mark in text for mark in ("[", "...", "|")):
            yield from _commands(text, line, page.name)


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Shell lines with their continuations joined (a trailing backslash, or a quote still open), each with its first
    line's offset in the block."""
    pending, start = "", 0
    for offset, raw in enumerate(text.splitlines()):
        if not pending:
            start = offset
        line = raw.removeprefix("$ ")
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        pending += line
        if _tokens(pending) is None:  # a quote spans lines
            pending += "\n"
            continue
        yield start, pending
        pending = ""
    if pending:
        yield start, pending


def _tokens(text: str) -> list[str] | None:
    """Shell words, with ``|``, ``&&``, ``;`` and parentheses apart and ``# comments`` left out; None when a quote
    is not closed."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:
        return None


def _commands(text: str, line: int, page: str) -> Iterator[tuple[str, int, list[str]]]:
    if PROGRAM not in text:
        return
    tokens = _tokens(text)
    if tokens is None:
        yield f"{page}:{line}", line, ["<a quote is never closed>"]
        return
    command: list[str] | None = None
    for token in [*tokens, ";"]:
        if token in SEPARATORS or token.endswith("$"):
            if command is not None:
                yield f"{page}:{line}", line, command
            command = None
        elif command is None and (token == PROGRAM or token.endswith(f"/{PROGRAM}")):
            command = []
        elif command is not None:
            command.append(token)


def parse_problem(argv: list[str]) -> str | None:
    """What the CLI's own parser says about ``argv`` (None: it parses)."""
    parser, _ = build_parser()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exit_:
        if exit_.code:
            return (
                errors.getvalue().strip().splitlines()[-1]
                if errors.getvalue().strip()
                else f"exit {exit_.code}"
            )
    return None


def command_problems(pages: list[Page]) -> list[str]:
    problems = []
    for page in pages:
        for where, _, argv in command_lines(page):
            problem = parse_problem(argv)
            if problem:
                problems.append(f"{where}: {PROGRAM} {shlex.join(argv)}: {problem}")
    return problems


def test_every_command_line_shown_parses(pages):
    problems = command_problems(pages)
    assert not problems, (
        "command lines the CLI refuses (fix the page, or the CLI if it lost a subcommand or option):\n"
        + "\n".join(problems)
    )


def test_the_pages_show_command_lines(pages):
    """The reader finds the commands that are there, in blocks and inline, across continuation lines."""
    found = [argv for page in pages for _, _, argv in command_lines(page)]
    assert len(found) > 30
    assert ["validate", "run.json"] in found and ["plan", "run.json", "--json"] in found
    assert ["submit", "run.json", "--name", "llama-1b-run-1", "--wait"] in found


def test_an_unknown_subcommand_or_option_is_found(tmp_path):
    page = Page.parse(
        "```bash\n"
        "blackwell-training launch run.json          # no such subcommand\n"
        "blackwell-training submit run.json \\\n    --wiat   # a misspelt option, on a continuation line\n"
        "x=$(blackwell-training runs --json) && blackwell-training watch   # a run name missing\n"
        "blackwell-training validate run.json        # fine\n"
        "```\n\nInline: `blackwell-training curves RUN --x minutes`, and a synopsis `blackwell-training curves RUN [RUN ...]`.\n",
        tmp_path / "page.md",
        "page.md",
    )
    problems = command_problems([page])
    assert len(problems) == 4, problems
    assert "invalid choice: 'launch'" in problems[0]
    assert "unrecognized arguments: --wiat" in problems[1] and problems[1].startswith("page.md:3:")
    assert "the following arguments are required: run" in problems[2]
    assert "invalid choice: 'minutes'" in problems[3]
