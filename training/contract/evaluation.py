"""An evaluation job (lm-evaluation-harness on a finished run's Hugging Face export, ``training/evaluate/``,
in the same image): its default instance type and whether a model fits it, the standard tasks, the
``evaluation task=...`` lines and their metric definitions, and the job's settings. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from training.contract.hardware import GPU_INSTANCE_TYPES
from training.contract.metric_lines import _NUMBER, MetricDefinition, _fields, _fmt_metric
from training.contract.settings_table import Hyperparameter

EVALUATION_INSTANCE_TYPE = "ml.p5.4xlarge"
"""The evaluation job's instance type when the request names none, no training plan holds the capacity and the
model's exported weights fit one GPU: one H100 (80 GB). lm-eval scores one model replica, on one GPU unless its
weights do not fit there (``training.evaluate.harness``), so the other GPUs of an 8-GPU training instance would sit
idle; this is the one single-GPU type of ``GPU_INSTANCE_TYPES`` (botocore's ``TrainingInstanceType`` also lists
single-GPU ``ml.g6e``/``ml.g7e`` sizes, which the workflow does not allow), at 6.88 USD an hour against 113.93 for
``ml.p6-b200.48xlarge`` (``ON_DEMAND_USD_PER_HOUR``). It holds the bf16 export of every preset up to 14b
(``evaluation_fits``); the 32b, 64b and 70b presets are evaluated on the training's instance type."""
EVALUATION_WEIGHTS_SHARE = 0.8
"""The share of GPU memory an evaluated model's weights may take: above it of one GPU, the harness spreads the
model over all the instance's GPUs; above it of all of them, the request check refuses the instance type (the rest
holds lm-eval's batch: activations and the log-probabilities over the vocabulary)."""


def export_weight_bytes(parameters: int, precision: str) -> int:
    """Bytes of a run's exported weights (``training.trainer.checkpoint.export_hf``): float32 for fp32 runs, else bfloat16."""
    return parameters * (4 if precision == "fp32" else 2)


def evaluation_fits(instance_type: str, weight_bytes: int, *, one_gpu: bool = False) -> bool:
    """Whether weights of ``weight_bytes`` fit ``instance_type`` for an evaluation: within
    ``EVALUATION_WEIGHTS_SHARE`` of one GPU's memory (``one_gpu``) or of all its GPUs' together."""
    gpu = GPU_INSTANCE_TYPES[instance_type]
    memory = gpu.gpu_memory_gb * 1e9 * (1 if one_gpu else gpu.gpus)
    return weight_bytes <= EVALUATION_WEIGHTS_SHARE * memory


STANDARD_TASK_CHANCE: Mapping[str, float] = {
    "hellaswag": 0.25,
    "arc_easy": 0.25,
    "piqa": 0.5,
    "winogrande": 0.5,
}
"""The standard small-model set (``python -m training.evaluate.prepare_tasks``) and each task's accuracy by chance:
one over the number of choices (4 endings; ARC-Easy's 4 options on almost every question; 2 solutions; 2
options). Zero-shot log-likelihood (rank) classification, as lm-eval and OLMo-core's small-model groups score it."""
DEFAULT_EVALUATION_TASKS: tuple[str, ...] = tuple(STANDARD_TASK_CHANCE)
EVALUATION_METRICS: tuple[str, ...] = ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")
"""Fields of an ``evaluation task=...`` line: lm-eval's accuracy, its length-normalized accuracy (by the choice's
characters) and their standard errors (a task whose YAML lists no acc_norm, such as winogrande, has none)."""
MAX_EVALUATION_TASKS = 10
"""At most this many tasks per evaluation: 4 metric definitions each, and SageMaker allows 40 per job."""
TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""A task (or group) name an evaluation may ask for: as lm-eval names its tasks, and safe in a metric name."""


def evaluation_metric_name(task: str, field: str) -> str:
    """``eval:hellaswag:acc``: the CloudWatch (and summary) name of one task's score."""
    if field not in EVALUATION_METRICS:
        raise ValueError(f"no evaluation metric {field!r}; defined: {', '.join(EVALUATION_METRICS)}")
    return f"eval:{task}:{field}"


def format_evaluation_line(task: str, scores: Mapping[str, float], samples: int | None = None) -> str:
    """``evaluation task=hellaswag acc=0.2512 acc_stderr=0.00433 ... samples=10042`` (fields in EVALUATION_METRICS
    order, absent ones left out)."""
    parts = ["evaluation", f"task={task}"]
    parts += [f"{k}={_fmt_metric(float(scores[k]))}" for k in EVALUATION_METRICS if scores.get(k) is not None]
    if samples is not None:
        parts.append(f"samples={samples}")
    return " ".join(parts)


_EVALUATION_LINE = re.compile(r"\bevaluation task=(\S+)((?: [a-z_]+=\S+)*)")


def parse_evaluation_line(line: str) -> tuple[str, dict[str, float]] | None:
    """``(task, {field: value})`` of a line made by :func:`format_evaluation_line`; None for any other line."""
    match = _EVALUATION_LINE.search(line)
    return (match.group(1), _fields(match.group(2), EVALUATION_METRICS)) if match else None


def evaluation_metric_definitions(tasks: tuple[str, ...] | list[str]) -> tuple[MetricDefinition, ...]:
    """SageMaker ``MetricDefinitions`` of an evaluation job of ``tasks``: ``eval:<task>:<field>`` read from that
    task's ``evaluation task=<task> ...`` line (the word boundary keeps ``acc=`` out of ``acc_norm=``)."""
    return tuple(
        MetricDefinition(
            evaluation_metric_name(task, field),
            rf"\bevaluation task={re.escape(task)} .*?\b{field}={_NUMBER}",
        )
        for task in tasks
        for field in EVALUATION_METRICS
    )


EVALUATION_SETTINGS: tuple[Hyperparameter, ...] = (
    Hyperparameter("tasks", "str", ",".join(DEFAULT_EVALUATION_TASKS), "Comma-separated task names."),
    Hyperparameter(
        "limit", "int", None, "Examples per task (for trying a set-up; scores need all).", 1, 10**8
    ),
    Hyperparameter(
        "batch_size",
        "int",
        32,
        "Requests per forward pass (scores can move slightly with it: lm-eval #1645).",
        1,
        4096,
    ),
    Hyperparameter(
        "dtype",
        "choice",
        "auto",
        "Weights' dtype in the evaluation (auto: as exported).",
        choices=("auto", "bfloat16", "float16", "float32"),
    ),
    Hyperparameter("seed", "int", 1234, "lm-eval's random, numpy and torch seeds.", 0, 2**31 - 1),
)
"""The evaluation job's settings (its ``HyperParameters``, the arguments of ``evaluate.sh``)."""
EVALUATION_SETTINGS_BY_NAME: Mapping[str, Hyperparameter] = {s.name: s for s in EVALUATION_SETTINGS}
