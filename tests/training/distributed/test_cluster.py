"""The job's hosts before torchrun (training.trainer.distributed.cluster, training.trainer.distributed.launch): resourceconfig.json, name
resolution within a bound, the roll call over real sockets (threads standing in for hosts), torchrun's node
options, the network report; and the trainer's layout (parallel.data_parallel_replicate) and data position
across layouts. Fast: no torchrun (the two-agent runs are tests/training/test_multinode.py)."""

from __future__ import annotations

import io
import json
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.training.runner import TINY, free_ports
from training.contract import settings_table
from training.trainer import config, refusal
from training.trainer.data import token_files
from training.trainer.distributed import cluster, launch, parallel


def write_config(base: Path, hosts: list[str], current: str, **extra) -> Path:
    path = base / cluster.RESOURCE_CONFIG
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"current_host": current, "hosts": hosts, **extra}))
    return path


def test_hosts_come_from_resourceconfig_json_in_its_order(tmp_path, monkeypatch):
    monkeypatch.setenv(cluster.BASE_DIR_ENV, str(tmp_path))
    assert cluster.Hosts.read().names == ("localhost",)  # no file: one host
    write_config(tmp_path, ["algo-1", "algo-2", "algo-3"], "algo-2", network_interface_name="eth0",
                 current_instance_type="ml.p6-b200.48xlarge")  # fmt: skip
    hosts = cluster.Hosts.read()
    assert (hosts.count, hosts.rank, hosts.master, hosts.interface) == (3, 1, "algo-1", "eth0")
    assert cluster.current_instance_type() == "ml.p6-b200.48xlarge"
    assert cluster.torchrun_node_args(hosts, 6000) == [
        "--nnodes=3", "--node-rank=1", "--master-addr=algo-1", "--master-port=6000"
    ]  # fmt: skip
    write_config(tmp_path, ["algo-1"], "algo-9")
    with pytest.raises(cluster.JoinError, match="current_host 'algo-9' is not one of its hosts"):
        cluster.Hosts.read()


def test_names_are_retried_until_they_resolve_and_those_that_never_do_are_named():
    tries = {"algo-2": 0}

    def lookup(name):
        if name == "algo-2" and tries["algo-2"] < 2:
            tries["algo-2"] += 1
            raise OSError("not yet")
        if name == "algo-3":
            raise OSError("never")

    cluster.resolve(["algo-1", "algo-2"], 30.0, lookup, every=0.01)
    assert tries["algo-2"] == 2
    with pytest.raises(cluster.JoinError) as refused:
        cluster.resolve(["algo-1", "algo-3"], 0.2, lookup)
    assert str(refused.value) == (
        "host algo-3 did not resolve within 0.2 s (HOST_JOIN_TIMEOUT; the job's hosts: algo-1, algo-3)"
    )


def roll_call(names, bound, nprocs, started=None):
    """Each started host's roll call in a thread, over real sockets on this machine; their errors (None: joined)."""
    port = free_ports()
    errors: dict[str, str | None] = {}

    def host(name: str, nproc: int) -> None:
        try:
            cluster.roll_call(cluster.Hosts(tuple(names), name), port, bound, nproc)
            errors[name] = None
        except cluster.JoinError as err:
            errors[name] = str(err).replace(str(port), "PORT")

    threads = [threading.Thread(target=host, args=(n, p)) for n, p in zip(names, nprocs, strict=True)
               if started is None or n in started]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def test_the_roll_call_lets_every_host_through_once_all_have_answered():
    assert roll_call(["127.0.0.1", "localhost"], 30.0, [2, 2]) == {"127.0.0.1": None, "localhost": None}


def test_a_host_that_never_comes_is_named_on_the_first_host_and_on_those_that_came():
    errors = roll_call(
        ["127.0.0.1", "localhost", "algo-3"], 1.0, [2, 2, 2], started={"127.0.0.1", "localhost"}
    )
    line = "host algo-3 did not join at 127.0.0.1:PORT within 1 s (HOST_JOIN_TIMEOUT; joined: 127.0.0.1, localhost)"
    assert errors == {"127.0.0.1": line, "localhost": line}


def test_hosts_that_differ_in_processes_are_refused_together():
    errors = roll_call(["127.0.0.1", "localhost"], 30.0, [8, 7])
    line = "hosts differ in processes per node: 127.0.0.1 has 8, localhost has 7"
    assert errors == {"127.0.0.1": line, "localhost": line}


def test_a_first_host_that_never_answers_is_named():
    errors = roll_call(["127.0.0.1", "localhost"], 1.0, [2, 2], started={"localhost"})
    assert errors == {
        "localhost": "host 127.0.0.1 (the first host, where the job meets) did not answer at 127.0.0.1:PORT within "
        "1 s (HOST_JOIN_TIMEOUT)"
    }


def test_the_launcher_adds_node_options_unless_given_and_on_one_host_runs_standalone(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(cluster.BASE_DIR_ENV, str(tmp_path))
    argv = ["--nproc-per-node=2", "-m", "training.trainer", "--max_steps", "3"]
    assert launch.node_arguments(["--standalone", *argv], {}) == ["--standalone", *argv]
    assert launch.node_arguments(argv, {}) == ["--standalone", *argv]  # no resourceconfig.json: one host
    assert "train.sh: network: NCCL not used (no GPU: gloo)" in capsys.readouterr().out
    write_config(tmp_path, ["127.0.0.1", "localhost"], "127.0.0.1", network_interface_name="lo")
    environ = {"HOST_JOIN_TIMEOUT": "0.5", "MASTER_PORT": str(free_ports())}
    with pytest.raises(cluster.JoinError, match="host localhost did not join at 127.0.0.1:"):
        launch.node_arguments(argv, environ)
    assert environ["NCCL_SOCKET_IFNAME"] == "lo"  # SageMaker's interface, as the toolkit's runner sets it
    monkeypatch.setenv("HOST_JOIN_TIMEOUT", "0.5")
    monkeypatch.setenv("MASTER_PORT", str(free_ports()))
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth9")  # a value already set is kept
    capsys.readouterr()
    assert launch.main(argv) == 1  # a host that never joined: a failure (exit 1), one line
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: host localhost did not join at 127.0.0.1:")


def test_every_stale_variable_is_warned_about_and_left_as_the_docs_say():
    hosts = cluster.Hosts(("algo-1", "algo-2"), "algo-1")
    stale = {
        **{name: "1" for name in cluster.STALE_VARIABLES},
        "NCCL_PROTO": "simple",
        "RDMAV_HUGEPAGES_SAFE": "1",
    }
    environ = {**stale, "FI_EFA_USE_HUGE_PAGE": "0", "NCCL_DEBUG": "INFO"}  # advised or harmless: no word
    lines = cluster.network_report(hosts, environ)
    assert lines[0].startswith("network: NCCL ") and "EFA devices: none" in lines[0]
    warned = {line.split()[1].split("=")[0] for line in lines if line.startswith("warning: ")}
    assert warned == set(stale) and len(lines) == 1 + len(stale)
    assert (
        "warning: NCCL_PROTO=simple is set in the environment: only for aws-ofi-nccl 1.5 and older"
        in lines[1 + sorted(stale).index("NCCL_PROTO")]
    )
    assert all(line.endswith("; left as set") for line in lines[1:])
    assert environ == {**stale, "FI_EFA_USE_HUGE_PAGE": "0", "NCCL_DEBUG": "INFO"}  # nothing cleaned
    # no GPU: no EFA warning either
    assert not any(line.startswith("warning") for line in cluster.network_report(hosts, {}))
    # the page lists every variable the code warns of
    page = (Path(__file__).resolve().parents[3] / "docs" / "multi-node.md").read_text()
    assert all(f"`{name}" in page for name in cluster.STALE_VARIABLES)


@pytest.mark.parametrize(
    ("preset", "warned"),
    [("eth0", False), ("eth", False), ("=eth0", False), ("^lo,docker", False), ("eth9", True), ("=eth", True),
     ("^eth", True), ("^=eth0", True), ("lo,docker0", True)],
)  # fmt: skip
def test_a_preset_socket_interface_is_kept_with_a_warning_when_it_misses_sagemakers(preset, warned):
    hosts = cluster.Hosts(("algo-1", "algo-2"), "algo-1", interface="eth0")
    assert cluster.socket_interface(hosts, {}) == (
        "eth0", "NCCL_SOCKET_IFNAME=eth0 (resourceconfig.json's network interface)"
    )  # fmt: skip
    value, line = cluster.socket_interface(hosts, {"NCCL_SOCKET_IFNAME": preset})
    assert value is None  # never overridden
    assert (line is not None) == warned
    if warned:
        assert line == (
            f"warning: NCCL_SOCKET_IFNAME={preset} is set in the environment and does not select resourceconfig.json's "
            "network interface eth0: NCCL's bootstrap and socket traffic between hosts use what it names; left as set"
        )
    assert cluster.socket_interface(cluster.Hosts(("algo-1",), "algo-1", interface="eth0"), {}) == (
        None,
        None,
    )


class _Pipe(io.RawIOBase):
    """One pipe both streams write into, as the toolkit reads a child's stdout and stderr."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.chunks.append(bytes(data))
        return len(data)


def test_the_launchers_lines_come_before_its_error_when_both_streams_are_a_pipe(tmp_path, monkeypatch):
    chunks: list[bytes] = []
    # Python's streams on a pipe: stdout block-buffered, stderr line-buffered
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(_Pipe(chunks))))
    monkeypatch.setattr(
        sys, "stderr", io.TextIOWrapper(io.BufferedWriter(_Pipe(chunks)), line_buffering=True)
    )
    monkeypatch.setenv(cluster.BASE_DIR_ENV, str(tmp_path))
    write_config(tmp_path, ["127.0.0.1", "localhost"], "127.0.0.1", network_interface_name="lo")
    monkeypatch.setenv("HOST_JOIN_TIMEOUT", "0.3")
    monkeypatch.setenv("MASTER_PORT", str(free_ports()))
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert launch.main(["--nproc-per-node=1", "-m", "training.trainer"]) == 1
    sys.stdout.flush()
    text = b"".join(chunks).decode()
    lines = [
        line for line in text.splitlines() if "NCCL_SOCKET_IFNAME=lo" in line or line.startswith("error:")
    ]
    assert (
        len(lines) == 2
        and lines[0] == "train.sh: NCCL_SOCKET_IFNAME=lo (resourceconfig.json's network interface)"
    )


def test_a_current_host_missing_from_the_host_list_is_named_once_and_becomes_the_failure_reason(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(cluster.BASE_DIR_ENV, str(tmp_path))
    # a SageMaker job, as the toolkit runs train.sh
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path / "model"))
    monkeypatch.setenv("SM_OUTPUT_DIR", str(tmp_path / "output"))
    path = write_config(tmp_path, ["algo-1", "algo-2"], "algo-3")
    assert cluster.main(["--count"]) == 2
    line = f"{path}: current_host 'algo-3' is not one of its hosts ['algo-1', 'algo-2']"
    assert capsys.readouterr().err == f"error: {line}\n"
    assert (tmp_path / "output" / "failure").read_text() == line + "\n"
    path.write_text("{not json")
    (tmp_path / "output" / "failure").unlink()
    assert cluster.main(["--count"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: cannot be read as JSON: ") and err.count(str(path)) == 1


def test_a_join_timeout_that_is_no_bound_is_refused_naming_the_variable(tmp_path, monkeypatch, capsys):
    allowed = "HOST_JOIN_TIMEOUT must be a number of seconds above 0 and at most 86400 (default 600)"
    for value in ("abc", "nan", "inf", "0", "-5", "86401"):
        with pytest.raises(cluster.SettingError) as refused:
            cluster.join_timeout({"HOST_JOIN_TIMEOUT": value})
        assert str(refused.value) == f"{allowed}; got {value!r}"
    assert cluster.join_timeout({"HOST_JOIN_TIMEOUT": "2.5"}) == 2.5 and cluster.join_timeout({}) == 600
    monkeypatch.setenv(cluster.BASE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path / "model"))
    monkeypatch.setenv("SM_OUTPUT_DIR", str(tmp_path / "output"))
    write_config(tmp_path, ["127.0.0.1", "localhost"], "127.0.0.1")
    monkeypatch.setenv("HOST_JOIN_TIMEOUT", "nan")
    monkeypatch.setenv("MASTER_PORT", str(free_ports()))
    assert launch.main(["--nproc-per-node=1", "-m", "training.trainer"]) == 2  # refused, before the roll call
    assert capsys.readouterr().err == f"error: {allowed}; got 'nan'\n"
    assert (tmp_path / "output" / "failure").read_text() == f"{allowed}; got 'nan'\n"


def agent_store():
    """A store as torchrun's agent on the first host holds it (the test's port)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))


def test_the_workers_meet_once_all_have_come_and_name_the_host_whose_workers_never_do():
    server = agent_store()
    hosts = {0: "127.0.0.1", 1: "127.0.0.1", 2: "localhost", 3: "localhost"}
    errors: dict[int, str | None] = {}

    def worker(rank: int, bound: float, attempt: str) -> None:
        store = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)
        try:
            cluster.workers_meet(store, cluster.Hosts(HOSTS, hosts[rank]), rank, 4, 2, bound, attempt)
            errors[rank] = None
        except cluster.JoinError as err:
            errors[rank] = str(err)

    def run(ranks, bound, attempt):
        threads = [threading.Thread(target=worker, args=(rank, bound, attempt)) for rank in ranks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

    run(range(4), 30.0, "0")
    assert errors == dict.fromkeys(range(4))
    errors.clear()
    run([0, 1], 0.5, "1")  # a restart's attempt: the first attempt's keys do not count
    line = (
        "host localhost (ranks 2-3) was lost after the roll call: its workers did not meet this host's within 0.5 s "
        "(HOST_JOIN_TIMEOUT; this is 127.0.0.1)"
    )
    assert errors == {0: line, 1: line}


HOSTS = ("127.0.0.1", "localhost")


def init_in_thread(monkeypatch, tmp_path, rank: int, port: int) -> BaseException | None:
    """``parallel.init_distributed`` as torchrun starts rank ``rank`` of 2 (one per host) in this process, in a
    thread that may take at most 30 s (a guard: the bound is 0.5 s); what it raised."""
    monkeypatch.setenv(cluster.BASE_DIR_ENV, str(tmp_path))
    write_config(tmp_path, list(HOSTS), HOSTS[rank])
    for name, value in {"RANK": rank, "LOCAL_RANK": 0, "WORLD_SIZE": 2, "LOCAL_WORLD_SIZE": 1, "MASTER_PORT": port,
                        "MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_USE_AGENT_STORE": "True",
                        "HOST_JOIN_TIMEOUT": "0.5"}.items():  # fmt: skip
        monkeypatch.setenv(name, str(value))
    raised: list[BaseException] = []

    def start() -> None:
        try:
            parallel.init_distributed()
        except BaseException as err:  # noqa: BLE001 (the test looks at it)
            raised.append(err)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "init_distributed still waits: the lost host was not bounded"
    assert not dist.is_initialized()
    return raised[0] if raised else None


def test_a_host_lost_after_the_roll_call_is_named_by_the_other_within_the_bound(tmp_path, monkeypatch):
    server = agent_store()  # the first host's agent; the second host's worker never comes
    err = init_in_thread(monkeypatch, tmp_path, 0, server.port)
    assert isinstance(err, cluster.JoinError) and str(err) == (
        "host localhost (rank 1) was lost after the roll call: its workers did not meet this host's within 0.5 s "
        "(HOST_JOIN_TIMEOUT; this is 127.0.0.1)"
    )
    # the first host gone: nothing holds the store
    err = init_in_thread(monkeypatch, tmp_path, 1, free_ports())
    assert isinstance(err, cluster.JoinError) and str(err).startswith(
        "host 127.0.0.1 (rank 0) (the first host, whose torchrun agent holds the workers' store) was lost after "
        "the roll call"
    )


def test_a_worker_that_finds_a_host_lost_says_it_once_as_the_jobs_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path / "model"))
    monkeypatch.setenv("SM_OUTPUT_DIR", str(tmp_path / "output"))
    monkeypatch.setenv(refusal.FAILURE_MARKER_ENV, str(tmp_path / "failed"))
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert refusal.fail_before_group("host localhost (rank 1) was lost after the roll call") == refusal.FAILED
    assert capsys.readouterr().err == "error: host localhost (rank 1) was lost after the roll call\n"
    reason = (tmp_path / "output" / "failure").read_text()
    assert reason == "host localhost (rank 1) was lost after the roll call\n"
    assert refusal.refused(refusal.FAILURE_MARKER_ENV) is not None  # the launcher then adds nothing


def test_efa_devices_are_the_rdma_devices_whose_driver_is_efa(tmp_path):
    for name, driver in (("rdmap16s27", "efa"), ("rdmap32s27", "efa"), ("mlx5_0", "mlx5_core")):
        (tmp_path / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        (tmp_path / "class" / name / "device").mkdir(parents=True)
        (tmp_path / "class" / name / "device" / "driver").symlink_to(tmp_path / "drivers" / driver)
    assert cluster.efa_devices(tmp_path / "class") == ["rdmap16s27", "rdmap32s27"]
    assert cluster.efa_devices(tmp_path / "none") == []


def tiny(**settings) -> config.TrainConfig:
    return config.config_from_mapping({**TINY, **settings})


def test_the_layout_is_checked_against_the_world_and_auto_asks_the_plan(tmp_path, monkeypatch):
    monkeypatch.setenv(cluster.BASE_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("SM_CURRENT_INSTANCE_TYPE", raising=False)
    assert parallel.data_parallel_replicate(tiny(data_parallel_replicate="2"), 4, 2) == (2, "set")
    with pytest.raises(settings_table.ContractError) as refused:
        parallel.data_parallel_replicate(tiny(data_parallel_replicate="3"), 4, 2)
    assert str(refused.value) == (
        "data_parallel_replicate: must divide the number of GPUs (4); got 3 (2 node(s) x 2 processes); or auto"
    )
    assert parallel.data_parallel_replicate(tiny(), 2, 2) == (1, "auto: one node")
    replicate, why = parallel.data_parallel_replicate(tiny(), 4, 2)
    assert replicate == 1 and why.startswith("auto: instance type unknown")
    write_config(tmp_path, ["a", "b"], "a", current_instance_type="ml.p6-b200.48xlarge")
    assert parallel.data_parallel_replicate(tiny(), 4, 2)[0] == 2  # the tiny model fits on one instance
    big = tiny(model_preset="llama3.1-70b", num_layers=None, hidden_size=None, num_heads=None, ffn_hidden_size=None,
               vocab_size=None, seq_length="8192", precision="bf16", batch_size="4", activation_checkpointing="full")  # fmt: skip
    assert parallel.data_parallel_replicate(big, 32, 8)[0] == 1  # 70B at micro-batch 4 does not


def test_the_data_continue_from_the_first_sample_not_trained_on_in_another_layout():
    written = token_files.SyntheticTokens(256, 16, 4, seed=7, rank=0, world_size=4)
    for _ in range(3):
        written.next_batch()
    state = written.state_dict()
    assert state == {"position": 3, "offset": 0, "world_size": 4, "batch_size": 4}
    # the next global batch of the 4 x 4 layout is samples 48-63; 2 ranks x 8 read exactly those
    expected = [token_files.SyntheticTokens(256, 16, 4, seed=7, rank=r, world_size=4) for r in range(4)]
    for source in expected:
        source.load_state_dict(state)
    wanted = [s.next_batch()[0] for s in expected]
    resumed = [token_files.SyntheticTokens(256, 16, 8, seed=7, rank=r, world_size=2) for r in range(2)]
    notes = [source.load_state_dict(state) for source in resumed]
    assert notes[0] == (
        "data: the checkpoint's 4 ranks x 4 samples per step consumed 48 samples; 2 ranks x 8 continue from sample "
        "48 of the same order"
    )
    got = [s.next_batch()[0] for s in resumed]
    assert all((got[i // 2][4 * (i % 2) : 4 * (i % 2) + 4] == wanted[i]).all() for i in range(4))
    same = token_files.SyntheticTokens(256, 16, 4, seed=7, rank=1, world_size=4)
    assert same.load_state_dict(state) is None and same.position == 3
    old = token_files.SyntheticTokens(256, 16, 4, seed=7, rank=1, world_size=2)
    assert old.load_state_dict({"position": 5}) is None and old.position == 5  # before layouts were recorded
