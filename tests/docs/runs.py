"""Running what the pages print, as a reader would: README.md's first run, then each docs page's opening example
(its blocks before its first ``##`` heading), in the reader's order (the README's page table), each block from a
fresh shell in a copy of the repository, on the CPU and without AWS credentials. ``tests/docs/test_runs.py`` runs
it on the real pages and on planted broken ones.

Each command line of a shell block is one of:

* **run**: executed as printed, in the block's one shell (``set -e``: the first failure stops the block);
* **aws**: a ``blackwell-training`` command that needs an AWS account: executed as printed in that shell without
  credentials, and it must exit 3 with one ``error:`` line, ``no AWS credentials found ...`` (or, when its input file
  does not exist, ``cannot read FILE``): what docs/running-jobs.md documents;
* **account**: the AWS CLI or the CDK CLI against an account (``aws ...``, ``cdk bootstrap``, ``make deploy``):
  listed, not run (neither the AWS CLI nor an account is part of this project);
* **set-up**: ``make synth``, ``make local``, ``make test`` ...: what built the environment the suite runs in
  (``make test``'s set-up is a superset), not run again.

A page that tells its reader, in its text just before the blocks, to ``source .venv/bin/activate`` (README.md's
first step) has its blocks' shells activate first; any other block runs in a shell as fresh as a new terminal's, so
it must use ``.venv/bin/...`` or activate in the block itself.

A ``json`` block flagged ``save=FILE`` (```` ```json input save=run.json ````, the words after the language are
invisible on GitHub) is written to FILE, as the page tells its reader to; a ``python`` block runs in the venv's
Python; a ``console`` block's ``$`` lines run one by one and what follows each must be its output (``echo $?``: the
previous status). Nothing tracked in the repository may change.
"""

from __future__ import annotations

import hashlib
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

SETUP_TARGETS = {"synth", "local", "test", "setup", "lint", "docs", "compat"}
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
}
"""Openings run by another test instead (file, test, why): the test must exist."""


@dataclass
class Command:
    page: str
    line: int
    text: str
    kind: str  # run, aws, account, set-up


@dataclass
class Outcome:
    """What running the pages gave: commands by kind, failures (one line each), seconds per page."""

    commands: list[Command] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(c.kind == kind for c in self.commands)

    def summary(self) -> str:
        kinds = ", ".join(f"{self.count(k)} {k}" for k in ("run", "aws", "account", "set-up"))
        times = ", ".join(f"{page} {s:.0f} s" for page, s in self.seconds.items())
        return f"commands: {kinds}; {len(self.failures)} failures; {times}"


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
    """run, aws, account or set-up (see the module's doc)."""
    tokens = _tokens(text) or []
    words = [t for t in tokens if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", t)]  # VAR=value prefixes
    first = words[0] if words else ""
    if first == "make":
        targets = set(words[1:]) or {"synth"}
        return "account" if targets & ACCOUNT_TARGETS else "set-up"
    if first == "aws" or (
        "cdk" in " ".join(words[:3]) and any(w in CDK_ACCOUNT_COMMANDS for w in words[1:4])
    ):
        return "account"
    if first == PROGRAM or first.endswith(f"/{PROGRAM}"):
        return "run" if _offline(words[1:]) else "aws"
    return "run"


def _offline(argv: list[str]) -> bool:
    """Whether a ``blackwell-training`` command needs no AWS: validate and plan without the deployed rules, tune's
    dry run, compare of local results folders (decided when it runs: the folders exist by then)."""
    sub = argv[0] if argv else ""
    if sub in ("validate", "plan"):
        return not {"--deployed", "--stack"} & set(argv)
    if sub == "tune":
        return "--dry-run" in argv
    if sub == "compare":
        return all(not a.startswith("-") and "/" in a for a in argv[1:] if a != "--json")
    return False


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
        if (dest / linked).exists() or (dest / linked).is_symlink():
            (dest / linked).unlink() if (dest / linked).is_symlink() else shutil.rmtree(dest / linked)
        (dest / linked).symlink_to((root / linked).resolve())
    return [n for n in tracked.split("\0") if n and (dest / n).is_file()]


def digest(root: Path, names: list[str]) -> dict[str, str]:
    return {
        name: hashlib.sha256((root / name).read_bytes()).hexdigest()
        for name in names
        if (root / name).is_file()
    }


def fresh_environment(root: Path, scratch: Path) -> dict[str, str]:
    """A fresh login's environment: the system PATH (no venv), a home of its own, no AWS credentials (and no
    instance metadata to wait for); the copy's code first on the path (as its editable install would have it)."""
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
        "COLUMNS": "160",
        "OMP_NUM_THREADS": "1",  # a good neighbour on a shared CI machine; changes no result
    }


class Runner:
    """Runs the pages' blocks in ``root`` (a copy of the checkout), collecting an :class:`Outcome`."""

    def __init__(self, root: Path, scratch: Path):
        self.root, self.scratch = root, scratch
        self.env = fresh_environment(root, scratch)
        self.outcome = Outcome()
        self.serial = 0
        self.activated_from: int | None = None

    def page(self, page: Page, start: int, blocks: list[Block]) -> None:
        started = time.monotonic()
        self.activated_from = min((line for text, line in page.inline_code if text == ACTIVATE and line > start),
                                  default=None)  # fmt: skip
        if page.name in SKIPPED_OPENINGS:
            self.outcome.skipped.append(f"{page.name}: run by {'::'.join(SKIPPED_OPENINGS[page.name][:2])}")
        else:
            for block in blocks:
                if not self.block(page, block):
                    break  # later blocks of the page build on this one
        self.outcome.seconds[page.name] = time.monotonic() - started

    def block(self, page: Page, block: Block) -> bool:
        saves = [f.removeprefix("save=") for f in block.flags if f.startswith("save=")]
        if saves:
            (self.root / saves[0]).write_text(block.text)
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
        ``aws`` lines as printed with their status and error kept, the rest left out."""
        marks = self.scratch / f"mark-{self.serial}"
        lines, checks = ["set -eo pipefail"], []
        if self.activated_from is not None and self.activated_from < block.line:
            lines.append(ACTIVATE)  # the page told its reader to, in its text before this block
        for offset, text in _logical_lines(block.text):
            line = block.line + 1 + offset
            if not (_tokens(text) or []):
                continue  # a comment or a blank line
            kind = kind_of(text)
            self.outcome.commands.append(Command(page.name, line, text.strip(), kind))
            if kind == "run":
                lines.append(f"echo {line} > {shlex.quote(str(marks))}")
                lines.append(text)
            elif kind == "aws":
                self.serial += 1
                err = self.scratch / f"aws-{self.serial}"
                lines.append(
                    f"set +e; ( {text} ) > /dev/null 2> {shlex.quote(str(err))}; echo $? >> {shlex.quote(str(err))}.status; set -e"
                )
                checks.append((line, text, err))
        self.serial += 1
        done = self._bash("\n".join(lines))
        ok = True
        if done.returncode != 0:
            at = marks.read_text().strip() if marks.exists() else str(block.line)
            tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
            self.outcome.failures.append(f"{page.name}:{at}: exit {done.returncode}: " + " | ".join(tail))
            ok = False
        for line, text, err in checks:
            if (err.parent / f"{err.name}.status").exists():
                self._check_aws(page.name, line, text, err)
        return ok

    def _check_aws(self, page: str, line: int, text: str, err: Path) -> None:
        status = int((err.parent / f"{err.name}.status").read_text().split()[-1])
        said = err.read_text().strip().splitlines() if err.exists() else []
        argv = (_tokens(text) or [])[1:]
        missing = next((a for a in argv[1:2] if a.endswith(".json") and not (self.root / a).exists()), None)
        expected = f"error: cannot read {missing}" if missing else NO_CREDENTIALS
        if status != AWS_STATUS or len(said) != 1 or not said[0].startswith(expected):
            self.outcome.failures.append(
                f"{page}:{line}: {text.strip()}: without AWS credentials it must exit {AWS_STATUS} with one line "
                f"{expected!r}...; it exited {status} and said {said[-3:]}"
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
                done = self._bash(command)
                status, printed = done.returncode, (done.stdout + done.stderr).strip().splitlines()
            if " ".join(printed).split() != " ".join(shown).split():
                self.outcome.failures.append(
                    f"{page.name}:{line}: `{command}` printed {printed[-4:]}, the page shows {shown[-4:]}"
                )
                return False
        return True


def run_pages(pages: list[Page], root: Path, scratch: Path) -> Outcome:
    """Copy ``root`` (a checkout) into ``scratch``, run the pages there, check nothing tracked changed."""
    copy = scratch / "checkout"
    copy.mkdir(parents=True)
    tracked = copy_checkout(root, copy)
    before = digest(copy, tracked)
    runner = Runner(copy, scratch)
    for page, start, blocks in to_run([Page.read(copy / p.name, p.name) for p in pages]):
        runner.page(page, start, blocks)
    changed = [name for name, value in digest(copy, tracked).items() if before.get(name) != value]
    changed += [name for name in before if not (copy / name).exists()]
    if changed:
        runner.outcome.failures.append(
            f"committed files changed by the pages' commands: {', '.join(changed)}"
        )
    return runner.outcome
