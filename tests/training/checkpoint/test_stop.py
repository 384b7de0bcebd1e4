"""The SIGTERM stop flag once a worker only waits to be stopped (``checkpoint.stop.wait_for_sigterm``): torchrun's
SIGTERM ends it, whether it comes during the wait or came while the flag still took it; without one the flag's
handler is back after the wait. (A whole run: tests/training/test_stops.py, whose silent worker is never killed.)"""

from __future__ import annotations

import signal
import subprocess
import sys

from training.trainer.checkpoint import stop

WAITING = """
import os, sys
from training.trainer.checkpoint import stop
flag = stop.StopFlag(None)  # the run's graceful handler, as the trainer installs it
if sys.argv[1] == "before":  # torchrun's SIGTERM while the worker was still leaving its process group
    os.kill(os.getpid(), stop.signal.SIGTERM)
    assert flag.received
print("waiting", flush=True)
stop.wait_for_sigterm(600)
print("the wait ran out")
"""


def waiting_worker(when: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WAITING, when], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_worker_waiting_to_be_stopped_ends_by_sigterm_even_with_the_stop_flags_handler():
    before, during = waiting_worker("before"), waiting_worker("during")
    try:
        assert during.stdout.readline() == "waiting\n", during.communicate()
        during.send_signal(signal.SIGTERM)
        for proc in (before, during):
            out, err = proc.communicate(timeout=300)  # a guard: the wait itself is 600 s
            assert proc.returncode == -signal.SIGTERM, (out, err)  # ended by the signal, not by a handler
            assert "the wait ran out" not in out
    finally:
        for proc in (before, during):
            proc.kill()  # nothing left waiting when the test fails
            proc.communicate()


def test_without_a_sigterm_the_wait_returns_and_the_stop_flags_handler_is_back():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        flag = stop.StopFlag(None)
        stop.wait_for_sigterm(0)
        assert signal.getsignal(signal.SIGTERM) == flag._handle and not flag.received
    finally:
        signal.signal(signal.SIGTERM, previous)
