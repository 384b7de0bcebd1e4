"""The client side of tests/zygote.py, standard library only: it decides whether a Python command line can be served
by the fork server, asks for it, and stands in for the process it got (``ForkedProcess``); run as a program (the
``python``, ``python3`` and ``torchrun`` of the run's shim folder, first on the PATH of the processes the trainer
tests start), it is that process: it forwards the signals it gets and exits as it exited. Anything the server does
not serve (another module, another copy of the repository's ``training`` package, ``-c``, an unknown option) is
handed to the real interpreter with ``exec``, unchanged.

The wire: one message with a 4-byte length, a JSON request (``argv``: the interpreter's arguments, ``env``, ``cwd``,
``kill_on_close``) and the three standard file descriptors (SCM_RIGHTS); answers are lines, ``pid N`` once, then
``exit N`` (a Popen-style return code: negative for a signal)."""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import struct
import sys

SOCKETS_ENV = "TESTS_ZYGOTE_SOCKETS"
"""``FOLDER=SOCKET`` pairs (``os.pathsep`` between them), set in the environment of the processes a test starts: the
fork server listening on SOCKET has imported the ``training`` package of FOLDER (the repository's, the first; or
the container's code laid out by the toolkit tests). A command that would import another copy runs in a real
interpreter."""
SERVED_MODULES = ("training.", "torch.distributed.run")
"""``-m`` modules the fork server runs (itself and what starts below it); any other runs in a real interpreter."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def servers(env: dict[str, str]) -> dict[str, str]:
    """The real path of each fork server's ``training`` package: its socket (the repository's first)."""
    pairs = (entry.partition("=") for entry in env.get(SOCKETS_ENV, "").split(os.pathsep) if entry)
    return {
        os.path.realpath(os.path.join(folder, "training")): socket_path for folder, _, socket_path in pairs
    }


def served(argv: list[str], env: dict[str, str], cwd: str) -> str | None:
    """The socket of the fork server that can run the interpreter arguments ``argv`` (``-u -m training.trainer
    ...``, ``script.py ...``) for a process with ``env`` in ``cwd``; None when a real interpreter must."""
    known = servers(env)
    if not known:
        return None
    rest = [arg for arg in argv if arg != "-u"]
    if not rest or (rest[0].startswith("-") and rest[0] != "-m"):
        return None
    path = [*filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    if rest[0] == "-m":
        if len(rest) < 2 or not (rest[1] + ".").startswith(SERVED_MODULES):
            return None
        search = [cwd, *path]
    else:
        script = os.path.realpath(os.path.join(cwd, rest[0]))
        repository = os.path.dirname(next(iter(known)))
        if not script.endswith(".py") or not script.startswith(os.path.join(repository, "tests", "")):
            return None
        search = [os.path.dirname(script), *path]
    for folder in search:  # where a fresh interpreter would find the training package first
        if os.path.isfile(os.path.join(folder, "training", "__init__.py")):
            return known.get(os.path.realpath(os.path.join(folder, "training")))
    return next(iter(known.values()))  # the installed (editable) package: the repository's


class Answers:
    """The server's lines on one connection, read with a time limit."""

    def __init__(self, connection: socket.socket):
        self.connection, self._buffer = connection, b""

    def line(self, timeout: float | None = None) -> str | None:
        """The next line (``""`` when the server closed the connection), or None when ``timeout`` ran out."""
        while b"\n" not in self._buffer:
            if timeout is not None and not select.select([self.connection], [], [], timeout)[0]:
                return None
            chunk = self.connection.recv(4096)
            if not chunk:
                return ""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("ascii")


def request(
    server: str,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    fds: tuple[int, int, int],
    kill_on_close: bool,
):
    """Ask the fork server listening on ``server`` to run ``argv``; returns its answers and the pid of the process
    it started."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(server)
    body = json.dumps({"argv": argv, "env": env, "cwd": cwd, "kill_on_close": kill_on_close}).encode()
    payload = struct.pack("!I", len(body)) + body
    sent = connection.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    if sent < len(payload):
        connection.sendall(payload[sent:])
    answers = Answers(connection)
    kind, _, value = (answers.line() or "closed").partition(" ")
    if kind != "pid":
        raise OSError(f"fork server: {kind} {value}")
    return answers, int(value)


def return_code(line: str) -> int:
    """The return code an ``exit N`` line gives (SIGKILL's when the server went away first)."""
    kind, _, value = line.partition(" ")
    return int(value) if kind == "exit" else -signal.SIGKILL


class ForkedProcess:
    """What ``subprocess.Popen`` offers torchrun's agent (``pid``, ``poll``, ``wait``, ``returncode``, signals) for a
    process the fork server started."""

    def __init__(
        self, server: str, argv: list[str], env: dict[str, str], cwd: str, fds: tuple[int, int, int]
    ):
        self._answers, self.pid = request(server, argv, env, cwd, fds, kill_on_close=False)
        self.returncode: int | None = None
        self.args = argv

    def _read_exit(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            line = self._answers.line(timeout)
            if line is None:
                return None
            self.returncode = return_code(line)
            self._answers.connection.close()
        return self.returncode

    def poll(self) -> int | None:
        return self._read_exit(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read_exit(timeout)
        if code is None:
            import subprocess

            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def main() -> None:
    """As ``python``/``python3`` (``argv[0]``'s name) or ``torchrun`` of the shim folder."""
    argv = sys.argv[1:]
    if os.path.basename(sys.argv[0]) == "torchrun":
        argv = ["-m", "torch.distributed.run", *argv]
    env, cwd = dict(os.environ), os.getcwd()
    server = served(argv, env, cwd)
    if server is None:
        os.execv(sys.executable, [sys.executable, *argv])
    answers, pid = request(server, argv, env, cwd, (0, 1, 2), kill_on_close=True)
    for sig in FORWARDED:
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    code = return_code(answers.line() or "")
    if code < 0:  # ended by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


if __name__ == "__main__":
    main()
