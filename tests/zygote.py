"""A fork server for the Python processes the trainer tests start: torchrun, its workers, and ``train.sh``'s
``python -m training...`` steps, each forked from one process per test worker that has already imported torch
and the trainer, instead of a new interpreter importing them again.

Why: a tiny 2-process trainer run costs about 12 CPU seconds on the shared 2-core machine whether it trains 1 step
or 12 (measured: 1 step 10.4 + 1.4 s user + system, 12 steps 10.5 + 1.5 s): torchrun's agent and each worker spend
it importing torch (2.4 s), torch.distributed's tensor and FSDP code and the trainer (3.3 s a process). The suite
starts a few hundred such processes.

What stays real: torchrun's own program and agent (rendezvous, worker environment, error files, stopping the other
workers with SIGTERM then SIGKILL), ``train.sh``, the trainer's code and its exit statuses. What differs: a forked
process starts from the server's imported modules (the server is started with ``OMP_NUM_THREADS=1`` and has run no
torch operator, so no thread pool is copied), a module run with ``-m`` is imported afresh (as ``python -m`` does);
the Python of ``train.sh``'s steps and of torchrun's workers is the shim (tests/zygote_shim.py), which hands
everything else to the real interpreter. A command the shim does not know, or one that would import another copy of
``training`` than a server holds, gets a new interpreter; the toolkit tests' /opt/ml/code links one staged copy of
the image's code, served by a server of its own (``environment(env, package_root)``). CPU time of forked processes
is the server's (tests/cpu_seconds.py counts the running descendants of a test's process).

``environment(env)`` starts the server on first use (one per test process, ended with it) and returns ``env``
pointing at it.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import importlib
import importlib.util
import io
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from tests import zygote_shim

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = (
    "torch",
    "torch.distributed.run",
    "training.trainer.__main__",
    "training.trainer.distributed.launch",
    "training.trainer.distributed.cluster",
    "safetensors.torch",
)
"""Imported once by the server: what ``python -m training.trainer`` and torchrun import before they do anything."""
SHIMS = ("python", "python3", "torchrun")
"""The names of tests/zygote_shim.py in the server's shim folder, first on the PATH of the processes it serves."""


# ----- the server (``python -m tests.zygote SOCKET``) -----


def _patch_torchrun() -> None:
    """torchrun's agent starts each worker with ``subprocess.Popen(sys.executable, -u, -m, ...)``
    (``SubprocessHandler._popen``): here, the fork server starts those it serves."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    original = subprocess_handler.SubprocessHandler._popen

    def _popen(self, args, env):  # noqa: ANN001, ANN202 (torch's signature)
        argv = [str(arg) for arg in args[1:]]
        server = zygote_shim.served(argv, env, os.getcwd()) if args[0] == sys.executable else None
        if server is not None:
            fds = (
                0,
                self._stdout.fileno() if self._stdout else 1,
                self._stderr.fileno() if self._stderr else 2,
            )
            return zygote_shim.ForkedProcess(server, argv, env, os.getcwd(), fds)
        return original(self, args, env)

    subprocess_handler.SubprocessHandler._popen = _popen


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    """One request and its three file descriptors."""
    data, ancillary, _, _ = connection.recvmsg(1 << 20, socket.CMSG_SPACE(3 * array.array("i").itemsize))
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        chunk = connection.recv(size - len(body))
        if not chunk:
            raise ConnectionError("request cut short")
        body += chunk
    return json.loads(body), list(fds)


def _streams(unbuffered: bool) -> None:
    """New ``sys.std*`` over file descriptors 0-2, buffered as a new interpreter would buffer them."""

    def writer(fd: int, errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        binary = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            binary, encoding="utf-8", errors=errors, line_buffering=os.isatty(fd) or fd == 2,
            write_through=unbuffered,
        )  # fmt: skip

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = sys.__stdout__ = writer(1, "strict")
    sys.stderr = sys.__stderr__ = writer(2, "backslashreplace")


def _exit_code(err: SystemExit) -> int:
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


def _run_python(argv: list[str]) -> int:
    """Run the interpreter arguments ``argv`` as ``python`` would in this (forked) process; its exit status."""
    unbuffered = "-u" in argv
    rest = [arg for arg in argv if arg != "-u"]
    _streams(unbuffered)
    try:
        if rest[0] == "-m":
            module = rest[1]
            sys.argv = [module, *rest[2:]]
            sys.path[0] = os.getcwd()
            target = (
                module
                if importlib.util.find_spec(module).submodule_search_locations is None
                else f"{module}.__main__"
            )
            sys.modules.pop(target, None)  # imported afresh as __main__, as ``python -m`` does
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = rest
            sys.path[0] = os.path.dirname(os.path.abspath(rest[0]))
            runpy.run_path(rest[0], run_name="__main__")
        code = 0
    except SystemExit as err:
        code = _exit_code(err)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 (what the interpreter does with any uncaught exception)
        traceback.print_exc()
        code = 1
    threading._shutdown()  # what interpreter shutdown does first: wait for non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


def _child(request: dict, fds: list[int], closing: list[socket.socket]) -> None:
    """The forked process: its own session, the client's standard files, environment and folder; never returns."""
    try:
        for sock in closing:
            sock.close()
        os.setsid()
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for number in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        code = _run_python(request["argv"])
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code)
    except BaseException:  # noqa: BLE001 (a forked process must never return into the server's loop)
        traceback.print_exc()
        os._exit(70)


def serve(path: str) -> None:
    """Import ``PRELOAD``, listen on ``path``, say ``ready`` on stdout, then fork a process per request until the
    process that started this one ends."""
    for name in PRELOAD:
        importlib.import_module(name)
    _patch_torchrun()
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    # pid: (its client's connection, kill_on_close)
    children: dict[int, tuple[socket.socket | None, bool]] = {}
    asked_by: dict[int, int] = {}  # pid: the pid of the process that asked for it (torchrun's, for a worker)
    print("ready", flush=True)
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=0.05):
            if key.fileobj is listener:
                connection, _ = listener.accept()
                request, fds = _receive(connection)
                open_sockets = [listener, *(c for c, _ in children.values() if c is not None), connection]
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, open_sockets)
                for fd in fds:
                    os.close(fd)
                connection.sendall(f"pid {pid}\n".encode())
                children[pid] = (connection, request["kill_on_close"])
                asked_by[pid] = struct.unpack(
                    "3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                )[0]
                selector.register(connection, selectors.EVENT_READ, pid)
            else:  # a client went away: its process goes too when it asked so (a killed shim)
                pid = key.data
                selector.unregister(key.fileobj)
                key.fileobj.close()
                _, kill_on_close = children[pid]
                children[pid] = (None, kill_on_close)
                if kill_on_close:
                    _kill_tree(pid, asked_by)
        _reap(children, selector)
        for pid in [pid for pid in asked_by if pid not in children]:
            del asked_by[pid]
    for pid, (_, kill_on_close) in list(children.items()):
        if kill_on_close:
            _kill_tree(pid, asked_by)


def _kill_tree(pid: int, asked_by: dict[int, int]) -> None:
    """SIGKILL the session of ``pid`` and of every process it (or one of those) asked for: what a test that kills
    a shim and every process below it means (the workers of a real torchrun are its descendants)."""
    tree, grown = {pid}, True
    while grown:
        more = {child for child, parent in asked_by.items() if parent in tree} - tree
        tree |= more
        grown = bool(more)
    for member in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(member, signal.SIGKILL)


def _reap(children: dict, selector: selectors.BaseSelector) -> None:
    """Collect every ended child and tell its client how it ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection, _ = children.pop(pid, (None, False))
        if connection is not None:
            selector.unregister(connection)
            with contextlib.suppress(OSError):
                connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
            connection.close()


# ----- the test process's side -----

_servers: dict[Path, str] = {}  # the package folder: its server's socket
_processes: list[subprocess.Popen] = []
_shims: list[Path] = []


def _shim_folder() -> Path:
    """This process's folder of shims (tests/zygote_shim.py as ``SHIMS``), made once."""
    if not _shims:
        folder = Path(tempfile.mkdtemp(prefix="zygote-"))
        shim = (ROOT / "tests" / "zygote_shim.py").read_text()
        for name in SHIMS:
            path = folder / name
            path.write_text(f"#!{sys.executable} -S\n{shim}")
            path.chmod(0o755)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _shims.append(folder)
    return _shims[0]


def _start(package_root: Path) -> str:
    """Start a server importing ``package_root``'s ``training`` package; its socket."""
    socket_path = str(_shim_folder() / f"socket-{len(_servers)}")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(dict.fromkeys((str(package_root), str(ROOT)))),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.zygote", socket_path],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    if process.stdout is None or process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError(f"the fork server for {package_root}'s trainer did not start (tests/zygote.py)")
    atexit.register(_stop, process)
    _processes.append(process)
    return socket_path


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


def pids() -> list[int]:
    """The process ids of this process's running fork servers."""
    return [process.pid for process in _processes if process.poll() is None]


def environment(env: dict[str, str], package_root: Path = ROOT) -> dict[str, str]:
    """``env`` with the fork servers of this process serving the Python commands they can: the repository's and,
    when it is another, ``package_root``'s (a folder holding a copy of ``training/``), each started on first use."""
    for folder in dict.fromkeys((ROOT, package_root)):
        if folder not in _servers:
            _servers[folder] = _start(folder)
    sockets = os.pathsep.join(f"{folder}={socket_path}" for folder, socket_path in _servers.items())
    return {
        **env,
        zygote_shim.SOCKETS_ENV: sockets,
        "PATH": f"{_shim_folder()}{os.pathsep}{env.get('PATH', '')}",
    }


if __name__ == "__main__":
    serve(sys.argv[1])
