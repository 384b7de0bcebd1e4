"""training/Dockerfile: base image, TE pin, layer order, layout, build-time self-check (parsed, not built)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from training.contract import container
from training.trainer import selfcheck

TRAINING = Path(__file__).resolve().parents[2] / "training"
DOCKERFILE = TRAINING / "Dockerfile"
DLC_TAG = "2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker"


class _AnyDigest(str):
    """Equal to any sha256 hex digest (the digests themselves are checked for shape in the parser)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and re.fullmatch(r"[0-9a-f]{64}", other) is not None

    __hash__ = str.__hash__


Match_any = _AnyDigest()


@pytest.fixture(scope="module")
def parser() -> DockerfileParser:
    return DockerfileParser(str(DOCKERFILE), cache_content=True)


@pytest.fixture(scope="module")
def instructions(parser) -> list[tuple[str, str]]:
    return [(i["instruction"], i["value"]) for i in parser.structure if i["instruction"] != "COMMENT"]


def _index(instructions, instruction: str, pattern: str) -> int:
    found = [
        n for n, (kind, value) in enumerate(instructions) if kind == instruction and re.search(pattern, value)
    ]
    assert found, f"no {instruction} matching {pattern!r}"
    return found[0]


def test_base_image_is_the_pytorch_dlc_with_registry_region_and_tag_as_args(parser, instructions):
    assert parser.baseimage == f"763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:{DLC_TAG}"
    from_index = _index(instructions, "FROM", ".")
    declared = {value.split("=")[0] for kind, value in instructions[:from_index] if kind == "ARG"}
    assert {"BASE_ACCOUNT", "BASE_REGION", "BASE_TAG"} <= declared
    other = DockerfileParser(
        str(DOCKERFILE),
        build_args={"BASE_ACCOUNT": "626614931356", "BASE_REGION": "af-south-1", "BASE_TAG": "x"},
    )
    assert other.baseimage == "626614931356.dkr.ecr.af-south-1.amazonaws.com/pytorch-training:x"
    china = DockerfileParser(
        str(DOCKERFILE),
        build_args={
            "BASE_ACCOUNT": "727897471807",
            "BASE_REGION": "cn-north-1",
            "BASE_DOMAIN": "amazonaws.com.cn",
        },
    )
    assert china.baseimage.startswith("727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/pytorch-training:")


def _image_requirements() -> dict[str, tuple[str, list[str]]]:
    """training/image-requirements.txt as {name: (pinned version, [sha256 digests])}, parsed with packaging."""
    return _pins(TRAINING / "image-requirements.txt")


def test_every_package_the_image_installs_is_pinned_with_a_hash():
    assert _image_requirements() == {
        "transformer-engine": ("2.11.0", [Match_any]),
        "transformer-engine-cu13": ("2.11.0", [Match_any]),
        "transformer-engine-torch": ("2.11.0", [Match_any]),
        "nvidia-cuda-runtime-cu12": ("12.9.79", [Match_any]),
    }


def test_transformer_engine_is_installed_hash_checked_and_built_against_the_dlc_torch(parser, instructions):
    copy = _index(instructions, "COPY", r"^image-requirements\.txt ")
    run = _index(instructions, "RUN", r"image-requirements\.txt")
    assert copy < run
    te = instructions[run][1]
    assert "--require-hashes" in te and "--no-deps" in te and "-r /tmp/image-requirements.txt" in te
    assert "--no-build-isolation" in te
    assert parser.envs["NVTE_FRAMEWORK"] == "pytorch"
    assert "MAX_JOBS" in te
    # No other pip install of a named package anywhere (everything goes through a hash-checked file).
    for kind, value in instructions:
        if kind == "RUN" and "pip install" in value:
            assert "--require-hashes" in value, value


def test_cuda12_runtime_for_flash_attn_is_on_the_library_path(parser):
    assert parser.envs["LD_LIBRARY_PATH"].startswith(
        "/usr/local/lib/python3.12/site-packages/nvidia/cuda_runtime/lib:"
    )


def test_slow_layers_come_before_the_trainer_code(instructions):
    te = _index(instructions, "RUN", r"image-requirements\.txt")
    requirements = _index(instructions, "COPY", r"requirements\.tx\[t\]")
    trainer = _index(instructions, "COPY", r"^\. /opt/ml/code/training/$")
    entry = _index(instructions, "COPY", r"train\.sh evaluate\.sh entrypoint\.sh /opt/ml/code/$")
    assert te < requirements < trainer < entry
    # Nothing before the trainer COPY copies the trainer itself (which would void the TE layer cache).
    for kind, value in instructions[:trainer]:
        if kind in ("COPY", "ADD"):
            assert "trainer" not in value and not value.startswith(". ")


def test_layout_and_sagemaker_settings_match_the_contract(parser, instructions):
    assert parser.envs["SAGEMAKER_PROGRAM"] == container.ENTRY_POINT
    assert parser.envs["SAGEMAKER_SUBMIT_DIRECTORY"] == container.CONTAINER_CODE_DIR
    assert parser.envs["PYTHONPATH"] == container.CONTAINER_CODE_DIR
    entry = instructions[_index(instructions, "COPY", r"train\.sh")][1]
    assert entry == (
        f"--chmod=0755 {container.ENTRY_POINT} {container.EVALUATE_ENTRY_POINT} entrypoint.sh {container.CONTAINER_CODE_DIR}/"
    )
    for script in (container.ENTRY_POINT, container.EVALUATE_ENTRY_POINT, "entrypoint.sh"):
        assert (TRAINING / script).is_file() and (TRAINING / script).stat().st_mode & 0o111, script


def test_pid1_entrypoint_wraps_the_dlc_entrypoint(parser, instructions):
    # SageMaker's SIGTERM goes to PID 1 only: our forwarder must be PID 1, with the DLC's own entry point under it.
    (entrypoint,) = [value for kind, value in instructions if kind == "ENTRYPOINT"]
    assert json.loads(entrypoint) == [
        f"{container.CONTAINER_CODE_DIR}/entrypoint.sh",
        "bash",
        "-m",
        "start_with_right_hostname.sh",
    ]
    assert _index(instructions, "RUN", r"entrypoint\.sh true$") > _index(
        instructions, "COPY", r"entrypoint\.sh"
    )


def test_build_time_self_checks_run_after_the_code_is_in(instructions):
    trainer = _index(instructions, "COPY", r"^\. /opt/ml/code/training/$")
    check = _index(instructions, "RUN", r"python -m training\.trainer\.selfcheck")
    help_run = _index(
        instructions, "RUN", r"^/opt/ml/code/train\.sh --help && /opt/ml/code/evaluate\.sh --help"
    )
    assert trainer < check and trainer < help_run
    command = instructions[check][1]
    assert "--expected-te-version 2.11.0" in command
    # The flag is the one the trainer's selfcheck accepts.
    selfcheck = TRAINING / "trainer" / "selfcheck.py"
    assert selfcheck.is_file(), "training/trainer/selfcheck.py is referenced by the Dockerfile"
    assert '"--expected-te-version"' in selfcheck.read_text()


def test_requirements_copy_tolerates_a_missing_requirements_file(instructions):
    copy = instructions[_index(instructions, "COPY", r"requirements\.tx\[t\]")][1]
    sources = copy.split()[:-1]
    assert any((TRAINING / source).is_file() for source in sources if "[" not in source), (
        "a COPY with only a non-matching wildcard fails; keep one file that always exists"
    )
    install = instructions[_index(instructions, "RUN", r"/tmp/requirements/requirements\.txt")][1]
    assert "if [ -f /tmp/requirements/requirements.txt ]" in install


def test_dockerignore_keeps_caches_out():
    ignored = (TRAINING / ".dockerignore").read_text().split()
    assert "**/__pycache__" in ignored and "**/*.py[cod]" in ignored


def test_the_development_measurements_stay_out_of_the_image():
    """.dockerignore is the one list (the source asset reads it: tests/constructs/image/test_build_context.py)."""
    from constructs_lib.image.project import source_excludes

    assert "measure" in (TRAINING / ".dockerignore").read_text().split()
    assert "measure" in source_excludes(TRAINING)


def test_the_build_passes_every_arg_the_dockerfile_declares_before_from(instructions):
    from constructs_lib.image.buildspec import buildspec

    from_index = _index(instructions, "FROM", ".")
    declared = {value.split("=")[0] for kind, value in instructions[:from_index] if kind == "ARG"}
    build = next(c for c in buildspec()["phases"]["build"]["commands"] if "buildx build" in c)
    passed = set(re.findall(r"--build-arg (\w+)=", build))
    assert passed == declared


def _pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """A hash-pinned requirements file as {name: (pinned version, [sha256 digests])}."""
    text = path.read_text().replace("\\\n", " ")
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = line.split(" --hash=")
        requirement = Requirement(spec.strip())
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{requirement.name}: pin an exact version"
        digests = [o.strip().removeprefix("sha256:") for o in options]
        assert digests and all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests), requirement.name
        found[canonicalize_name(requirement.name)] = (specifier.version, digests)
    return found


def test_the_trainers_packages_are_hash_pinned_at_the_versions_the_tests_use():
    image = _pins(TRAINING / "requirements.txt")
    shared = (
        "safetensors",
        "tensorboardx",
        "mlflow-skinny",
        "sagemaker-mlflow",
        "lm-eval",
        "transformers",
        "tokenizers",
        "peft",
        "zstandard",
        "pyarrow",
    )
    assert set(shared) <= image.keys()
    dev = {}
    extras = tomllib.loads((TRAINING.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    project = tomllib.loads((TRAINING.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    for entry in extras["train"] + extras["dev"] + extras["eval"] + extras["charts"] + project:
        requirement = Requirement(entry)
        dev[canonicalize_name(requirement.name)] = str(requirement.specifier).removeprefix("==")
    for name in (*shared, "matplotlib"):  # matplotlib: the tuning report's charts, at the CLI's own pin
        assert image[name][0] == dev[name], name
    # the trainer imports exactly these, and the build's self-check imports them
    assert set(selfcheck.TRACKING_MODULES) == {"tensorboardX", "mlflow", "sagemaker_mlflow"}
    assert {"lm_eval", "training.evaluate.run"} <= set(selfcheck.EVALUATION_MODULES)


def test_the_requirements_install_builds_sdists_with_the_dlcs_own_setuptools(instructions):
    """--require-hashes does not cover build dependencies; without build isolation pip fetches none."""
    install = instructions[_index(instructions, "RUN", r"/tmp/requirements/requirements\.txt")][1]
    assert "--require-hashes" in install and "--no-build-isolation" in install
