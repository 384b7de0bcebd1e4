"""The ``environment`` field's names (``training.request.fields``): a variable that makes a library of the job load
code from a path, or read or write a file of the execution's choosing, is refused by name with its reason, also
inside the allowed prefixes; the knobs the prefixes are for stay allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.request.decision import validate_request
from training.request.fields import ENVIRONMENT_LOADS_CODE, ENVIRONMENT_PREFIXES, environment_name_refusal
from training.request.rules import RequestRules

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def _problems(environment: dict[str, str]) -> list[str]:
    return validate_request({"environment": environment}, RequestRules())


def test_the_reviews_injection_is_refused_naming_the_variable_and_why():
    problems = validate_request(
        {
            "train_data_uri": "s3://b/data/tasks/",
            "environment": {"CUDA_INJECTION64_PATH": "/opt/ml/input/data/train/x.so"},
        },
        RequestRules(),
    )
    assert problems == [
        "environment.CUDA_INJECTION64_PATH: refused: the CUDA driver loads that library into the process when CUDA "
        "starts; with a file in a data folder, the job would run that code as the workflow's execution role "
        "(docs/security.md lists these names)"
    ]


@pytest.mark.parametrize("name", sorted(ENVIRONMENT_LOADS_CODE))
def test_every_listed_variable_is_refused_with_its_own_reason(name):
    assert name.startswith(ENVIRONMENT_PREFIXES), "only names the prefixes would let through need listing"
    (problem,) = _problems({name: "/opt/ml/input/data/train/x"})
    assert problem.startswith(f"environment.{name}: refused: {ENVIRONMENT_LOADS_CODE[name]};")


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "FI_PROVIDER_PATH",
        "CUDA_INJECTION64_PATH",
    ],
)
def test_the_reviews_named_variables_are_listed(name):
    assert name in ENVIRONMENT_LOADS_CODE


@pytest.mark.parametrize(
    "name",
    ["NCCL_SOMETHING_PLUGIN", "FI_EFA_NEW_LIB", "TORCH_FUTURE_CACHE_DIR", "NVTE_X_PATH", "CUDA_Y_FILE"],
)
def test_a_variable_named_like_a_path_is_refused_even_when_no_version_has_it_yet(name):
    (problem,) = _problems({name: "x"})
    assert "it names a file or folder for a library of the job to load from or write to" in problem


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_TIMEOUT",
        "NCCL_NET",
        "NCCL_ALGO",
        "NCCL_CUMEM_ENABLE",
        "FI_PROVIDER",
        "FI_EFA_USE_DEVICE_RDMA",
        "FI_LOG_LEVEL",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_LOGS",
        "TORCH_DISTRIBUTED_DEBUG",
        "PYTORCH_CUDA_ALLOC_CONF",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_MODULE_LOADING",
        "NVTE_DEBUG",
        "NVTE_FUSED_ATTN",
    ],
)
def test_the_knobs_the_prefixes_are_for_stay_allowed(name):
    assert environment_name_refusal(name) is None
    assert _problems({name: "1"}) == []


def test_the_platforms_own_variables_keep_their_reason():
    assert _problems({"CUDA_VISIBLE_DEVICES": "0"}) == [
        "environment.CUDA_VISIBLE_DEVICES: set by the platform (train.sh starts one process per visible GPU; "
        "hiding GPUs breaks that count)"
    ]


def test_docs_security_names_every_refused_variable_with_its_source():
    text = DOCS.read_text(encoding="utf-8")
    missing = [name for name in ENVIRONMENT_LOADS_CODE if f"`{name}`" not in text]
    assert not missing, f"docs/security.md does not name {missing}"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        # torch 2.13 torch/_native/__init__.py (get_user_ordering_fn): importlib.import_module of the value
        ("TORCH_PYTHON_NATIVE_USER_GRAPH_ORDER_FN", "PyTorch imports the module that value names"),
        # torch 2.9 and 2.13 torch/testing/_internal/common_device_type.py: runpy.run_path of each path listed
        ("TORCH_TEST_DEVICES", "PyTorch's device-type test harness runs the Python files it lists"),
        # torch 2.13 torch/_dynamo/config.py (dynamo_profiler): a path the profile is saved to
        ("TORCH_COMPILE_DYNAMO_PROFILER", "PyTorch writes to that path"),
    ],
)
def test_torch_variables_that_import_run_or_write_what_they_name_are_refused(name, reason):
    """From reading torch 2.9's and 2.13's Python source for environment reads whose value reaches
    ``importlib.import_module``, ``__import__``, ``runpy.run_path``, ``spec_from_file_location``, ``ctypes.CDLL`` or a
    file written (docs/security.md)."""
    (problem,) = _problems({name: "my_package.module.fn"})
    assert problem.startswith(f"environment.{name}: refused: {reason}"), problem


@pytest.mark.parametrize(
    "name",
    ["TORCH_SOMETHING_FN", "PYTORCH_HOOK_MODULE", "TORCH_X_CLASS", "TORCH_Y_CALLABLE", "TORCH_Z_FUNCTION"],
)
def test_a_variable_named_like_a_python_callable_is_refused_before_a_version_has_it(name):
    (problem,) = _problems({name: "package.module.fn"})
    assert "it names Python code (a module, class or function) for a library of the job to import" in problem


@pytest.mark.parametrize(
    "name",
    ["PYTHONPATH", "PYTHONSTARTUP", "PYTHONBREAKPOINT", "PYTHONWARNINGS", "PYTHONHOME", "PYTHONUSERBASE",
     "PYTHONPYCACHEPREFIX", "PYTHONINSPECT", "PYTHONSAFEPATH", "LD_PRELOAD", "LD_LIBRARY_PATH"],
)  # fmt: skip
def test_pythons_own_variables_that_import_or_load_are_outside_the_prefixes(name):
    """Python imports a named callable (PYTHONBREAKPOINT, a PYTHONWARNINGS category), runs a file (PYTHONSTARTUP)
    or reads modules and bytecode from a path (PYTHONPATH, PYTHONHOME, PYTHONUSERBASE, PYTHONPYCACHEPREFIX): none
    of them starts with an allowed prefix, so each is refused as such."""
    (problem,) = _problems({name: "x"})
    assert problem.startswith(f"environment.{name}: name must start with one of NCCL_, TORCH_"), problem
