"""What one H100 or H200 cannot measure, and the published figure, the estimate or the assumption the plan uses
instead, each read from the constant the plan itself uses, so the list cannot drift from the code."""

from __future__ import annotations

from typing import Any

from training.contract import hardware
from training.plan import band, memory_terms
from training.request import tuning_plan


def items() -> list[dict[str, Any]]:
    b200 = hardware.PEAK_TFLOPS["B200"]
    h100 = hardware.PEAK_TFLOPS["H100"]
    return [
        {
            "what": "FSDP2 communication across 8 GPUs (NVLink all-gathers and reduce-scatters of ml.p6-b200.48xlarge)",
            "why": "one GPU: FSDP2 on a one-rank mesh has nothing to exchange; its collectives are local copies",
            "instead": "the plan's throughput is an estimate with a low-high band, scaled from the source article's "
            f"8-GPU measurements ({band.REFERENCE_SOURCE}); its memory "
            f"counts NCCL's buffers in a fixed allowance of {memory_terms.ALLOWANCE_FIXED_GIB:g} GiB per GPU (assumed)",
        },
        {
            "what": "Transformer Engine precisions (fp8 recipes, mxfp8, nvfp4) and TE's kernels",
            "why": "TE 2.11's CUDA 13 core wheel is 179 MB, over what one device call carries (64 MiB), and its torch "
            "extension is source-only; MXFP8 and NVFP4 need Blackwell (SM 10.x) anyway",
            "instead": f"published dense peaks (NVIDIA datasheets): H100 fp8 {h100['fp8']:g} TFLOP/s; B200 fp8 "
            f"{b200['fp8']:g}, mxfp8 {b200['mxfp8']:g}, nvfp4 {b200['nvfp4']:g}; the memory of quantized "
            "activations and weight copies from TE 2.11's source (memory_terms.QUANTIZED_BYTES)",
        },
        {
            "what": "Blackwell (B200, B300, GB200): speed, memory, the product's target GPU",
            "why": "the lent machines are Hopper (H100, H200)",
            "instead": f"B200 dense bf16 {b200['bf16']:g} TFLOP/s, "
            f"{hardware.GPU_INSTANCE_TYPES['ml.p6-b200.48xlarge'].gpu_memory_gb} GB per GPU (NVIDIA's HGX B200 "
            "datasheet, halved from its sparse figures); throughput an estimate scaled from the source article's two "
            "8x B200 configurations by FLOPs and peak, its band from peer figures (band.PEER_FIGURES)",
        },
        {
            "what": "Several instances (EFA between hosts) and SageMaker's own start-up and checkpoint volume",
            "why": "one machine, outside SageMaker",
            "instead": f"a tuning job's start assumed {tuning_plan.JOB_START_SECONDS:.0f} s, a trial's "
            f"{tuning_plan.TRIAL_START_SECONDS:.0f} s, a checkpoint write {tuning_plan.SAVE_GB_PER_SECOND_PER_GPU:g} GB/s per GPU "
            "(round upper figures, not measured)",
        },
    ]
