"""The import graph of the project (``constructs_lib`` and ``training``) has no circle, its arrows point one way
between the parts, and the workflow's and the image build's units do not reach back into the construct that
composes them.

Imports are read from the source (ast), every ``import`` and ``from ... import`` anywhere in a module: at the top,
inside functions and under ``if TYPE_CHECKING:`` (a type-only import counts: a reader still has to open both sides).
An import by name counts too: ``importlib.import_module("a.b")`` / ``import_module(NAME)`` / ``__import__("a.b")``
with a literal string (or a module-level constant holding one), a name bound by a loop over literal names (``for
name in ("a.b", "c.d"): import_module(name)``, a comprehension, or a loop over a module-level tuple or list constant
of strings), ``map(import_module, NAMES)``, and a package ``__init__``'s lazy re-export table (``_EXPORTS =
{"Name": ".module"}``: an edge from the package to the module). ``from package import name`` is an
edge to ``package.name`` when that is a module, else to ``package``. Running a package's ``__init__`` when one of its
modules is imported is not counted as an edge (it would make every module of a package import its siblings).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("constructs_lib", "training")

COMPOSERS = {
    "TrainingWorkflow": {"constructs_lib.workflow.construct", "constructs_lib.stack"},
    "TrainingImageBuild": {"constructs_lib.image.build", "constructs_lib.stack"},
}
"""Where each composing construct may be named: its own module, and the stack that composes the parts."""


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {
        _module_name(path, root): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    }


_IMPORTERS = {"import_module", "__import__"}
"""Calls that import a module by name: ``importlib.import_module`` (however it is reached) and ``__import__``."""


def _literal_names(node: ast.expr | None, constants: dict[str, list[str]]) -> list[str] | None:
    """The strings a literal stands for: a string, a tuple or list of them (``*NAMES`` of a constant spliced in),
    ``A + B`` of such, or a name bound to one; None when it is anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal_names(node.left, constants), _literal_names(node.right, constants)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Tuple | ast.List):
        names: list[str] = []
        for element in node.elts:
            found = _literal_names(element.value if isinstance(element, ast.Starred) else element, constants)
            if found is None or (len(found) != 1 and not isinstance(element, ast.Starred)):
                return None
            names += found
        return names
    return None


def _string_constants(tree: ast.Module) -> dict[str, list[str]]:
    """Names bound to literal module names without running the code: module-level ``NAME = "text"`` and ``NAMES =
    ("a", "b")`` (a tuple or list of strings), then every loop variable over such a literal or constant (``for
    name in NAMES``, in a statement or a comprehension, anywhere in the module)."""
    constants: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = _literal_names(node.value, constants)
            for target in targets:
                if isinstance(target, ast.Name) and names is not None:
                    constants[target.id] = names
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.AsyncFor | ast.comprehension) and isinstance(node.target, ast.Name):
            names = _literal_names(node.iter, constants)
            if names is not None:
                constants.setdefault(node.target.id, []).extend(names)
    return constants


def _called(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _by_name(node: ast.Call, constants: dict[str, list[str]], package: str) -> list[str]:
    """The modules a call imports by name, when the names are known without running the code: ``import_module``
    or ``__import__`` of a literal or a name bound to literals, and ``map(import_module, NAMES)``."""
    called = _called(node.func)
    if called == "map" and len(node.args) == 2 and _called(node.args[0]) in _IMPORTERS:
        texts = _literal_names(node.args[1], constants)
    elif called in _IMPORTERS and node.args:
        texts = _literal_names(node.args[0], constants)
    else:
        return []
    return [package + text if text.startswith(".") else text for text in texts or []]


def _lazy_exports(tree: ast.Module, package: str) -> list[str]:
    """The modules of a package ``__init__``'s lazy re-export table (``_EXPORTS = {"Name": ".module"}``)."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            return sorted(
                {
                    package + v.value
                    for v in node.value.values
                    if isinstance(v, ast.Constant) and isinstance(v.value, str)
                }
            )
    return []


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str]]]:
    """``(module imported, names imported from it)`` for every import statement of the module, every literal
    import by name, and (for a package) its lazy re-exports."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    constants = _string_constants(tree)
    found: list[tuple[str, list[str]]] = []
    if is_package:
        found.extend((module, []) for module in _lazy_exports(tree, package))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found.extend((module, []) for module in _by_name(node, constants, package))
        elif isinstance(node, ast.Import):
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


def _graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = _modules(root, packages)
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
    assert "training.request.decision" in graph["constructs_lib.workflow.rules"]
    assert "constructs_lib.image.repository" in graph["constructs_lib.image.build"]
    assert "constructs_lib._shared.console_links" in graph["constructs_lib.workflow.states"]
    assert "training.contract.settings_table" in graph["training.trainer.config"]
    assert "training.trainer.loop" in graph["training.measure.benchmark"]
    assert "constructs_lib.workflow.construct" in graph["constructs_lib.workflow"]  # a lazy re-export
    # the image's self-check imports these by name: for name in (*TRAINER_MODULES, *EVALUATION_MODULES, ...)
    assert {"training.trainer.loop", "training.evaluate.run"} <= graph["training.trainer.selfcheck"]


def test_imports_by_name_are_read(tmp_path):
    """``importlib.import_module`` of a literal, of a module-level constant, and ``__import__``, are edges."""
    source = tmp_path / "mod.py"
    source.write_text(
        "import importlib\nfrom importlib import import_module\nNAME = 'pkg.c'\n"
        "def f():\n    importlib.import_module('pkg.a')\n    import_module(NAME)\n    __import__('pkg.b')\n"
        "    importlib.import_module(f'pkg.{x}')\n"
    )
    known = {"pkg.a", "pkg.b", "pkg.c", "pkg.mod"}
    found = {target for target, _ in _imports("pkg.mod", source, known)}
    assert {"pkg.a", "pkg.b", "pkg.c"} <= found


def test_imports_by_names_from_a_literal_list_are_read(tmp_path):
    """A loop (statement or comprehension) over a literal tuple or list of names, or over a module-level constant
    holding one, and ``map(import_module, NAMES)``: each name is an edge."""
    source = tmp_path / "mod.py"
    source.write_text(
        "import importlib\nfrom importlib import import_module\nNAMES = ('pkg.c', 'pkg.d')\n"
        "LATER: list[str] = ['pkg.e']\nALL = (*NAMES, 'pkg.g') + ('pkg.h',)\n"
        "def f():\n    for name in ('pkg.a', 'pkg.b'):\n        importlib.import_module(name)\n"
        "    for other in NAMES:\n        import_module(other)\n"
        "    return [importlib.import_module(n) for n in LATER], list(map(import_module, ['pkg.f']))\n"
        "def g(names):\n    for unknown in names:\n        importlib.import_module(unknown)\n"
        "    for every in (*ALL, *LATER):\n        import_module(every)\n"
    )
    known = {f"pkg.{x}" for x in "abcdefgh"} | {"pkg.mod"}
    found = {target for target, _ in _imports("pkg.mod", source, known)}
    assert found >= {f"pkg.{x}" for x in "abcdefgh"}, found


def test_a_planted_cycle_through_a_list_of_names_is_found(tmp_path):
    """The whole test on a planted package: ``a`` imports ``b`` plainly, ``b`` imports ``a`` only through
    importlib over a constant tuple of names; the cycle finder must report it."""
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from planted import b\n")
    (package / "b.py").write_text(
        "import importlib\nPLUGINS = ('planted.c', 'planted.a')\n"
        "def load():\n    return [importlib.import_module(name) for name in PLUGINS]\n"
    )
    (package / "c.py").write_text("for name in ('planted.b',):\n    __import__(name)\n")
    graph = _graph(tmp_path, ("planted",))
    assert graph["planted.b"] == {"planted.a", "planted.c"}
    assert _cycles(graph) == [["planted.a", "planted.b", "planted.c"]]


def test_no_import_cycle_in_the_project():
    cycles = _cycles(_graph())
    assert cycles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_training_parts_point_one_way():
    """``training/request`` with ``training/contract``, ``training/plan`` and ``training/models`` (what decides a
    request; in the Lambda asset) imports nothing else of the project, the plan only the contract and the models,
    the contract nothing but itself and the models, and the models (the families' configs) nothing but themselves;
    the image's code (``training/trainer``) does not import the development measurements; nothing in
    ``training`` imports ``constructs_lib``."""
    graph = _graph()
    for name, targets in graph.items():
        if name.startswith("training.request"):
            assert {
                t
                for t in targets
                if not t.startswith(
                    ("training.request", "training.contract", "training.plan", "training.models")
                )
            } == set(), name
        if name.startswith("training.plan"):
            assert {
                t
                for t in targets
                if not t.startswith(("training.plan", "training.contract", "training.models"))
            } == set(), name
        if name.startswith("training.contract"):
            assert {
                t for t in targets if not t.startswith(("training.contract", "training.models"))
            } == set(), name
        if name.startswith("training.models"):
            assert {t for t in targets if not t.startswith("training.models")} == set(), name
        if name.startswith("training.trainer"):
            assert not {t for t in targets if t.startswith("training.measure")}, name
        if name.startswith("training"):
            assert not {t for t in targets if t.startswith("constructs_lib")}, name


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
