"""The fork servers of the trainer tests (tests/zygote.py): what they serve, and that a served process behaves as a
new interpreter would for its caller (output, exit status, signals, a killed caller)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests import zygote, zygote_shim
from tests.training.runner import PYTHON, ROOT, env

PROBE = "tests/training/zygote_probe.py"  # beside the other probes (tests/ itself holds a training/ package)


def test_what_is_served_and_what_runs_in_a_new_interpreter(tmp_path):
    served = env()
    sockets = zygote_shim.servers(served)
    assert sockets
    repository = next(iter(sockets.values()))
    assert (
        zygote_shim.served(["-u", "-m", "training.trainer", "--max_steps", "1"], served, str(ROOT))
        == repository
    )
    assert (
        zygote_shim.served(["-m", "torch.distributed.run", "--standalone"], served, str(tmp_path))
        == repository
    )
    assert zygote_shim.served([PROBE], served, str(ROOT)) == repository
    assert zygote_shim.served(["-m", "json.tool"], served, str(ROOT)) is None  # not a trainer module
    assert zygote_shim.served(["-c", "print(1)"], served, str(ROOT)) is None
    assert (
        zygote_shim.served(["-X", "dev", "-m", "training.trainer"], served, str(ROOT)) is None
    )  # unknown option
    outside = tmp_path / "script.py"
    outside.write_text("print(1)\n")
    assert (
        zygote_shim.served([str(outside)], served, str(ROOT)) is None
    )  # only the repository's tests/ scripts
    copy = tmp_path / "copy"
    (copy / "training").mkdir(parents=True)
    (copy / "training" / "__init__.py").write_text("")
    elsewhere = str(tmp_path)  # python -m looks in its folder first, then PYTHONPATH
    assert (
        zygote_shim.served(["-m", "training.trainer"], {**served, "PYTHONPATH": str(copy)}, elsewhere) is None
    )
    assert (
        zygote_shim.served(["-m", "training.trainer"], {**served, "PYTHONPATH": str(ROOT)}, str(copy)) is None
    )
    assert (
        zygote_shim.served(["-m", "training.trainer"], dict(os.environ), str(ROOT)) is None
    )  # no server named


def test_a_served_program_is_forked_with_torch_imported_and_exits_as_it_did():
    served = subprocess.run(
        [PYTHON, PROBE, "3"], env=env(), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    fresh = subprocess.run([sys.executable, PROBE, "3"], env=env(), cwd=ROOT, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert served.returncode == fresh.returncode == 3, (served.stderr, fresh.stderr)
    assert "torch_imported=True" in served.stdout and f"ppid={zygote.pids()[0]}" in served.stdout
    assert "torch_imported=False" in fresh.stdout
    assert served.stdout.split("argv=")[1] == fresh.stdout.split("argv=")[1] == "['3']\n"


def waiting_probe() -> tuple[subprocess.Popen, int]:
    """The probe waiting for a signal, through the shim; the shim and the probe's pid."""
    shim = subprocess.Popen([PYTHON, PROBE, "wait"], env=env(), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert shim.stdout is not None
    line = shim.stdout.readline()
    return shim, int(line.split()[0].removeprefix("pid="))


def gone(pid: int, guard: float = 60.0) -> bool:
    """Whether ``pid`` ends (or is a zombie) within ``guard`` seconds: a guard against a hang, not a verdict."""
    deadline = time.monotonic() + guard
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_signal_to_the_shim_reaches_the_forked_process_and_the_shim_ends_as_it_ended():
    shim, pid = waiting_probe()
    assert pid != shim.pid
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(timeout=120) == -signal.SIGTERM
    assert gone(pid)


def test_a_killed_shim_takes_its_forked_process_with_it():
    shim, pid = waiting_probe()
    shim.kill()
    shim.wait(timeout=120)
    assert gone(pid)
