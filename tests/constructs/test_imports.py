"""The source files a module needs of its packages (constructs_lib/_shared/imports.py), on packages written here:
every import statement followed wherever it stands, nothing else taken, a new import followed at the next call, and
an import of a module with no source named with its file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from constructs_lib._shared.imports import MissingSource, source_files

PACKAGES = {
    "walked/__init__.py": "import walked.unused  # run on the way to any module of walked: not counted\n",
    "walked/handler.py": """
        from __future__ import annotations

        import json
        from typing import TYPE_CHECKING

        from other import thing
        from walked.rules import RULES
        from walked.sub import deep
        from .helpers import helper

        if TYPE_CHECKING:
            from walked.typed import Typed


        def late():
            import walked.late

            return walked.late
    """,
    "walked/rules.py": "from .sub.deep import DEPTH\n\nRULES = DEPTH\n",
    "walked/sub/__init__.py": "import walked.unused\n\nSETTING = 1\n",
    "walked/sub/deep.py": "from ..helpers import helper\n\nDEPTH = 2\n",
    "walked/helpers.py": "def helper():\n    return 3\n",
    "walked/late.py": "",
    "walked/typed.py": "Typed = int\n",
    "walked/unused.py": "",
    "other/__init__.py": "",
    "other/thing.py": "",
}
"""Two packages: ``walked`` (its handler's imports at the top, relative, in a function, type-only) and ``other``."""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in PACKAGES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_every_import_of_the_package_is_followed_wherever_it_stands_and_nothing_else(root):
    files = source_files("walked.handler", ["walked"])
    assert files == {
        name: root / name
        for name in (
            "walked/handler.py",
            "walked/helpers.py",  # relative, from the handler and from sub/deep.py two levels down
            "walked/late.py",  # in a function
            "walked/rules.py",  # a name from a module
            "walked/sub/deep.py",  # a module from a package: not the package's __init__
            "walked/typed.py",  # type-only
        )
    }
    assert list(files) == sorted(files)
    assert "other/thing.py" in source_files("walked.handler", ["walked", "other"])


def test_a_new_import_is_followed_at_the_next_call(root):
    assert "walked/sub/__init__.py" not in source_files("walked.handler", ["walked"])
    helpers = root / "walked/helpers.py"
    helpers.write_text("from walked.sub import SETTING\n\n" + helpers.read_text())
    files = source_files("walked.handler", ["walked"])
    assert {"walked/sub/__init__.py", "walked/unused.py"} <= set(files)  # a name from a package: its __init__


def test_an_import_with_no_source_file_is_named_with_the_importing_file(root):
    (root / "walked/late.py").write_text("from walked.gone import missing\n")
    with pytest.raises(
        MissingSource, match=r"walked/late\.py: imports walked\.gone, which has no source file"
    ):
        source_files("walked.handler", ["walked"])
    with pytest.raises(MissingSource, match="walked.nowhere: no source file in walked"):
        source_files("walked.nowhere", ["walked"])
