"""The import graph of ``constructs_lib`` has no circle, and the workflow's and the image build's units do not
reach back into the construct that composes them.

Imports are read from the source (ast), every ``import`` and ``from ... import`` anywhere in a module: at the top,
inside functions and under ``if TYPE_CHECKING:`` (a type-only import counts: a reader still has to open both sides).
``from package import name`` is an edge to ``package.name`` when that is a module, else to ``package``. Running a
package's ``__init__`` when one of its modules is imported is not counted as an edge: the ``__init__`` files
re-export lazily (names in strings, imported on first use), so they import no part at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "constructs_lib"

COMPOSERS = {
    "TrainingWorkflow": {"constructs_lib.workflow.construct", "constructs_lib.stack"},
    "TrainingImageBuild": {"constructs_lib.image.build", "constructs_lib.stack"},
}
"""Where each composing construct may be named: its own module, and the stack that composes the parts."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str]]]:
    """``(module imported, names imported from it)`` for every import statement of the module."""
    is_package = path.name == "__init__.py"
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.append((target, []) if target in known else (base, [alias.name]))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {
        name: {target for target, _ in _imports(name, path, known) if target in known and target != name}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_graph_is_read():
    """The reader sees the imports that are there (so that an empty graph cannot pass the test below)."""
    graph = _graph()
    assert "constructs_lib.workflow.request_check" in graph["constructs_lib.workflow.construct"]
    assert "constructs_lib.image.repository" in graph["constructs_lib.image.build"]
    assert "constructs_lib._shared.console_links" in graph["constructs_lib.workflow.states"]


def test_no_import_cycle_in_constructs_lib():
    cycles = _cycles(_graph())
    assert cycles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("construct", sorted(COMPOSERS))
def test_only_the_composer_names_the_construct(construct):
    """Units take what they use: no module but the construct's own and the stack imports the construct class."""
    modules = _modules()
    known = set(modules)
    naming = {
        name
        for name, path in modules.items()
        for _, names in _imports(name, path, known)
        if construct in names
    }
    assert naming <= COMPOSERS[construct], f"{construct} imported by {sorted(naming - COMPOSERS[construct])}"


@pytest.mark.parametrize(
    ("package", "construct_module"),
    [
        ("constructs_lib.workflow", "constructs_lib.workflow.construct"),
        ("constructs_lib.image", "constructs_lib.image.build"),
    ],
)
def test_units_do_not_import_their_construct_module(package, construct_module):
    graph = _graph()
    importers = {name for name, targets in graph.items() if construct_module in targets}
    assert not {name for name in importers if name.startswith(f"{package}.")}, sorted(importers)
