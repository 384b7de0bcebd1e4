"""A time limit on a block of Python code, in whatever thread runs it: ``with limit(seconds): ...`` raises
``TimeUp`` inside the block once ``seconds`` have passed. Used to bound a chat template's rendering (a template is
code from the model's folder: a loop without end would otherwise hold ``prepare`` until it is killed).

How: one watchdog thread per process (started on first use) holds each limited thread's expiry; when one passes it
raises ``TimeUp`` in that thread with CPython's ``PyThreadState_SetAsyncExc`` (the C API that delivers an
exception to another thread), which the thread raises at its next bytecode, as it would the exception of a signal
handler, but in any thread (a signal, ``SIGALRM``, reaches only the main thread and would take over the caller's
own handler). Jinja compiles a template to Python code, so every step of its rendering is bytecode and stops
there. What it does not stop: one long call into C (a huge string built in one operation) ends first. The common
path costs two short lock holds per block; the watchdog wakes at most once per expiry, not once per block.
``TimeUp`` is a ``BaseException`` (as ``KeyboardInterrupt``), so code that catches ``Exception`` lets it through.

The limited thread takes the state's lock only with ``with _lock:`` on the C lock itself: a ``TimeUp`` can arrive
at any bytecode while its block is registered (also in ``limit``'s own entry and exit), and a Python-level
``__enter__`` (``Condition.__enter__``, an ``RLock``) can be interrupted after it has taken the lock and before the
``with`` protects it, leaving the lock held and the watchdog waiting for it forever (every later block then ran
unlimited). The C lock's ``__enter__`` runs no bytecode, so the lock is released whenever the exception comes.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class TimeUp(BaseException):
    """The limited block ran past its limit."""


_lock = threading.Lock()
_cond = threading.Condition(_lock)  # the watchdog waits on it; the limited threads take only ``_lock``
_expiries: dict[int, tuple[float, int]] = {}  # thread id -> (time.monotonic() expiry, block number)
_fired: set[int] = set()  # blocks whose TimeUp was raised
_blocks = itertools.count()
_watchdog: dict[str, object] = {"pid": None, "thread": None, "until": math.inf}


def _raise_in(thread_id: int, exception: type[BaseException] | None) -> None:
    """Make ``thread_id`` raise ``exception`` at its next bytecode; None clears one still pending."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception) if exception else None
    )


def _watch() -> None:
    with _cond:
        while True:
            if not _expiries:
                _watchdog["until"] = math.inf
                _cond.wait()
                continue
            thread_id, (expiry, block) = min(_expiries.items(), key=lambda item: item[1][0])
            now = time.monotonic()
            if expiry > now:
                _watchdog["until"] = expiry
                _cond.wait(expiry - now)
                continue
            del _expiries[thread_id]
            _fired.add(block)
            _raise_in(thread_id, TimeUp)


def _ensure_watchdog() -> None:
    """Start the watchdog (again in a forked child, which inherits no threads). Called holding ``_lock``."""
    thread = _watchdog["thread"]
    if _watchdog["pid"] != os.getpid() or not (isinstance(thread, threading.Thread) and thread.is_alive()):
        thread = threading.Thread(target=_watch, name="deadline-watchdog", daemon=True)
        _watchdog.update(pid=os.getpid(), thread=thread, until=math.inf)
        thread.start()


def _forked() -> None:
    """In a forked child (a process pool's worker): fresh state and a fresh lock (the parent's watchdog may have
    held it at the fork; its thread is not in the child), the watchdog started again on first use."""
    global _cond, _lock
    _lock = threading.Lock()
    _cond = threading.Condition(_lock)
    _expiries.clear()
    _fired.clear()
    _watchdog.update(pid=None, thread=None, until=math.inf)


os.register_at_fork(after_in_child=_forked)


@contextmanager
def limit(seconds: float | None) -> Iterator[None]:
    """Raise ``TimeUp`` in this thread if the block runs longer than ``seconds`` (None: no limit). Blocks in one
    thread do not nest."""
    if seconds is None:
        yield
        return
    thread_id, block = threading.get_ident(), next(_blocks)
    expiry = time.monotonic() + seconds
    with _lock:
        if thread_id in _expiries:
            raise RuntimeError("deadline.limit blocks do not nest")
        _ensure_watchdog()
        _expiries[thread_id] = (expiry, block)
        if expiry < float(_watchdog["until"]):  # type: ignore[arg-type]
            _cond.notify()
    try:
        yield
    finally:
        with _lock:
            _expiries.pop(thread_id, None)
            fired = block in _fired
            _fired.discard(block)
        if fired:  # raised already, or still pending (the block ended first): the block's own outcome stands
            _raise_in(thread_id, None)
