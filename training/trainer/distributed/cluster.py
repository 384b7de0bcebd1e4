"""The job's hosts and how they meet before torchrun: SageMaker's ``resourceconfig.json`` (the hosts, this host,
the instance type, the network interface), every host name resolving (retried within a bound, as host names of
a starting cluster resolve late), a roll call at the first host that every host must answer within the bound (a
host that never comes is named in one line), torchrun's node arguments (the first host is the master, node ranks
in the file's order), and a report of the network stack this host has (NCCL, libfabric, the EFA installer,
aws-ofi-nccl, the EFA devices) with any stale variable found in the environment.

What the launcher sets: ``NCCL_SOCKET_IFNAME`` to the interface SageMaker names (when unset), nothing else. The
sagemaker-training toolkit's own torchrun runner also sets ``NCCL_PROTO=simple`` and ``RDMAV_FORK_SAFE=1``; AWS's
EFA cheatsheet (https://github.com/aws-samples/awsome-distributed-training/blob/main/1.architectures/efa-cheatsheet.md)
says the first is only for aws-ofi-nccl 1.5 and older and the second should not be used; they are reported when
found, never set.

Stdlib only at import (``train.sh`` runs ``python -m training.trainer.distributed.cluster --count`` before the check).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

BASE_DIR_ENV = "SAGEMAKER_BASE_DIR"
"""The sagemaker-training toolkit's variable for the ``/opt/ml`` folder (its local runs point it elsewhere)."""
RESOURCE_CONFIG = "input/config/resourceconfig.json"

JOIN_TIMEOUT_ENV = "HOST_JOIN_TIMEOUT"
JOIN_TIMEOUT_SECONDS = 600.0
"""How long a host waits for every host name to resolve, and then for every host to answer the roll call."""
ROLL_CALL_PORT_OFFSET = 1
"""The roll call listens on the first host at torchrun's rendezvous port plus this."""
DEFAULT_MASTER_PORT = 29500

STALE_VARIABLES = {
    "NCCL_PROTO": "only for aws-ofi-nccl 1.5 and older (it forces NCCL's slowest protocol)",
    "RDMAV_FORK_SAFE": "rdma-core's variable; AWS's EFA cheatsheet says not to use it (it can break things on "
    "newer kernels)",
    "FI_EFA_USE_DEVICE_RDMA": "not needed with libfabric 1.18 and aws-ofi-nccl 1.7 or newer",
}
"""Variables the toolkit's torchrun runner sets that AWS's EFA cheatsheet calls stale, and why."""


class JoinError(RuntimeError):
    """A host did not resolve or join within the bound (the message names it)."""


@dataclass(frozen=True)
class Hosts:
    """The job's hosts (``resourceconfig.json``'s order: the first is the master), this host, the instance type
    and the network interface SageMaker names."""

    names: tuple[str, ...]
    current: str
    instance_type: str | None = None
    interface: str | None = None

    @classmethod
    def read(cls, path: Path | None = None) -> Hosts:
        """The hosts of ``path`` (default :func:`resource_config_path`); one host, ``localhost``, without it."""
        path = path or resource_config_path()
        if not path.is_file():
            return cls(("localhost",), "localhost", os.environ.get("SM_CURRENT_INSTANCE_TYPE"))
        config = json.loads(path.read_text())
        names = tuple(config.get("hosts") or ()) or ("localhost",)
        current = config.get("current_host") or names[0]
        if current not in names:
            raise JoinError(f"{path}: current_host {current!r} is not one of its hosts {list(names)}")
        return cls(names, current, config.get("current_instance_type"), config.get("network_interface_name"))

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def rank(self) -> int:
        return self.names.index(self.current)

    @property
    def master(self) -> str:
        return self.names[0]


def resource_config_path() -> Path:
    """``resourceconfig.json`` where SageMaker writes it (``$SAGEMAKER_BASE_DIR`` or ``/opt/ml``)."""
    return Path(os.environ.get(BASE_DIR_ENV) or "/opt/ml") / RESOURCE_CONFIG


def current_instance_type() -> str | None:
    """The instance type this job runs on (``resourceconfig.json``, else ``SM_CURRENT_INSTANCE_TYPE``)."""
    try:
        return Hosts.read().instance_type or os.environ.get("SM_CURRENT_INSTANCE_TYPE")
    except (OSError, ValueError, JoinError):
        return os.environ.get("SM_CURRENT_INSTANCE_TYPE")


def join_timeout(environ: Mapping[str, str] | None = None) -> float:
    raw = (os.environ if environ is None else environ).get(JOIN_TIMEOUT_ENV)
    try:
        value = float(raw) if raw else JOIN_TIMEOUT_SECONDS
    except ValueError:
        raise JoinError(f"{JOIN_TIMEOUT_ENV} must be a number of seconds; got {raw!r}") from None
    if value <= 0:
        raise JoinError(f"{JOIN_TIMEOUT_ENV} must be above 0 seconds; got {raw!r}")
    return value


def resolve(
    names: Sequence[str], bound: float, lookup: Callable[[str], object] = socket.gethostbyname
) -> None:
    """Wait until every name resolves (SageMaker's host names may resolve late), at most ``bound`` seconds;
    :class:`JoinError` names those that did not."""
    deadline = time.monotonic() + bound
    pending = list(dict.fromkeys(names))
    while True:
        for name in list(pending):
            with contextlib.suppress(OSError):
                lookup(name)
                pending.remove(name)
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise JoinError(
                f"host {', '.join(pending)} did not resolve within {bound:g} s ({JOIN_TIMEOUT_ENV}; the job's hosts: "
                f"{', '.join(names)})"
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _send(connection: socket.socket, message: Mapping[str, object]) -> None:
    connection.sendall((json.dumps(message) + "\n").encode())


def _receive(connection: socket.socket, deadline: float) -> dict[str, object] | None:
    """One JSON line, or None when the peer closed or the deadline passed."""
    data = b""
    while not data.endswith(b"\n"):
        connection.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = connection.recv(65536)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    try:
        message = json.loads(data)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def roll_call(hosts: Hosts, port: int, bound: float, nproc: int) -> None:
    """Every host answers at the first host within ``bound`` seconds, each with its processes per node; the first
    host answers all of them at once, or names who did not come (or who differs) to every host that did.
    Raises :class:`JoinError` with that one line on every host that hears it. One host: nothing to do."""
    if hosts.count == 1:
        return
    deadline = time.monotonic() + bound
    where = f"{hosts.master}:{port}"
    if hosts.rank == 0:
        _lead(hosts, port, deadline, nproc, where, bound)
        return
    connection = _connect(hosts.master, port, deadline, where, bound)
    with connection:
        _send(connection, {"host": hosts.current, "nproc": nproc})
        answer = _receive(connection, deadline + 30.0)  # the first host answers by its own deadline
    if answer is None:
        raise JoinError(f"the first host {hosts.master} closed the roll call at {where} without an answer")
    if answer.get("error"):
        raise JoinError(str(answer["error"]))


def _connect(master: str, port: int, deadline: float, where: str, bound: float) -> socket.socket:
    while True:
        try:
            return socket.create_connection((master, port), timeout=5)
        except OSError:
            if time.monotonic() >= deadline:
                raise JoinError(
                    f"host {master} (the first host, where the job meets) did not answer at {where} within "
                    f"{bound:g} s ({JOIN_TIMEOUT_ENV})"
                ) from None
            time.sleep(0.5)


def _lead(hosts: Hosts, port: int, deadline: float, nproc: int, where: str, bound: float) -> None:
    """The first host's side: gather every other host's answer, then answer them all."""
    joined: dict[str, tuple[socket.socket, int]] = {}
    error = None
    with socket.create_server(("", port)) as server:
        while len(joined) < hosts.count - 1 and time.monotonic() < deadline:
            server.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                connection, _ = server.accept()
            except TimeoutError:
                break
            message = _receive(connection, deadline)
            name = str((message or {}).get("host"))
            if message is None or name not in hosts.names[1:] or name in joined:
                error = (
                    error
                    or f"host {name} answered the roll call at {where} but is not one of the job's other hosts"
                )
                connection.close()
                continue
            joined[name] = (connection, int(message.get("nproc") or 0))  # type: ignore[call-overload]
        missing = [name for name in hosts.names[1:] if name not in joined]
        if missing:
            error = (
                f"host {', '.join(missing)} did not join at {where} within {bound:g} s ({JOIN_TIMEOUT_ENV}; joined: "
                f"{', '.join([hosts.master, *joined])})"
            )
        differing = [f"{name} has {n}" for name, (_, n) in joined.items() if n != nproc]
        if differing and not error:
            error = f"hosts differ in processes per node: {hosts.master} has {nproc}, " + ", ".join(differing)
        for connection, _ in joined.values():
            with connection, contextlib.suppress(OSError):
                _send(connection, {"error": error} if error else {"ok": True})
    if error:
        raise JoinError(error)


def torchrun_node_args(hosts: Hosts, port: int) -> list[str]:
    """torchrun's options for this node: ``--standalone`` on one host, else a static rendezvous at the first host
    with this host's rank in the file's order."""
    if hosts.count == 1:
        return ["--standalone"]
    return [f"--nnodes={hosts.count}", f"--node-rank={hosts.rank}", f"--master-addr={hosts.master}",
            f"--master-port={port}"]  # fmt: skip


# ------------------------------------------------------------------------------------------------------------------
# What this host's network stack is
# ------------------------------------------------------------------------------------------------------------------

EFA_INSTALLED = Path("/opt/amazon/efa_installed_packages")
FI_INFO = ("fi_info", "/opt/amazon/efa/bin/fi_info")
OFI_NCCL_GLOBS = ("/opt/amazon/ofi-nccl/lib*/**/libnccl-net*.so", "/opt/amazon/ofi-nccl/lib*/libnccl-net*.so",
                  "/opt/aws-ofi-nccl/lib/libnccl-net*.so")  # fmt: skip
INFINIBAND = Path("/sys/class/infiniband")


def _libfabric() -> str | None:
    for candidate in FI_INFO:
        program = shutil.which(candidate)
        if program is None:
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=20).stdout
            for line in out.splitlines():
                if line.strip().startswith("libfabric:"):
                    return line.split(":", 1)[1].strip()
    return None


def _efa_installer() -> str | None:
    with contextlib.suppress(OSError):
        for line in EFA_INSTALLED.read_text().splitlines():
            if "installer version" in line.lower():
                return line.split(":", 1)[1].strip()
    return None


def efa_devices(root: Path = INFINIBAND) -> list[str]:
    """The RDMA devices whose driver is EFA (``/sys/class/infiniband/*/device/driver``)."""
    if not root.is_dir():
        return []
    return sorted(
        device.name
        for device in root.iterdir()
        if os.path.basename(os.path.realpath(device / "device" / "driver")) == "efa"
    )


def _nccl() -> str | None:
    """NCCL's version as torch loads it, or None when this host has no GPU (gloo then)."""
    import torch

    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def network_report(hosts: Hosts, environ: Mapping[str, str]) -> list[str]:
    """Lines for the job's log: the network stack, and warnings (stale variables; no EFA between instances)."""
    plugins = sorted({p for pattern in OFI_NCCL_GLOBS for p in glob.glob(pattern, recursive=True)})
    devices = efa_devices()
    nccl = _nccl()
    lines = [
        f"network: NCCL {nccl or 'not used (no GPU: gloo)'}, libfabric {_libfabric() or 'not found'}, EFA installer "
        f"{_efa_installer() or 'not found'}, aws-ofi-nccl {', '.join(plugins) or 'not found'}; EFA devices: "
        + (f"{len(devices)} ({', '.join(devices)})" if devices else "none")
    ]
    for name, why in STALE_VARIABLES.items():
        if name in environ:
            lines.append(
                f"warning: {name}={environ[name]} is set in the environment: {why}; the launcher sets none"
            )
    others = sorted(k for k in environ if k.startswith("RDMAV_") and k not in STALE_VARIABLES)
    if others:
        lines.append(
            f"warning: {', '.join(others)} set: AWS's EFA cheatsheet says not to set RDMAV_* variables"
        )
    if hosts.count > 1 and nccl and not devices:
        lines.append(
            "warning: no EFA device on this host: between instances NCCL uses TCP sockets (far slower); "
            "the instance type must support EFA"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``--count``: print the number of hosts (``train.sh`` sizes its check with it)."""
    parser = argparse.ArgumentParser(
        prog="python -m training.trainer.distributed.cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--count", action="store_true", help="print the number of hosts")
    args = parser.parse_args(argv)
    try:
        hosts = Hosts.read()
    except (JoinError, OSError, ValueError) as err:
        print(f"error: {resource_config_path()}: {err}", file=sys.stderr)
        return 2
    if args.count:
        print(hosts.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
