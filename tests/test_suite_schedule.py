"""The order ``make test`` hands tests to its workers (tests/schedule.py): longest first, the users of a
module-scoped fixture kept together as one unit, and pytest's own order under any other way of running."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests import schedule

TOOLKIT = (
    "tests/tune/test_tune_toolkit.py::test_a_tuning_job_under_the_toolkit_ranks_its_trials_through_an_oom"
)


class Item:
    """What ``schedule`` reads of a pytest item: its node id, its ``slow`` mark, its fixtures' scopes."""

    def __init__(self, nodeid: str, slow: bool = False, scope: str = "function"):
        self.nodeid, self.slow, self.marks = nodeid, slow, []
        self._fixtureinfo = SimpleNamespace(name2fixturedefs={"a_fixture": [SimpleNamespace(scope=scope)]})

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None

    def add_marker(self, mark) -> None:
        self.marks.append(mark)


def config(dist: str, reorder: bool) -> SimpleNamespace:
    options = {"dist": dist, "loadscopereorder": reorder}
    return SimpleNamespace(getoption=lambda name, default=None: options.get(name, default))


def items() -> list[Item]:
    return [
        Item("tests/a/test_fast.py::test_one"),
        Item("tests/b/test_stack.py::test_synth", scope="module"),
        Item("tests/b/test_stack.py::test_alone"),
        Item("tests/c/test_runs.py::test_torchrun", slow=True),
        Item(TOOLKIT),
        Item("tests/b/test_stack.py::test_nag", scope="module"),
        Item("tests/a/test_fast.py::test_two"),
    ]


def test_the_longest_unit_goes_first_and_a_module_fixtures_users_stay_together():
    ordered = items()
    schedule.longest_first(config("loadgroup", reorder=False), ordered)
    assert [item.nodeid.split("::")[1] for item in ordered] == [
        TOOLKIT.split("::")[1],  # listed: 290 s
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


@pytest.mark.parametrize(("dist", "reorder"), [("load", False), ("no", True), ("loadgroup", True)])
def test_any_other_way_of_running_keeps_pytests_order(dist, reorder):
    ordered = items()
    schedule.longest_first(config(dist, reorder), ordered)
    assert [item.nodeid for item in ordered] == [item.nodeid for item in items()]
    assert not any(item.marks for item in ordered)


def test_a_module_named_in_split_runs_its_tests_as_units_of_their_own(monkeypatch):
    monkeypatch.setattr(schedule, "SPLIT", ("tests/d/test_cheap_fixture.py",))
    item = Item("tests/d/test_cheap_fixture.py::test_x", scope="module")
    assert not schedule.shared_module_fixture(item)
    assert schedule.shared_module_fixture(Item("tests/b/test_stack.py::test_synth", scope="module"))
