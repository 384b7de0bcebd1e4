"""Running what the pages print, as a reader would: README.md's first run, then each docs page's opening example
(its blocks before its first ``##`` heading), in the reader's order (the README's page table), in a copy of the
repository, on the CPU and without AWS credentials; then every ``blackwell-training`` command of every page that
needs AWS, checked to exit as documented. ``tests/docs/test_runs.py`` runs it on the real pages and on planted
broken ones.

Each command line of a shell block is one of:

* **run**: executed as printed (``set -e``: the first failure stops the page);
* **aws**: a ``blackwell-training`` command that needs an AWS account: executed as printed without credentials; it
  must exit 3 with one line, ``error: no AWS credentials found ...`` (or, when the request file it reads does not
  exist, ``error: cannot read FILE``): what docs/running-jobs.md documents;
* **account**: the AWS CLI or the CDK CLI against an account (``aws ...``, ``cdk bootstrap``, ``make deploy``):
  listed, not run (neither the AWS CLI nor an account is part of this project);
* **set-up**: ``make synth``, ``make local``, ... : what built the environment the suite runs in (``make test``'s
  set-up is a superset of every other), not run again;
* **suite**: the test suite's own tests (``pytest``, ``make test``): listed, not run inside the suite.

A page is one terminal session, as its reader has it: the blocks run one after the other, each in a shell that
starts as fresh as a new terminal's (no venv on the PATH, no AWS credentials, a home of its own), except that once
the page has said to ``source .venv/bin/activate`` (in a block, or in its text: README.md's first step) the later
blocks' shells have it too. A ``json`` block flagged ``save=FILE`` (```` ```json input save=run.json ````: the
words after the language are invisible on GitHub) is written to FILE first, as the page tells its reader to; a
``python`` block runs in the venv's Python; a ``console`` block's ``$`` lines run one by one and what follows each
must be its output (``echo $?``: the previous status). Nothing tracked in the repository may change.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

from tests.docs.pages import Block, Page
from tests.docs.test_commands import PROGRAM, SHELL_LANGUAGES, _logical_lines, _tokens

ACCOUNT_TARGETS = {"deploy", "destroy"}
CDK_ACCOUNT_COMMANDS = {"bootstrap", "deploy", "destroy", "diff"}
ACTIVATE = "source .venv/bin/activate"
AWS_STATUS = 3
NO_CREDENTIALS = "error: no AWS credentials found"
BLOCK_TIMEOUT = 1800
SKIPPED_OPENINGS = {
    "docs/reuse.md": (
        "tests/test_package.py",
        "test_reuse_example_synthesizes_from_a_fresh_install",
        "its pip installs into the reader's own app venv; that test builds the wheel, installs it into a fresh venv "
        "and synthesizes the page's app",
    ),
    "docs/fine-tuning.md": (
        "tests/training/test_fine_tuning.py",
        "test_trained_locally_as_the_page_shows_the_export_answers_held_out_prompts_and_stops",
        "that test runs the page's training command as printed (read from the page) on the example its setup and "
        "prepare functions make, and checks the held-out answers the chat command prints, at least 9 of 10 right",
    ),
    "docs/preference-tuning.md": (
        "tests/training/preference/test_toy_task.py",
        "test_the_pages_commands_teach_the_preferred_style_and_answers_still_stop",
        "that test runs the page's commands as printed (read from the page): a supervised fine-tuning and DPO of a tiny "
        "model, and checks the reward accuracy and the styles of the held-out answers",
    ),
}
"""Openings run by another test instead (file, test, why): the test must exist."""
KINDS = ("run", "aws", "account", "set-up", "suite")


@dataclass
class Command:
    page: str
    line: int
    text: str
    kind: str


@dataclass
class Outcome:
    """What running the pages gave: commands by kind, failures (one line each), seconds per page."""

    commands: list[Command] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    aws_checked: list[Command] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(c.kind == kind for c in self.commands)

    def summary(self) -> str:
        kinds = ", ".join(f"{self.count(k)} {k}" for k in KINDS)
        times = ", ".join(f"{page} {s:.0f} s" for page, s in self.seconds.items())
        return (
            f"commands of the first run and the openings: {kinds}; every page's AWS commands checked without "
            f"credentials: {len(self.aws_checked)}; {len(self.failures)} failures; {times}"
        )


def reading_order(pages: list[Page]) -> list[Page]:
    """README.md, then the pages in the order of its table of pages, then any other page."""
    by_name = {page.name: page for page in pages}
    readme = by_name["README.md"]
    listed = [target for target, _ in readme.links if target.startswith("docs/") and target.endswith(".md")]
    order = ["README.md", *dict.fromkeys(t for t in listed if t in by_name)]
    return [by_name[name] for name in order] + sorted(
        (p for p in pages if p.name not in order), key=lambda p: p.name
    )


def _h2_lines(page: Page) -> list[tuple[int, str]]:
    tokens = MarkdownIt("commonmark").enable("table").parse(page.path.read_text())
    return [
        (token.map[0] + 1, tokens[i + 1].content)
        for i, token in enumerate(tokens)
        if token.type == "heading_open" and token.tag == "h2" and token.map
    ]


def first_run(readme: Page) -> tuple[int, list[Block]]:
    """Where README.md's section ``A first run ...`` starts, and its blocks."""
    headings = _h2_lines(readme)
    start = next(line for line, text in headings if text.startswith("A first run"))
    end = next((line for line, _ in headings if line > start), 10**9)
    return start, [b for b in readme.blocks if start < b.line < end]


def opening(page: Page) -> tuple[int, list[Block]]:
    """A docs page's opening example: its blocks before its first ``##`` heading."""
    first = next((line for line, _ in _h2_lines(page)), 10**9)
    return 1, [b for b in page.blocks if b.line < first]


def to_run(pages: list[Page]) -> list[tuple[Page, int, list[Block]]]:
    """Every page with where its part to run starts and its blocks, in reading order (README's first run, then
    the openings)."""
    return [
        (page, *(first_run(page) if page.name == "README.md" else opening(page)))
        for page in reading_order(pages)
    ]


def kind_of(text: str) -> str:
    """run, aws, account, set-up or suite (see the module's doc)."""
    tokens = _tokens(text) or []
    words = [t for t in tokens if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", t)]  # VAR=value prefixes
    first = words[0] if words else ""
    if first == "make":
        targets = set(words[1:]) or {"synth"}
        if targets & ACCOUNT_TARGETS:
            return "account"
        return "suite" if "test" in targets else "set-up"
    if "pytest" in words[:3]:
        return "suite"
    if first == "aws" or (
        "cdk" in " ".join(words[:3]) and any(w in CDK_ACCOUNT_COMMANDS for w in words[1:4])
    ):
        return "account"
    if first == PROGRAM or first.endswith(f"/{PROGRAM}"):
        return "run" if _offline(words[1:]) else "aws"
    return "run"


def _offline(argv: list[str]) -> bool:
    """Whether a ``blackwell-training`` command needs no AWS: validate and plan without the deployed rules, tune's
    dry run, compare of local results folders (paths)."""
    sub = argv[0] if argv else ""
    if sub in ("validate", "plan"):
        return not {"--deployed", "--stack"} & set(argv)
    if sub == "tune":
        return "--dry-run" in argv
    if sub == "compare":
        runs = [a for a in argv[1:] if not a.startswith("-")]
        return bool(runs) and all("/" in a for a in runs)
    return False


def expected_aws_line(argv: list[str], root: Path) -> str:
    """What an AWS command says without credentials: that, or first that its request file cannot be read."""
    missing = next((a for a in argv[1:2] if a.endswith(".json") and not (root / a).exists()), None)
    return f"error: cannot read {missing}" if missing else NO_CREDENTIALS


def copy_checkout(root: Path, dest: Path) -> list[str]:
    """The checkout's tracked and new (not ignored) files into ``dest``, its .venv and node_modules linked;
    returns the tracked files."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = root / name
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            (dest / name).symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, dest / name)
    for linked in (".venv", "node_modules"):
        if (dest / linked).is_symlink():
            (dest / linked).unlink()
        elif (dest / linked).exists():
            shutil.rmtree(dest / linked)
        (dest / linked).symlink_to((root / linked).resolve())
    return [n for n in tracked.split("\0") if n and (dest / n).is_file()]


def digest(root: Path, names: list[str]) -> dict[str, str]:
    return {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in names if (root / n).is_file()}


def fresh_environment(root: Path, scratch: Path) -> dict[str, str]:
    """A fresh login's environment: the system PATH (no venv), a home of its own, no AWS credentials (and no
    instance metadata to wait for); the copy's code first on the path (as its editable install would have it).
    Nothing the pages do not print: no thread count (the trainer and the evaluation choose theirs), no terminal
    width (a reader's is unknown; rich falls back to 80 columns without one)."""
    for folder in ("home", "tmp", "hf"):
        (scratch / folder).mkdir(exist_ok=True)
    return {
        "HOME": str(scratch / "home"),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "TMPDIR": str(scratch / "tmp"),
        "PYTHONPATH": str(root),
        "HF_HOME": str(scratch / "hf"),
        "AWS_CONFIG_FILE": str(scratch / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(scratch / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


class Runner:
    """Runs the pages' blocks in ``root`` (a copy of the checkout), collecting an :class:`Outcome`."""

    def __init__(self, root: Path, scratch: Path):
        self.root, self.scratch = root, scratch
        self.env = fresh_environment(root, scratch)
        self.outcome = Outcome()
        self.serial = 0
        self.activated = False

    def page(self, page: Page, start: int, blocks: list[Block]) -> None:
        """One page's blocks, in one session: the files it saves first, then the others in order until one fails."""
        started = time.monotonic()
        if page.name in SKIPPED_OPENINGS:
            self.outcome.skipped.append(f"{page.name}: run by {'::'.join(SKIPPED_OPENINGS[page.name][:2])}")
            return
        told = [line for text, line in page.inline_code if text == ACTIVATE and line > start]
        self.activated = False
        for block in sorted(blocks, key=lambda b: not _saves(b)):
            self.activated = self.activated or any(line < block.line for line in told)
            if not self.block(page, block):
                break  # later blocks of the page build on this one
        self.outcome.seconds[page.name] = time.monotonic() - started

    def block(self, page: Page, block: Block) -> bool:
        if saved := _saves(block):
            (self.root / saved).write_text(block.text)
            return True
        if block.language in SHELL_LANGUAGES - {"console"}:
            return self.shell(page, block)
        if block.language == "console":
            return self.console(page, block)
        if block.language == "python":
            return self.python(page, block)
        return True  # json inputs (tests/docs/test_inputs.py checks them), text, yaml: nothing to run

    def _bash(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/bin/bash", "--noprofile", "--norc", "-c", script], cwd=self.root, env=self.env,
            capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
        )  # fmt: skip

    def shell(self, page: Page, block: Block) -> bool:
        """The block's lines in one shell: ``run`` lines as printed (a marker before each says which failed),
        ``aws`` lines as printed with their status and error kept, the others left out."""
        self.serial += 1
        marks = self.scratch / f"mark-{self.serial}"
        lines, checks = ["set -eo pipefail", *([ACTIVATE] if self.activated else [])], []
        for offset, text in _logical_lines(block.text):
            line = block.line + 1 + offset
            if not (_tokens(text) or []):
                continue  # a comment or a blank line
            kind = kind_of(text)
            self.outcome.commands.append(Command(page.name, line, text.strip(), kind))
            self.activated = self.activated or (kind == "run" and text.split("#")[0].strip() == ACTIVATE)
            if kind == "run":
                lines += [f"echo {line} > {shlex.quote(str(marks))}", text]
            elif kind == "aws":
                err = self.scratch / f"aws-{self.serial}-{line}"
                lines += ["set +e", "(", text, f") > /dev/null 2> {shlex.quote(str(err))}",
                          f"echo $? > {shlex.quote(str(err))}.status", "set -e"]  # fmt: skip
                checks.append((Command(page.name, line, text.strip(), kind), err))
        done = self._bash("\n".join(lines))
        for command, err in checks:
            if (err.parent / f"{err.name}.status").exists():
                status = int((err.parent / f"{err.name}.status").read_text().split()[-1])
                self._check_aws(command, status, err.read_text() if err.exists() else "")
        if done.returncode != 0:
            at = marks.read_text().strip() if marks.exists() else str(block.line)
            tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
            self.outcome.failures.append(f"{page.name}:{at}: exit {done.returncode}: " + " | ".join(tail))
            return False
        return True

    def _check_aws(self, command: Command, status: int, stderr: str) -> None:
        self.outcome.aws_checked.append(command)
        said = stderr.strip().splitlines()
        expected = expected_aws_line((_tokens(command.text) or [])[1:], self.root)
        if status != AWS_STATUS or len(said) != 1 or not said[0].startswith(expected):
            self.outcome.failures.append(
                f"{command.page}:{command.line}: {command.text}: without AWS credentials it must exit {AWS_STATUS} "
                f"with one line {expected!r}...; it exited {status} and said {said[-3:]}"
            )

    def python(self, page: Page, block: Block) -> bool:
        self.outcome.commands.append(Command(page.name, block.line, "(a python block)", "run"))
        done = subprocess.run(
            [str(self.root / ".venv" / "bin" / "python"), "-"], input=block.text, cwd=self.root, env=self.env,
            capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
        )  # fmt: skip
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-8:]
            self.outcome.failures.append(
                f"{page.name}:{block.line}: python: exit {done.returncode}: " + " | ".join(tail)
            )
            return False
        return True

    def console(self, page: Page, block: Block) -> bool:
        """``$ command`` lines, each followed by its output as shown."""
        steps: list[tuple[int, str, list[str]]] = []
        for offset, raw in enumerate(block.text.splitlines()):
            if raw.startswith("$ "):
                steps.append((block.line + 1 + offset, raw[2:], []))
            elif steps:
                steps[-1][2].append(raw)
        status = 0
        for line, command, shown in steps:
            self.outcome.commands.append(Command(page.name, line, command, kind_of(command)))
            if command.strip() == "echo $?":
                printed = [str(status)]
            else:
                done = self._bash(f"{ACTIVATE}\n{command}" if self.activated else command)
                status, printed = done.returncode, (done.stdout + done.stderr).strip().splitlines()
            if " ".join(printed).split() != " ".join(shown).split():
                self.outcome.failures.append(
                    f"{page.name}:{line}: `{command}` printed {printed[-4:]}, the page shows {shown[-4:]}"
                )
                return False
        return True

    def every_aws_command(self, pages: list[Page], elsewhere: set[tuple[str, int]] = frozenset()) -> None:
        """Every page's ``blackwell-training`` commands that need AWS and were not run above (nor are in
        ``elsewhere``: the parts another test runs), each run by the CLI's own entry point in one Python process (a
        command of shell syntax, ``$VAR`` or ``$(...)``, is left out)."""
        checked = {(c.page, c.line) for c in self.outcome.aws_checked} | elsewhere
        todo = []
        for page in pages:
            for block in page.blocks:
                if block.language not in SHELL_LANGUAGES - {"console"}:
                    continue
                for offset, text in _logical_lines(block.text):
                    line, tokens = block.line + 1 + offset, _tokens(text) or []
                    if (
                        (page.name, line) in checked
                        or kind_of(text) != "aws"
                        or "$" in text
                        or len(tokens) < 2
                    ):
                        continue
                    if any(t in ("|", "&&", ";", "||", "(", ")") for t in tokens):
                        continue
                    todo.append((Command(page.name, line, text.strip(), "aws"), tokens[1:]))
        script = (
            "import contextlib, io, json, sys\nfrom constructs_lib.cli.main import main\nout = []\n"
            "for argv in json.load(sys.stdin):\n    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
            "        try:\n            status = main(argv)\n        except SystemExit as exit_:\n"
            "            status = exit_.code if isinstance(exit_.code, int) else 1\n"
            "    out.append([status, err.getvalue()])\nprint(json.dumps(out))\n"
        )
        done = subprocess.run(
            [str(self.root / ".venv" / "bin" / "python"), "-c", script], input=json.dumps([a for _, a in todo]),
            cwd=self.root, env=self.env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
        )  # fmt: skip
        if done.returncode != 0:
            self.outcome.failures.append(f"the AWS commands' check failed: {done.stderr[-2000:]}")
            return
        for (command, _), (status, stderr) in zip(
            todo, json.loads(done.stdout.splitlines()[-1]), strict=True
        ):
            self._check_aws(command, status, stderr)


def _saves(block: Block) -> str | None:
    return next((f.removeprefix("save=") for f in block.flags if f.startswith("save=")), None)


def part_lines(page: Page, blocks: list[Block]) -> set[tuple[str, int]]:
    """(page, line) of every command line of a part's shell blocks."""
    return {
        (page.name, block.line + 1 + offset)
        for block in blocks
        if block.language in SHELL_LANGUAGES - {"console"}
        for offset, _ in _logical_lines(block.text)
    }


def run_pages(
    pages: list[Page], root: Path, scratch: Path, *, only: tuple[str, ...] = (), apart: tuple[str, ...] = ()
) -> Outcome:
    """Copy ``root`` (a checkout) into ``scratch``, run the pages there, check every page's AWS commands, check
    that nothing tracked changed. ``only``: run these pages' parts alone (no other page's AWS commands); ``apart``:
    leave these pages' parts out, to a run of their own (``only``), their AWS commands with them."""
    copy = scratch / "checkout"
    copy.mkdir(parents=True)
    tracked = copy_checkout(root, copy)
    before = digest(copy, tracked)
    present = set(files_in(copy))
    runner = Runner(copy, scratch)
    copied = [Page.read(copy / p.name, p.name) for p in pages]
    elsewhere: set[tuple[str, int]] = set()  # the apart parts' lines: their own run checks their AWS commands
    for page, start, blocks in to_run(copied):
        if page.name in apart:
            elsewhere |= part_lines(page, blocks)
        elif not only or page.name in only:
            runner.page(page, start, blocks)
    if not only:
        runner.every_aws_command(copied, elsewhere)
    changed = [name for name, value in digest(copy, tracked).items() if before.get(name) != value]
    changed += [name for name in before if not (copy / name).exists()]
    if changed:
        runner.outcome.failures.append(
            f"committed files changed by the pages' commands: {', '.join(changed)}"
        )
    shown = not_ignored(root, sorted(set(files_in(copy)) - present))
    if shown:
        runner.outcome.failures.append(
            "files the pages' commands create that git does not ignore (git status would offer them to commit): "
            + ", ".join(shown[:10])
            + (f" and {len(shown) - 10} more" if len(shown) > 10 else "")
        )
    return runner.outcome


def files_in(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative paths), but the linked ``.venv`` and ``node_modules``."""
    return [
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.parts[len(folder.parts)] not in (".venv", "node_modules") and not path.is_dir()
    ]


def not_ignored(root: Path, names: list[str]) -> list[str]:
    """Those of ``names`` (paths relative to the checkout ``root``) that its .gitignore does not ignore."""
    if not names:
        return []
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin", "-z"], cwd=root, input="\0".join(names) + "\0",
        capture_output=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    return [name for name in names if name not in set(ignored)]
