"""The hardware a run may get: the precisions and which GPUs run them (compute capability), the FP8
recipes, the GPU training instance types and their GPUs, their on-demand prices and their GPUs' peak throughput (for
MFU).

Part of the contract between the infrastructure (``constructs_lib``) and the trainer (``training.trainer``): pure
Python, standard library only; the CDK app imports it at synth time, the request check in its Lambda, the trainer at
run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")
"""Every precision the trainer accepts. fp8/mxfp8/nvfp4 run through NVIDIA Transformer Engine."""

TE_PRECISIONS: frozenset[str] = frozenset({"fp8", "mxfp8", "nvfp4"})
"""Precisions that need Transformer Engine (low-precision GEMMs)."""

BLACKWELL_ONLY_PRECISIONS: frozenset[str] = frozenset({"mxfp8", "nvfp4"})
"""Precisions whose TE recipes need a data-centre Blackwell GPU (SM 10.x)."""

FP8_RECIPES: tuple[str, ...] = ("auto", "current", "delayed", "mxfp8")
"""For ``precision=fp8``: ``auto`` (the default) is ``Float8CurrentScaling`` on Ada and Hopper and
``MXFP8BlockScaling`` on data-centre Blackwell (SM 10.x), the fastest stable recipe of each generation (Megatron's
``low_precision_training.md``; torchtitan's float8 and mxfp8 recipes); ``current`` is TE ``Float8CurrentScaling``,
``delayed`` TE ``DelayedScaling`` (amax history 1024) and ``mxfp8`` TE ``MXFP8BlockScaling`` (SM 10.x only)."""


def fp8_recipe_for(fp8_recipe: str, sm: tuple[int, int] | None) -> str:
    """The recipe ``fp8_recipe`` means on a GPU of compute capability ``sm``: ``auto`` resolves to ``mxfp8`` on
    SM 10.x and to ``current`` elsewhere (and without a GPU, where nothing runs fp8)."""
    if fp8_recipe != "auto":
        return fp8_recipe
    return "mxfp8" if sm is not None and sm[0] == 10 else "current"


QUANTIZED_INIT_PRECISIONS: frozenset[str] = frozenset({"fp8", "mxfp8"})
"""Precisions whose quantized primary weights work with FSDP2 in TE 2.11 (Float8Tensor and MXFP8Tensor only)."""


def precision_supported_on(precision: str, sm: tuple[int, int]) -> bool:
    """Whether a GPU of compute capability ``sm`` (major, minor) can run ``precision``.

    bf16 needs Ampere (8.0); fp8 recipes need SM 8.9+ (Ada, Hopper, Blackwell); MXFP8 and NVFP4 need a
    data-centre Blackwell GPU (SM 10.x; TE 2.11 refuses MXFP8 on SM 12.0).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if precision in ("fp32", "fp16"):
        return True
    if precision == "bf16":
        return sm >= (8, 0)
    if precision == "fp8":
        return sm >= (8, 9)
    return sm[0] == 10


@dataclass(frozen=True)
class GpuInstance:
    """A SageMaker GPU training instance type."""

    gpu: str
    gpus: int
    sm: tuple[int, int]
    gpu_memory_gb: int

    def supports(self, precision: str) -> bool:
        return precision_supported_on(precision, self.sm)


GPU_INSTANCE_TYPES: Mapping[str, GpuInstance] = {
    "ml.p6-b200.48xlarge": GpuInstance("B200", 8, (10, 0), 180),
    "ml.p6-b300.48xlarge": GpuInstance("B300", 8, (10, 3), 268),
    "ml.p6e-gb200.36xlarge": GpuInstance("GB200", 4, (10, 0), 186),
    "ml.p5.48xlarge": GpuInstance("H100", 8, (9, 0), 80),
    "ml.p5e.48xlarge": GpuInstance("H200", 8, (9, 0), 141),
    "ml.p5en.48xlarge": GpuInstance("H200", 8, (9, 0), 141),
    "ml.p5.4xlarge": GpuInstance("H100", 1, (9, 0), 80),
    "ml.p4d.24xlarge": GpuInstance("A100", 8, (8, 0), 40),
    "ml.p4de.24xlarge": GpuInstance("A100", 8, (8, 0), 80),
}
"""GPU training instance types the workflow may launch (botocore's enum, November 2026), with their GPUs."""
DEFAULT_INSTANCE_TYPE = "ml.p6-b200.48xlarge"


def instance_types_supporting(precision: str) -> tuple[str, ...]:
    """The instance types whose GPUs can run ``precision``, in the order of ``GPU_INSTANCE_TYPES``."""
    return tuple(name for name, gpu in GPU_INSTANCE_TYPES.items() if gpu.supports(precision))


# On-demand list price per instance-hour (USD, us-east-1), used by the operator CLI's cost estimates
# (billable seconds x instance count x this). Looked up on 2026-11-23 with the project's search tool; SageMaker's
# own price page could not be read there, so the figures are the AWS Price List's on-demand Linux rates of the same
# EC2 instances (us-east-1, as of 2026-07-27, quoted in the public test tables of pricing tools; p5en also in
# dstack PR #4110, Aug 2026). SageMaker's ml.* rate for an instance is the same or higher (ml.p4d.24xlarge:
# 37.688), so an estimate from this table is a floor. None: no on-demand row was found (p5e has none at all;
# B300 and GB200 are sold through capacity reservations / training plans). Update from
# https://aws.amazon.com/sagemaker/ai/pricing/ (Training, On-Demand) for your region.
ON_DEMAND_USD_PER_HOUR: Mapping[str, float | None] = {
    "ml.p6-b200.48xlarge": 113.93,
    "ml.p6-b300.48xlarge": None,
    "ml.p6e-gb200.36xlarge": None,
    "ml.p5.48xlarge": 55.04,
    "ml.p5e.48xlarge": None,
    "ml.p5en.48xlarge": 63.296,
    "ml.p5.4xlarge": 6.88,
    "ml.p4d.24xlarge": 21.95764,
    "ml.p4de.24xlarge": 27.44705,
}
PRICES_AS_OF = "2026-07-27 (AWS Price List, us-east-1, EC2 on-demand Linux; a floor for SageMaker)"


def estimate_cost_usd(instance_type: str, instance_count: int, billable_seconds: float) -> float | None:
    """On-demand cost of ``billable_seconds`` of wall-clock time on ``instance_count`` instances (SageMaker bills
    BillableTimeInSeconds per instance; managed spot's savings are already in it). None when the table has no
    price for ``instance_type``."""
    price = ON_DEMAND_USD_PER_HOUR.get(instance_type)
    if price is None:
        return None
    return price * instance_count * billable_seconds / 3600.0


# Peak dense tensor throughput per GPU (TFLOP/s), used for MFU: dense (no 2:4 sparsity), per GPU, at the
# precision of the GEMMs. A low-precision run's MFU is counted against that precision's own peak (fp8 and mxfp8
# against the FP8 peak, nvfp4 against the FP4 peak), not against bf16, so an fp8 run at the same TFLOP/s shows
# half the MFU of a bf16 run. fp32 is the non-tensor FP32 figure (the trainer's fp32 GEMMs do not use TF32).
# Sources: NVIDIA HGX B200 / HGX B300 datasheets (8-GPU totals divided by 8: FP32 600 TFLOPS -> 75; FP8 and
# BF16 figures there are "with sparsity", halved here) and NVIDIA's Blackwell architecture technical brief for
# GB200 (1200 W: FP32 90, BF16 2.5 PF, FP8 5 PF, FP4 10 PF dense); per-GPU tables collected at
# https://glennklockwood.com/garden/processors/B200 and https://glennklockwood.com/garden/processors/B300
# (checked November 2026). B200's fp32 was 80 (the technical brief's early figure); the shipping HGX B200
# datasheet says 600 TFLOPS per 8 GPUs, i.e. 75. B300 dense FP4: 105 PFLOPS per 8 GPUs.
PEAK_TFLOPS: Mapping[str, Mapping[str, float]] = {
    "B200": {"fp32": 75.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0, "mxfp8": 4500.0, "nvfp4": 9000.0},
    "B300": {"fp32": 75.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0, "mxfp8": 4500.0, "nvfp4": 13125.0},
    "GB200": {"fp32": 90.0, "fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0, "mxfp8": 5000.0, "nvfp4": 10000.0},
    "H100": {"fp32": 67.0, "fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
    "H200": {"fp32": 67.0, "fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
    "A100": {"fp32": 19.5, "fp16": 312.0, "bf16": 312.0},
}
