"""training.prepare.deadline: a block that runs past its limit is stopped with TimeUp, in the main thread or any
other; a block that ends in time is left alone, and no TimeUp reaches the code after a block."""

from __future__ import annotations

import functools
import multiprocessing
import random
import threading
import time

import pytest

from training.prepare import deadline


def spin(seconds: float) -> int:
    """Python bytecode for about ``seconds`` (a loop, as a template's loops compile to)."""
    end, turns = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        turns += 1
    return turns


def _forever() -> None:
    while True:
        pass


def test_a_loop_without_end_is_stopped():
    with pytest.raises(deadline.TimeUp), deadline.limit(0.2):
        while True:
            pass
    spin(0.3)  # nothing left pending


def test_a_loop_without_end_is_stopped_in_another_thread():
    outcome = []

    def work():
        try:
            with deadline.limit(0.2):
                while True:
                    pass
        except deadline.TimeUp:
            outcome.append("stopped")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert outcome == ["stopped"] and not thread.is_alive()


def test_blocks_that_end_around_their_limit_leave_nothing_pending():
    """Blocks racing their limit either end or stop inside; the code after them never sees a TimeUp.

    Which of the racing blocks stop depends on the scheduler (under load almost none do), so the verdict rests
    only on what holds at any speed: no TimeUp outside a block, and among them one block certain to stop (it never
    ends: a TimeUp arriving while ``limit`` itself held its lock once left the lock held and every later block
    unlimited, so this one ran for ever) and one certain to end (it does nothing). The blocks run in a thread of
    their own so that a block never stopped fails the test instead of holding it."""
    rng = random.Random(0)
    works = [functools.partial(spin, rng.uniform(0.0, 0.006)) for _ in range(150)]
    works[75:75] = [_forever, lambda: None]
    outcome: dict[str, int] = {"stopped": 0, "ended": 0}

    def race():
        for work in works:
            try:
                with deadline.limit(0.002):
                    work()
                outcome["ended"] += 1
            except deadline.TimeUp:
                outcome["stopped"] += 1
            spin(0.003)  # a TimeUp still pending would be raised here, outside the block, and end the thread
        outcome["done"] = 1

    thread = threading.Thread(target=race, daemon=True)
    thread.start()
    thread.join(timeout=300)  # about 2 s of work: the bound only turns a block never stopped into a failure
    assert outcome.get("done") == 1, f"a block was never stopped or a TimeUp escaped: {outcome}"
    assert (
        outcome["stopped"] + outcome["ended"] == len(works)
        and outcome["stopped"] >= 1
        and outcome["ended"] >= 1
    )
    with deadline.limit(5):
        assert spin(0.01) > 0


def test_no_limit_and_no_nesting():
    with deadline.limit(None):
        spin(0.01)
    with deadline.limit(5), pytest.raises(RuntimeError, match="do not nest"), deadline.limit(5):
        pass


def _stopped_in_a_child() -> str:
    try:
        with deadline.limit(0.2):
            while True:
                pass
    except deadline.TimeUp:
        return "stopped"


def test_a_forked_child_gets_a_watchdog_of_its_own():
    """A process pool's worker forked while the parent's watchdog runs: the limit holds there too."""
    with deadline.limit(5):  # the parent's watchdog is running, with a block waiting on it
        context = multiprocessing.get_context("fork")
        with context.Pool(1) as pool:
            assert pool.apply_async(_stopped_in_a_child).get(timeout=60) == "stopped"
