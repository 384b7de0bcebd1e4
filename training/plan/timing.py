"""The time and cost estimate: throughput per GPU (published, estimated with its low-high spread, or
measured), step and run time, the network time a multi-instance layout adds, and the run's on-demand cost
(``training.contract.hardware.estimate_cost_usd``); a warning when the run outlasts its time limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from training.contract import hardware, metric_lines, shapes
from training.plan import network
from training.plan.band import (
    AC_OVERHEAD,
    AC_OVERHEAD_BAND,
    REFERENCE_INSTANCE_TYPE,
    REFERENCE_POINTS,
    REFERENCE_PRECISION,
    REFERENCE_PRESET,
    REFERENCE_SEQ_LENGTH,
    REFERENCE_SOURCE,
    MfuBand,
    mfu_band,
)
from training.plan.memory import Setup, lora_block_parameters
from training.plan.memory_terms import QUANTIZED_BYTES


@dataclass(frozen=True)
class Spread:
    """The low and high ends of an estimate (``basis`` ``estimate``), each a (least, most) pair: the throughput at
    the MFU band's ends (``mfu_band``) with the article's 10-30% recompute overhead (``AC_OVERHEAD_BAND``), and the
    step time, run time and cost that follow."""

    tokens_per_sec_per_gpu: tuple[float, float]
    step_seconds: tuple[float, float]
    run_seconds: tuple[float, float]
    cost_usd: tuple[float, float] | None
    mfu_bf16: tuple[float, float]
    """The MFU the run would report (as ``Timing.mfu_bf16``) at either end."""
    assumptions: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_per_sec_per_gpu": [round(v) for v in self.tokens_per_sec_per_gpu],
            "step_seconds": [round(v, 4) for v in self.step_seconds],
            "run_seconds": [round(v) for v in self.run_seconds],
            "cost_usd": None if self.cost_usd is None else [round(v, 2) for v in self.cost_usd],
            "mfu_bf16": [round(v, 4) for v in self.mfu_bf16],
            "assumptions": self.assumptions,
        }


@dataclass(frozen=True)
class Timing:
    """Expected throughput, step time, run time and cost; ``warning`` when the run outlasts its time limit.

    ``mfu_bf16``: the model-FLOPs utilization the run would report against the GPU's bf16 peak (the trainer's
    ``mfu`` for bf16, its ``mfu_bf16`` for lower precisions): the model's FLOPs per token (``flops_per_token``)
    at ``tokens_per_sec_per_gpu``, so activation checkpointing's recompute and the chunked loss's second head GEMM,
    which the model FLOPs leave out, lower it; with LoRA the model FLOPs leave out the frozen weights' gradient
    GEMMs, as the trainer counts them."""

    tokens_per_sec_per_gpu: float
    mfu_bf16: float
    step_seconds: float
    run_seconds: float
    cost_usd: float | None
    warning: str | None
    source: str = REFERENCE_SOURCE
    basis: str = "estimate"
    """``published`` (one of the source article's own measured configurations, ``article_point``), ``estimate``
    (scaled from them, with its ``spread``) or ``measured`` (a stored tuning measurement of this exact
    configuration, image and instance: :mod:`training.plan.measured`)."""
    network: network.StepNetwork | None = None
    """The step's collectives on this layout (:func:`step_network`); None where the instance type's links are not
    in ``network.INTERCONNECTS``."""
    spread: Spread | None = None
    """The estimate's low and high ends; None for ``published`` and ``measured`` figures."""
    network_note: str | None = None
    """Why a job with collectives has no ``network`` (``network.unmodelled``): its time and cost are then a floor.
    None with a network estimate, a measured figure (which holds the network's time) or one GPU."""


def recompute_overhead(s: Setup, overhead: float = AC_OVERHEAD) -> float:
    """The slow-down activation checkpointing's recompute costs: ``overhead`` (a whole block's forward again)
    for every checkpointed block's share of the blocks; ``selective`` recomputes only the output and down
    projections of the matmuls (and cheap element-wise work), so its share of a block's forward FLOPs,
    (h^2 + hf) / (2h^2 + 2h kv + 3hf + 2hS) per token, scales the overhead (QKV h(h + 2kv), output h^2, gate/up
    2hf, down hf, attention 2hS; kv = kv_heads x head_dim, h without grouped-query attention)."""
    if not s.ac_on:
        return 1.0
    share = len(s.checkpointed_blocks) / s.shape.num_layers
    if s.activation_checkpointing == "selective":
        h, f = s.shape.hidden_size, s.shape.ffn_hidden_size
        kv = s.shape.kv_heads * s.shape.head_dim
        share *= (h * h + h * f) / (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h * s.seq_length)
    return 1.0 + (overhead - 1.0) * share


def article_point(s: Setup) -> bool:
    """Whether ``s`` is one of the source article's own measured configurations (``REFERENCE_POINTS``): its 1B
    shape, MXFP8, 8,192 tokens, one ml.p6-b200.48xlarge, full fine-tuning with the whole loss at once, and batch 1
    without activation checkpointing or batch 16 with it on every block. Only there is the figure ``published``."""
    article = shapes.MODEL_PRESETS[REFERENCE_PRESET]
    same_shape = replace(s.shape, num_kv_heads=s.shape.kv_heads) == replace(
        article, num_kv_heads=article.kv_heads
    )
    if not same_shape or (s.precision, s.seq_length, s.instance_type, s.instance_count) != (
        REFERENCE_PRECISION, REFERENCE_SEQ_LENGTH, REFERENCE_INSTANCE_TYPE, 1
    ):  # fmt: skip
        return False
    if s.lora_rank or s.loss_chunk_tokens or s.activation_checkpointing == "selective":
        return False
    every_block = s.activation_checkpointing_interval == 1
    return any(
        s.tokens == tokens and s.ac_on == ac and (every_block or not ac) for tokens, _, ac in REFERENCE_POINTS
    )


def work_flops_per_token(s: Setup) -> float:
    """The FLOPs per token a step of ``s`` runs (recompute and the chunked loss's extra GEMM aside): full
    fine-tuning's ``6N``, or with LoRA the frozen weights' forward and input-gradient GEMMs and the adapters' three
    (``shapes.flops_per_token``'s ``lora_parameters``): also the model FLOPs the run's MFU counts."""
    return shapes.flops_per_token(s.shape, s.seq_length, lora_block_parameters(s) * s.shape.num_layers)


def throughput_at(s: Setup, mfu: float, ac_overhead: float = AC_OVERHEAD) -> float:
    """Tokens/s per GPU of ``s`` computing at ``mfu`` of its peak (bf16's; fp32's for fp32), slowed by the work the
    model FLOPs leave out: activation checkpointing's recompute (:func:`recompute_overhead` at ``ac_overhead``) and
    the chunked loss's second head GEMM in backward (2 x hidden x vocabulary FLOPs per token,
    ``training/trainer/loss.py``)."""
    gpu = hardware.GPU_INSTANCE_TYPES[s.instance_type].gpu
    flops = work_flops_per_token(s)
    peak = hardware.PEAK_TFLOPS[gpu]["fp32" if s.precision == "fp32" else "bf16"]
    tps = mfu * peak * 1e12 / flops / recompute_overhead(s, ac_overhead)
    if s.loss_chunk_tokens > 0:
        tps /= 1 + 2.0 * s.shape.hidden_size * s.shape.vocab_size / flops
    return tps


def with_network(s: Setup, tps: float) -> tuple[float, float, network.StepNetwork | None]:
    """(tokens/s per GPU, step seconds, the step's collectives) of ``s`` at the single-instance throughput ``tps``
    once the network time this layout exposes beyond one instance's is added (the article measured one instance)."""
    step = s.tokens * s.grad_accum_steps / tps
    net = step_network(s, step)
    if net is None:
        return tps, step, None
    one_instance = step_network(replace(s, instance_count=1, data_parallel_replicate=1), step)
    step += net.exposed_seconds - (one_instance.exposed_seconds if one_instance else 0.0)
    return s.tokens * s.grad_accum_steps / step, step, net


def spread(s: Setup, band: MfuBand) -> Spread:
    """The estimate's (least, most) throughput, step time, run time, cost and reported MFU at ``band``'s ends."""
    gpu = hardware.GPU_INSTANCE_TYPES[s.instance_type].gpu
    ends = [
        with_network(s, throughput_at(s, band.low, AC_OVERHEAD_BAND[1])),
        with_network(s, throughput_at(s, band.high, AC_OVERHEAD_BAND[0])),
    ]
    runs = [step * s.max_steps for _, step, _ in ends]
    costs = [hardware.estimate_cost_usd(s.instance_type, s.instance_count, run) for run in runs]
    mfus = [tps * work_flops_per_token(s) / (hardware.PEAK_TFLOPS[gpu]["bf16"] * 1e12) for tps, _, _ in ends]
    ac = " and activation checkpointing 10-30% (the article)" if s.ac_on else ""
    peak = "fp32" if s.precision == "fp32" else "bf16"
    return Spread(
        tokens_per_sec_per_gpu=(ends[0][0], ends[1][0]),
        step_seconds=(ends[1][1], ends[0][1]),
        run_seconds=(runs[1], runs[0]),
        cost_usd=None if None in costs else (costs[1], costs[0]),  # type: ignore[arg-type]
        mfu_bf16=(mfus[0], mfus[1]),
        assumptions=(
            f"MFU {band.low:.2%}-{band.high:.2%} of the {gpu}'s {peak} peak (centre {band.central:.2%}: "
            f"the article's two points, log-linear in one micro-batch's FLOPs at the centre, as a power of them at "
            f"the low end){ac}; {band.sources}"
        ),
    )


def estimate_time(s: Setup, measured: Mapping[str, Any] | None = None) -> Timing:
    """Tokens/s per GPU, step time, time for ``max_steps`` and the on-demand cost (``hardware.estimate_cost_usd``):
    given a ``measured`` record that stands for this request (:func:`training.plan.measured.find`), its
    measured tokens/s (``measured``); at one of the article's own configurations its figure (``published``,
    :func:`article_point`); else an ``estimate`` from the article's curve (:func:`_reference_mfu`) with its band
    (:func:`mfu_band`, :func:`spread`).

    The MFU is counted against the GPU's bf16 peak for every 16-bit and lower precision and against its fp32 peak
    for fp32 (the trainer's fp32 GEMMs do not use TF32: 30x below bf16 on B200), on the FLOPs a step runs
    (:func:`work_flops_per_token`: LoRA's frozen weights have no weight-gradient GEMM), slowed by what the model
    FLOPs leave out (:func:`throughput_at`)."""
    gpu = hardware.GPU_INSTANCE_TYPES[s.instance_type].gpu
    band = mfu_band(s, s.tokens * work_flops_per_token(s))
    tps, step, net = with_network(s, throughput_at(s, band.central))
    basis = "published" if article_point(s) else "estimate"
    source = REFERENCE_SOURCE if basis == "published" else f"scaled from {REFERENCE_SOURCE}"
    if measured is not None:  # a measured step already holds its network time
        tps = float(measured["measured"]["tokens_per_sec_per_gpu"])
        step, source, basis = s.tokens * s.grad_accum_steps / tps, measured_source(measured), "measured"
        net = step_network(s, step)
    mfu_bf16 = tps * work_flops_per_token(s) / (hardware.PEAK_TFLOPS[gpu]["bf16"] * 1e12)
    run = step * s.max_steps
    cost = hardware.estimate_cost_usd(s.instance_type, s.instance_count, run)
    warning = None
    if s.max_runtime_seconds is not None and run > s.max_runtime_seconds:
        reached = int(s.max_runtime_seconds // step)
        warning = (
            f"max_runtime_seconds {s.max_runtime_seconds}: the run needs about {metric_lines.format_duration(run)} for "
            f"max_steps {s.max_steps}; it will stop near step {reached} (raise max_runtime_seconds, or lower max_steps)"
        )
    band_spread = spread(s, band) if basis == "estimate" else None
    note = (
        None
        if net is not None or basis == "measured"
        else network.unmodelled(s.instance_type, s.instance_count, s.gpus_per_instance)
    )
    return Timing(tps, mfu_bf16, step, run, cost, warning, source, basis, net, band_spread, note)


def step_network(s: Setup, compute_seconds: float) -> network.StepNetwork | None:
    """The collectives of one optimizer step of ``s`` on its layout (``s.replicate`` x ``s.shard_size``), against
    ``compute_seconds`` of compute (:mod:`training.plan.network`). The article's throughput points were
    measured on one instance, so :func:`estimate_time` adds only what this layout exposes beyond one instance's."""
    links = network.INTERCONNECTS.get(s.instance_type)
    if links is None:
        return None
    quantized = s.quantized_model_init and s.precision in QUANTIZED_BYTES
    model = network.Model(
        block_params=s.shape.block_parameter_count(),
        root_params=s.shape.root_parameter_count(),
        layers=s.shape.num_layers,
        gather_bytes=2 * QUANTIZED_BYTES[s.precision] if quantized else float(s.compute_bytes),
        micro_batches=s.grad_accum_steps,
        # LoRA: only the adapters have gradients to reduce (the embedding, norms and head are frozen too)
        trained_block_params=lora_block_parameters(s) if s.lora_rank else None,
        trained_root_params=0 if s.lora_rank else None,
    )
    layout = network.Layout(s.instance_count, s.gpus_per_instance, s.replicate)
    return network.step(model, layout, links, compute_seconds)


def measured_source(record: Mapping[str, Any]) -> str:
    """Where a measured figure comes from, in words: the tuning job, the hardware, the image and its versions."""
    key, where = record["key"], record["where"]
    spread = record["measured"].get("step_seconds") or {}
    return (
        f"measured by tuning job {where.get('job') or '(local)'} on {key['instance_count']} x "
        f"{key['instance_type']} ({where.get('world_size')} x {where.get('gpu')}) at {where.get('measured_at')}: "
        f"median of {spread.get('steps', '?')} timed steps, image {key['image_tag']} (torch {key.get('torch')}, "
        f"Transformer Engine {key.get('transformer_engine')})"
    )
