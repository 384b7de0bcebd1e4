"""Run one trial as a process tree of its own: a fresh ``train.sh`` (so a fresh ``torchrun`` and fresh workers)
started in a new session, its output saved line by line, a hard timeout, and the whole tree killed when the trial
ends, fails or runs out of time, so that nothing of one trial (a hung rank, a leaked worker, its memory) reaches
the next.

Killing the trial's process group is not enough: torchrun starts every worker in a session of its own, so the
workers of a killed torchrun would run on (and hold the output pipe). The tree is found from /proc's parent links
before anything is killed, and the driver is made the subreaper of its orphans (``PR_SET_CHILD_SUBREAPER``), so
that a worker whose torchrun died is still found, killed and reaped after its trial."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from training.contract import metric_lines, settings_parse

KILL_GRACE_SECONDS = 10.0
"""After killing a trial: how long to wait for its output pipe to close."""
PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Finished:
    """What one trial process left: its exit status (None when killed at its timeout), its lines, when its first
    step line came (seconds after the start), how long it took."""

    exit_code: int | None
    timed_out: bool
    lines: list[str]
    seconds: float
    first_step_seconds: float | None = None
    notes: list[str] = field(default_factory=list)


def cli_args(settings: Mapping[str, object]) -> list[str]:
    """``--key value`` for each setting (values as the contract prints them)."""
    return [
        part for key, value in settings.items() for part in (f"--{key}", settings_parse.format_setting(value))
    ]


def _limit_memory(gigabytes: float | None) -> Callable[[], None] | None:
    if gigabytes is None:
        return None
    limit = int(gigabytes * 1e9)

    def apply() -> None:  # in the child, before exec: inherited by torchrun and every worker
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``), so that the
    workers of a trial whose torchrun died stay findable as its descendants; False where it is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children first), read from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])  # the fields after "(comm)": state, ppid, ...
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def kill_tree(root: int) -> None:
    """SIGKILL ``root``, its process group and every descendant, wherever it runs: torchrun starts each worker
    in a session of its own (``start_new_session``), so killing torchrun's group alone leaves its workers running.
    Gone already: nothing to do."""
    victims = [root, *descendants(root)]
    for pid in victims:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


def sweep(before: set[int]) -> None:
    """Kill whatever a finished trial left below this process (orphans re-parented to it as subreaper), that is
    every descendant that was not there ``before`` the trial, and reap them."""
    victims = [pid for pid in descendants(os.getpid()) if pid not in before]
    for pid in victims:
        kill_tree(pid)
    deadline = time.monotonic() + KILL_GRACE_SECONDS
    for pid in victims:  # our own children among them (re-parented orphans): reap each, no one else's
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:  # not our child, or already reaped
                break
            time.sleep(0.01)


def run(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    timeout: float,
    memory_limit_gb: float | None = None,
    echo: Callable[[str], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Finished:
    """Run ``command`` in a new session, write its output to ``log_path``, kill its group at ``timeout`` seconds
    (and, in any case, once it has ended); ``echo`` sees every line as it comes, ``on_start`` the group's id (the
    process's pid: a new session leads its own group), e.g. to kill it from a signal handler."""
    started = time.monotonic()
    before = set(descendants(os.getpid()))  # this process's own other children are none of the trial's
    lines: list[str] = []
    first_step: list[float] = []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            list(command),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
            preexec_fn=_limit_memory(memory_limit_gb),
        )

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                log.write(line + "\n")
                lines.append(line)
                if not first_step and metric_lines.parse_step_line(line) is not None:
                    first_step.append(time.monotonic() - started)
                if echo is not None:
                    echo(line)

        if on_start is not None:
            on_start(proc.pid)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        timed_out = False
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out, code = True, None
        kill_tree(proc.pid)  # torchrun, its workers (each in a session of its own), anything they started
        if timed_out:
            proc.wait()
        # orphans that left the tree before the kill (re-parented to this subreaper) may hold the output pipe:
        # killed now, so the reader sees its end at once and writes its last lines while the log is open
        sweep(before)
        reader.join(KILL_GRACE_SECONDS)
        log.flush()
    notes = (
        [] if not reader.is_alive() else ["output pipe still open after the kill (a process left the group)"]
    )
    return Finished(
        code,
        timed_out,
        lines,
        time.monotonic() - started,
        first_step[0] if first_step else None,
        notes,
    )
