"""A trial's status and error line from its output, its step-time statistics, and the convergence check."""

from __future__ import annotations

import math

import pytest

from training.contract import metric_lines
from training.tune import convergence, outcome
from training.tune.runner import Finished
from training.tune.stability import Spread, Stability, cv, percentile

CONFIG = metric_lines.format_config_line({"world_size": 8, "device": "cuda", "gpu": "B200"})


def steps(times: list[float], warmup: int = 2) -> list[str]:
    lines = [metric_lines.format_step_line(i + 1, {"loss": 3.0}) for i in range(warmup)]
    for i, seconds in enumerate(times, start=warmup + 1):
        lines.append(metric_lines.format_step_line(i, {"loss": 3.0 - i / 100, "step_time": seconds}, 40))
    return lines


def classified(
    lines: list[str], code: int | None = 0, timed_out: bool = False, **limits
) -> outcome.TrialResult:
    result = outcome.TrialResult(1, {"batch_size": 4})
    finished = Finished(code, timed_out, lines, 12.0, 5.0)
    outcome.classify(
        result, finished, gpu_memory_gb=limits.get("gpu", 180.0), memory_limit_gb=limits.get("cpu")
    )
    return result


def summary(**fields: float) -> str:
    return metric_lines.format_summary_line({"steps": 10, "final_loss": 2.5, **fields})


def test_a_run_with_its_summary_is_ok_with_its_timed_steps_only():
    result = classified(
        [CONFIG, *steps([0.5, 0.52, 0.51]), summary(max_allocated_gb=40.0, max_reserved_gb=44.0)]
    )
    assert result.status == "ok" and result.error is None
    assert result.step_times == [0.5, 0.52, 0.51] and result.spread.median == 0.51
    assert result.config["gpu"] == "B200" and result.summary["max_reserved_gb"] == 44.0
    assert len(result.losses) == 5


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"alloc_retries": 3, "alloc_ooms": 0, "max_reserved_gb": 100.0}, "retried 3 time(s)"),
        ({"alloc_retries": 0, "alloc_ooms": 0, "max_reserved_gb": 178.5}, "within 2 GB of the GPU's 180 GB"),
    ],
)
def test_allocator_retries_or_a_reserved_peak_near_capacity_is_near_oom(fields, why):
    result = classified([*steps([0.5, 0.5]), summary(max_allocated_gb=90.0, **fields)])
    assert result.status == "near-oom" and why in result.error


def test_on_a_cpu_a_resident_peak_near_the_trials_limit_is_near_oom():
    assert classified([*steps([0.5]), summary(max_allocated_gb=1.9)], cpu=2.0).status == "near-oom"
    assert classified([*steps([0.5]), summary(max_allocated_gb=1.0)], cpu=2.0).status == "ok"


@pytest.mark.parametrize(
    "line",
    [
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity",
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "NCCL WARN Cuda failure 2 'out of memory'",
    ],
)
def test_out_of_memory_is_read_from_the_error_strings(line):
    result = classified([CONFIG, "Traceback (most recent call last):", line, "ChildFailedError: ..."], code=1)
    assert result.status == "oom" and result.error


def test_a_timeout_names_its_last_line():
    result = classified([CONFIG, *steps([9.0])], code=None, timed_out=True)
    assert result.status == "timeout" and "killed" in result.error and "step=3/40" in result.error


def test_a_failure_names_the_root_cause_not_torchruns_wrapper():
    lines = [
        "[rank1]: Traceback (most recent call last):",
        "[rank1]: ValueError: the shapes do not line up",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "exitcode  : 1 (pid: 17)",
    ]
    result = classified(lines, code=1)
    assert (result.status, result.error) == ("failed", "ValueError: the shapes do not line up")
    refused = classified(["error: invalid setting seq_length: must be a multiple of 32"], code=2)
    assert refused.error == "error: invalid setting seq_length: must be a multiple of 32"
    killed = classified(["exitcode  : -9 (pid: 40)"], code=1)
    assert killed.error.startswith("a worker was killed by signal 9")


def test_a_clean_exit_without_a_summary_is_a_failure():
    result = classified([CONFIG, *steps([0.4])], code=0)
    assert result.status == "failed" and result.error.startswith("no timed step or summary line")


def test_step_time_statistics():
    assert math.isinf(cv([1.0]))
    assert cv([1.0, 1.0, 1.0]) == 0.0
    assert percentile([1, 2, 3, 4, 5], 10) == pytest.approx(1.4)
    assert percentile([5, 1, 3], 50) == 3
    spread = Spread.of([1.0, 1.1, 0.9, 1.0])
    assert (spread.steps, spread.median) == (4, 1.0) and spread.p10 < spread.median < spread.p90
    stability = Stability(window=3, cv_target=0.02)
    assert not stability.stable([1.0, 1.0])  # not a full window yet
    assert stability.stable([3.0, 1.0, 1.0, 1.01])  # the last window only
    assert not stability.stable([1.0, 1.2, 0.9])
    assert not Stability(3, 0.0).stable([1.0, 1.0, 1.0])  # 0: never early
    assert Spread.of([2.0]).as_dict()["cv"] is None  # one timed step has no spread: null in report.json, '-'


def curve(final: float, noise: float = 0.0, points: int = 50) -> list[tuple[int, float]]:
    return [(i, final + 3.0 * math.exp(-i / 8) + noise * math.sin(i)) for i in range(1, points + 1)]


def test_a_curve_within_tolerance_passes_the_convergence_check():
    check = convergence.compare("mxfp8", curve(2.52), "bf16", curve(2.5))
    assert check.passed and check.tolerance == 0.10 and check.correlation > 0.99
    assert check.points == 40  # the first 20% of 50 skipped


def test_a_diverging_or_uncorrelated_curve_fails_with_the_reason():
    off = convergence.compare("nvfp4", curve(1.2), "bf16", curve(1.0))
    assert not off.passed and "final loss differs" in off.why and off.tolerance == 0.05
    noisy = convergence.compare("fp8", curve(0.3, noise=2.0), "bf16", curve(0.3))
    assert not noisy.passed and "correlation" in noisy.why
    short = convergence.compare("fp8", curve(1.0, points=3), "bf16", curve(1.0, points=3))
    assert not short.passed and "only" in short.why
