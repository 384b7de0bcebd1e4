"""What a trial's output says: its status (``ok``, ``near-oom``, ``oom``, ``timeout``, ``failed``, or ``not-run``),
the error line that explains a failure, and its measurements (timed step times, losses, the summary line's
throughput and memory over every rank).

Out of memory is read from the error strings CUDA, cuBLAS, NCCL and PyTorch's CPU allocator print (the HyperPod
recipes' Auto Configurator reads the same kind of strings); near-OOM is a run that finished but whose caching
allocator had to free its cache and retry (``alloc_retries`` > 0: torchtitan logs the same counter as a
warning), or whose reserved peak came within ``NEAR_OOM_MARGIN_GB`` of the GPU's memory (the Auto
Configurator's 2 GB margin); on a CPU with a per-trial memory limit, a peak resident set above
``NEAR_OOM_CPU_SHARE`` of the limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from training.contract import metric_lines
from training.tune.runner import Finished
from training.tune.stability import Spread

STATUSES = ("ok", "near-oom", "oom", "timeout", "failed", "not-run")
NEAR_OOM_MARGIN_GB = 2.0
NEAR_OOM_CPU_SHARE = 0.9
OOM_MARKERS = (
    "CUDA out of memory",
    "OutOfMemoryError",
    "CUDA error: out of memory",
    "cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "Failed to CUDA calloc",
    "Cuda failure 2 'out of memory'",
    "DefaultCPUAllocator: can't allocate memory",
    "MemoryError",
    "std::bad_alloc",
    "Cannot allocate memory",
    "can't start new thread",  # a thread stack that no longer fits under the address-space limit
)
_EXCEPTION = re.compile(r"(?:^|[\]:]\s)\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_WRAPPERS = ("ChildFailedError", "torch.distributed.elastic")
_SIGNAL = re.compile(r"exitcode\s*:\s*-(\d+)")


@dataclass
class TrialResult:
    """One trial: its settings, status and what was measured (``spread``: the timed steps' step times)."""

    index: int
    settings: dict[str, Any]
    probe: bool = False
    status: str = "not-run"
    error: str | None = None
    spread: Spread | None = None
    step_times: list[float] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None
    first_step_seconds: float | None = None
    stopped_early: bool = False
    log: str | None = None

    @property
    def ran(self) -> bool:
        return self.status in ("ok", "near-oom")


def error_line(lines: list[str]) -> str | None:
    """The line that best says why a trial failed: the trainer's own ``error:`` line, else the first exception
    line that is not torchrun's wrapper, else a worker killed by a signal, else the last line."""
    for line in lines:
        if line.startswith("error: ") or "] error: " in line:
            return line[line.index("error: ") :]
    for line in lines:
        match = _EXCEPTION.search(line)
        if match and not any(w in line for w in _WRAPPERS):
            return f"{match.group(1)}: {match.group(2)}".strip()
    for line in lines:
        match = _SIGNAL.search(line)
        if match:
            return f"a worker was killed by signal {match.group(1)} ({line.strip()})"
    return next((line.strip() for line in reversed(lines) if line.strip()), None)


def read_lines(result: TrialResult, lines: list[str]) -> None:
    """Fill ``result`` from the trial's lines: config, timed step times, losses, summary."""
    for line in lines:
        config = metric_lines.parse_config_line(line)
        if config is not None:
            result.config = config
            continue
        step = metric_lines.parse_step_line(line)
        if step is not None:
            number, values = step
            if "loss" in values:
                result.losses.append((number, values["loss"]))
            if "step_time" in values:
                result.step_times.append(values["step_time"])
            continue
        summary = metric_lines.parse_summary_line(line)
        if summary is not None:
            result.summary = summary
        elif line.startswith("tune: step time stable"):
            result.stopped_early = True
    result.spread = Spread.of(result.step_times)


def classify(
    result: TrialResult,
    finished: Finished,
    *,
    gpu_memory_gb: float | None,
    memory_limit_gb: float | None,
) -> None:
    """Set ``result``'s status and error from how its process ended and what it printed."""
    read_lines(result, finished.lines)
    result.seconds, result.first_step_seconds = finished.seconds, finished.first_step_seconds
    oom = next((line.strip() for line in finished.lines if any(m in line for m in OOM_MARKERS)), None)
    if finished.timed_out:
        last = next((line.strip() for line in reversed(finished.lines) if line.strip()), "no output")
        result.status = "timeout"
        result.error = f"no result within {finished.seconds:.0f} s: its process tree was killed (last line: {last[:200]})"
    elif oom is not None and (finished.exit_code != 0 or not result.summary):
        result.status, result.error = "oom", error_line([oom]) or oom
    elif finished.exit_code != 0 or not result.summary or result.spread is None:
        result.status = "failed"
        result.error = error_line(finished.lines) or f"exit status {finished.exit_code}"
        if finished.exit_code == 0:
            result.error = f"no timed step or summary line ({result.error})"
    else:
        result.status = "near-oom" if near_oom(result.summary, gpu_memory_gb, memory_limit_gb) else "ok"
        if result.status == "near-oom":
            result.error = near_oom_reason(result.summary, gpu_memory_gb, memory_limit_gb)


def near_oom(summary: dict[str, float], gpu_memory_gb: float | None, memory_limit_gb: float | None) -> bool:
    return near_oom_reason(summary, gpu_memory_gb, memory_limit_gb) is not None


def near_oom_reason(
    summary: dict[str, float], gpu_memory_gb: float | None, memory_limit_gb: float | None
) -> str | None:
    retries, ooms = summary.get("alloc_retries", 0), summary.get("alloc_ooms", 0)
    if retries or ooms:
        return (
            f"the caching allocator retried {retries:.0f} time(s) after failed allocations ({ooms:.0f} OOMs)"
        )
    reserved = summary.get("max_reserved_gb")
    if reserved is not None and gpu_memory_gb and reserved > gpu_memory_gb - NEAR_OOM_MARGIN_GB:
        return f"reserved peak {reserved:.1f} GB is within {NEAR_OOM_MARGIN_GB:g} GB of the GPU's {gpu_memory_gb:g} GB"
    allocated = summary.get("max_allocated_gb")
    if (
        reserved is None
        and memory_limit_gb
        and allocated
        and allocated > NEAR_OOM_CPU_SHARE * memory_limit_gb
    ):
        return (
            f"peak resident set {allocated:.2f} GB is above {NEAR_OOM_CPU_SHARE:.0%} of the trial's memory "
            f"limit {memory_limit_gb:g} GB"
        )
    return None
