"""The Makefile as a newcomer meets it, run for real on a copy of the checkout: ``make local`` says what each set-up
step installs before pip shows its own progress (never minutes of silence), and ``make deploy`` without AWS
credentials stops at once with the CLI's one line and exit status 3, before the CDK CLI synthesizes anything.

``make local``'s pip is a stand-in here (a script in the copy's ``.venv/bin`` that records how it was called): the
real install takes minutes and the network; what is checked is what make prints and how it calls pip."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ("Makefile", "pyproject.toml", "package.json", "package-lock.json", "cdk.json", "app.py")
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../calls.txt"
case "$1" in
  -c) echo "$(dirname "$0")/../nodejs" ;;
  -m) echo "Collecting what pip would install (a stand-in)" ;;
esac
"""


def _copy(tmp_path: Path) -> Path:
    """The Makefile and what it reads, with the code linked in; every input old (set-up stamps count as newer)."""
    copy = tmp_path / "checkout"
    copy.mkdir()
    for name in FILES:
        shutil.copy2(ROOT / name, copy / name)
        os.utime(copy / name, (0, 0))
    for package in ("constructs_lib", "training"):
        (copy / package).symlink_to(ROOT / package)
    return copy


def _reader_env(tmp_path: Path) -> dict[str, str]:
    """A fresh terminal's: the system PATH, a home of its own, no AWS credentials (nor instance metadata)."""
    (tmp_path / "home").mkdir(exist_ok=True)
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "LANG": "C.UTF-8",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def test_make_local_says_what_each_step_installs_and_lets_pip_show_its_progress(tmp_path):
    copy = _copy(tmp_path)
    (copy / ".venv" / "bin").mkdir(parents=True)
    python = copy / ".venv" / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    done = subprocess.run(["make", "local"], cwd=copy, env=_reader_env(tmp_path), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    said = [line for line in done.stdout.splitlines() if line.startswith("set-up: ")]
    assert said == [
        f"set-up: installing the package and its own dependencies into .venv: {', '.join(project['dependencies'])} "
        "and what they require; pip shows its progress",
        "set-up: installing the extras train, eval, charts into .venv: "
        f"{', '.join(extras['train'] + extras['eval'] + extras['charts'])} and what they require; pip shows its "
        "progress",
    ]
    out = done.stdout.splitlines()
    for line, install in zip(said, ("-e .", "-e '.[train,eval,charts]'"), strict=True):
        pip = out.index(f".venv/bin/python -m pip install {install}")  # the step as make echoes it
        assert out.index(line) < pip  # said first, then pip runs
        assert out[pip + 1] == "Collecting what pip would install (a stand-in)"  # pip's own output shows
    calls = (copy / ".venv" / "calls.txt").read_text().splitlines()
    installs = [c for c in calls if c.startswith("-m pip install") and "pip==" not in c]
    assert installs == ["-m pip install -e .", "-m pip install -e .[train,eval,charts]"]  # no --quiet
    again = subprocess.run(["make", "local"], cwd=copy, env=_reader_env(tmp_path), capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert "set-up: " not in again.stdout  # set up once: nothing said, nothing installed


def test_make_deploy_without_credentials_stops_first_with_the_clis_line(tmp_path):
    """No synthesis (no ``cdk.out``), no CDK output: the CLI's line, its status 3 in make's report (make itself
    exits 2 when a step fails)."""
    copy = _copy(tmp_path)
    for linked in (".venv", "node_modules"):
        (copy / linked).symlink_to((ROOT / linked).resolve())
    done = subprocess.run(["make", "deploy"], cwd=copy, env=_reader_env(tmp_path), capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    errors = done.stderr.strip().splitlines()
    assert errors[0] == (
        "error: no AWS credentials found: run `aws configure` or `aws sso login`, set AWS_PROFILE or pass --profile"
    ), done.stdout + done.stderr
    assert len(errors) == 2 and errors[1].startswith("make: *** [Makefile:") and errors[1].endswith("Error 3")
    assert done.returncode == 2 and not (copy / "cdk.out").exists()
    assert "cdk" not in done.stdout  # the CDK CLI never started
