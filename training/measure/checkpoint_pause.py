"""Checkpoint save pause and resume time, local folder against S3 direct, on one machine.

    python -m training.measure.checkpoint_pause                      # 2 processes, the 1b preset's shapes, bf16
    python -m training.measure.checkpoint_pause --preset llama3.2-1b --repeats 5 --state full

It starts moto's S3-compatible server on loopback (unless ``AWS_ENDPOINT_URL`` names one), then runs itself under
torchrun (gloo, ``--nproc`` processes). Each process builds the state of a model of the preset's shapes (every
weight matrix at its real size, FSDP2-sharded over the processes; ``--state weights``: the weights in bf16,
``full``: fp32 weights and Adam's two moments, what the trainer saves), then, for each backend in turn:

* saving: a step-like loop (``--step-seconds`` of matrix products per step) saves in the background every
  step. Printed separately: how long the save call holds the step (staging the state into host memory, the plan,
  the trainer-state object), how long the next save is held by the rest of the previous upload (if it still
  runs) and then by its seal (the folder hashes every file on the training thread; S3 direct gathers the digests
  taken during the upload and writes its marker), and how long the upload took behind the steps. The first save
  is a warm-up and left out; the median and the range (min to max) of ``--repeats`` saves are printed, each the
  slowest process's.
* resume: the newest sealed checkpoint found, verified (every file's SHA-256, each read by one process) and
  loaded into a fresh state, timed from the listing to the last tensor, ``--repeats`` times after one warm-up.

Both through the trainer's own ``training.trainer.checkpoint.manager.CheckpointManager``: local is the folder backend
(DCP's FileSystemWriter, the files hashed when sealed), S3 the S3 backend (``training.trainer.checkpoint.s3``,
through s3torchconnector to the server, hashed as the bytes go). It prints numbers and asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from training.contract import shapes

SERVER_READY_SECONDS = 60


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="1b", choices=sorted(shapes.MODEL_PRESETS))
    parser.add_argument("--state", default="weights", choices=["weights", "full"])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-seconds", type=float, default=2.0)
    parser.add_argument("--part-mb", type=int, default=64, help="S3 part size (the connector's default: 8)")
    parser.add_argument("--threads", type=int, default=4, help="DCP writer threads (objects) per process")
    parser.add_argument(
        "--throughput-gbps", type=float, default=1.0, help="the connector's target (default 10)"
    )
    parser.add_argument(
        "--folder", default=None, help="where the local checkpoints go (default: a temporary one)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _shapes(preset: str) -> dict[str, tuple[int, ...]]:
    """Every weight of a Llama-style decoder of the preset's shape, by name."""
    shape = shapes.MODEL_PRESETS[preset]
    h, kv = shape.hidden_size, shape.kv_heads * (shape.hidden_size // shape.num_heads)
    found: dict[str, tuple[int, ...]] = {"embed": (shape.vocab_size, h), "norm": (h,)}
    if not shape.tie_embeddings:
        found["head"] = (shape.vocab_size, h)
    for layer in range(shape.num_layers):
        for name, dims in {
            "q": (h, h), "k": (kv, h), "v": (kv, h), "o": (h, h), "gate": (shape.ffn_hidden_size, h),
            "up": (shape.ffn_hidden_size, h), "down": (h, shape.ffn_hidden_size), "norm1": (h,), "norm2": (h,),
        }.items():  # fmt: skip
            found[f"layers.{layer}.{name}"] = dims
    return found


def _state(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """This process's shards of the model state (FSDP2's DTensors over the world), filled from ``seed``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    dtype = torch.bfloat16 if args.state == "weights" else torch.float32
    kinds = ["weight"] if args.state == "weights" else ["weight", "exp_avg", "exp_avg_sq"]
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, Any] = {}
    for name, dims in _shapes(args.preset).items():
        for kind in kinds:
            full = torch.empty(dims, dtype=dtype)
            full.uniform_(-1, 1, generator=generator)
            state[f"{name}.{kind}"] = distribute_tensor(full, mesh, [Shard(0)])
            del full
    return state


def _busy(seconds: float) -> None:
    """A step: matrix products for ``seconds``."""
    a = torch.randn(256, 256)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


class _Env:
    """What ``CheckpointManager`` reads of the run's ``parallel.DistEnv``."""

    def __init__(self) -> None:
        self.rank, self.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self.local_rank, self.device, self.replicate = self.rank, torch.device("cpu"), 1
        self.cpu_group = torch.distributed.new_group(backend="gloo")


class _Holder(torch.nn.Module):
    """The state as a module's parameters (``CheckpointManager`` saves a model and an optimizer)."""

    def __init__(self, state: dict[str, Any]):
        super().__init__()
        for index, value in enumerate(state.values()):
            self.register_parameter(f"p{index}", torch.nn.Parameter(value, requires_grad=False))


class _Timings:
    """Per save: ``stage`` (the save call: the step is held), ``wait`` (at the next save or the end: the rest of
    the upload, if it still runs), ``seal`` (then the seal itself), ``upload`` (from the save call to the end of
    its write); ``resume`` per resume. The first save and the first resume are warm-ups, left out."""

    def __init__(self) -> None:
        self.stage: list[float] = []
        self.wait: list[float] = []
        self.seal: list[float] = []
        self.upload: list[float] = []
        self.resume: list[float] = []

    def uploaded(self, future: Any, started: float) -> None:
        def done(_: Any) -> None:
            self.upload.append(time.perf_counter() - started)

        future.add_done_callback(done)

    def result(self) -> dict[str, list[float]]:
        return {key: values[1:] for key, values in vars(self).items()}


def _timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _measure(args: argparse.Namespace, state: dict[str, Any], manager_of: Any) -> dict[str, list[float]]:
    """Background saves every step, then resumes into a fresh state, through the trainer's own
    ``CheckpointManager`` (``manager_of()`` makes one on the backend measured)."""
    times = _Timings()
    holder = _Holder(state)
    optimizer = torch.optim.SGD(holder.parameters(), lr=0.0)  # no momentum: no state of its own
    manager = manager_of()
    for step in range(args.repeats + 2):
        if step:
            times.wait.append(_timed(manager._pending.future.result))  # the upload's rest
            times.seal.append(
                _timed(manager.seal_pending)
            )  # the folder hashes its files; S3 writes its marker
        if step > args.repeats:
            break
        started = time.perf_counter()
        manager.save(step + 1, holder, optimizer, {"step": step + 1}, background=True)
        times.stage.append(time.perf_counter() - started)
        times.uploaded(manager._pending.future, started)
        _busy(args.step_seconds)
    for _ in range(args.repeats + 1):
        fresh = _Holder({k: torch.zeros_like(v) for k, v in state.items()})
        fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.0)
        again = manager_of()
        times.resume.append(_timed(lambda: again.load_latest(fresh, fresh_optimizer)))  # noqa: B023
        assert again.loaded is not None, again.skipped
    return times.result()


def _managers(args: argparse.Namespace, env: _Env) -> dict[str, Any]:
    """Makers of a ``CheckpointManager`` on each backend: the folder, and S3 direct with the measurement's tuning."""
    from training.trainer.checkpoint import manager as checkpoint_manager
    from training.trainer.checkpoint.s3 import S3Storage
    from training.trainer.checkpoint.s3_dcp import Tuning

    tuning = Tuning(args.throughput_gbps, args.part_mb * 1024 * 1024, writer_threads=args.threads)
    folder, uri, keep = os.environ["PAUSE_LOCAL_FOLDER"], os.environ["PAUSE_S3_URI"], args.repeats + 2
    return {
        "local": lambda: checkpoint_manager.CheckpointManager(folder, keep, env),
        "s3": lambda: checkpoint_manager.CheckpointManager(
            uri, keep, env, storage=S3Storage(uri, env, tuning)
        ),
    }


def _spread(values: list[float]) -> str:
    return (
        f"{statistics.median(values):7.2f} s  (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"
    )


def _worker(args: argparse.Namespace) -> None:
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    state = _state(args, seed=1)
    size = sum(v.to_local().numel() * v.to_local().element_size() for v in state.values())
    sizes: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(sizes, size)
    env = _Env()
    results = {backend: _measure(args, state, make) for backend, make in _managers(args, env).items()}
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, results)
    if rank == 0:
        total = sum(sizes) / 1e9
        print(f"state: preset {args.preset}, {args.state}, {total:.2f} GB over {len(sizes)} processes; "
              f"a step of {args.step_seconds:g} s between saves; warm-up save and resume excluded")  # fmt: skip
        for backend in ("local", "s3"):
            worst = {  # each save's and resume's slowest process: the step waits for every rank
                key: [max(values) for values in zip(*(g[backend][key] for g in gathered), strict=True)]
                for key in ("stage", "wait", "seal", "upload", "resume")
            }
            print(f"{backend}: step held by the save call {_spread(worst['stage'])}")
            print(f"{backend}: held at the next save by the upload's rest {_spread(worst['wait'])}")
            print(f"{backend}: held at the next save by the seal {_spread(worst['seal'])}")
            print(f"{backend}: upload, behind the steps {_spread(worst['upload'])}")
            print(f"{backend}: resume (find, verify, load) {_spread(worst['resume'])}")
    torch.distributed.destroy_process_group()


def _start_server(folder: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": folder},
    )  # fmt: skip
    deadline = time.monotonic() + SERVER_READY_SECONDS
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("moto's server did not start") from None
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    scratch = tempfile.mkdtemp(prefix="checkpoint_pause_")
    server = None
    try:
        env = dict(os.environ)
        if not env.get("AWS_ENDPOINT_URL"):
            server, url = _start_server(scratch)
            env |= {
                "AWS_ENDPOINT_URL": url,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
            }
        env.setdefault("AWS_REGION", "us-east-1")
        import boto3
        from botocore.config import Config

        bucket = f"pause-{os.getpid()}"
        boto3.client(
            "s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"), aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
            config=Config(s3={"addressing_style": "path"}),
        ).create_bucket(Bucket=bucket)  # fmt: skip
        env |= {"PAUSE_LOCAL_FOLDER": args.folder or os.path.join(scratch, "local"),
                "PAUSE_S3_URI": f"s3://{bucket}/checkpoints/measure/run/", "OMP_NUM_THREADS": "1"}  # fmt: skip
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
                   "-m", "training.measure.checkpoint_pause", "--worker", *(argv if argv is not None else sys.argv[1:])]  # fmt: skip
        return subprocess.run(command, env=env, check=False).returncode
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
