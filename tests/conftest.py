"""Suite-wide set-up: every cache and temporary file in a folder of this run (tests/run_folder.py), set before any
test module is imported; jsii on the pinned Node 24 (from the venv) even when pytest is started directly."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tests import run_folder

RUN_FOLDER = run_folder.enter()

ROOT = Path(__file__).resolve().parent.parent
_venv_node = Path(sys.executable).parent / "node"
if "JSII_NODE" not in os.environ and _venv_node.exists():
    os.environ["JSII_NODE"] = str(_venv_node)
elif "JSII_NODE" not in os.environ and shutil.which("node"):
    os.environ["JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION"] = "1"


def pytest_report_header() -> str:
    return f"run folder (caches, temporary files, tmp_path): {RUN_FOLDER}"
