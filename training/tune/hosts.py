"""The hosts of a tuning job: every host runs the driver and the same ordered trials (each trial is one torchrun
over all of them); the first host (``SM_HOSTS[0]``, where rank 0 runs and prints) leads: it measures, writes the
report. What only the leader knows and every host needs (the winner, for the convergence runs) it
hands to the others over one small TCP exchange."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

SHARE_PORT_OFFSET = 997
"""The leader's port for the exchange: ``MASTER_PORT`` (train.sh's rendezvous port) plus this."""
SHARE_TIMEOUT_SECONDS = 600.0
"""How long the exchange waits for the other side (every host ends its trials within a trial timeout of the
others: each trial is one torchrun over all of them)."""


@dataclass(frozen=True)
class Hosts:
    names: tuple[str, ...]
    current: str

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> Hosts:
        environ = dict(os.environ if environ is None else environ)
        names = tuple(json.loads(environ.get("SM_HOSTS") or "[]")) or ("localhost",)
        current = environ.get("SM_CURRENT_HOST") or names[0]
        return cls(names, current if current in names else names[0])

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def leader(self) -> bool:
        return self.current == self.names[0]

    def share(self, value: Any, port: int, timeout: float | None = None) -> Any:
        """The leader's ``value`` on every host: the leader serves it to each other host once, the others fetch
        it (retrying until the leader listens), each side waiting at most ``timeout`` seconds (default
        ``SHARE_TIMEOUT_SECONDS``; then ``TimeoutError`` or the connection's ``OSError``). One host: ``value``."""
        if self.count == 1:
            return value
        timeout = SHARE_TIMEOUT_SECONDS if timeout is None else timeout
        if self.leader:
            payload = (json.dumps(value) + "\n").encode()
            with socket.create_server(("", port)) as server:
                server.settimeout(timeout)
                for _ in range(self.count - 1):
                    connection, _ = server.accept()
                    with connection:
                        connection.sendall(payload)
            return value
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((self.names[0], port), timeout=10) as connection:
                    data = b""
                    while not data.endswith(b"\n"):
                        chunk = connection.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    return json.loads(data)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
