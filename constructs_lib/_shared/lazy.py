"""Lazy re-exports for the package ``__init__`` files (PEP 562): a name is imported from its module on first use.

So importing a pure module of a package (``constructs_lib.workflow.request_check``, which a Lambda function and
the operator CLI import) runs the package's ``__init__`` without loading aws_cdk and the constructs.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def lazy_attribute(package: str, exports: Mapping[str, str], name: str) -> Any:
    """``name`` from its module (``exports[name]``, relative to ``package``), for the package's ``__getattr__``."""
    if name not in exports:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(exports[name], package), name)
