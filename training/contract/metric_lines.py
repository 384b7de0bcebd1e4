"""The lines the trainer prints (rank 0: ``config``, ``step=N``, ``validation``, ``summary``), how they
are formatted and parsed, and the regexes SageMaker's ``MetricDefinitions`` read them with (their CloudWatch names
and dimensions). Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DPO_STEP_METRICS: tuple[str, ...] = (
    "rewards_chosen",
    "rewards_rejected",
    "reward_accuracy",
    "reward_margin",
    "logps_chosen",
    "logps_rejected",
)
"""A preference tuning run's step-line fields (``objective`` dpo), each a mean over the pairs trained since the last
line, over every rank (TRL's ``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracies``, ``rewards/margins``,
``logps/chosen``, ``logps/rejected``): the rewards ``dpo_beta`` x (policy - reference) log-probability of the chosen
and the rejected answer, the share of pairs whose chosen reward is the higher, the mean difference of the two
rewards, and the policy's log-probabilities of the answers (sums over their trained tokens)."""

STEP_METRICS: tuple[str, ...] = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_sec",
    "tflops_per_gpu",
    "mfu",
    "mfu_bf16",
    "peak_mem_gb",
    "step_time",
    "trained_tokens",
    "padding",
    *DPO_STEP_METRICS,
)
"""Fields of a ``step=N ...`` line, in print order. Throughput fields exclude the warm-up steps. ``mfu`` is against
the peak of the run's own precision (``PEAK_TFLOPS``); ``mfu_bf16``, printed for the low precisions
(``TE_PRECISIONS``: fp8, mxfp8, nvfp4), is the same TFLOP/s against the GPU's bf16 peak: the bf16-equivalent MFU,
comparable with a bf16 run's ``mfu``. ``trained_tokens``: the targets the last step's loss counted, over every rank
and micro-batch (conversation data trains only the assistant's tokens); ``padding``: the share of that step's
window positions that hold padding (0 for token streams; with packing, what is left at the end of each window).
The :data:`DPO_STEP_METRICS` only in a preference tuning run's lines."""

SUMMARY_METRICS: tuple[str, ...] = (
    "steps",
    "final_loss",
    "tokens_per_sec",
    "tflops_per_gpu",
    "mfu",
    "mfu_bf16",
    "peak_mem_gb",
    "max_allocated_gb",
    "max_reserved_gb",
    "alloc_retries",
    "alloc_ooms",
    "train_seconds",
    "val_loss",
    "unusable_checkpoints",
    "val_accuracy",
    "empty_micro_batches",
    "val_reward_accuracy",
    "val_reward_margin",
)
"""Fields of the final ``summary ...`` line (``mfu_bf16`` as in ``STEP_METRICS``; ``val_loss`` and ``val_accuracy``
(the share of counted validation targets the model's argmax predicts) only when the data has a validation split;
``val_reward_accuracy`` and ``val_reward_margin`` (preference tuning's, as in :data:`VALIDATION_METRICS`) only for a
preference tuning run with a validation split; ``empty_micro_batches`` only when some micro-batch had no target to
count (every one ignored): it contributed
nothing to its step;
``unusable_checkpoints`` only when checkpoints were found and none was usable, so the run restarted from step 0:
the line then ends ``restarted_from: none (N checkpoints unusable)``). ``peak_mem_gb`` is rank 0's; the
:data:`MEMORY_SUMMARY_METRICS` are over every rank."""

MEMORY_SUMMARY_METRICS: tuple[str, ...] = (
    "max_allocated_gb",
    "max_reserved_gb",
    "alloc_retries",
    "alloc_ooms",
)
"""Memory over every rank, in the summary line (``training.trainer.observe.metrics.memory_over_ranks``):
``max_allocated_gb`` the largest peak of any rank (CUDA: ``max_memory_allocated``; CPU: the peak resident set
size); on CUDA only, ``max_reserved_gb`` the largest peak the caching allocator reserved, ``alloc_retries`` the
allocator's retries after a failed ``cudaMalloc`` (it freed its cache and tried again: a sign of near-OOM) and
``alloc_ooms`` the allocations that failed even then, summed over ranks (``torch.cuda.memory_stats``'s
``num_alloc_retries`` and ``num_ooms``)."""

VALIDATION_METRICS: tuple[str, ...] = ("val_loss", "val_accuracy", "val_reward_accuracy", "val_reward_margin")
"""Fields of a ``validation step=N/M val_loss=... val_accuracy=...`` line (every ``validation_interval`` steps and
at the end): the mean loss over every counted target of the held-out split, and the token accuracy (the share of
those targets the logits' argmax predicts). A preference tuning run's: ``val_loss`` its DPO loss over every held-out
pair, ``val_reward_accuracy`` the share of those pairs whose chosen answer gets the higher reward, and
``val_reward_margin`` the mean difference of the two rewards (no ``val_accuracy``)."""

_NUMBER = r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)"


def format_step_line(
    step: int,
    metrics: Mapping[str, float],
    max_steps: int | None = None,
    elapsed: float | None = None,
    eta: float | None = None,
) -> str:
    """``step=10/100 10.0% elapsed=0:00:05 eta=0:00:45 loss=2.3456 lr=... step_time=0.5321``; metric fields in
    STEP_METRICS order, absent ones left out; the progress part only when ``max_steps`` is given."""
    head = [f"step={step}"]
    if max_steps:
        head = [f"step={step}/{max_steps}", f"{100 * step / max_steps:.1f}%"]
        if elapsed is not None:
            head.append(f"elapsed={format_duration(elapsed)}")
        if eta is not None:
            head.append(f"eta={format_duration(eta)}")
    return " ".join([*head, *(f"{k}={_fmt_metric(metrics[k])}" for k in STEP_METRICS if k in metrics)])


def format_validation_line(
    step: int, max_steps: int, val_loss: float, val_accuracy: float | None = None, **fields: float
) -> str:
    """``validation step=10/100 val_loss=2.3456 val_accuracy=0.5123`` (``val_accuracy`` when given); ``fields``: the
    others of ``VALIDATION_METRICS`` (a preference tuning run's), in that order."""
    values: dict[str, float | None] = {"val_loss": val_loss, "val_accuracy": val_accuracy, **fields}
    unknown = set(values) - set(VALIDATION_METRICS)
    if unknown:
        raise ValueError(f"not validation metrics: {', '.join(sorted(unknown))}")
    shown = " ".join(
        f"{k}={_fmt_metric(value)}" for k in VALIDATION_METRICS if (value := values.get(k)) is not None
    )
    return f"validation step={step}/{max_steps} {shown}"


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (hours grow past 24)."""
    minutes, secs = divmod(int(round(max(0.0, seconds))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def format_summary_line(metrics: Mapping[str, float]) -> str:
    """``summary steps=... final_loss=...``; with ``unusable_checkpoints`` (N) it ends
    ``unusable_checkpoints=N restarted_from: none (N checkpoints unusable)``."""
    parts = ["summary", *(f"{k}={_fmt_metric(metrics[k])}" for k in SUMMARY_METRICS if k in metrics)]
    if "unusable_checkpoints" in metrics:
        parts.append(f"restarted_from: {restarted_from_none(int(metrics['unusable_checkpoints']))}")
    return " ".join(parts)


def restarted_from_none(unusable: int) -> str:
    """Where a run that found only unusable checkpoints started from: ``none (N checkpoints unusable)`` (its
    summary line says ``restarted_from: ...``, the operator CLI's ``result`` shows it)."""
    return f"none ({unusable} checkpoint{'' if unusable == 1 else 's'} unusable)"


def format_config_line(settings: Mapping[str, Any]) -> str:
    """``config key=value ...`` with every setting that took effect, sorted by key."""
    return " ".join(["config", *(f"{k}={_fmt_config(settings[k])}" for k in sorted(settings))])


def _fmt_metric(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.6g}"


def _fmt_config(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace(" ", "_")


@dataclass(frozen=True)
class MetricDefinition:
    name: str
    regex: str

    def as_sagemaker(self) -> dict[str, str]:
        return {"Name": self.name, "Regex": self.regex}


def metric_definitions() -> tuple[MetricDefinition, ...]:
    """SageMaker ``MetricDefinitions`` matching the trainer's lines: ``train:<field>`` for each step-line field,
    ``val_loss`` for each validation line (the word-boundary ``loss=`` never matches inside ``val_loss=``), ``final:<field>`` for
    each summary field (at most 40 in all, regexes at most 500 chars)."""
    defs = [MetricDefinition(f"train:{k}", rf"\bstep=[0-9]+\S* .*?\b{k}={_NUMBER}") for k in STEP_METRICS]
    defs += [
        MetricDefinition(k, rf"\bvalidation step=[0-9]+\S* .*?\b{k}={_NUMBER}") for k in VALIDATION_METRICS
    ]
    defs += [
        MetricDefinition(f"final:{k}", rf"\bsummary .*?\b{k}={_NUMBER}")
        for k in SUMMARY_METRICS
        if k != "steps"
    ]
    return tuple(defs)


TRAINING_METRICS_NAMESPACE = "/aws/sagemaker/TrainingJobs"
"""Where SageMaker publishes the ``MetricDefinitions`` metrics (dimension ``TrainingJobName``) and the per-host
instance metrics (dimension ``Host`` = ``<job>/algo-<n>``)."""
TRAINING_JOB_DIMENSION = "TrainingJobName"
HOST_DIMENSION = "Host"
HOST_GPU_METRICS: tuple[str, ...] = ("GPUUtilization", "GPUMemoryUtilization")
"""Per-host GPU metrics SageMaker publishes every minute: percent summed over the host's GPUs (0-800 on 8 GPUs)."""


def metric_name(field: str, kind: str = "train") -> str:
    """The CloudWatch name of a trainer metric: ``kind`` ``train`` (step lines), ``validation`` or ``final``
    (summary line), e.g. ``train:loss``, ``val_loss``, ``final:mfu``; a ValueError for a name that
    ``metric_definitions`` does not define (so a renamed metric fails wherever it is used)."""
    name = {"train": f"train:{field}", "validation": field, "final": f"final:{field}"}.get(kind)
    defined = {definition.name for definition in metric_definitions()}
    if name not in defined:
        raise ValueError(
            f"no metric definition for {kind} field {field!r}; defined: {', '.join(sorted(defined))}"
        )
    return name


def parse_metric_line(line: str) -> dict[str, float]:
    """Extract every metric SageMaker would see in ``line`` (by running the same regexes), keyed by metric name."""
    found: dict[str, float] = {}
    for definition in metric_definitions():
        match = re.search(definition.regex, line)
        if match:
            found[definition.name] = float(match.group(1))
    return found


_STEP_LINE = re.compile(r"(?<!validation )\bstep=([0-9]+)(?:/[0-9]+ [0-9.]+%)?((?: [a-z0-9_]+=\S+)*)")
_SUMMARY_LINE = re.compile(r"\bsummary((?: [a-z0-9_]+=\S+)+)")
_CONFIG_LINE = re.compile(r"^(?:.*?[:\]] )?config((?: [a-z0-9_]+=\S*)+)\s*$")


def _fields(text: str, names: tuple[str, ...]) -> dict[str, float]:
    found: dict[str, float] = {}
    for item in text.split():
        key, _, value = item.partition("=")
        if key in names:
            try:
                found[key] = float(value)
            except ValueError:
                continue
    return found


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {field: value})`` of a line made by :func:`format_step_line` (anywhere in ``line``, so a
    launcher's prefix such as ``[rank0]:`` is fine); None for any other line."""
    match = _STEP_LINE.search(line)
    if not match:
        return None
    return int(match.group(1)), _fields(match.group(2), STEP_METRICS)


_VALIDATION_LINE = re.compile(r"\bvalidation step=([0-9]+)(?:/[0-9]+)?((?: [a-z_]+=\S+)+)")


def parse_validation_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {"val_loss": ...})`` of a line made by :func:`format_validation_line`; None for any other line."""
    match = _VALIDATION_LINE.search(line)
    if not match:
        return None
    return int(match.group(1)), _fields(match.group(2), VALIDATION_METRICS)


def parse_summary_line(line: str) -> dict[str, float] | None:
    """The fields of a line made by :func:`format_summary_line`; None for any other line."""
    match = _SUMMARY_LINE.search(line)
    return _fields(match.group(1), SUMMARY_METRICS) if match else None


def parse_config_line(line: str) -> dict[str, str] | None:
    """The settings of a line made by :func:`format_config_line` (values as printed); None for any other line."""
    match = _CONFIG_LINE.match(line.strip())
    if not match:
        return None
    return dict(item.partition("=")[::2] for item in match.group(1).split())
