"""The execution input's fields, in ONE table (:data:`FIELDS`): each field's default, what it does, its check and
what it allows, in words. Each field's check (:func:`check_field`), the defaults (:data:`DEFAULT_INPUT`, which
``RequestRules`` merges), the request read once (``value.Fields``: one attribute per row) and the reference page
(``docs/reference.md``, written by ``make docs``) are read from it: a new input field is one row here (then
``make docs``).

Pure Python, no aws_cdk: part of the request check's Lambda asset (``request_function``). ``rules`` below is a
``rules.RequestRules`` (not imported: that module reads this one).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from training.contract.evaluation import DEFAULT_EVALUATION_TASKS, EVALUATION_SETTINGS_BY_NAME
from training.contract.hardware import DEFAULT_INSTANCE_TYPE, PRECISIONS
from training.contract.settings_table import AC_MODES, HYPERPARAMETERS_BY_NAME
from training.request.tuning import TUNE_KEYS

MAX_RUNTIME_SECONDS_LIMIT = 28 * 24 * 3600
"""SageMaker's ceiling for ``MaxRuntimeInSeconds`` and ``MaxWaitTimeInSeconds`` (28 days)."""
UUID_LENGTH = 36
"""Job names are ``<job_name_prefix>-<UUID>``."""
DATA_INPUT_MODES = ("FastFile", "File")
"""Input modes of the train channel (``Pipe`` is not something the trainer reads)."""
EXECUTION_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
ENVIRONMENT_PREFIXES = ("NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "NVTE_", "FI_")
"""Names an execution's ``environment`` may set: NCCL, PyTorch, CUDA, Transformer Engine and libfabric (EFA) knobs."""
PLATFORM_ENVIRONMENT: Mapping[str, str] = MappingProxyType(
    {
        "NVTE_FRAMEWORK": "set by the training image (training/Dockerfile)",
        "CUDA_VISIBLE_DEVICES": "train.sh starts one process per visible GPU; hiding GPUs breaks that count",
    }
)
"""Names under the allowed prefixes that the platform sets itself (refused, with the reason)."""
_WRITES = "writes to that path, which can replace a file the job loads later"
ENVIRONMENT_LOADS_CODE: Mapping[str, str] = MappingProxyType(
    {
        # NCCL (src/plugin/plugin_open.cc, src/misc/ibvsymbols.cc, src/misc/param.cc, src/debug.cc)
        "NCCL_NET_PLUGIN": "NCCL loads that library as its network plugin",
        "NCCL_TUNER_PLUGIN": "NCCL loads that library as its tuner plugin",
        "NCCL_PROFILER_PLUGIN": "NCCL loads that library as its profiler plugin",
        "NCCL_ENV_PLUGIN": "NCCL loads that library as its environment plugin",
        "NCCL_GIN_PLUGIN": "NCCL loads that library as its GPU-initiated networking plugin",
        "NCCL_RMA_PLUGIN": "NCCL loads that library as its RMA plugin",
        "NCCL_IBVERBS_LIB": "NCCL loads that library instead of libibverbs",
        "NCCL_CONF_FILE": "NCCL sets every variable that file lists, these included",
        "NCCL_DEBUG_FILE": f"NCCL {_WRITES}",
        "NCCL_TOPO_DUMP_FILE": f"NCCL {_WRITES}",
        "NCCL_GRAPH_DUMP_FILE": f"NCCL {_WRITES}",
        # libfabric, the EFA transport (src/fabric.c, src/log.c)
        "FI_PROVIDER_PATH": "libfabric loads provider libraries from those folders",
        "FI_LOG_LOCATION": f"libfabric {_WRITES}",
        # the CUDA driver (CUPTI's injection, the JIT cache, core dumps and its error log)
        "CUDA_INJECTION64_PATH": "the CUDA driver loads that library into the process when CUDA starts",
        "CUDA_INJECTION32_PATH": "the CUDA driver loads that library into the process when CUDA starts",
        "CUDA_CACHE_PATH": "the CUDA driver loads compiled GPU code from that JIT cache",
        "CUDA_COREDUMP_FILE": f"the CUDA driver {_WRITES}",
        "CUDA_COREDUMP_PIPE": f"the CUDA driver {_WRITES}",
        "CUDA_LOG_FILE": f"the CUDA driver {_WRITES}",
        # Transformer Engine v2.11 (transformer_engine/common/__init__.py, common/util/cuda_runtime.cpp)
        "CUDA_HOME": "Transformer Engine loads libcudnn, libnvrtc and libcurand from below it, and PyTorch runs its "
        "nvcc",
        "CUDA_PATH": "Transformer Engine loads libcudnn, libnvrtc and libcurand from below it, and PyTorch runs its "
        "nvcc",
        "CUDA_DIR": "Transformer Engine compiles its runtime GPU kernels with the headers below it",
        "NVTE_CUDA_INCLUDE_DIR": "Transformer Engine compiles its runtime GPU kernels with the headers in it",
        # PyTorch (torch/utils/cpp_extension.py, torch/hub.py, torch/serialization.py, torch/_inductor/utils.py,
        # torch/profiler/_cupti_monitor.py, aten/src/ATen/native/cuda/jit_utils.cpp, torch/_logging)
        "CUDA_INC_PATH": "PyTorch's extension builds compile with the headers in it",
        "PYTORCH_NVCC": "PyTorch runs that program to compile CUDA extensions",
        "TORCH_EXTENSIONS_DIR": "PyTorch loads the extension libraries it finds built there",
        "PYTORCH_KERNEL_CACHE_PATH": "PyTorch's jiterator loads compiled GPU kernels from that cache",
        "TORCH_HOME": "torch.hub imports the repositories cached there",
        "TORCH_CUSTOM_PYTHONPATH": "TorchInductor's compile workers import Python from it (their PYTHONPATH)",
        "TORCH_CUPTI_MONITOR_LIBCUPTI_PATH": "PyTorch's CUPTI monitor loads that library",
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "torch.load then unpickles any object, running the code a file carries",
        # torch 2.13 torch/_native/__init__.py (importlib.import_module), torch 2.9 and 2.13
        # torch/testing/_internal/common_device_type.py (runpy.run_path), torch 2.13 torch/_dynamo/config.py
        "TORCH_PYTHON_NATIVE_USER_GRAPH_ORDER_FN": "PyTorch imports the module that value names and calls the "
        "function it names in it",
        "TORCH_TEST_DEVICES": "PyTorch's device-type test harness runs the Python files it lists",
        "TORCH_COMPILE_DYNAMO_PROFILER": f"PyTorch {_WRITES}",
        "TORCH_LOGS_OUT": f"PyTorch {_WRITES}",
        "TORCH_TRACE": f"PyTorch {_WRITES}",
        "TORCH_COMPILE_DEBUG_DIR": f"PyTorch {_WRITES}",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"PyTorch {_WRITES}",
        "TORCH_FR_DUMP_TEMP_FILE": f"PyTorch {_WRITES}",
        "PYTORCH_TUNABLEOP_FILENAME": f"PyTorch {_WRITES}",
    }
)
"""Names under the allowed prefixes that make a library of the job load code from a path (a plugin, an injected
library, a toolkit folder, a compiled-code cache, an unrestricted unpickler) or write to a path, refused by name
with the reason; their sources are in docs/security.md. Each was found by reading the libraries the job runs
(NCCL, libfabric, the CUDA driver's documentation, Transformer Engine v2.11, PyTorch). The job runs as the
execution role, so a library in a data folder that one of these loads would run with every run's checkpoints."""
ENVIRONMENT_PATH_NAME = re.compile(
    r"(PATH|_DIR|_DIRECTORY|_FILE|_FILENAME|_LIB|_LIBRARY|_PLUGIN|_HOME|_PIPE)$"
)
"""Names that end like a path's (``_PATH``, ``_DIR``, ``_FILE``, ``_PLUGIN``, ...): refused too, for the variables a
later version of these libraries adds (NCCL added four plugin variables in two years)."""
ENVIRONMENT_CODE_NAME = re.compile(r"(_FN|_FUNC|_FUNCTION|_MODULE|_MODULES|_CLASS|_CALLABLE|_HOOK|_IMPORT)$")
"""Names that end like a Python callable's or module's (``_FN``, ``_MODULE``, ``_CLASS``, ...): refused too, for the
variables a later PyTorch adds that import what they name (torch 2.13 added
``TORCH_PYTHON_NATIVE_USER_GRAPH_ORDER_FN``)."""


def environment_name_refusal(name: str) -> str | None:
    """Why ``environment`` may not set ``name`` although it has an allowed prefix, or None."""
    if name in PLATFORM_ENVIRONMENT:
        return f"set by the platform ({PLATFORM_ENVIRONMENT[name]})"
    reason = ENVIRONMENT_LOADS_CODE.get(name)
    if reason is None and ENVIRONMENT_PATH_NAME.search(name):
        reason = "it names a file or folder for a library of the job to load from or write to"
    if reason is None and ENVIRONMENT_CODE_NAME.search(name):
        reason = "it names Python code (a module, class or function) for a library of the job to import"
    if reason is None:
        return None
    return (
        f"refused: {reason}; with a file in a data folder, the job would run that code as the workflow's execution "
        "role (docs/security.md lists these names)"
    )


TAG_CHARACTERS = "letters, digits, spaces and _.:/=+-@"
EVALUATE_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "tasks": list(DEFAULT_EVALUATION_TASKS),
        "task_data_uri": None,
        "limit": None,
        "batch_size": EVALUATION_SETTINGS_BY_NAME["batch_size"].default,
        "instance_type": None,
        "max_runtime_seconds": 4 * 3600,
        "training_job": None,
    }
)
"""The ``evaluate`` field's own fields and their values when left out (``task_data_uri`` must be given); each is
checked by ``evaluate_block.block_problems`` and described by its ``EVALUATE_FIELDS`` (docs/reference.md)."""

Check = Callable[[Any, Any], bool]
"""``(value, rules) -> bool``: whether a non-null value is allowed."""


@dataclass(frozen=True)
class InputField:
    """One execution-input field. ``allowed(rules)``: what it allows, in words, under one deployment's rules (every
    problem line says it); ``nullable``: null is allowed (", or null" is added); ``context_key``: the ``cdk.json``
    key that sets the workflow's default for it, if any."""

    name: str
    default: Any
    description: str
    check: Check
    allowed: Callable[[Any], str]
    nullable: bool = False
    context_key: str | None = None

    def allowed_text(self, rules: Any) -> str:
        text = self.allowed(rules)
        return f"{text}, or null" if self.nullable else text


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_bool(value: Any, rules: Any) -> bool:
    return isinstance(value, bool)


def _true_or_false(rules: Any) -> str:
    return "true or false"


def _int_between(low: Callable[[Any], int], high: Callable[[Any], int]) -> Check:
    return lambda v, r: is_int(v) and low(r) <= v <= high(r)


def _contract_int(name: str) -> Check:
    spec = HYPERPARAMETERS_BY_NAME[name]
    return lambda v, r: is_int(v) and spec.minimum <= v <= spec.maximum  # type: ignore[operator]


def _contract_allowed(name: str) -> Callable[[Any], str]:
    return lambda r: HYPERPARAMETERS_BY_NAME[name].allowed()


def _one_of(choices: Callable[[Any], tuple[str, ...]]) -> Callable[[Any], str]:
    return lambda r: "one of " + ", ".join(choices(r))


def _job_name_prefix_ok(value: Any, rules: Any) -> bool:
    limits = rules.sagemaker()["TrainingJobName"]
    if not isinstance(value, str) or not value or len(value) + 1 + UUID_LENGTH > limits["max"]:
        return False
    example = f"{value}-{'0' * 8}-{'0' * 4}-{'0' * 4}-{'0' * 4}-{'0' * 12}"
    return re.fullmatch(limits["pattern"], example) is not None


def _job_name_prefix_allowed(rules: Any) -> str:
    most = rules.sagemaker()["TrainingJobName"]["max"] - 1 - UUID_LENGTH
    return f"1 to {most} characters of a-z, A-Z, 0-9 and hyphen, starting with a letter or digit"


def _plan_arn_ok(value: Any, rules: Any) -> bool:
    limits = rules.sagemaker()["TrainingPlanArn"]
    if not isinstance(value, str) or not limits.get("min", 0) <= len(value) <= limits["max"]:
        return False
    if re.fullmatch(limits["pattern"], value) is None:
        return False
    return rules.region is None or value.split(":")[3] == rules.region


def data_uri_ok(value: Any, rules: Any) -> bool:
    """An ``s3://`` prefix (ending in ``/``) under one of the workflow's data sources."""
    limits = rules.sagemaker()["S3Uri"]
    if not isinstance(value, str) or len(value) > limits["max"] or not re.fullmatch(limits["pattern"], value):
        return False
    if not value.startswith("s3://") or not value.endswith("/") or "//" in value[5:] or "/../" in value:
        return False
    return any(_under(value, source) for source in rules.data_source_uris())


def _under(uri: str, source: str) -> bool:
    if source.startswith("s3://*/"):
        key = uri[5:].partition("/")[2]
        return key.startswith(source[len("s3://*/") :])
    return uri.startswith(source)


def execution_name_ok(value: Any, rules: Any) -> bool:
    """A run (execution) name: it names the run's checkpoint folder, an S3 key segment, so no ``.``/``..`` nor
    anything path-like (the names ``resume_from`` takes)."""
    limits = rules.sagemaker()["ExecutionName"]
    return (
        isinstance(value, str)
        and 1 <= len(value) <= limits["max"]
        and EXECUTION_NAME.match(value) is not None
    )


def _string_map(value: Any, rules: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _hyperparameters_shape_ok(value: Any, rules: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str)
        and (isinstance(v, str | bool) or (isinstance(v, int | float) and math.isfinite(v)))
        for k, v in value.items()
    )


def _keep_alive_allowed(rules: Any) -> str:
    most = rules.max_keep_alive_seconds
    if not most:
        return "0 (this workflow is deployed without warm pools: maxKeepAliveSeconds is 0)"
    return f"an integer in [0, {most}] (seconds the instances stay in a warm pool after the job)"


def _remote_debug_allowed(rules: Any) -> str:
    if rules.network_isolation:
        return "false (the jobs run with network isolation, and remote debugging needs the network)"
    if not rules.remote_debug:
        return "false (this workflow is deployed without remote debugging: set remoteDebug in cdk.json)"
    return "true or false"


def _tags_allowed(rules: Any) -> str:
    limits = rules.sagemaker()
    most = limits["Tags"]["max"] - len(rules.fixed_tags())
    return (
        f"a JSON object of string values (at most {most} tags; keys of {limits['TagKey'].get('min', 1)} to "
        f"{limits['TagKey']['max']} and values of up to {limits['TagValue']['max']} {TAG_CHARACTERS}; keys not "
        f"starting with aws: nor one of the workflow's own: {', '.join(rules.fixed_tags())})"
    )


def _environment_allowed(rules: Any) -> str:
    limits = rules.sagemaker()
    return (
        f"a JSON object of string values (at most {limits['Environment']['max']} variables whose names start "
        f"with {', '.join(ENVIRONMENT_PREFIXES)} (letters, digits and _, at most "
        f"{limits['EnvironmentKey']['max']} characters), values of up to {limits['EnvironmentValue']['max']} "
        f"characters; not {', '.join(PLATFORM_ENVIRONMENT)}, nor a name that makes a library load or import code "
        "or names a path: those listed in docs/security.md and any ending in PATH, _DIR, _FILE, _LIB, _PLUGIN, "
        "_HOME, _FN, _MODULE, _CLASS, ...)"
    )


def _resume_from_allowed(rules: Any) -> str:
    most = rules.sagemaker()["ExecutionName"]["max"]
    return (
        f"the name of an earlier execution of this workflow, or this execution's own to continue its run in its "
        f"folder (1 to {most} characters of a-z, A-Z, 0-9, _ and -)"
    )


FIELDS: tuple[InputField, ...] = (
    InputField(
        "precision",
        HYPERPARAMETERS_BY_NAME["precision"].default,
        "Numeric format of the GEMMs. mxfp8 and nvfp4 need a Blackwell instance, fp8 Hopper or newer; a "
        "precision the instance's GPUs cannot run is refused.",
        lambda v, r: v in PRECISIONS,
        _one_of(lambda r: PRECISIONS),
        context_key="defaultPrecision",
    ),
    InputField(
        "num_layers",
        None,
        "Transformer blocks; null: the model preset's depth.",
        _contract_int("num_layers"),
        _contract_allowed("num_layers"),
        nullable=True,
    ),
    InputField(
        "batch_size",
        HYPERPARAMETERS_BY_NAME["batch_size"].default,
        "Micro-batch per GPU (sequences).",
        _contract_int("batch_size"),
        _contract_allowed("batch_size"),
    ),
    InputField(
        "seq_length",
        HYPERPARAMETERS_BY_NAME["seq_length"].default,
        "Tokens per sequence.",
        _contract_int("seq_length"),
        _contract_allowed("seq_length"),
    ),
    InputField(
        "activation_checkpointing",
        HYPERPARAMETERS_BY_NAME["activation_checkpointing"].default,
        "Recompute activations in the backward pass (less memory, more compute): none, full (each block's, "
        "about a third more FLOPs), or selective (op-level: matmul and attention outputs kept, the rest recomputed); "
        "true means full and false none. Every k-th block only: the trainer setting "
        "activation_checkpointing_interval.",
        lambda v, r: isinstance(v, bool) or v in AC_MODES,
        lambda r: f"true, false or one of {', '.join(AC_MODES)} (true = full, false = none)",
    ),
    InputField(
        "instance_type",
        DEFAULT_INSTANCE_TYPE,
        "The SageMaker instance type: a GPU type of training/contract/ that the workflow allows.",
        lambda v, r: isinstance(v, str) and v in r.allowed_instance_types,
        _one_of(lambda r: r.allowed_instance_types),
        context_key="defaultInstanceType",
    ),
    InputField(
        "instance_count",
        1,
        "Instances (nodes). Traffic between them is encrypted when more than 1. At most the cdk.json key "
        "maxInstanceCount.",
        _int_between(lambda r: 1, lambda r: r.max_instance_count),
        lambda r: f"an integer in [1, {r.max_instance_count}]",
    ),
    InputField(
        "training_plan_arn",
        None,
        "A SageMaker Flexible Training Plan to run in (the job waits for the plan to become active); in the "
        "stack's region; not with use_spot.",
        _plan_arn_ok,
        lambda r: (
            f"a training plan ARN arn:aws:sagemaker:{r.region or '<region>'}:<12 digits>:training-plan/<name>"
        ),
        nullable=True,
    ),
    InputField(
        "use_spot",
        False,
        "Managed spot capacity: on reclaim the trainer gets SIGTERM, seals a checkpoint, and the job resumes "
        "from it.",
        _is_bool,
        _true_or_false,
    ),
    InputField(
        "max_runtime_seconds",
        24 * 3600,
        "Training time limit (StoppingCondition.MaxRuntimeInSeconds); at most min(28 days, workflowTimeoutHours).",
        _int_between(lambda r: 1, lambda r: r.max_runtime_seconds),
        lambda r: f"an integer in [1, {r.max_runtime_seconds}]",
    ),
    InputField(
        "max_wait_seconds",
        None,
        "Spot only: training plus waiting for spot capacity (MaxWaitTimeInSeconds), at least max_runtime_seconds; "
        "null: max_runtime_seconds.",
        _int_between(lambda r: 1, lambda r: MAX_RUNTIME_SECONDS_LIMIT),
        lambda r: f"an integer in [1, {MAX_RUNTIME_SECONDS_LIMIT}]",
        nullable=True,
    ),
    InputField(
        "hyperparameters",
        {},
        "Trainer settings (the trainer settings table below; either spelling, num_layers or num-layers), each "
        "parsed by the trainer's own rules. Not the top-level fields of this table, and not checkpoint_dir or "
        "model_dir (the paths SageMaker syncs).",
        _hyperparameters_shape_ok,
        lambda r: "a JSON object of trainer settings (string, number or boolean values)",
    ),
    InputField(
        "job_name_prefix",
        "blackwell-training",
        "Prefix of the training job names (<prefix>-<UUID> fits SageMaker's 63 characters). The dashboard "
        "finds jobs by the deployment's defaultJobNamePrefix (and dashboardJobNamePrefixes).",
        _job_name_prefix_ok,
        _job_name_prefix_allowed,
        context_key="defaultJobNamePrefix",
    ),
    InputField(
        "train_data_uri",
        None,
        "Pre-tokenized data for the train channel: an s3:// prefix under one of the deployment's dataSources "
        "that holds at least one object (listed once before launch: ListObjectsV2, MaxKeys 1); null: synthetic "
        "data.",
        data_uri_ok,
        lambda r: "an s3:// prefix ending in '/' under one of " + ", ".join(r.data_source_uris()),
        nullable=True,
    ),
    InputField(
        "train_data_input_mode",
        "FastFile",
        "How the train channel reaches the container: FastFile streams it, File copies it first.",
        lambda v, r: v in DATA_INPUT_MODES and v in r.sagemaker()["TrainingInputMode"],
        _one_of(lambda r: DATA_INPUT_MODES),
    ),
    InputField(
        "resume_from",
        None,
        "An earlier execution of this workflow: the job starts from its newest complete checkpoint (mounted "
        "read-only as the resume channel; refused before launch when there is none, or when max_steps is not "
        "above its step). This execution's own name continues the run of that name in its own checkpoint folder "
        "(an execution whose folder already holds an earlier run's checkpoints is refused otherwise).",
        execution_name_ok,
        _resume_from_allowed,
        nullable=True,
    ),
    InputField(
        "init_from",
        None,
        "A Hugging Face model (Llama 3, Qwen 2 / 2.5, Qwen 3, Mistral or Gemma 3 text) to start from instead of "
        "random weights: an s3:// prefix under one of the deployment's dataSources holding its config.json and "
        "safetensors, mounted read-only as the weights channel (File mode). Its config.json is read before launch: "
        "the model's family, shape and RoPE replace the preset's, and a request that contradicts them or an "
        "architecture the trainer cannot load is refused (docs/open-weights.md).",
        data_uri_ok,
        lambda r: (
            "an s3:// prefix ending in '/' under one of "
            + ", ".join(r.data_source_uris())
            + " holding a Hugging Face model folder (config.json and safetensors)"
        ),
        nullable=True,
    ),
    InputField(
        "keep_alive_seconds",
        0,
        "Keep the instances in a SageMaker warm pool this long after the job "
        "(ResourceConfig.KeepAlivePeriodInSeconds); not with use_spot; at most the cdk.json key "
        "maxKeepAliveSeconds.",
        _int_between(lambda r: 0, lambda r: r.max_keep_alive_seconds),
        _keep_alive_allowed,
    ),
    InputField(
        "infra_check",
        False,
        "SageMaker's instance and network health check before training (InfraCheckConfig.EnableInfraCheck).",
        _is_bool,
        _true_or_false,
    ),
    InputField(
        "tags",
        {},
        "Run tags (Tags, e.g. for cost allocation), after the workflow's own (training-workflow, "
        "training-workflow-execution) and the construct's tags.",
        _string_map,
        _tags_allowed,
    ),
    InputField(
        "remote_debug",
        False,
        "A shell in the running container (RemoteDebugConfig): only where the stack is deployed with "
        "remoteDebug, never with networkIsolation.",
        lambda v, r: v is False or (v is True and r.remote_debug and not r.network_isolation),
        _remote_debug_allowed,
    ),
    InputField(
        "environment",
        {},
        "Container variables (Environment): NCCL, PyTorch, CUDA, Transformer Engine and libfabric (EFA) knobs. "
        "NVTE_FRAMEWORK is set by the image, and CUDA_VISIBLE_DEVICES would break train.sh's one process per "
        "visible GPU. Variables that make a library load code or read or write a file of the execution's choice "
        "(plugins such as NCCL_NET_PLUGIN, CUDA_INJECTION64_PATH, FI_PROVIDER_PATH, ...) are refused by name: "
        "docs/security.md.",
        _string_map,
        _environment_allowed,
    ),
    InputField(
        "ignore_memory_estimate",
        False,
        "Launch even when the memory plan says the request cannot fit (recorded in the run's summary).",
        _is_bool,
        _true_or_false,
    ),
    InputField(
        "evaluate",
        None,
        "Evaluate the model with lm-evaluation-harness after training (an evaluation job: offline and always "
        "network-isolated, also with MLflow configured, over the task folder task_data_uri; its scores join the "
        "summary, not MLflow), or, with training_job, evaluate that finished training job instead of training; "
        "see docs/evaluation.md.",
        lambda v, r: isinstance(v, Mapping),  # its own fields: evaluate_block.block_problems
        lambda r: f"an object of evaluation fields ({', '.join(EVALUATE_DEFAULTS)}; see docs/evaluation.md)",
        nullable=True,
    ),
    InputField(
        "tune",
        None,
        "A tuning run instead of a training run (docs/tuning.md): one job, the same image, instance type and "
        "count, measures the configurations the plan picks from this block's search space, and ranks them; its "
        "fields (search_space, max_trials, max_cost_usd, ...) are checked before launch. null: a training run.",
        lambda v, r: isinstance(v, Mapping),  # its own fields: training.request.tuning.parse_tune
        lambda r: (
            "an object of tuning settings (" + ", ".join(TUNE_KEYS) + "; all optional, {} tunes the defaults)"
        ),
        nullable=True,
    ),
)
"""THE table of execution-input fields, in the order problems are listed."""

FIELDS_BY_NAME: Mapping[str, InputField] = MappingProxyType({f.name: f for f in FIELDS})
DEFAULT_INPUT: Mapping[str, Any] = MappingProxyType({f.name: f.default for f in FIELDS})
"""Every execution-input field and its value when neither the input nor the workflow's defaults give one."""
INPUT_FIELDS: tuple[str, ...] = tuple(DEFAULT_INPUT)


def show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= 200 else text[:197] + "..."


def suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_field(name: str, value: Any, rules: Any) -> str | None:
    """The problem of one field's value under ``rules``, or None (the field's row of :data:`FIELDS`)."""
    spec = FIELDS_BY_NAME[name]
    if value is None:
        return None if spec.nullable else f"{name}: must be {spec.allowed_text(rules)}; got null"
    return (
        None if spec.check(value, rules) else f"{name}: must be {spec.allowed_text(rules)}; got {show(value)}"
    )
