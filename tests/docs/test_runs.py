"""Every command the pages print runs as printed (``tests/docs/runs.py`` says how): README.md's first run and each
docs page's opening example, in the reader's order, from a fresh shell in a copy of the checkout, on the CPU; the
commands that need AWS exit as documented without credentials. And the runner finds a broken page."""

from __future__ import annotations

import ast
import subprocess

import pytest

from tests.docs import runs
from tests.docs.pages import ROOT, Page

APART = ("docs/evaluation.md",)
"""Openings run by a test of their own, in a copy of their own, so that pytest-xdist's two workers share the pages
(docs/evaluation.md's: 64 of the pages' 170 s on the 2-core development machine, README.md's first run another 64
s): each makes and uses only files of its own (in a fresh copy any use of another page's would fail), and no other
page reads them (the pages below run without them)."""


@pytest.mark.slow
def test_every_command_of_the_first_run_and_of_each_opening_runs_as_printed(pages, tmp_path):
    outcome = runs.run_pages(pages, ROOT, tmp_path, apart=APART)
    print(outcome.summary())
    for command in outcome.commands:
        if command.kind != "run":
            print(f"  {command.kind}: {command.page}:{command.line}: {command.text}")
    for command in outcome.aws_checked:
        print(f"  checked without credentials: {command.page}:{command.line}: {command.text}")
    assert not outcome.failures, "pages whose commands do not run as printed:\n" + "\n".join(outcome.failures)
    assert outcome.count("run") >= 20 and outcome.count("aws") >= 8 and outcome.count("account") >= 2
    assert len(outcome.aws_checked) >= 25  # every page's, not only the openings'
    assert {c.text.split()[0] for c in outcome.commands if c.kind == "suite"} <= {"make", ".venv/bin/python"}
    ran = {c.page for c in outcome.commands if c.kind == "run"}
    assert {"README.md", "docs/trainer.md", "docs/exit-status.md", "docs/plan.md", "docs/using-the-model.md",
            "docs/tuning.md", "docs/performance.md"} <= ran  # fmt: skip
    assert not ran & set(APART)


@pytest.mark.slow
@pytest.mark.parametrize("name", APART)
def test_an_opening_run_apart_runs_as_printed_in_a_copy_of_its_own(pages, name, tmp_path):
    outcome = runs.run_pages(pages, ROOT, tmp_path, only=(name,))
    print(outcome.summary())
    assert not outcome.failures, f"{name}'s commands do not run as printed:\n" + "\n".join(outcome.failures)
    assert {c.page for c in outcome.commands} == {name} and outcome.count("run") >= 8
    assert outcome.count("aws") == len(outcome.aws_checked)  # its own AWS commands, checked in its run


def test_the_openings_run_elsewhere_are_run_there():
    """An opening this test leaves to another one names a test that exists."""
    for page, (path, name, _why) in runs.SKIPPED_OPENINGS.items():
        assert (ROOT / page).is_file()
        tree = ast.parse((ROOT / path).read_text())
        assert name in {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}, (
            page,
            name,
        )


def test_the_pages_run_in_the_environment_a_reader_has(tmp_path):
    """Only what a fresh terminal has (and the isolation of the copy: its home, temporary folder, Hugging Face
    cache, no AWS credentials): no thread count and no terminal width the pages do not print."""
    environment = runs.fresh_environment(tmp_path / "checkout", tmp_path)
    assert set(environment) == {
        "HOME", "PATH", "LANG", "TMPDIR", "PYTHONPATH", "HF_HOME", "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED",
    }  # fmt: skip
    assert environment["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def test_the_folders_the_pages_create_with_weights_inside_are_ignored_by_git():
    """docs/fine-tuning.md's example/ (run by tests/training/test_fine_tuning.py, not here) and docs/evaluation.md's
    eval-demo/ among them; the run above checks every file the pages it runs create."""
    created = ["example/model/model.safetensors", "example/trained/hf/model.safetensors", "example/data/train.bin",
               "eval-demo/run-300/model/hf/model.safetensors", "eval-demo/scores-300/scores.json",
               "eval-demo/tokenizer.json", "cut-short/train.bin", "run.json"]  # fmt: skip
    assert runs.not_ignored(ROOT, created) == []
    assert runs.not_ignored(ROOT, ["docs/example/x.py", "training/eval-demo.py"]) == [
        "docs/example/x.py", "training/eval-demo.py"]  # fmt: skip


def test_each_command_is_run_checked_or_listed():
    assert runs.kind_of("python -m training.trainer --max_steps 3") == "run"
    assert runs.kind_of("NPROC_PER_NODE=2 training/train.sh --tune_trials x") == "run"
    assert runs.kind_of("blackwell-training validate run.json") == "run"
    assert runs.kind_of("blackwell-training plan run.json --deployed") == "aws"
    assert runs.kind_of("blackwell-training tune run.json --dry-run") == "run"
    assert runs.kind_of(".venv/bin/blackwell-training compare eval-demo/a eval-demo/b") == "run"
    assert runs.kind_of("blackwell-training compare run-1 run-2") == "aws"
    assert runs.kind_of("blackwell-training submit run.json --wait") == "aws"
    assert runs.kind_of("aws s3 sync a s3://b/") == "account"
    assert (
        runs.kind_of(".venv/bin/node node_modules/aws-cdk/bin/cdk bootstrap aws://1/us-west-2") == "account"
    )
    assert runs.kind_of("make deploy") == "account" and runs.kind_of("make synth") == "set-up"
    assert runs.kind_of("make local") == "set-up" and runs.kind_of("make test") == "suite"
    assert runs.kind_of(".venv/bin/python -m pytest -q tests/test_app.py -k checkov") == "suite"


PLANTED_README = """# A project

## A first run in five steps

```json input save=run.json
{"precision": "bf16"}
```

```bash
.venv/bin/python -c "print('fine')"
.venv/bin/python -m training.prepare no-such-file.txt --output data/
.venv/bin/python -c "print('never reached')"
```

## Where to go next

| page | for |
| --- | --- |
| [b](docs/b.md) | b |
| [a](docs/a.md) | a |
"""
PLANTED_A = """# A

```console
$ .venv/bin/python -c "import sys; print('one'); sys.exit(2)"
two
$ echo $?
2
```
"""
PLANTED_B = """# B

```bash
source .venv/bin/activate
blackwell-training validate run.json
blackwell-training runs --no-such-option
blackwell-training runs
cat README.md > README.md.copy && echo changed > docs/a.md
```
"""


def test_a_broken_command_a_wrong_output_and_a_wrong_exit_are_found(tmp_path):
    """A planted page set: the README's second command fails (exit 2), docs/a.md's console shows another output
    than its command prints, docs/b.md's AWS command exits 2 (a bad option) instead of 3 and its last command
    changes a committed file and leaves a new one that git does not ignore; the good commands pass (validate of the saved run.json, the AWS check of `runs`)."""
    root = tmp_path / "planted"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(PLANTED_README)
    (root / "docs" / "a.md").write_text(PLANTED_A)
    (root / "docs" / "b.md").write_text(PLANTED_B)
    for name in ("cdk.json", "pyproject.toml"):
        (root / name).write_text((ROOT / name).read_text())
    for package in ("training", "constructs_lib"):
        (root / package).symlink_to(ROOT / package)
    (root / ".venv").symlink_to((ROOT / ".venv").resolve())
    (root / "node_modules").symlink_to((ROOT / "node_modules").resolve())
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "README.md", "docs", "cdk.json", "pyproject.toml"], cwd=root, check=True)
    pages = [Page.read(root / name, name) for name in ("README.md", "docs/a.md", "docs/b.md")]
    outcome = runs.run_pages(pages, root, tmp_path / "scratch")
    failures = sorted(outcome.failures)
    assert len(failures) == 5, failures
    assert failures[0].startswith("README.md:11: exit 2: ") and "no-such-file.txt" in failures[0]
    assert failures[1].startswith("committed files changed by the pages' commands: docs/a.md")
    assert failures[2].startswith("docs/a.md:4: ") and "printed ['one']" in failures[2]
    assert failures[3].startswith(
        "docs/b.md:6: blackwell-training runs --no-such-option: without AWS credentials"
    )
    assert "it exited 2" in failures[3]
    assert failures[4] == (  # the planted checkout has no .gitignore
        "files the pages' commands create that git does not ignore (git status would offer them to commit): "
        "README.md.copy, run.json"
    )
    assert list(outcome.seconds) == ["README.md", "docs/b.md", "docs/a.md"]
    assert outcome.count("aws") == 2 and len(outcome.aws_checked) == 2
