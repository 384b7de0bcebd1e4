"""training.prepare.deadline: a block that runs past its limit is stopped with TimeUp, in the main thread or any
other; a block that ends in time is left alone, and no TimeUp reaches the code after a block."""

from __future__ import annotations

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
    """Blocks racing their limit either end or stop inside; the code after them never sees a TimeUp."""
    rng = random.Random(0)
    stopped = ended = 0
    for _ in range(150):
        try:
            with deadline.limit(0.002):
                spin(rng.uniform(0.0, 0.006))
            ended += 1
        except deadline.TimeUp:
            stopped += 1
        spin(0.003)  # a TimeUp still pending would be raised here, outside the block, and fail the test
    assert stopped + ended == 150 and stopped and ended
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
