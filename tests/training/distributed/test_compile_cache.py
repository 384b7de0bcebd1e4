"""A damaged compile cache entry (what a run stopped mid-compile leaves: a 0-byte or truncated ``.so``, a half-written
precompiled header) neither fails the suite's compile tests, which compile in their run's own folder
(tests/run_folder.py), nor stops a trainer run that meets it: the run says where its cache is, names the entry and
how to clear it, and trains eagerly."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import run_folder
from tests.training.runner import ROOT, TINY, cli_args, env
from training.trainer.distributed import compile as compiling

A_SHARED_OBJECT = Path(torch.__file__).parent / "lib" / "libtorch_global_deps.so"


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """Inductor's cache, its precompiled headers and Triton's cache in folders of this test."""
    from torch._inductor import codecache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(codecache, "_HEADER_DIR", str(tmp_path / "headers"), raising=False)
    (tmp_path / "headers").mkdir()
    yield tmp_path / "inductor"
    compiling.reset()


def planted(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_damaged_entry_is_named_with_how_to_clear_it_the_one_the_error_names_first(cache):
    whole = A_SHARED_OBJECT.read_bytes()
    empty = planted(cache / "ab" / "cab.main.so", b"")
    truncated = planted(cache / "cd" / "ccd.so", whole[: len(whole) // 2])
    planted(cache / "ef" / "cef.so", whole)  # whole: never named
    planted(cache / "gh" / "cgh.py", b"")  # a source (written atomically by Inductor): not a compiled entry
    load_error = ImportError(f"{truncated}: file too short")
    assert compiling.is_compile_failure(load_error)
    assert not compiling.is_compile_failure(
        ImportError("/usr/lib/libfoo.so: file too short")
    )  # not the cache's
    assert not compiling.is_compile_failure(OSError("No space left on device"))
    assert compiling.damaged_entries(load_error) == [
        (truncated, f"truncated: {len(whole) // 2} of at least {len(whole)} bytes"),
        (empty, "0 bytes"),
    ]
    assert compiling.damaged_line(compiling.damaged_entries(load_error)) == (
        f"warning: damaged compile cache entry {truncated} (truncated: {len(whole) // 2} of at least "
        f"{len(whole)} bytes) and 1 more: clear with `rm -f {truncated} {empty}`, and the next run compiles again"
    )
    assert compiling.damaged_line(compiling.damaged_entries(), listed=1).endswith(
        f"and 1 more: clear with `rm -rf {cache}`, and the next run compiles again"
    )


def test_a_precompiled_header_the_compiler_cannot_read_is_named(cache, tmp_path):
    from torch._inductor.exc import CppCompileError

    header = planted(tmp_path / "headers" / "chdr.h", b"#include <torch/csrc/inductor/cpp_prefix.h>\n")
    planted(Path(f"{header}.gch"), b"gpch" + bytes(1000))  # half-written: only the compiler can tell
    error = CppCompileError(
        [
            "g++",
            str(cache / "jb" / "cjb.main.cpp"),
            "-include",
            str(header),
            "-o",
            str(cache / "jb" / "cjb.so"),
        ],
        "<command-line>: fatal error: cannot read PCH file: No such file or directory\ncompilation terminated.\n",
    )
    assert compiling.damaged_entries(error) == [(Path(f"{header}.gch"), "the C++ compiler cannot read it")]
    assert (
        compiling.damaged_entries(CppCompileError(["g++", "-include", str(header)], "error: 'x' undeclared"))
        == []
    )
    assert compiling.cache_line() == (
        f"compile cache: {cache} (Inductor's, TORCHINDUCTOR_CACHE_DIR), its precompiled C++ headers in "
        f"{tmp_path / 'headers'}, Triton's kernels in {tmp_path / 'triton'}"
    )


def test_a_load_error_naming_a_damaged_entry_runs_eagerly_with_the_entry_named_and_any_other_is_raised(
    cache, capsys
):
    empty = planted(cache / "ab" / "cab.main.so", b"")

    def damaged(x):
        raise ImportError(f"{empty}: file too short")

    def elsewhere(x):
        raise ImportError("/usr/lib/libfoo.so: file too short")

    with pytest.raises(ImportError, match="libfoo"):
        compiling.guarded(elsewhere, lambda x: x + 1, "f")(1)
    assert compiling.failure() is None
    assert compiling.guarded(damaged, lambda x: x + 1, "a block's forward")(1) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"warning: torch.compile failed compiling a block's forward (ImportError: {empty}: file too short); every "
        "block and loss chunk runs eagerly",
        f"warning: damaged compile cache entry {empty} (0 bytes): clear with `rm -f {empty}`, and the next run "
        "compiles again",
    ]


COMPILE_AND_BACKWARD = """
import json, sys
from pathlib import Path
import torch
from training.trainer.distributed import compile as compiling

compiling.disable_autograd_cache()  # as the trainer: the backward graph compiles lazily, at the first backward


def f(x, w):
    return torch.nn.functional.gelu(x @ w).sum()


cache = compiling.cache_locations()["inductor"]
x = torch.linspace(-1, 1, 32).reshape(4, 8).requires_grad_()
w = torch.linspace(-1, 1, 64).reshape(8, 8)
compiled = compiling.guarded(torch.compile(f, fullgraph=True), f, "f")
loss = compiled(x, w)
after_forward = sorted(str(p) for p in cache.rglob("*.so"))
if not compiling.backward(loss, "compiling f's backward"):
    compiled(x, w).backward()  # eager now
print(json.dumps({"forward": after_forward, "all": sorted(str(p) for p in cache.rglob("*.so")),
                  "failure": compiling.failure(), "grad": x.grad.tolist()}))
"""


def compile_and_backward(cache: Path) -> tuple[dict, str]:
    """``COMPILE_AND_BACKWARD`` in a process of its own with Inductor's cache in ``cache``: its JSON and stderr."""
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_AND_BACKWARD], env={**env(), "TORCHINDUCTOR_CACHE_DIR": str(cache)},
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


@pytest.mark.slow
def test_a_0_byte_library_of_the_backward_graph_in_the_cache_runs_eagerly_naming_it(tmp_path):
    """The issue's leftover, real Inductor: the backward graph's kernel library left empty by a stopped run. The next
    process finds the graph in Inductor's cache and loads the library at its first backward pass, where torch raises
    the load error bare (not as a compile error)."""
    compiled, _ = compile_and_backward(tmp_path / "inductor")
    assert compiled["failure"] is None
    backward_only = sorted(set(compiled["all"]) - set(compiled["forward"]))
    assert backward_only, compiled
    for library in backward_only:
        Path(library).write_bytes(b"")
    again, err = compile_and_backward(tmp_path / "inductor")
    assert again["failure"].startswith("ImportError: ") and "file too short" in again["failure"], again
    (named,) = re.findall(r"^warning: damaged compile cache entry (\S+) \(0 bytes\)", err, re.MULTILINE)
    assert named in backward_only, err
    assert "`rm -f " in err and "and the next run compiles again" in err
    torch.testing.assert_close(
        torch.tensor(again["grad"]), torch.tensor(compiled["grad"])
    )  # eager, same gradient


def developer_shell(machine_tmp: Path) -> dict[str, str]:
    """The environment of a shell on a machine whose temp folder is ``machine_tmp``: none of the suite's folders
    (tests/run_folder.py), none of pytest's variables; the checkout importable, one thread per process."""
    dropped = {*run_folder.FOLDERS, *run_folder.UNSET, run_folder.MARK}
    shell = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("PYTEST_")}
    return {**shell, "TMPDIR": str(machine_tmp), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


PLANT = """
import json, torch
from training.trainer.distributed import compile as compiling

torch.compile(lambda x: torch.nn.functional.gelu(x * 2).sum())(torch.linspace(-1, 1, 64))
print(json.dumps({name: str(path) for name, path in compiling.cache_locations().items()}))
"""
COMPILE_TEST = (
    "tests/training/distributed/test_levers.py::"
    "test_compiled_blocks_and_loss_chunks_train_like_eager_ones_with_every_graph_compiled_in_the_warm_up"
)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_half_written_precompiled_header_in_the_machine_wide_cache_fails_no_compile_test_and_the_trainer_names_it(
    tmp_path,
):
    """A compile in a developer's shell fills torch's default cache, ``<temp dir>/torchinductor_<user>`` (here the
    temp folder is ``machine/``, so no real cache of this machine is touched), then its precompiled header is cut
    to half, as a run killed while g++ wrote it leaves it: every later compile with that cache includes it and
    fails. The trainer run from that shell says where its cache is, names the header and trains eagerly; the
    suite's compile test, started from the same shell with one xdist worker, passes, and leaves it as it was."""
    shell = developer_shell(tmp_path / "machine")
    (tmp_path / "machine").mkdir()
    plant = subprocess.run([sys.executable, "-c", PLANT], env=shell, cwd=ROOT, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert plant.returncode == 0, plant.stderr[-4000:]
    places = {name: Path(path) for name, path in json.loads(plant.stdout.splitlines()[-1]).items()}
    machine_wide = places["inductor"]
    assert machine_wide.parent == tmp_path / "machine" and machine_wide.name.startswith("torchinductor_")
    assert places["precompiled_headers"].is_relative_to(machine_wide)
    headers = sorted(places["precompiled_headers"].glob("*.gch"))
    assert headers, sorted(places["precompiled_headers"].iterdir())
    for header in headers:
        header.write_bytes(header.read_bytes()[: header.stat().st_size // 2])
    damaged = {header: digest(header) for header in headers}

    settings = {**TINY, "max_steps": "2", "compile": "true", "checkpoint_dir": str(tmp_path / "ckpt"),
                "model_dir": str(tmp_path / "model")}  # fmt: skip
    trainer = subprocess.run([sys.executable, "-m", "training.trainer", *cli_args(settings)], env=shell, cwd=ROOT,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    output = trainer.stdout + trainer.stderr
    assert trainer.returncode == 0, output[-4000:]
    assert f"compile cache: {machine_wide} (Inductor's, TORCHINDUCTOR_CACHE_DIR)\n" in trainer.stdout
    assert "warning: torch.compile failed compiling " in trainer.stderr
    (line,) = [
        x for x in trainer.stderr.splitlines() if x.startswith("warning: damaged compile cache entry ")
    ]
    named = Path(line.split()[5])
    assert named in damaged and "(the C++ compiler cannot read it)" in line, line
    assert f"rm -f {named}" in line and line.endswith(", and the next run compiles again")
    assert re.search(r"^step=2/2 ", trainer.stdout, re.MULTILINE)  # trained, eagerly

    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1", COMPILE_TEST],
        env=shell, cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert suite.returncode == 0 and "1 passed" in suite.stdout, suite.stdout[-6000:] + suite.stderr[-3000:]
    (own,) = re.findall(
        r"^run folder \(caches, temporary files, tmp_path\): (\S+)$", suite.stdout, re.MULTILINE
    )
    runs = tmp_path / "machine" / f"blackwell-tests-{os.getuid()}"
    assert sorted(runs.glob("run-*")) == [
        Path(own)
    ]  # the xdist worker compiled in its controller's folder ...
    assert any(Path(own, "torchinductor").rglob("*.so"))  # ... and there
    assert {header: digest(header) for header in headers} == damaged  # the damaged header left as it was
    shutil.rmtree(tmp_path / "machine", ignore_errors=True)  # about 300 MB of compiled code
