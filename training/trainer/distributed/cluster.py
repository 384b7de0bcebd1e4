"""The job's hosts and how they meet before torchrun: SageMaker's ``resourceconfig.json`` (the hosts, this host,
the instance type, the network interface), every host name resolving (retried within a bound, as host names of
a starting cluster resolve late), a roll call at the first host that every host must answer within the bound (a
host that never comes is named in one line), torchrun's node arguments (the first host is the master, node ranks
in the file's order), the workers' own meeting on torchrun's store once they start (a host lost after the roll
call is named within the same bound), and a report of the network stack this host has (NCCL, libfabric, the EFA
installer, aws-ofi-nccl, the EFA devices) with every stale variable found in the environment.

What the launcher sets: ``NCCL_SOCKET_IFNAME`` to the interface SageMaker names (when unset; a value already set is
kept, with a warning when it does not select that interface), nothing else. The sagemaker-training toolkit's own
torchrun runner also sets ``NCCL_PROTO=simple`` and ``RDMAV_FORK_SAFE=1``; AWS's EFA cheatsheet
(https://github.com/aws-samples/awsome-distributed-training/blob/main/1.architectures/efa-cheatsheet.md) calls
those and more stale (``STALE_VARIABLES``): each one found is named in a warning and left as set, never set.

Stdlib only at import (``train.sh`` runs ``python -m training.trainer.distributed.cluster --count`` before the check).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from training.trainer import sagemaker_job

BASE_DIR_ENV = "SAGEMAKER_BASE_DIR"
"""The sagemaker-training toolkit's variable for the ``/opt/ml`` folder (its local runs point it elsewhere)."""
RESOURCE_CONFIG = "input/config/resourceconfig.json"

JOIN_TIMEOUT_ENV = "HOST_JOIN_TIMEOUT"
JOIN_TIMEOUT_SECONDS = 600.0
"""How long a host waits for every host name to resolve, then for every host to answer the roll call, then (each
worker) for every host's workers to meet on torchrun's store."""
JOIN_TIMEOUT_MAX_SECONDS = 86400.0
"""The largest bound accepted (a day): a bound, not a way to wait forever."""
ROLL_CALL_PORT_OFFSET = 1
"""The roll call listens on the first host at torchrun's rendezvous port plus this."""
DEFAULT_MASTER_PORT = 29500
WORKERS_MEET_PREFIX = "blackwell-training/workers-meet"
"""The keys on torchrun's store (the first host's agent's) under which each worker checks in."""
SOCKET_IFNAME_ENV = "NCCL_SOCKET_IFNAME"

STALE_VARIABLES = {
    "NCCL_PROTO": "only for aws-ofi-nccl 1.5 and older (NCCL_PROTO=simple forces NCCL's slowest protocol)",
    "FI_PROVIDER": "only for aws-ofi-nccl 1.5 and older",
    "FI_EFA_USE_DEVICE_RDMA": "not needed with libfabric 1.18 and aws-ofi-nccl 1.7 or newer",
    "FI_EFA_FORK_SAFE": "not needed on Linux 5.15 or newer (no effect there)",
    "FI_EFA_SET_CUDA_SYNC_MEMOPS": "only for an EFA installer older than 1.29.1",
    "FI_EFA_ENABLE_SHM_TRANSFER": "a no-op: shared-memory transfer is the default",
    "NCCL_SOCKET_NTHREADS": "not applicable to EFA",
    "NCCL_NSOCKS_PERTHREAD": "not applicable to EFA",
    "NCCL_MIN_CHANNELS": "best left out: more channels than needed split messages smaller and starve EFA",
    "NCCL_BUFFSIZE": "best left out (NCCL's default)",
    "RDMAV_FORK_SAFE": "rdma-core's variable, not to be used: it can break things on newer kernels "
    "(FI_EFA_FORK_SAFE is the EFA one)",
}
"""Every variable AWS's EFA cheatsheet calls stale, not applicable or best left out, and why (the toolkit's torchrun
runner sets the first and ``RDMAV_FORK_SAFE``). Any other ``RDMAV_*`` variable is named too (``STALE_PREFIX``)."""
STALE_PREFIX = "RDMAV_"
"""The cheatsheet says not to use any ``RDMAV_*`` variable."""


class JoinError(RuntimeError):
    """A host did not resolve or join within the bound, or was lost after the roll call (the message names it)."""


class SettingError(ValueError):
    """A launch variable (``HOST_JOIN_TIMEOUT``) holds a value it may not have; the message names it and what it
    may be."""


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
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise JoinError(f"{path}: cannot be read as JSON: {err}") from None
        hosts = config.get("hosts") if isinstance(config, dict) else None
        if hosts is not None and (not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts)):
            raise JoinError(f"{path}: hosts must be a list of host names; got {hosts!r}")
        names = tuple(hosts or ()) or ("localhost",)
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
    """``HOST_JOIN_TIMEOUT`` in seconds (default ``JOIN_TIMEOUT_SECONDS``); :class:`SettingError` names the
    variable and what it may be."""
    raw = (os.environ if environ is None else environ).get(JOIN_TIMEOUT_ENV)
    if not raw:
        return JOIN_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= JOIN_TIMEOUT_MAX_SECONDS:  # also refuses nan
        raise SettingError(
            f"{JOIN_TIMEOUT_ENV} must be a number of seconds above 0 and at most {JOIN_TIMEOUT_MAX_SECONDS:g} "
            f"(default {JOIN_TIMEOUT_SECONDS:g}); got {raw!r}"
        )
    return value


def resolve(
    names: Sequence[str],
    bound: float,
    lookup: Callable[[str], object] = socket.gethostbyname,
    every: float = 1.0,
) -> None:
    """Wait until every name resolves (SageMaker's host names may resolve late), at most ``bound`` seconds, trying
    the names still unresolved ``every`` seconds; :class:`JoinError` names those that did not."""
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
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))


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


def workers_meet(store: Any, hosts: Hosts, rank: int, world: int, local_world: int, bound: float,
                 attempt: str = "0") -> None:  # fmt: skip
    """Each worker checks in on torchrun's store (held by the first host's agent) and waits, at most ``bound``
    seconds, until every rank of every host has: the roll call proved the hosts were there, this proves their
    workers started. Without it, a host lost in between leaves the others' workers waiting in
    ``init_process_group`` for torch's process-group timeout (10 minutes with NCCL, 30 with gloo), saying nothing.
    :class:`JoinError` names the hosts whose workers did not come (node ``r`` holds ranks ``r * local_world`` on,
    as torchrun numbers them), or the first host when its store is gone. ``store`` is a
    ``torch.distributed.Store`` (``set``, ``wait``, ``check``); ``attempt`` keeps a restarted attempt's keys
    apart."""
    key = f"{WORKERS_MEET_PREFIX}/{attempt}/{{}}".format
    try:
        store.set(key(rank), hosts.current)
        store.wait([key(r) for r in range(world)], timedelta(seconds=bound))
        return
    except RuntimeError:  # torch's DistStoreError (timeout), DistNetworkError (the store's host is gone)
        pass
    try:
        nodes = sorted({r // local_world for r in range(world) if not store.check([key(r)])})
    except RuntimeError:
        nodes = [0]
    if not nodes:
        return  # the last one arrived as the wait ran out
    raise JoinError(lost_after_roll_call(hosts, nodes, world, local_world, bound))


def lost_after_roll_call(
    hosts: Hosts, nodes: Sequence[int], world: int, local_world: int, bound: float
) -> str:
    """The line naming the hosts (node ranks ``nodes``) whose workers did not meet the others' within ``bound``."""
    named = hosts.count * local_world == world
    lost = ", ".join(f"{hosts.names[n] if named else f'node {n}'} ({_ranks(n, local_world)})" for n in nodes)
    first = " (the first host, whose torchrun agent holds the workers' store)" if nodes == [0] else ""
    return (
        f"host {lost}{first} was lost after the roll call: its workers did not meet this host's within {bound:g} s "
        f"({JOIN_TIMEOUT_ENV}; this is {hosts.current})"
    )


def _ranks(node: int, local_world: int) -> str:
    first = node * local_world
    return f"rank {first}" if local_world == 1 else f"ranks {first}-{first + local_world - 1}"


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
    lines.extend(stale_warnings(environ))
    if hosts.count > 1 and nccl and not devices:
        lines.append(
            "warning: no EFA device on this host: between instances NCCL uses TCP sockets (far slower); "
            "the instance type must support EFA"
        )
    return lines


def stale_warnings(environ: Mapping[str, str]) -> list[str]:
    """One ``warning:`` line for each variable of ``environ`` that AWS's EFA cheatsheet calls stale
    (``STALE_VARIABLES``, any ``RDMAV_*``), saying why; the launcher leaves them as set."""
    lines = []
    for name in sorted(environ):
        why = STALE_VARIABLES.get(name)
        if why is None and name.startswith(STALE_PREFIX):
            why = f"AWS's EFA cheatsheet says not to set any {STALE_PREFIX}* variable"
        if why is not None:
            lines.append(f"warning: {name}={environ[name]} is set in the environment: {why}; left as set")
    return lines


def selects_interface(value: str, interface: str) -> bool:
    """Whether ``NCCL_SOCKET_IFNAME=value`` lets NCCL use ``interface``: NCCL reads a comma-separated list of name
    prefixes, exact names after a leading ``=``, and names to exclude after a leading ``^`` (NCCL's environment
    variables documentation)."""
    value = value.strip()
    exclude = value.startswith("^")
    value = value.removeprefix("^")
    exact = value.startswith("=")
    names = [name.strip() for name in value.removeprefix("=").split(",") if name.strip()]
    matched = any(interface == name if exact else interface.startswith(name) for name in names)
    return not matched if exclude else matched


def socket_interface(hosts: Hosts, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """What the launcher does with ``NCCL_SOCKET_IFNAME`` on several hosts: the value to set (SageMaker's
    interface, when unset) and the line that says so, or a ``warning:`` line when the value already set does not
    select that interface (kept: the job's environment wins)."""
    if hosts.count == 1 or not hosts.interface:
        return None, None
    preset = environ.get(SOCKET_IFNAME_ENV)
    if preset is None:
        return hosts.interface, (
            f"{SOCKET_IFNAME_ENV}={hosts.interface} (resourceconfig.json's network interface)"
        )
    if selects_interface(preset, hosts.interface):
        return None, None
    return None, (
        f"warning: {SOCKET_IFNAME_ENV}={preset} is set in the environment and does not select "
        f"resourceconfig.json's network interface {hosts.interface}: NCCL's bootstrap and socket traffic between "
        "hosts use what it names; left as set"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``--count``: print the number of hosts (``train.sh`` sizes its check with it)."""
    parser = argparse.ArgumentParser(
        prog="python -m training.trainer.distributed.cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--count", action="store_true", help="print the number of hosts")
    args = parser.parse_args(argv)
    try:
        hosts = Hosts.read()
    except JoinError as err:  # it names the file; the job's failure reason is it, not the toolkit's own text
        print(f"error: {err}", file=sys.stderr, flush=True)
        sagemaker_job.write_failure(str(err))
        return 2
    if args.count:
        print(hosts.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
