"""Guards the code-size rule: no function or method in constructs_lib/ or training/ exceeds 150 lines."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 150


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_LINES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


@pytest.mark.parametrize("package", ["constructs_lib", "training"])
def test_no_function_longer_than_limit(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    offenders = [entry for path in files for entry in _long_functions(path)]
    assert not offenders, f"functions over {MAX_LINES} lines:\n" + "\n".join(offenders)


MAX_CLI_MODULE_LINES = 400


def test_no_cli_module_is_a_list_of_everything() -> None:
    """The operator CLI is grouped by what the user does (``constructs_lib/cli/commands/``): no module of it grows
    past 400 lines."""
    long = {
        str(path.relative_to(ROOT)): length
        for path in sorted((ROOT / "constructs_lib" / "cli").rglob("*.py"))
        if (length := len(path.read_text().splitlines())) > MAX_CLI_MODULE_LINES
    }
    assert not long, f"CLI modules over {MAX_CLI_MODULE_LINES} lines: {long}"
