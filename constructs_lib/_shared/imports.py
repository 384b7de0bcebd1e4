"""The source files a module needs of the packages it belongs to: its own and those of every module of those
packages it imports, directly or through another, read from the source (``ast``) without running any of it. The
request check's Lambda asset (``workflow/request_function``) is made of them at synth time, so that the module a
new import brings travels with it.

Imports are read as statements: every ``import`` and ``from ... import`` in a module, at the top, in a function or
under ``if TYPE_CHECKING:`` (a type-only import adds a file that is never run, never leaves one out);
``from package import name`` needs ``package/name.py`` when there is such a module, else the package's
``__init__.py``. A package's ``__init__`` that Python runs on the way to one of its modules is not counted (the
asset gives such a package an empty one). An import by a computed name (``importlib.import_module``) is not
seen: tests/constructs/workflow/test_request_function.py holds the asset against the project's import graph,
which counts imports by literal name too.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path


class MissingSource(ValueError):
    """A module of the packages, or one they import, has no source file there."""


def source_files(module: str, packages: Sequence[str]) -> dict[str, Path]:
    """``path inside the packages' folder: source file`` of ``module`` and of every module of ``packages`` it
    imports, directly or through another, sorted by path (``training/request/rules.py``: ``/.../rules.py``).
    Read again only when one of those files changed since the last call (its size or modification time)."""
    roots = {package: _root(package) for package in packages}
    key = (module, tuple(sorted(roots.items())))
    if key not in _found or _found[key][1] != _stats(_found[key][0].values()):
        files = _closure(module, roots)
        _found[key] = files, _stats(files.values())
    return dict(_found[key][0])


_found: dict[
    tuple[str, tuple[tuple[str, Path], ...]], tuple[dict[str, Path], list[tuple[int, int]] | None]
] = {}
"""``source_files``' answers and their files' stats: a synth builds the asset once per function, and one process
(the suite's) synthesizes many."""


def _stats(paths: Iterable[Path]) -> list[tuple[int, int]] | None:
    """Each file's modification time and size; None when one is gone."""
    try:
        return [(stat.st_mtime_ns, stat.st_size) for stat in map(Path.stat, paths)]
    except OSError:
        return None


def _closure(module: str, roots: dict[str, Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path, top = _file(name, roots), name.split(".")[0]
        if path is None:
            raise MissingSource(f"{name}: no source file in {', '.join(roots)}")
        key = f"{top}/{path.relative_to(roots[top]).as_posix()}"
        if key not in found:
            found[key] = path
            todo.extend(_imported(name, path, roots))
    return dict(sorted(found.items()))


def _root(package: str) -> Path:
    """The folder of an installed (or checked-out) top-level package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None or not spec.origin.endswith("__init__.py"):
        raise MissingSource(f"{package}: not a package with source files on this Python's path")
    return Path(spec.origin).parent


def _file(name: str, roots: dict[str, Path]) -> Path | None:
    """The source file of the module ``name`` (``a/b.py``, or ``a/b/__init__.py`` for a package); None when
    ``name`` is not one of ``roots``' packages or has no such file."""
    top, *parts = name.split(".")
    if top not in roots:
        return None
    base = roots[top].joinpath(*parts)
    for path in (base / "__init__.py", base.parent / f"{base.name}.py"):
        if path.is_file():
            return path
    return None


def _imported(name: str, path: Path, roots: dict[str, Path]) -> list[str]:
    """The modules of ``roots``' packages that the module ``name`` (its source at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    modules: list[str] = []
    for base, names in _import_statements(path, package):
        if base.split(".")[0] not in roots:
            continue
        found = [f"{base}.{alias}" for alias in names if _file(f"{base}.{alias}", roots)]
        if len(found) < len(names) or not names:  # a name that is no module: it is read from ``base`` itself
            if _file(base, roots) is None:
                raise MissingSource(f"{path}: imports {base}, which has no source file in {', '.join(roots)}")
            found.append(base)
        modules += found
    return modules


def _import_statements(path: Path, package: str) -> list[tuple[str, list[str]]]:
    """``(module, names imported from it)`` of each import statement of the file (``import a.b``: ``("a.b",
    [])``), relative imports made absolute from ``package``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    statements: list[tuple[str, list[str]]] = []
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            statements += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            statements.append((_absolute(node, package), [alias.name for alias in node.names]))
    return statements


def _statements(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every statement of ``body`` and of the blocks nested in it (an import is a statement: no expression is
    read)."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(node, block, []))


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` reads from, relative ones (``from .x import y``) made absolute."""
    if not node.level:
        return node.module or ""
    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))
