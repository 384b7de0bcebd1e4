"""The order ``make test`` hands tests to its workers (tests/schedule.py): longest first, the users of a
module-scoped fixture kept together as one unit, and pytest's own order under any other way of running; then once
in a real pytest-xdist run with the options of the Makefile's ``test`` target, through the suite's own hook
(tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import schedule

ROOT = Path(__file__).resolve().parent.parent

LONGEST = max(schedule.SECONDS, key=schedule.SECONDS.__getitem__)


class Item:
    """What ``schedule`` reads of a pytest item: its node id, its ``slow`` mark, its fixtures' scopes."""

    def __init__(self, nodeid: str, slow: bool = False, scope: str = "function"):
        self.nodeid, self.slow, self.marks = nodeid, slow, []
        self._fixtureinfo = SimpleNamespace(name2fixturedefs={"a_fixture": [SimpleNamespace(scope=scope)]})

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None

    def add_marker(self, mark) -> None:
        self.marks.append(mark)


def config(loadgroup: bool | None, reorder: bool) -> SimpleNamespace:
    """The options a pytest-xdist worker has (``xdist.remote.setup_config``): ``dist`` always ``"no"``,
    ``loadgroup`` true under ``--dist loadgroup``; ``loadgroup`` None: a pytest without workers (no such option)."""
    options = {"dist": "no", "loadscopereorder": reorder}
    if loadgroup is not None:
        options["loadgroup"] = loadgroup
    return SimpleNamespace(getoption=lambda name, default=None: options.get(name, default))


def items() -> list[Item]:
    return [
        Item("tests/a/test_fast.py::test_one"),
        Item("tests/b/test_stack.py::test_synth", scope="module"),
        Item("tests/b/test_stack.py::test_alone"),
        Item("tests/c/test_runs.py::test_torchrun", slow=True),
        Item(LONGEST),
        Item("tests/b/test_stack.py::test_nag", scope="module"),
        Item("tests/a/test_fast.py::test_two"),
    ]


def test_the_longest_unit_goes_first_and_a_module_fixtures_users_stay_together():
    ordered = items()
    schedule.longest_first(config(loadgroup=True, reorder=False), ordered)
    assert [item.nodeid.split("::")[1] for item in ordered] == [
        LONGEST.split("::")[1],  # the longest listed
        "test_torchrun",  # slow, not listed: SLOW_SECONDS
        "test_synth",  # the module fixture's two users, one unit of 2 x FAST_SECONDS
        "test_nag",
        "test_one",  # then pytest's order
        "test_alone",
        "test_two",
    ]
    grouped = [item for item in ordered if item.marks]
    assert [item.nodeid for item in grouped] == [
        "tests/b/test_stack.py::test_synth",
        "tests/b/test_stack.py::test_nag",
    ]
    assert {mark.args for item in grouped for mark in item.marks} == {("tests/b/test_stack.py",)}
    assert all(mark.name == "xdist_group" for item in grouped for mark in item.marks)


@pytest.mark.parametrize(("loadgroup", "reorder"), [(False, False), (None, False), (True, True)])
def test_any_other_way_of_running_keeps_pytests_order(loadgroup, reorder):
    ordered = items()
    schedule.longest_first(config(loadgroup, reorder), ordered)
    assert [item.nodeid for item in ordered] == [item.nodeid for item in items()]
    assert not any(item.marks for item in ordered)


def test_a_module_named_in_split_runs_its_tests_as_units_of_their_own(monkeypatch):
    monkeypatch.setattr(schedule, "SPLIT", ("tests/d/test_cheap_fixture.py",))
    item = Item("tests/d/test_cheap_fixture.py::test_x", scope="module")
    assert not schedule.shared_module_fixture(item)
    assert schedule.shared_module_fixture(Item("tests/b/test_stack.py::test_synth", scope="module"))


RUN = {
    "pytest.ini": "[pytest]\n",
    "conftest.py": """
        from tests import schedule
        from tests.conftest import pytest_collection_modifyitems  # noqa: F401  (the suite's own hook)

        schedule.SECONDS = {"test_order.py::test_z": 90, "test_order.py::test_y": 60}
    """,
    "test_order.py": """
        import os

        def started(name):
            with open(os.environ["STARTS"], "a") as handle:
                handle.write(os.environ["PYTEST_XDIST_WORKER"] + " " + name + "\\n")

        def test_a(): started("test_a")
        def test_b(): started("test_b")
        def test_c(): started("test_c")
        def test_y(): started("test_y")
        def test_z(): started("test_z")
    """,
    "test_shared.py": """
        import pytest
        from test_order import started

        @pytest.fixture(scope="module")
        def made_once():
            return object()

        def test_one(made_once): started("test_one")
        def test_two(made_once): started("test_two")
    """,
}
"""A folder of tests whose pytest order (alphabetical) puts the two longest of its ``SECONDS`` last."""


def make_test_options() -> list[str]:
    """The pytest options of the Makefile's ``test`` recipe (``$(PYTEST_ARGS)`` left out: empty by default)."""
    recipe = ROOT.joinpath("Makefile").read_text().split("\ntest: ", 1)[1].splitlines()[1]
    words = shlex.split(recipe.split(" -m pytest ", 1)[1])
    assert words[-1] == "$(PYTEST_ARGS)" and not any("$" in word for word in words[:-1]), recipe
    return words[:-1]


def test_under_make_tests_options_the_two_longest_start_first_and_a_module_fixture_is_made_once(tmp_path):
    """pytest-xdist hands the first unit to one worker and the second to the other: with the longest first, each
    worker starts with one of the two longest, whichever is quicker; the module fixture's two users run on one
    worker, one after the other; tests/cpu_seconds.py records each test under the id ``SECONDS`` is keyed by."""
    for name, text in RUN.items():
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_XDIST", "PYTEST_CURR"))
    }
    env.update(PYTHONPATH=str(ROOT), STARTS=str(tmp_path / "starts"))
    rows = tmp_path / "rows.jsonl"
    command = [sys.executable, "-m", "pytest", *make_test_options(), "-p", "no:cacheprovider", "-q"]
    record = ["-p", "tests.cpu_seconds", f"--cpu-seconds={rows}"]
    done = subprocess.run(
        [*command, *record], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs: dict[str, list[str]] = {}
    for line in (tmp_path / "starts").read_text().splitlines():
        worker, name = line.split()
        runs.setdefault(worker, []).append(name)
    assert len(runs) == 2 and sum(map(len, runs.values())) == 7, runs
    assert {names[0] for names in runs.values()} == {"test_z", "test_y"}, runs
    shared = [names for names in runs.values() if "test_one" in names]
    assert len(shared) == 1 and "test_two" in shared[0], runs
    assert shared[0].index("test_two") == shared[0].index("test_one") + 1, runs
    recorded = {json.loads(line)["test"] for line in rows.read_text().splitlines()}
    collected = [f"test_order.py::test_{name}" for name in "abcyz"] + [
        "test_shared.py::test_one",
        "test_shared.py::test_two",
    ]
    assert recorded == set(collected)  # as SECONDS is keyed: no "@test_shared.py" of the group
