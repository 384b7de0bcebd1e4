"""Suite-wide set-up: every cache and temporary file in a folder of this run (tests/run_folder.py), set before any
test module is imported; jsii on the pinned Node 24 (from the venv) even when pytest is started directly; under
pytest-xdist, one torch thread per worker and the longest tests first (tests/schedule.py)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests import run_folder, schedule

RUN_FOLDER = run_folder.enter()

ROOT = Path(__file__).resolve().parent.parent
_venv_node = Path(sys.executable).parent / "node"
if "JSII_NODE" not in os.environ and _venv_node.exists():
    os.environ["JSII_NODE"] = str(_venv_node)
elif "JSII_NODE" not in os.environ and shutil.which("node"):
    os.environ["JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION"] = "1"


def pytest_report_header() -> str:
    return f"run folder (caches, temporary files, tmp_path): {RUN_FOLDER}"


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """The longest first, before pytest-xdist's own hook reads the ``xdist_group`` marks it adds; after that hook,
    the groups it wrote carried into the node ids (tests/schedule.py)."""
    schedule.longest_first(config, items)
    result = yield
    schedule.carry_groups(items)
    return result


def pytest_runtest_setup(item: pytest.Item) -> None:
    """One intra-op thread for the models a test runs in this process, when it runs beside other xdist workers:
    torch's default (one per core) has the workers' threads wait on each other (a test took 1 s with one thread,
    10 to 50 s with two, on the loaded 2-core machine). The processes a test starts choose their own."""
    if os.environ.get("PYTEST_XDIST_WORKER") and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
