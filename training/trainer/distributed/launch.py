"""torchrun with the trainer's exit-status contract (docs/exit-status.md), on the job's hosts; ``train.sh`` starts
the workers with it:

    python -m training.trainer.distributed.launch --nproc-per-node=8 -m training.trainer --max_steps 100 ...

Without node options of its own (``--standalone``, ``--nnodes``), it adds them from SageMaker's
``resourceconfig.json`` (``training.trainer.distributed.cluster``): ``--standalone`` on one host; on several, after every
host name resolves and every host has answered the roll call at the first host (each within
``HOST_JOIN_TIMEOUT`` seconds, else one ``error:`` line naming the host, exit 1 and the job's failure reason), a
static rendezvous at the first host (``MASTER_PORT``, default 29500) with this host's rank in the file's order
(the workers then meet on torchrun's store within the same bound before their process group:
``parallel.meet_the_other_hosts``). A ``HOST_JOIN_TIMEOUT`` that is no bound is refused (exit 2). It logs the
network stack found (NCCL, libfabric, EFA), sets ``NCCL_SOCKET_IFNAME`` when unset, and warns of every stale
variable set (and of a set ``NCCL_SOCKET_IFNAME`` that misses SageMaker's interface), leaving them as set.

It runs torch's own torchrun program in this process (``torch.distributed.run.main``, unchanged: the same options,
agent and worker environment) and changes only how the end is reported. torchrun ends every failed run the same
way, whatever its workers' exit statuses: ``launch_agent`` raises ``ChildFailedError``, torchrun's ``main`` (under
``@record``) re-raises it, and Python prints a traceback and a block with each worker's exit code, then exits 1
(torch/distributed/launcher/api.py, torch/distributed/elastic/multiprocessing/errors/__init__.py). Here:

* the workers refused: they recorded the reason in ``$TRAINER_REFUSAL_FILE`` (set here unless the container's
  entry point set it) and exited 2, and torchrun stopped any still running (SIGTERM, then SIGKILL). Exit 2 and
  print nothing more: one worker printed the ``error:`` line, and torchrun's log lines about stopping the workers
  are dropped once a refusal is recorded (but for the one saying a worker outlived its SIGTERM and was killed);
* the workers stopped together on a failure during training (``refusal.TrainingFailure``: a bad token id, a
  non-finite loss): rank 0 recorded it in ``$TRAINER_FAILURE_FILE`` (set here) and printed its ``error:`` line, every
  failed worker exited 1 or was stopped by torchrun. Exit 1 and print nothing more, as for a refusal;
* any other failure: torchrun's block, without the traceback through torchrun's own code, and exit 1;
* success: exit 0.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from training.trainer import refusal, sagemaker_job
from training.trainer.distributed import cluster

AGENT_LOGGERS = (
    "torch.distributed.elastic.multiprocessing.api",
    "torch.distributed.elastic.multiprocessing.errors.error_handler",
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
)
"""The loggers torchrun's agent reports a failed worker through ("Sending process ... closing signal SIGTERM",
"failed (exitcode: 2) local_rank: 0 ...", the error-file copy)."""

STOPPED_BY_TORCHRUN = frozenset({-signal.SIGTERM, -signal.SIGKILL})
"""Exit codes torchrun records for the workers it stopped after the first one failed."""


KILLED_RECORD = "Unable to shutdown process"
"""How the agent's record begins when a worker outlived its SIGTERM for the whole close timeout (30 s) and had to be
killed (``torch.distributed.elastic.multiprocessing.api``: "Unable to shutdown process %s via %s, forcefully
exiting via %s")."""


class _QuietAfterRefusal(logging.Filter):
    """Drops the agent's records once a worker has recorded a refusal (its line already says everything), except
    that a worker had to be killed: the run's end waited for it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(KILLED_RECORD):
            return True
        return refusal.refused() is None and refusal.refused(refusal.FAILURE_MARKER_ENV) is None


def is_refusal(err: ChildFailedError) -> bool:
    """Whether the failed run is the workers' refusal: one recorded, every failed worker exited 2 or was stopped by
    torchrun, at least one exited 2."""
    codes = {failure.exitcode for failure in err.failures.values()}
    return (
        refusal.refused() is not None
        and refusal.REFUSED in codes
        and codes <= {refusal.REFUSED, *STOPPED_BY_TORCHRUN}
    )


NODE_OPTIONS = (
    "--standalone",
    "--nnodes",
    "--node-rank",
    "--node_rank",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
)


def _nproc(options: list[str]) -> int:
    for index, option in enumerate(options):
        if option.startswith(("--nproc-per-node=", "--nproc_per_node=")):
            return int(option.split("=", 1)[1])
        if option in ("--nproc-per-node", "--nproc_per_node"):
            return int(options[index + 1])
    return 1


def node_arguments(argv: list[str], environ: MutableMapping[str, str] | None = None) -> list[str]:
    """``argv`` with the node options of the job's hosts in front (unless it names its own): the hosts have
    resolved and answered the roll call. Raises ``cluster.JoinError``, or ``cluster.SettingError`` for a bad
    ``HOST_JOIN_TIMEOUT``."""
    environ = os.environ if environ is None else environ
    options = argv[: argv.index("-m")] if "-m" in argv else argv
    if any(option.split("=", 1)[0] in NODE_OPTIONS for option in options):
        return argv
    hosts = cluster.Hosts.read()
    bound = cluster.join_timeout(environ) if hosts.count > 1 else cluster.JOIN_TIMEOUT_SECONDS
    interface, said = cluster.socket_interface(hosts, environ)
    if interface:
        environ[cluster.SOCKET_IFNAME_ENV] = interface
    for line in [*cluster.network_report(hosts, environ), *([said] if said else [])]:
        print(f"train.sh: {line}", flush=True)  # flushed: before any error line on stderr
    port = int(environ.get("MASTER_PORT") or cluster.DEFAULT_MASTER_PORT)
    if hosts.count > 1:
        cluster.resolve(hosts.names, bound)
        cluster.roll_call(hosts, port + cluster.ROLL_CALL_PORT_OFFSET, bound, _nproc(options))
        print(f"train.sh: {hosts.count} hosts joined ({', '.join(hosts.names)}); this is {hosts.current}, node "
              f"rank {hosts.rank}", flush=True)  # fmt: skip
    return [*cluster.torchrun_node_args(hosts, port), *argv]


def is_failure_together(err: ChildFailedError) -> bool:
    """Whether the failed run is a ``TrainingFailure`` the workers stopped on together: one recorded, every failed
    worker exited 1 or was stopped by torchrun, at least one exited 1."""
    codes = {failure.exitcode for failure in err.failures.values()}
    return (
        refusal.refused(refusal.FAILURE_MARKER_ENV) is not None
        and refusal.FAILED in codes
        and codes <= {refusal.FAILED, *STOPPED_BY_TORCHRUN}
    )


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv`` (its own options, then the program) on the job's hosts; return the contract's
    exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        argv = node_arguments(argv)
    except cluster.SettingError as err:  # a bad launch variable: refused before anything runs
        return refusal.refuse(str(err), report=True)
    except cluster.JoinError as err:  # a host never came: a failure of the job, named in one line
        print(f"error: {err}", file=sys.stderr, flush=True)
        sagemaker_job.write_failure(str(err))
        return refusal.FAILED
    print("train.sh: torchrun " + " ".join(argv), flush=True)
    with tempfile.TemporaryDirectory(prefix="trainer-launch-") as private:
        marker = Path(os.environ.setdefault(refusal.MARKER_ENV, str(Path(private) / "refused")))
        marker.unlink(missing_ok=True)  # train.sh's check passed: nothing has refused yet
        failure = Path(os.environ.setdefault(refusal.FAILURE_MARKER_ENV, str(Path(private) / "failed")))
        failure.unlink(missing_ok=True)
        quiet = _QuietAfterRefusal()
        for name in AGENT_LOGGERS:
            logging.getLogger(name).addFilter(quiet)
        try:
            torchrun.main(argv)
        except ChildFailedError as err:
            if is_refusal(err):
                return refusal.REFUSED
            if is_failure_together(err):
                return refusal.FAILED
            print(str(err).strip("\n"), file=sys.stderr, flush=True)
            return refusal.FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
