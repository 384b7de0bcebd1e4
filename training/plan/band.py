"""Where the time estimate's throughput comes from: the source article's two measured points (the reference),
the MFU curve through them, and the band a configuration the article did not measure may reach (each end
with its source: the precision's factor, the best published figure of a peer FSDP2 stack).

Throughput is the source article's own figure at its two measured configurations (``basis`` ``published``,
:func:`article_point`); anywhere else an ``estimate`` scaled from them by FLOPs and the GPU's peak, with a low-high
band from a stated MFU band (:func:`mfu_band`); unless a tuning run measured this exact configuration on this
instance type with this image (``basis`` ``measured``: :mod:`training.plan.measured` decides, the caller passes
the stored records in).
Stored records also check the memory estimate: the plan reports its own error against them (:func:`memory_check`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from training.contract import hardware, shapes
from training.plan.memory import Setup

# Throughput: the source article's measured points where no tuning run has measured the configuration ("Optimize
# model training on Amazon SageMaker AI with NVIDIA Blackwell", AWS Machine Learning blog, June 2026, Figure 1: 1B
# LLM, MXFP8, 8K sequence, one ml.p6-b200.48xlarge, FSDP): batch 1 without AC ~6,000 tokens/s; batch 16 with AC
# ~51,000 tokens/s (per GPU: the only reading that gives a plausible MFU). AC's recompute overhead: the article's
# "typically 10-30%", taken as 20%. Any other configuration is an estimate from them (``estimate_time``).
REFERENCE_URL = (
    "https://aws.amazon.com/blogs/machine-learning/"
    "optimize-model-training-on-amazon-sagemaker-ai-with-nvidia-blackwell/"
)
REFERENCE_GPU = "B200"
REFERENCE_INSTANCE_TYPE = "ml.p6-b200.48xlarge"
REFERENCE_PRESET = "1b"
REFERENCE_PRECISION = "mxfp8"
REFERENCE_SEQ_LENGTH = 8192
REFERENCE_POINTS: tuple[tuple[int, float, bool], ...] = ((8192, 6_000.0, False), (131_072, 51_000.0, True))
"""(tokens per micro-batch, tokens/s per GPU, activation checkpointing) of the article's 1B MXFP8 runs."""
AC_OVERHEAD = 1.2
AC_OVERHEAD_BAND = (1.1, 1.3)
"""The article's "typically 10-30%" recompute overhead: the high estimate takes 10%, the low one 30%."""
REFERENCE_SOURCE = (
    f"the source article ({REFERENCE_URL}) Figure 1: 1B, MXFP8, 8K tokens, one {REFERENCE_INSTANCE_TYPE}: "
    "~6,000 tokens/s per GPU at batch 1 without activation checkpointing, ~51,000 at batch 16 with it"
)


TORCHAO_B200 = "https://github.com/pytorch/ao/tree/main/torchao/prototype/mx_formats#training-e2e-benchmarks-on-nvidia-b200"
TORCHTITAN_H100 = "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md"


@dataclass(frozen=True)
class PeerFigure:
    """A peer FSDP2 stack's published tokens/s per GPU for Llama 3 8B at 8,192 tokens, read as the MFU it is against
    the GPU's bf16 peak (this project's ``flops_per_token`` of the ``llama3.1-8b`` preset)."""

    gpus: tuple[str, ...]
    """The GPU it was measured on, then those it stands for (same chip generation and bf16 peak class)."""
    precision: str
    tokens_per_sec_per_gpu: float
    source: str

    @property
    def mfu_bf16(self) -> float:
        flops = shapes.flops_per_token(shapes.MODEL_PRESETS["llama3.1-8b"], 8192)
        return self.tokens_per_sec_per_gpu * flops / (hardware.PEAK_TFLOPS[self.gpus[0]]["bf16"] * 1e12)


PEER_FIGURES: tuple[PeerFigure, ...] = (
    PeerFigure(
        ("B200", "B300", "GB200"), "bf16", 8_307.5, f"torchao on torchtitan, 8x B200 ({TORCHAO_B200})"
    ),
    PeerFigure(
        ("B200", "B300", "GB200"), "mxfp8", 9_969.0, f"torchao on torchtitan, 8x B200 ({TORCHAO_B200})"
    ),
    PeerFigure(
        ("B200", "B300", "GB200"), "fp8", 10_417.0, f"torchao on torchtitan, 8x B200 ({TORCHAO_B200})"
    ),
    PeerFigure(("H100", "H200"), "bf16", 6_667.0, f"torchtitan, 8x H100 ({TORCHTITAN_H100})"),
    PeerFigure(("H100", "H200"), "fp8", 8_532.0, f"torchtitan, 8x H100 ({TORCHTITAN_H100})"),
    PeerFigure(("A100",), "bf16", 2_973.0, f"torchtitan, 64x A100 ({TORCHTITAN_H100})"),
)
"""The best published MFU of a peer FSDP2 stack per GPU and precision: the top of the estimate's band where it is
above the article's (torchao's Llama3-8b table: bf16 8,307.5, mxfp8_cublas 9,969, float8 tensorwise 10,417 tokens/s
per GPU, batch 1, torch.compile, selective AC; torchtitan's Llama 3.1 8B with torch.compile 6,667 and with Float8
8,532, batch 2, selective AC; Llama 3 8B on A100 2,973). fp16 reads as bf16."""

PRECISION_BAND: Mapping[str, tuple[float, float, str]] = {
    "mxfp8": (1.0, 1.0, "the article's own precision"),
    "bf16": (1 / 1.20, 1.0, "up to the 20% mxfp8 gains over bf16 on 8x B200 in torchao's table less, or as fast (the "
             "article finds low precisions' gains modest under 14B)"),
    "fp16": (1 / 1.20, 1.0, "as bf16"),
    "fp8": (1.0, 1.254 / 1.200, "as mxfp8, or faster by float8 tensorwise's lead over mxfp8 in torchao's table "
            "(+25.4% against +20.0% over bf16; the article finds fp8's overhead lower than mxfp8's)"),
    "nvfp4": (1 / 1.20, 1.20, "no published NVFP4 training speed on this stack: mxfp8's 20% either way (the article: "
              "NVFP4's gains come with large models)"),
    "fp32": (0.5, 2.0, "no published figure: against the GPU's fp32 peak, a factor of two either way"),
}  # fmt: skip
"""Per precision: (low, high) factors on the article's MXFP8 MFU, and why."""


@dataclass(frozen=True)
class MfuBand:
    """The MFU (against the peak the estimate uses) of the estimate's low, central and high ends, and their
    sources in words."""

    low: float
    central: float
    high: float
    sources: str


def _trend_mfu(step_flops: float) -> float:
    """The low end of the band: MFU as a power of one micro-batch's FLOPs through the article's two points (a step
    with fixed costs that shrink less than its work), below its larger micro-batch, where it lies under the
    log-linear centre (:func:`_reference_mfu`) and goes on falling below the smaller one; held flat above."""
    (x0, y0), (x1, y1) = _reference_curve()
    x = math.log(max(step_flops, 1.0))
    if x >= x1:
        return y1
    return y0 * math.exp((x - x0) * math.log(y1 / y0) / (x1 - x0))


def mfu_band(s: Setup, step_flops: float) -> MfuBand:
    """The estimate's MFU band for ``s`` at ``step_flops`` per micro-batch: the article's curve
    (:func:`_reference_mfu`) as the centre; the low end the power law through its points (:func:`_trend_mfu`) times the precision's low factor (``PRECISION_BAND``); the high end the curve times the
    larger of the precision's high factor and the best peer MFU for this GPU and precision (``PEER_FIGURES``) over
    the article's top MFU."""
    gpu = hardware.GPU_INSTANCE_TYPES[s.instance_type].gpu
    low_factor, high_factor, why = PRECISION_BAND[s.precision]
    top = _reference_curve()[1][1]
    peer_precision = "bf16" if s.precision == "fp16" else s.precision
    peers = [p for p in PEER_FIGURES if gpu in p.gpus and p.precision == peer_precision]
    sources = [f"{s.precision}: {why}"]
    if peers:
        best = max(peers, key=lambda p: p.mfu_bf16)
        high_factor = max(high_factor, best.mfu_bf16 / top)
        sources.append(f"best published on {gpu} {peer_precision}: {best.mfu_bf16:.1%} MFU, {best.source}")
    central = _reference_mfu(step_flops)
    return MfuBand(
        low=_trend_mfu(step_flops) * low_factor,
        central=central,
        high=central * high_factor,
        sources="; ".join(sources),
    )


def _reference_curve() -> tuple[tuple[float, float], tuple[float, float]]:
    """The article's two points as (log of one micro-batch's FLOPs, MFU without AC against B200's bf16 peak): 2.3%
    at 7e13, 23% at 1.1e15."""
    ref_flops = shapes.flops_per_token(shapes.MODEL_PRESETS[REFERENCE_PRESET], REFERENCE_SEQ_LENGTH)
    peak = hardware.PEAK_TFLOPS[REFERENCE_GPU]["bf16"] * 1e12
    first, second = (
        (math.log(tokens * ref_flops), tps * (AC_OVERHEAD if ac else 1.0) * ref_flops / peak)
        for tokens, tps, ac in REFERENCE_POINTS
    )
    return first, second


def _reference_mfu(step_flops: float) -> float:
    """Model FLOPs utilization against B200's bf16 peak, without AC, interpolated log-linearly in the FLOPs of one
    micro-batch (the work each kernel launch and each FSDP2 collective is spread over) between the article's two
    points (:func:`_reference_curve`), held flat outside them."""
    (x0, y0), (x1, y1) = _reference_curve()
    x = min(max(math.log(max(step_flops, 1.0)), x0), x1)
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
