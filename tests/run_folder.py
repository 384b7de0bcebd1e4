"""One folder per run of the suite for every cache and temporary file, so that nothing an earlier run left on the
machine (a damaged compile cache entry of a run stopped mid-compile, a half-extracted package) can pass or fail a
test.

``enter`` runs once per process, when tests/conftest.py is imported: before any test module imports torch,
transformers or jsii, and before pytest makes its ``tmp_path`` folders. It points the variables of ``FOLDERS`` at
sub-folders of the run's folder (``<temp dir>/blackwell-tests-<uid>/run-*``) and drops those of ``UNSET`` (they
would override them), in this process's environment: every process a test starts (torchrun, train.sh, the
toolkit, jsii's Node, pip) inherits it, unless the test builds an environment of its own on purpose. pytest-xdist's
workers take over their controller's folder (one compile cache per run, not per worker); any other pytest, a
nested one included, makes a new one. Torch's own default location matters twice: Inductor keeps its precompiled
C++ headers in ``<temp dir>/torchinductor_<user>`` whatever ``TORCHINDUCTOR_CACHE_DIR`` says (torch 2.9 to 2.13),
hence ``TMPDIR`` and ``tempfile.tempdir`` too.

The run's folder is locked (``flock``) while its run goes on; a new run removes the folders of finished runs but the
newest ``KEEP`` (a failed run's files stay for a look until the next run after it).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

MARK = "BLACKWELL_TESTS_RUN"
"""``<pid>:<folder>``: the run folder the process ``pid`` made; its pytest-xdist workers (its children) take it."""
FOLDERS = {
    "TMPDIR": "tmp",  # tempfile's and Node's temp dir: pytest's tmp_path, Inductor's default folder and its
    # precompiled headers, the request validator's asset, CDK's cdk.out folders, torchrun's and jsii's files
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
    "TRITON_HOME": "triton-home",
    "XDG_CACHE_HOME": "cache",  # the default root of pip's, Hugging Face's, torch hub's and matplotlib's caches
    "HF_HOME": "huggingface",
    "PIP_CACHE_DIR": "pip",
    "npm_config_cache": "npm",
    "JSII_RUNTIME_PACKAGE_CACHE_ROOT": "jsii",
    "MPLCONFIGDIR": "matplotlib",
}
"""Variable: its sub-folder of the run folder."""
UNSET = (
    "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "HF_ASSETS_CACHE", "HF_MODULES_CACHE",
    "HF_XET_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "TORCH_EXTENSIONS_DIR", "PYTORCH_KERNEL_CACHE_PATH",
)  # fmt: skip
"""Cache locations a shell may set that would win over ``FOLDERS`` (their defaults follow ``HF_HOME`` or
``XDG_CACHE_HOME``)."""
KEEP = 1
"""Finished runs' folders kept besides the running ones."""
_held: list[int] = []  # the lock of the folder this process made, held until it exits


def enter() -> Path:
    """This process's run folder (its xdist controller's, or a new one), with ``FOLDERS`` and ``tempfile`` pointed
    into it and ``UNSET`` removed."""
    pid, _, taken = os.environ.get(MARK, "").partition(":")
    if os.environ.get("PYTEST_XDIST_WORKER") and pid == str(os.getppid()) and Path(taken).is_dir():
        run = Path(taken)
    else:
        parent = Path(tempfile.gettempdir()) / f"blackwell-tests-{os.getuid()}"
        parent.mkdir(mode=0o700, exist_ok=True)
        prune(parent)
        run = _new(parent)
        os.environ[MARK] = f"{os.getpid()}:{run}"
    for name, sub in FOLDERS.items():
        (run / sub).mkdir(exist_ok=True)
        os.environ[name] = str(run / sub)
    for name in UNSET:
        os.environ.pop(name, None)
    tempfile.tempdir = str(run / "tmp")
    return run


def _new(parent: Path) -> Path:
    """A new run folder, locked before it gets its ``run-`` name (``prune`` never sees it unlocked)."""
    making = Path(tempfile.mkdtemp(prefix=".new-", dir=parent))
    lock = os.open(making / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _held.append(lock)
    run = parent / f"run-{making.name.removeprefix('.new-')}"
    making.rename(run)
    return run


def prune(parent: Path, keep: int = KEEP) -> list[Path]:
    """Remove the folders of finished runs under ``parent`` (their lock is free) but the newest ``keep``; return
    those removed. A folder whose run still goes on (locked) is never touched."""
    finished: list[tuple[float, Path, int]] = []
    for folder in parent.glob("run-*"):
        try:
            lock = os.open(folder / ".lock", os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its run goes on
            os.close(lock)
            continue
        finished.append((os.fstat(lock).st_mtime, folder, lock))
    finished.sort(reverse=True)
    removed = [folder for _, folder, _ in finished[keep:]]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    for _, _, lock in finished:
        os.close(lock)
    return removed
