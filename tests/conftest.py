"""Suite-wide set-up: run jsii on the pinned Node 24 (from the venv) even when pytest is started directly."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_venv_node = Path(sys.executable).parent / "node"
if "JSII_NODE" not in os.environ and _venv_node.exists():
    os.environ["JSII_NODE"] = str(_venv_node)
elif "JSII_NODE" not in os.environ and shutil.which("node"):
    os.environ["JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION"] = "1"
