"""Two nodes on this machine: two SageMaker "hosts", each the real sagemaker-training toolkit driving train.sh with
its own resourceconfig.json (the job's two host names, this host's name) and its own /opt/ml (so its own checkpoint
disk), each starting a torchrun agent with 2 CPU processes on gloo. They meet as a job's hosts do: the roll call at
the first host, then torchrun's rendezvous there.

* hybrid sharding, replicate 2 x shard 2, trains the losses of one agent with 4 processes sharding over all 4
  (fp32; ``LOSS_TOLERANCE`` on the printed losses, their six significant digits);
* a checkpoint written by the two agents (4 ranks, replicate 2 x shard 2) resumes on one agent of 2 processes
  (shard 2; batch 8 per rank, so the same 16 samples per step) and that one's on the two agents again (2
  micro-batches of 2 per rank: gradient accumulation under hybrid sharding): the losses of an uninterrupted run,
  so model, optimizer and data position crossed both layout changes;
* a host that never comes is named in one line within the bound.

The two hosts' names are 127.0.0.1 and localhost (names that resolve here, both this machine). Slow: about 2.5
minutes on 2 cores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.training.runner import TINY, fields, free_ports, losses, toolkit_command, toolkit_job

pytestmark = pytest.mark.slow

HOSTS = ("127.0.0.1", "localhost")
LOSS_TOLERANCE = 1e-4
"""Absolute, on losses of about 4 to 6 printed with six significant digits: summing gradients in another order
(reduce-scatter over 2 then all-reduce over 2, instead of one reduce-scatter over 4) changes fp32 results in
their last bits, far below this."""
SETTINGS = {**TINY, "checkpoint_interval": "3", "checkpoint_dir": "ckpt", "model_dir": "model"}
"""The tiny model; relative folders, so each host's are under its own /opt/ml/code (its own disk, as in a job)."""


def run_job(tmp: Path, settings: dict[str, str], hosts=HOSTS, started=None, nproc=2, timeout=400, **environ):
    """The toolkit on each of ``hosts`` (those of ``started``: all by default) under ``tmp/<host>``, at once;
    ``(exit status, output)`` of each started host, in order. ``tmp/<host>/opt_ml/code/ckpt`` may be filled
    before (a host's checkpoint disk)."""
    port = str(free_ports())
    procs = []
    for host in hosts if started is None else started:
        folder = tmp / host
        if not (folder / "opt_ml").exists():
            folder.mkdir(parents=True, exist_ok=True)
            toolkit_job(folder, dict(settings), hosts=tuple(hosts), current=host)
        else:
            (folder / "opt_ml" / "input" / "config" / "hyperparameters.json").write_text(json.dumps(settings))
        command, child_env = toolkit_command(folder)
        child_env.update(MASTER_PORT=port, NPROC_PER_NODE=str(nproc), **environ)
        log = open(folder / "output.txt", "w")  # noqa: SIM115 (closed below)
        procs.append(
            (subprocess.Popen(command, env=child_env, cwd=folder, stdout=log, stderr=subprocess.STDOUT), log)
        )
    results = []
    for proc, log in procs:
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
        results.append((proc.returncode, Path(log.name).read_text()))
    return results


def ckpt(tmp: Path, host: str) -> Path:
    return tmp / host / "opt_ml" / "code" / "ckpt"


def as_floats(printed: dict[int, str]) -> dict[int, float]:
    return {step: float(value) for step, value in printed.items()}


def max_difference(a: dict[int, float], b: dict[int, float]) -> float:
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(abs(a[step] - b[step]) for step in a)


def levers(output: str) -> dict[str, str]:
    return fields(next(line for line in output.splitlines() if line.startswith("levers ")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two agents (replicate 2 x shard 2) and one agent of 4 processes (shard 4), 9 steps each."""
    tmp = tmp_path_factory.mktemp("multinode")
    two = run_job(tmp / "two", {**SETTINGS, "max_steps": "9", "data_parallel_replicate": "2"})
    one = run_job(tmp / "one", {**SETTINGS, "max_steps": "9"}, hosts=("algo-1",), nproc=4)
    return tmp, two, one[0]


def test_two_agents_with_hybrid_sharding_train_the_losses_of_one_agent_sharding_over_four(runs):
    tmp, two, one = runs
    for status, output in [*two, one]:
        assert status == 0, output
    (_, first), (_, second) = two
    assert "train.sh: 2 hosts joined (127.0.0.1, localhost); this is 127.0.0.1, node rank 0" in first
    assert "this is localhost, node rank 1" in second
    assert "--nnodes=2 --node-rank=1 --master-addr=127.0.0.1 " in second
    assert levers(first)["data_parallel"] == "replicate_2_x_shard_2"
    assert levers(one[1])["data_parallel"] == "shard_4"
    hybrid, plain = as_floats(losses(first)), as_floats(losses(one[1]))
    assert sorted(hybrid) == list(range(1, 10))
    difference = max_difference(hybrid, plain)
    print(f"max abs loss difference, replicate 2 x shard 2 (2 agents) vs shard 4 (1 agent): {difference:.2e}")
    assert difference <= LOSS_TOLERANCE
    # each host sealed the same marker, listing every host's files (SageMaker syncs both disks to one S3 prefix)
    markers = [(ckpt(tmp / "two", host) / "step_00000009" / "COMPLETE").read_text() for host in HOSTS]
    assert markers[0] == markers[1]
    listed = set(json.loads(markers[0])["files"])
    on_disks = {p.name for host in HOSTS for p in (ckpt(tmp / "two", host) / "step_00000009").iterdir()} - {
        "COMPLETE"
    }
    assert listed == on_disks and json.loads(markers[0])["data_parallel"] == [2, 2]
    # the model and its Hugging Face export, gathered on rank 0 (the first host)
    assert (tmp / "two" / HOSTS[0] / "opt_ml" / "code" / "model" / "hf" / "model.safetensors").is_file()


def merged(sources: list[Path], target: Path) -> None:
    """``target`` holds every file of ``sources`` (checkpoint folders of one step on several hosts), as the S3
    prefix SageMaker syncs them to, and every host's download of it, does."""
    target.mkdir(parents=True)
    for source in sources:
        for path in source.iterdir():
            if not (target / path.name).exists():
                shutil.copy2(path, target / path.name)


def test_a_checkpoint_resumes_from_four_processes_on_two_and_back(runs):
    tmp, two, _ = runs
    reference = as_floats(losses(two[0][1]))
    # 4 ranks (2 agents, replicate 2 x shard 2) -> 2 ranks (1 agent, shard 2), batch 8 so a step has the same samples
    step_3 = [ckpt(tmp / "two", host) / "step_00000003" for host in HOSTS]
    single = tmp / "resume" / "algo-1"
    merged(step_3, single / "ckpt-step3")
    toolkit_job(single, {})
    merged([single / "ckpt-step3"], single / "opt_ml" / "code" / "ckpt" / "step_00000003")
    [(status, output)] = run_job(
        tmp / "resume", {**SETTINGS, "max_steps": "9", "batch_size": "8"}, hosts=("algo-1",)
    )
    assert status == 0, output
    assert (
        "layout changed: the checkpoint was written by 4 ranks (replicate 2 x shard 2), this run has 2 (shard 2)"
        in output
    )
    assert (
        "data: the checkpoint's 4 ranks x 4 samples per step consumed 48 samples; 2 ranks x 8 continue from sample 48"
        in output
    )
    down = as_floats(losses(output))
    assert sorted(down) == list(
        range(4, 10)
    )  # the same schedule (max_steps 9): its step-6 checkpoint goes back
    # ... and back: its step-6 checkpoint on the two agents (each host's disk gets all of it, as from S3)
    back = tmp / "back"
    for host in HOSTS:
        (back / host).mkdir(parents=True)
        toolkit_job(back / host, {}, hosts=HOSTS, current=host)
        merged([single / "opt_ml" / "code" / "ckpt" / "step_00000006"], ckpt(back, host) / "step_00000006")
    # with 2 micro-batches of 2 per step (gradient accumulation under hybrid sharding: the same 4 samples a rank)
    back_settings = {**SETTINGS, "max_steps": "9", "data_parallel_replicate": "2", "batch_size": "2"}
    results = run_job(back, {**back_settings, "grad_accum_steps": "2"})
    for status, output in results:
        assert status == 0, output
    output = results[0][1]
    assert "this run has 4 (replicate 2 x shard 2)" in output and "continue from sample 96" in output
    up = as_floats(losses(output))
    difference = max(max_difference(down, {s: reference[s] for s in down}),
                     max_difference(up, {s: reference[s] for s in up}))  # fmt: skip
    print(f"max abs loss difference of the resumed steps 4-9 vs the uninterrupted run: {difference:.2e}")
    assert sorted(up) == [7, 8, 9] and difference <= LOSS_TOLERANCE


def test_a_host_that_never_comes_is_named_in_one_line_within_the_bound(tmp_path):
    [(status, output)] = run_job(tmp_path, {**SETTINGS, "max_steps": "3"}, started=HOSTS[:1], HOST_JOIN_TIMEOUT="5",
                                 timeout=180)  # fmt: skip
    assert status == 1, output
    errors = [line for line in output.splitlines() if "error:" in line]
    expected = "host localhost did not join at 127.0.0.1:"
    assert (
        len(errors) == 1
        and expected in errors[0]
        and "within 5 s (HOST_JOIN_TIMEOUT; joined: 127.0.0.1)" in errors[0]
    )
    reason = (tmp_path / HOSTS[0] / "opt_ml" / "output" / "failure").read_text()
    assert reason.startswith(expected) and len(reason.splitlines()) == 1
    assert "train.sh: torchrun" not in output  # torchrun never started
