"""Throughput, FLOPs, MFU and memory, measured over logging intervals with the warm-up steps left out.

FLOPs per token (training = forward + backward = 3x forward), the PaLM/Megatron convention:

    flops_per_token = 6 * N + 12 * L * H * S

N: parameters taking part in matmuls (all but the input embedding, a lookup; the LM head counts);
L layers, H hidden size, S sequence length: the second term is attention's QK^T and AV matmuls (2 * 2 * S * H
multiply-adds per token per layer, x3 for training), counted in full although the causal mask skips about half.
A LoRA run computes no weight gradient of its frozen weights: ``4 * N + 6 * Na + 12 * L * H * S`` with Na the
adapters' parameters (``ModelConfig.flops_per_token``).

MFU = achieved TFLOP/s per GPU / peak dense TFLOP/s of the GPU at the run's precision (hardware.PEAK_TFLOPS);
left out (not printed as 0) on a CPU or an unknown GPU, which have no peak to divide by. A low-precision run is
counted against its own precision's peak (fp8 and mxfp8 against the FP8 peak, nvfp4 against the FP4 peak), so its
MFU is comparable across precisions only as "share of what that format can do": the same TFLOP/s gives an fp8 run
half the MFU of a bf16 run. So low-precision runs also report ``mfu_bf16``: the same TFLOP/s against the GPU's bf16
peak (the bf16-equivalent MFU, comparable with a bf16 run's MFU).
"""

from __future__ import annotations

import resource
import sys
import time

import torch
import torch.distributed

from training.contract import hardware
from training.models.config import ModelConfig


def gpu_name(device: torch.device) -> str | None:
    """The hardware.PEAK_TFLOPS key of this GPU (e.g. "B200"), or None on CPU / an unlisted GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    # longest key first: "NVIDIA GB200" contains "B200"
    return next((key for key in sorted(hardware.PEAK_TFLOPS, key=len, reverse=True) if key in name), None)


def peak_tflops(device: torch.device, precision: str) -> float | None:
    name = gpu_name(device)
    return hardware.PEAK_TFLOPS.get(name, {}).get(precision) if name else None


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch, or on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1e9 if sys.platform == "darwin" else rss * 1024 / 1e9


def memory_over_ranks(device: torch.device, group: torch.distributed.ProcessGroup) -> dict[str, float]:
    """``metric_lines.MEMORY_SUMMARY_METRICS`` of this run: every rank's peaks and allocator counts, reduced over
    ``group`` (a collective: every rank calls it). On a CPU only ``max_allocated_gb`` (the peak resident set size;
    there is no caching allocator to reserve or retry)."""
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        peaks = [torch.cuda.max_memory_allocated(device) / 1e9, torch.cuda.max_memory_reserved(device) / 1e9]
        counts = [float(stats.get("num_alloc_retries", 0)), float(stats.get("num_ooms", 0))]
    else:
        peaks, counts = [peak_memory_gb(device)], []
    maxima = torch.tensor(peaks, dtype=torch.float64)
    torch.distributed.all_reduce(maxima, op=torch.distributed.ReduceOp.MAX, group=group)
    out = dict(zip(("max_allocated_gb", "max_reserved_gb"), maxima.tolist(), strict=False))
    if counts:
        sums = torch.tensor(counts, dtype=torch.float64)
        torch.distributed.all_reduce(sums, group=group)
        out.update(alloc_retries=int(sums[0].item()), alloc_ooms=int(sums[1].item()))
    return out


class Throughput:
    """Accumulates step timings. ``tokens_per_step`` is per GPU (batch_size * seq_length)."""

    def __init__(
        self,
        shape: ModelConfig,
        seq_length: int,
        tokens_per_step: int,
        warmup_steps: int,
        device: torch.device,
        precision: str,
        lora_parameters: int = 0,
    ):
        """``lora_parameters``: the LoRA adapters' parameters (0: every weight trains)."""
        self.tokens_per_step, self.warmup_steps, self.device = tokens_per_step, warmup_steps, device
        self.flops_per_token = shape.flops_per_token(seq_length, lora_parameters)
        self.peak = peak_tflops(device, precision)
        self.bf16_peak = peak_tflops(device, "bf16") if precision in hardware.TE_PRECISIONS else None
        self.interval_start = 0.0
        self.steps_done = self.interval_steps = self.measured_steps = 0
        self.measured_seconds = 0.0
        self.first_start: float | None = None

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self) -> None:
        """Call once before the first step."""
        self.interval_start = self.first_start = self._now()

    def step_done(self) -> None:
        """Count a finished step. The first ``warmup_steps`` of this process (allocations, autotuning, also
        after a resume) are left out: timing restarts when the last of them ends."""
        self.steps_done += 1
        if self.steps_done == self.warmup_steps:
            self.reset_interval()
        elif self.steps_done > self.warmup_steps:
            self.interval_steps += 1

    def interval(self) -> dict[str, float]:
        """Close the interval at a logging step: its step time and, past the warm-up, its throughput."""
        now = self._now()
        elapsed = now - self.interval_start
        self.interval_start = now
        steps, self.interval_steps = self.interval_steps, 0
        if steps == 0:  # still warming up: time everything, report no throughput
            return {}
        self.measured_steps += steps
        self.measured_seconds += elapsed
        return {"step_time": elapsed / steps, **self.rates(steps * self.tokens_per_step, elapsed)}

    def reset_interval(self) -> None:
        """Restart timing (e.g. after a checkpoint save, which is not training time)."""
        self.interval_start = self._now()
        self.interval_steps = 0

    def summary(self) -> dict[str, float]:
        """Throughput over every measured (post-warm-up) step; when no step was measured (a run as short as its
        warm-up), over every step of this process, warm-up included, rather than a meaningless 0."""
        if self.measured_steps == 0:
            seconds = self.total_seconds()
            if self.steps_done == 0 or seconds <= 0:
                return {}
            return self.rates(self.steps_done * self.tokens_per_step, seconds)
        return self.rates(self.measured_steps * self.tokens_per_step, self.measured_seconds)

    def total_seconds(self) -> float:
        """Seconds since ``start``: the measured steps' time, or all of it when none was measured."""
        if self.measured_steps:
            return self.measured_seconds
        return self._now() - self.first_start if self.first_start is not None else 0.0

    def rates(self, tokens: int, seconds: float) -> dict[str, float]:
        tokens_per_sec = tokens / seconds
        tflops = tokens_per_sec * self.flops_per_token / 1e12
        out = {"tokens_per_sec": tokens_per_sec, "tflops_per_gpu": tflops}
        if self.peak:
            out["mfu"] = tflops / self.peak
        if self.bf16_peak:
            out["mfu_bf16"] = tflops / self.bf16_peak
        return out
