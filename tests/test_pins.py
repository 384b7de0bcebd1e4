"""The environment `make test` built is the one pyproject.toml pins, and pip finds nothing in it broken.

A pin that pip cannot honour beside the others does not fail here by itself: it fails a fresh machine's set-up (pip
backtracks until resolution-too-deep), while an older venv keeps what it had. These two checks make that visible in
any venv: the installed version of every pin of the extras `make test` installs is the pinned one, and every installed
distribution's own requirements hold (`pip check`): pyarrow pinned 26.0.1 beside mlflow 3.17.2 (which requires
pyarrow<26) fails the first in an old venv and the second in a new one."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# What `make test` installs into .venv (the Makefile's TEST_EXTRAS); compat and scan have venvs of their own.
TEST_EXTRAS = ("train", "eval", "charts", "dev", "sdk")


def _pins() -> list[str]:
    return [
        *PROJECT["dependencies"],
        *(r for extra in TEST_EXTRAS for r in PROJECT["optional-dependencies"][extra]),
    ]


def test_the_makefile_installs_these_extras():
    makefile = (ROOT / "Makefile").read_text()
    assert "LOCAL_EXTRAS := train,eval,charts\n" in makefile
    assert "TEST_ONLY_EXTRAS := dev,sdk\n" in makefile


@pytest.mark.parametrize("pin", _pins())
def test_every_pin_is_installed_at_its_version(pin):
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[a-z0-9,]+\])?==([0-9][0-9a-z.]*)", pin)
    assert match, f"{pin}: every dependency is pinned to an exact version (name==version)"
    name, pinned = match.group(1), match.group(3)
    try:
        installed = version(name)
    except PackageNotFoundError:
        pytest.fail(f"{name} is pinned in pyproject.toml but not installed: run make setup")
    assert installed.split("+")[0] == pinned, (
        f"{name} {installed} is installed, pyproject.toml pins {pinned}: run make setup (if pip cannot install the"
        " pin, it conflicts with another pin's requirements)"
    )


def test_pip_finds_no_broken_requirement():
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
