"""The image's build context is what the container runs, and one list says what it leaves out.

``training/.dockerignore`` is that list. The image build's source asset (the zip CodeBuild builds from, whose content
hash is the image tag) leaves out exactly what it lists (``constructs_lib.image.project.source_excludes``), less the
build's own ``Dockerfile`` and ``.dockerignore``, so the files CDK stages and hashes are the Docker build context.

What the container runs: the programs the ``Dockerfile`` names (``train.sh``, ``evaluate.sh``, ``entrypoint.sh``,
its ``RUN`` lines), and the Python modules they start (every ``training.<module>`` their lines name: ``python -m
training.trainer``, ``training.trainer.distributed.launch``, ``training.evaluate``, ``training.trainer.selfcheck``, ...), with
everything those import (the import graph of ``tests/test_import_cycles.py``: import statements anywhere and imports
by literal name) and their packages' ``__init__``. The staged context's Python files must be exactly these: a module
the container imports cannot be left out, and a script it never runs (data preparation, the task-folder writer,
development measurements) cannot ride along.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
from pathlib import Path

import aws_cdk as cdk

from constructs_lib.image.build import TRAINING_DIR, TrainingImageBuild
from constructs_lib.image.project import BUILD_FILES, source_excludes
from constructs_lib.image.repository import TrainingImageRepository
from tests.cdk_helpers import DEFAULT_ENV
from tests.test_import_cycles import _graph, _modules

MODULE_NAME = re.compile(r"\btraining(?:\.[A-Za-z_]\w*)+")


def staged(source: Path, outdir: Path) -> tuple[str, set[str]]:
    """The image tag and the files CDK stages (and hashes) for a build from ``source``, relative to it."""
    stack = cdk.Stack(cdk.App(outdir=str(outdir)), "Context", env=DEFAULT_ENV)
    build = TrainingImageBuild(
        stack, "Build", image_repository=TrainingImageRepository(stack, "Images"), source_directory=source
    )
    folder = outdir / f"asset.{build.image_tag}"
    assert folder.is_dir(), f"no staged build context in {outdir}"
    return build.image_tag, {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def named_modules(text: str) -> set[str]:
    """The ``training.<module>`` names a script's or the Dockerfile's lines (not its comments) name."""
    lines = (line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return {name for line in lines for name in MODULE_NAME.findall(line)}


def container_modules(context: set[str], source: Path) -> tuple[set[str], list[str]]:
    """The modules the container runs and imports (with their packages), and the names that are no module."""
    graph = _graph()
    programs = ["Dockerfile", *sorted(name for name in context if name.endswith(".sh"))]
    roots = set().union(*(named_modules((source / name).read_text()) for name in programs))
    unknown = sorted(name for name in roots if name not in graph)
    todo = [name for name in roots if name in graph]
    todo += [f"{name}.__main__" for name in todo if f"{name}.__main__" in graph]  # python -m <package>
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += graph[name]
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a.b.c runs a and a.b
    return seen, unknown


def copied_by_the_dockerfile(name: str, dockerfile: str) -> bool:
    """Whether a ``COPY`` of the Dockerfile names the file (``COPY .`` aside: that is the whole context)."""
    for line in dockerfile.splitlines():
        words = [w for w in line.split()[1:-1] if not w.startswith("--")] if line.startswith("COPY ") else []
        if any(w != "." and fnmatch.fnmatch(name, w) for w in words):
            return True
    return False


def test_the_source_asset_leaves_out_what_dockerignore_lists():
    """One list: the asset's excludes are ``.dockerignore``'s lines, plus keeping the build's own files."""
    lines = [line.strip() for line in (TRAINING_DIR / ".dockerignore").read_text().splitlines()]
    listed = [line for line in lines if line and not line.startswith("#")]
    assert source_excludes(TRAINING_DIR) == [*listed, "!Dockerfile", "!.dockerignore"]
    assert {"measure", "prepare/corpus.py", "**/__pycache__"} <= set(listed)


def test_the_build_context_is_what_the_container_runs(tmp_path):
    _, context = staged(TRAINING_DIR, tmp_path / "cdk.out")
    modules, unknown = container_modules(context, TRAINING_DIR)
    assert unknown == [], f"the container's programs name modules that do not exist: {unknown}"
    paths = _modules()
    needed = {
        paths[name].relative_to(TRAINING_DIR).as_posix() for name in modules if name.startswith("training.")
    }
    needed.add("__init__.py")  # the package training itself
    shipped = {name for name in context if name.endswith(".py")}
    assert needed - shipped == set(), (
        f"the container imports these, but training/.dockerignore leaves them out: {sorted(needed - shipped)}"
    )
    assert shipped - needed == set(), (
        f"the container never runs or imports these: list them in training/.dockerignore: {sorted(shipped - needed)}"
    )
    dockerfile = (TRAINING_DIR / "Dockerfile").read_text()
    others = sorted(name for name in context - shipped if name not in BUILD_FILES)
    assert others and all(copied_by_the_dockerfile(name, dockerfile) for name in others), others
    assert set(BUILD_FILES) <= context  # the build reads them from the asset
    assert {
        "trainer/loop.py",
        "evaluate/run.py",
        "contract/settings_table.py",
        "train.sh",
        "prepare/job.py",
        "prepare/sources.py",
    } <= context
    assert (
        not {"prepare/corpus.py", "prepare/plan.py", "evaluate/prepare_tasks.py", "measure/benchmark.py"}
        & context
    )


def test_the_tag_is_the_hash_of_the_context_only(tmp_path):
    """What the context leaves out does not change the image tag; each kind of file in it does."""
    copy = tmp_path / "training"
    shutil.copytree(TRAINING_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    first, context = staged(copy, tmp_path / "out0")
    for index, name in enumerate(["prepare/corpus.py", "evaluate/prepare_tasks.py", "request/tuning.py"]):
        (copy / name).write_text((copy / name).read_text() + "\n# changed\n")
        assert staged(copy, tmp_path / f"out-left-{index}")[0] == first, name
    for index, name in enumerate(
        ["train.sh", "requirements.txt", "contract/settings_table.py", "Dockerfile"]
    ):
        assert name in context
        original = (copy / name).read_text()
        (copy / name).write_text(original + "\n# changed\n")
        assert staged(copy, tmp_path / f"out-in-{index}")[0] != first, name
        (copy / name).write_text(original)


def test_a_context_of_ones_own_follows_its_dockerignore(tmp_path):
    """A ``source_directory`` of one's own: its ``.dockerignore`` (Docker's rules: ``!`` re-includes) is the list;
    without one, everything is staged."""
    source = tmp_path / "image"
    (source / "notes").mkdir(parents=True)
    (source / "Dockerfile").write_text("FROM scratch\nCOPY . /app/\n")
    (source / "run.py").write_text("print('run')\n")
    (source / "notes" / "a.md").write_text("a\n")
    (source / "keep.md").write_text("k\n")
    _, everything = staged(source, tmp_path / "out0")
    assert everything == {"Dockerfile", "run.py", "notes/a.md", "keep.md"}
    (source / ".dockerignore").write_text(
        "# notes stay home\nnotes\n*.md\n!keep.md\nDockerfile\n.dockerignore\n"
    )
    _, context = staged(source, tmp_path / "out1")
    assert context == {"Dockerfile", ".dockerignore", "run.py", "keep.md"}


def test_the_module_names_of_a_script_are_read():
    script = (
        "# python -m training.measure.benchmark is a comment\n"
        'exec "$python" -m training.tune "$@"\n'
        "case $module in\n    training.trainer | training.tune.trial) ;;\nesac\n"
        "RUN python -m training.trainer.selfcheck --expected-te-version 2.11.0\n"
    )
    assert named_modules(script) == {
        "training.tune",
        "training.trainer",
        "training.tune.trial",
        "training.trainer.selfcheck",
    }
