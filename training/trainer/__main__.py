"""Entry point: ``python -m training.trainer --num_layers 2 ...`` (under torchrun, or alone as one process).

Settings are validated, the precision checked against this machine, and the output folders and data checked
(``preflight``), before any process group starts. ``--check-only`` stops there (``train.sh`` runs it before
starting torchrun) and says how much of the data it read. Every refusal before training (any
``settings_table.ContractError`` before the process group; a ``refusal.Refusal`` after it, such as a checkpoint of
another model shape or ``on_unusable_checkpoints=fail``) is one ``error: ...`` line, exit status 2, and under
SageMaker the job's failure reason; a failure during training is exit status 1 with its reason in the failure
file, and one ``error: ...`` line when the ranks found it together (``refusal.TrainingFailure``: a bad token id,
a non-finite loss) (``training.trainer.refusal``; docs/exit-status.md). A run on the CPU then chooses how many
threads torch computes with and says so in one line (``distributed.cpu_threads``).

Leaving: every rank meets at a barrier, destroys the process group, flushes its output and ends the process with
``os._exit``, skipping interpreter finalization. Why: ``destroy_process_group`` does not stop gloo's threads
while Python objects still reference the group (measured with 2 gloo ranks: 3 extra threads per process stay
alive after it while a DeviceMesh is referenced, and end only when the last reference goes). In the trainer the
mesh, the FSDP state and ``DistEnv`` hold it to the end, so those threads were torn down during finalization;
"terminate called without an active exception" is what C++ reports when a joinable thread is destroyed or a
thread is ended by a finalizing interpreter inside a ``noexcept`` frame (exit 1 after a finished run, seen in 3
of 60 runs in the issue; 0 of 60 runs of the previous code on this machine, with or without its barrier, so the
abort itself could not be reproduced here). Nothing is left to run at that point: model and checkpoints are
written and closed, and the PID file is removed explicitly.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.distributed as dist

from training.contract import settings_table
from training.trainer import config, loop, preflight, refusal, sagemaker_job
from training.trainer.checkpoint import stop
from training.trainer.distributed import cluster, cpu_threads, parallel, precision


def main(argv: list[str] | None = None) -> int:
    cfg, check_only = config.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        precision.check_run(cfg)
        notes = preflight.check(cfg, world)
        replicate, why = parallel.data_parallel_replicate(
            cfg, world, int(os.environ.get("LOCAL_WORLD_SIZE", world))
        )
    except settings_table.ContractError as err:
        return refusal.refuse(f"invalid setting {err}")
    if check_only:
        print("settings ok: " + config.config_line(cfg.as_dict()).removeprefix("config "))
        for note in [*notes, f"layout ok: {world} processes, data_parallel_replicate={replicate} ({why})"]:
            print(note)
        return 0
    if not torch.cuda.is_available():  # a CPU run: its threads, chosen before the first operator
        threads = cpu_threads.configure()
        if int(os.environ.get("RANK", "0")) == 0:
            print(threads, flush=True)
    try:
        env = parallel.init_distributed(replicate)
        loop.run(cfg, env)
    except cluster.JoinError as err:  # before the process group: a host lost after the roll call, named
        return refusal.fail_before_group(str(err))
    except refusal.Refusal as err:  # raised on every rank together, so the process group exists
        return _leave_together(str(err), env, refusal.REFUSED)
    except refusal.TrainingFailure as err:  # raised on every rank together, after training began
        return _leave_together(str(err), env, refusal.FAILED)
    except Exception as err:  # a failure: Python prints the traceback and exits 1
        sagemaker_job.write_failure(refusal.failure_reason(err))
        raise
    # Leave together: a rank that tears gloo down while a peer is still in its last collective (the final model
    # gather) makes that peer fail.
    dist.barrier(group=env.cpu_group)
    dist.destroy_process_group()
    return 0


def _leave_together(message: str, env: parallel.DistEnv, code: int) -> int:
    """A refusal (``code`` 2) or a training failure (1) every rank raised: rank 0 prints it, each node's local
    rank 0 writes its failure file and records it for the launcher and torchrun; nobody leaves before all of that
    is done (torchrun stops the other workers as soon as one exits). The other local ranks then wait for their
    node's first worker to exit first (torchrun stops them: SIGTERM ends them at once, ``stop.wait_for_sigterm``),
    so that torchrun's root cause is the worker that recorded the reason (``training.trainer.refusal``)."""
    if env.local_rank == 0:
        if code == refusal.REFUSED:
            refusal.refuse(message, report=env.is_main)
        else:
            refusal.fail(message, report=env.is_main)
    with contextlib.suppress(RuntimeError):  # a peer already gone: nothing left to wait for
        dist.barrier(group=env.cpu_group)
    dist.destroy_process_group()
    if env.local_rank != 0:
        stop.wait_for_sigterm(refusal.QUIET_WAIT_SECONDS)
    return code


def exit_now(code: int) -> None:
    """Flush and end the process without interpreter finalization (see the module doc)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
