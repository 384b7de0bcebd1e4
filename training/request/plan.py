"""Know before paying: one request's per-GPU peak memory by part, its time and its cost, in closed form.

Pure Python (standard library and ``training.contract`` only, no torch): it runs in the request-check Lambda, in
the operator CLI and at synth. ``python -m training.request.plan RUN.json [--json]`` prints the closed form. The
measured reference it is checked against lives with the development measurements, which import this module and
never the other way round: ``python -m training.measure.memory_trace --request RUN.json`` traces one real FSDP2 step
of the trainer's own model on this CPU, and ``python -m training.measure.plan_agreement`` prints the agreement
table.

The memory model (bytes per GPU; P parameters, Pb one block's, Pr the root's = embedding + head + final norm,
W = GPUs per instance x instance_count, T = micro-batch x sequence tokens, h/f/V/nh the model's widths):

* persistent: sharded fp32 parameters 4P/W, AdamW's two fp32 moments 8P/W (gradients are set to None after each
  step, so they exist only in the backward pass: 4Pb/W per finished block);
* FSDP2 buffers (``training/trainer/parallel.py``: bf16 all-gather, fp32 reduce-scatter, every block but the last
  resharded after forward, the root never): the root's unsharded bf16 weights 2Pr for the whole step, one block's
  unsharded bf16 weights 2Pb, the next block's prefetched all-gather 2Pb, and in the backward pass the previous
  block's fp32 reduce-scatter input 4Pb (FSDP2 frees it only at the next reduce-scatter) and the head's bf16
  weight gradient 2Vh (kept until the root's reduce-scatter at the end);
* saved activations per layer (``training/trainer/model.TorchBlock`` with CUDA's flash attention and fused
  RMSNorm): 2(6h + 2kv + 4f) + 4nh + 8 bytes per token without activation checkpointing, with kv = kv_heads x
  head_dim the key and value width (h without grouped-query attention): block input, normed input, QKV (h + 2kv),
  attention output (flash returns it sequence-major: the reshape is a view), residual, normed input, gate/up,
  SiLU, product; log-sum-exp and two rstd in fp32. 2h with it (the checkpoint's input). RoPE
  (``position_encoding`` rope, the default) adds the rotated query and key (2(h + kv) per token) and, per layer,
  cos and sin for the query and the key (4 x 2 bytes x seq x head_dim); fp32 runs hold every activation, gathered weight and unsharded gradient in 4 bytes instead of 2;
* ``attention_backend`` math (torch path): PyTorch's math kernel keeps each layer's whole fp32 score matrix
  (``math_attention_bytes``: 4 x num_heads x seq bytes per token) and fp32 copies of the query, key and value instead
  of Flash's log-sum-exp, and its backward holds two more score matrices (``math_attention_moments``);
* the loss: unchunked (``loss_chunk_tokens`` 0), ``F.cross_entropy(logits.float())`` keeps the fp32 log-softmax
  (4V per token) and in its backward its fp32 gradient in and out (8V): 12V bytes per token of the micro-batch;
  chunked (``training/trainer/loss.py``, the contract's default), one chunk's fp32 logits and their gradient in the
  compute dtype (6V per token of the chunk), an fp32 log-sum-exp per token, and the head's weight gradient (summed
  in fp32 over the chunks: 4Vh) and input gradient made in the loss's own backward;
* the peak is the largest of six moments: the loss's backward, inside the last block's backward (its MLP's
  gradients out, the next block prefetched), a block's reduce-scatter (without activation checkpointing), right
  after a block's recompute and at the end of its backward (with it), the root's reduce-scatter (FSDP2 frees the
  gathered weights first) and the optimizer step. The per-token gradients in flight inside a block's backward
  (4f + 2h and 18h bytes without activation checkpointing, 9h and 8(h + f) with it) are fitted to the traced
  reference (``python -m training.measure.plan_agreement``); every other term is derived tensor by tensor.
* Transformer Engine precisions (not traceable here: no GPU, no TE), checked at TE tag v2.11: GEMM inputs saved
  quantized (1 byte per value for fp8, 1 + 1/32 for mxfp8's E8M0 block scales, 0.5 + 1/16 for nvfp4;
  ``module/linear.py`` keeps only the column-wise usage of the saved input, lines 396-399), each layer's quantized
  weight copy saved for the backward pass (``MXFP8TensorStorage`` holds ``_rowwise_data`` and
  ``_columnwise_data`` with their ``_*_scale_inv``, ``tensor/storage/mxfp8_tensor_storage.py``;
  ``Float8TensorStorage`` ``_data`` and ``_transpose``, ``tensor/storage/float8_tensor_storage.py``; the forward
  makes the weight's copy, the backward uses its column-wise usage, ``module/linear.py`` line 695), and with
  ``quantized_model_init`` (``quantization.py``: primary weights stored quantized) the blocks' sharded and
  gathered weights in the quantized format (both usages) and bf16 gradients, AdamW's moments still fp32, plus the
  blocks' fp32 master weights (``training/trainer/master_weights.py``; they start from the fp32 values
  ``weights.py`` keeps until step 1, no memory beyond their own) and, in the step, their gradients' fp32 copies.
  The seed article:
  "TE maintains both high-precision primary weights and quantized copies", which is what the default terms model.
* the speed levers (``docs/performance.md``): ``selective`` activation checkpointing keeps per token the block's
  input, the QKV (h + 2kv) and gate/up projections' outputs and attention's output and log-sum-exp
  (``selective_saved_bytes``: 2(3h + 2kv + 2f) + 4nh bytes in 16 bits); ``activation_checkpointing_interval`` k checkpoints blocks 0, k, 2k, ... and the
  others keep every activation (``saved_per_block``); ``grad_accum_steps`` above 1 holds every parameter's
  unsharded fp32 gradient between micro-batches (4P, less the blocks already reduced on the last micro-batch) and
  the whole step's tokens; the fused AdamW of a GPU run makes no temporaries; ``nvfp4_bf16_blocks``' first and
  last blocks of an NVFP4 run save bf16 activations (``high_precision_blocks``). ``torch.compile`` is not counted:
  the closed form is eager memory, which compile's fusions only lower. Traced rows for each in
  ``python -m training.measure.plan_agreement``.
* an allowance for what no tensor tracker sees: the CUDA context, cuBLAS and TE workspaces, NCCL buffers and the
  caching allocator's fragmentation: ``ALLOWANCE_FIXED_GIB`` plus ``ALLOWANCE_FRACTION`` of the tensors.

A request fits when the estimate is at most ``HEADROOM`` x the GPU's memory (the contract's GB, 10^9 bytes).

Throughput is the source article's own figure at its two measured configurations (``basis`` ``published``,
:func:`article_point`); anywhere else an ``estimate`` scaled from them by FLOPs and the GPU's peak, with a low-high
band from a stated MFU band (:func:`mfu_band`); unless a tuning run measured this exact configuration on this
instance type with this image (``basis`` ``measured``: :mod:`training.request.measured` decides, the caller passes
the stored records in).
Stored records also check the memory estimate: the plan reports its own error against them (:func:`memory_check`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from training.contract import hardware, metric_lines, settings_checks, settings_parse, settings_table, shapes
from training.request import measured, network

GIB = 2**30
HEADROOM = 0.95
"""Share of the GPU's memory a request may plan to use; the rest is for what even the allowance misses."""
ALLOWANCE_FIXED_GIB = 2.0
"""CUDA context (about 0.5 GiB on H100/B200), cuBLAS workspace (32 MiB per stream on Hopper and newer), TE's
workspace (32 MiB), NCCL's buffers (a few MiB per channel and peer: a few hundred MiB at 8-16 ranks)."""
ALLOWANCE_FRACTION = 0.08
"""The caching allocator's fragmentation, as a share of the live tensors (PyTorch's reserved-over-allocated is
typically 1.05-1.15 in steady training)."""
AC_RECOMPUTE_BYTES_PER_H = 9
"""Fitted to the trace: gradients in flight right after a block's recompute, per token, in units of h."""
AC_TAIL_BYTES_PER_HF = 8
"""Fitted to the trace: per-token gradients in flight at the end of a block's backward, in units of (h + f)."""
LOSS_BYTES_PER_V = 12
"""Unchunked: fp32 log-softmax saved (4), and in its backward its fp32 gradient in and out (8), per token and
vocabulary entry."""
CHUNKED_LOSS_BYTES_PER_V = 6
"""Chunked: one chunk's fp32 logits (4) and their gradient in the compute dtype (2), per token and entry."""

QUANTIZED_BYTES: Mapping[str, float] = {"fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32, "nvfp4": 0.5 + 1.0 / 16}
"""Bytes per value of one quantized usage (data + block scales: E8M0 per 32 values for MXFP8, E4M3 per 16 for
NVFP4; fp8's per-tensor scale is negligible)."""

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


# ----------------------------------------------------------------------------------------------------------
# The request
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What the estimate needs from a request (its merged, parsed settings)."""

    shape: shapes.ModelShape
    precision: str
    quantized_model_init: bool
    batch_size: int
    seq_length: int
    activation_checkpointing: str | bool
    """none, full or selective (``settings_table.AC_MODES``); True and False are taken as full and none."""
    instance_type: str
    instance_count: int
    max_steps: int
    loss_chunk_tokens: int = 0
    max_runtime_seconds: int | None = None
    position_encoding: str = "rope"
    activation_checkpointing_interval: int = 1
    grad_accum_steps: int = 1
    adamw_impl: str = "auto"
    nvfp4_bf16_blocks: int = 1
    lora_rank: int = 0
    """LoRA (``lora_memory``): adapters of this rank on ``lora_targets``, the base frozen; 0: every weight trains."""
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.0
    data_parallel_replicate: int | str = "auto"
    """Replicas of the hybrid-sharding mesh, or ``auto`` (``replicate``)."""
    attention_backend: str = "auto"
    """``math`` keeps attention's whole score matrix (``math_attention_bytes``); every other kernel is counted as
    Flash's (output and log-sum-exp only)."""
    packed_documents: bool = False
    """Packed conversation data (``packing`` on, data prepared with ``--init-from``): every example of a window
    attends only to itself; on the torch path through a block-causal mask (``document_mask_bytes``,
    ``document_mask_layer_bytes``), on Transformer Engine's with ``cu_seqlens`` (no mask)."""

    def __post_init__(self) -> None:
        mode = self.activation_checkpointing
        if isinstance(mode, bool):
            object.__setattr__(self, "activation_checkpointing", "full" if mode else "none")

    @property
    def ac_on(self) -> bool:
        return self.activation_checkpointing != "none"

    @property
    def checkpointed_blocks(self) -> list[int]:
        """Blocks 0, k, 2k, ... (``activation_checkpoint.checkpointed_blocks`` in the trainer)."""
        if not self.ac_on:
            return []
        return list(range(0, self.shape.num_layers, self.activation_checkpointing_interval))

    @property
    def high_precision_blocks(self) -> set[int]:
        """NVFP4's first and last ``nvfp4_bf16_blocks`` blocks, which run in bf16 (``precision.py``)."""
        if self.precision != "nvfp4":
            return set()
        k, layers = self.nvfp4_bf16_blocks, self.shape.num_layers
        return {*range(k), *range(layers - k, layers)} if k else set()

    @property
    def compute_bytes(self) -> int:
        """Bytes per value of activations and gathered weights: fp32 runs compute in fp32 (no MixedPrecisionPolicy
        cast, ``parallel.mixed_precision``); every other precision computes in 16 bits."""
        return 4 if self.precision == "fp32" else 2

    @property
    def gpus_per_instance(self) -> int:
        return hardware.GPU_INSTANCE_TYPES[self.instance_type].gpus

    @property
    def world_size(self) -> int:
        return self.gpus_per_instance * self.instance_count

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one GPU."""
        return self.batch_size * self.seq_length

    @property
    def replicate(self) -> int:
        """``data_parallel_replicate`` in effect: ``auto`` is the instance count when one instance's GPUs hold the
        sharded states with room for the step (the estimate fits with shards of one instance), else 1."""
        if self.data_parallel_replicate != "auto":
            return int(self.data_parallel_replicate)
        if self.instance_count == 1:
            return 1
        one_node = replace(self, data_parallel_replicate=self.instance_count)
        return self.instance_count if estimate_memory(one_node).fits else 1

    @property
    def shard_size(self) -> int:
        """GPUs each parameter, gradient and optimizer state is sharded over (the world over the replicas)."""
        return max(1, self.world_size // self.replicate)


def trainer_settings(request: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer's settings of an execution input: its ``hyperparameters`` with the top-level ones set over them."""
    settings = dict(request.get("hyperparameters") or {})
    settings.update({k: request[k] for k in settings_table.TOP_LEVEL_SETTINGS if request.get(k) is not None})
    return settings


def setup_from_request(request: Mapping[str, Any], architecture: Mapping[str, Any] | None = None) -> Setup:
    """A :class:`Setup` from an execution input (the workflow's fields; absent ones take the trainer's and the
    workflow's defaults). ``architecture``: the settings of the ``init_from`` model's config.json
    (``training.request.hf_config.architecture``), which give the shape. Raises ``settings_table.ContractError`` naming
    a bad setting."""
    return parse_request(request, architecture)[1]


def parse_request(
    request: Mapping[str, Any], architecture: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], Setup]:
    """The parsed settings (``settings_parse.parse_hyperparameters``) and the :class:`Setup` of a plain execution input,
    for a plan outside the request's decision (``python -m training.request.plan``, the tuning report, the
    measurements, a stored record's configuration); the decision passes its own parsed settings to
    :func:`setup_from_values`. Raises ``settings_table.ContractError`` naming a bad setting."""
    instance_type = request.get("instance_type") or hardware.DEFAULT_INSTANCE_TYPE
    if instance_type not in hardware.GPU_INSTANCE_TYPES:
        raise settings_table.ContractError(
            "instance_type", f"must be one of {', '.join(hardware.GPU_INSTANCE_TYPES)}; got {instance_type!r}"
        )
    sm = hardware.GPU_INSTANCE_TYPES[instance_type].sm
    values = settings_parse.parse_hyperparameters(trainer_settings(request), architecture, sm=sm)
    count = request.get("instance_count") or 1
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise settings_table.ContractError("instance_count", f"must be an integer >= 1; got {count!r}")
    replicate_setting(values, count, instance_type)
    setup = setup_from_values(
        values,
        instance_type=instance_type,
        instance_count=count,
        max_runtime_seconds=request.get("max_runtime_seconds"),
    )
    return values, setup


def setup_from_values(
    values: Mapping[str, Any],
    *,
    instance_type: str,
    instance_count: int = 1,
    max_runtime_seconds: int | None = None,
    conversations: bool = False,
) -> Setup:
    """A :class:`Setup` from parsed settings (``settings_parse.parse_hyperparameters``' result, their
    ``data_parallel_replicate`` checked against the GPUs by :func:`replicate_setting`: nothing is parsed or checked
    here) on ``instance_count`` x ``instance_type``, with the run's time limit; ``conversations``: the data is
    prepared conversations (packed into windows when the settings' ``packing`` is on)."""
    shape = settings_parse.model_shape(values)
    return Setup(
        shape=shape,
        precision=values["precision"],
        quantized_model_init=bool(values["quantized_model_init"]),
        batch_size=values["batch_size"],
        seq_length=values["seq_length"],
        activation_checkpointing=values["activation_checkpointing"],
        instance_type=instance_type,
        instance_count=instance_count,
        max_steps=values["max_steps"],
        loss_chunk_tokens=int(values.get("loss_chunk_tokens") or 0),
        max_runtime_seconds=max_runtime_seconds,
        position_encoding=values["position_encoding"],
        activation_checkpointing_interval=values["activation_checkpointing_interval"],
        grad_accum_steps=values["grad_accum_steps"],
        adamw_impl=values["adamw_impl"],
        nvfp4_bf16_blocks=values["nvfp4_bf16_blocks"],
        lora_rank=values["lora_rank"],
        lora_targets=settings_checks.lora_target_modules(values["lora_targets"])
        if values["lora_rank"]
        else (),
        lora_dropout=values["lora_dropout"],
        data_parallel_replicate=values.get("data_parallel_replicate", "auto"),
        attention_backend=values["attention_backend"],
        packed_documents=conversations and bool(values.get("packing", True)),
    )


def replicate_setting(values: Mapping[str, Any], count: int, instance_type: str) -> int | str:
    """``data_parallel_replicate`` of parsed settings, refused by name when it does not divide the GPUs of ``count``
    x ``instance_type``: where the settings are read (``value.read_settings`` for a request, :func:`parse_request`
    for a plain input) and for each tuning candidate that sets it."""
    replicate = values.get("data_parallel_replicate", "auto")
    world = count * hardware.GPU_INSTANCE_TYPES[instance_type].gpus
    problem = None if replicate == "auto" else network.layout_problem(int(replicate), world)
    if problem:
        raise settings_table.ContractError(
            "data_parallel_replicate", f"{problem} ({count} x {instance_type}); or leave it auto"
        )
    return replicate


# ----------------------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """The estimate: ``parts`` (GiB, at the peak moment) sum to ``tensors_gib``; ``peak_gib`` adds the allowance."""

    moment: str
    parts: dict[str, float]
    tensors_gib: float
    allowance_gib: float
    peak_gib: float
    gpu_gib: float
    limit_gib: float

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.limit_gib


def layer_activation_bytes(s: Setup) -> float:
    """Bytes per token one block saves for its backward pass without activation checkpointing.

    Grouped-query attention makes the key and value ``kv_heads * head_dim`` wide (h without it). RoPE
    (``position_encoding`` rope) adds the rotated query and key (h + kv values): new tensors that attention
    saves, while the QKV projection's output stays alive through the value, a view of it (torch path: traced;
    TE path: its fused RoPE also returns new query and key tensors, assumed to be saved the same way)."""
    h, f, nh = s.shape.hidden_size, s.shape.ffn_hidden_size, s.shape.num_heads
    kv = s.shape.kv_heads * s.shape.head_dim  # key (and value) width: h without grouped-query attention
    c = s.compute_bytes
    # flash attention's fp32 log-sum-exp per query head (math's score matrix instead), two RMSNorm rstd
    stats = 4 * nh + 8 + math_attention_bytes(s)
    rope = c * (h + kv) if s.position_encoding == "rope" else 0  # the rotated query and key
    if s.precision in QUANTIZED_BYTES:
        q = QUANTIZED_BYTES[s.precision]
        # x, q/k/v (h + 2kv), attention output, residual in bf16; three GEMM inputs quantized (3qh); fc1 output
        # in bf16 for SwiGLU's backward (4f); fc2's input quantized (qf)
        return 2 * (4 * h + 2 * kv) + 3 * q * h + (4 + q) * f + stats + rope
    # block input, normed input, QKV (h + 2kv), attention output, residual, normed input; gate/up, SiLU, product
    return c * (6 * h + 2 * kv + 4 * f) + stats + rope


def selective_saved_bytes(s: Setup) -> float:
    """Bytes per token a ``selective`` block keeps (``training/trainer/activation_checkpoint.py``, torchtitan's
    op-level policy): its input (h), the QKV projection's output (h + 2kv: the query, and the key and value
    ``kv_heads * head_dim`` wide each, h without grouped-query attention), attention's output (h) and fp32
    log-sum-exp (4 bytes per head), the gate/up projection's output (2f); the output and down projections (every
    second matmul) and everything else are recomputed."""
    h, f, nh = s.shape.hidden_size, s.shape.ffn_hidden_size, s.shape.num_heads
    kv = s.shape.kv_heads * s.shape.head_dim
    return s.compute_bytes * (3 * h + 2 * kv + 2 * f) + 4 * nh


def math_attention_bytes(s: Setup) -> float:
    """Bytes per token one block's attention keeps beyond Flash's with ``attention_backend`` math (torch path only:
    Transformer Engine precisions choose their own kernel). PyTorch's math kernel
    (``_scaled_dot_product_attention_math``, ATen ``native/transformers/attention.cpp``) computes in fp32 for 16-bit
    inputs (``allow_fp16_bf16_reduction_math_sdp`` is off by default) and keeps for its backward the softmax of the
    whole score matrix (``num_heads x seq_length`` fp32 values per token, causal or not), the scaled query, and the
    key and value repeated to every query head (fp32: 4h each; in fp32 runs the value only with grouped-query
    attention, else it is the projection's own), and no log-sum-exp (Flash's 4 bytes per head, counted by the
    caller, less). The traced rows of ``training.measure.plan_agreement`` run it."""
    if s.attention_backend != "math" or s.precision in QUANTIZED_BYTES:
        return 0.0
    h, nh = s.shape.hidden_size, s.shape.num_heads
    value = 4.0 * h if s.compute_bytes < 4 or s.shape.kv_heads != nh else 0.0
    return 4.0 * nh * s.seq_length + 8.0 * h + value - 4.0 * nh


def math_attention_moments(s: Setup, moments: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """With ``attention_backend`` math, the moment inside a block's attention backward: the first block's backward
    (``last block backward``, or the top checkpointed block's right after its recompute) once its MLP is done (its
    saved tensors freed, ``mlp_saved_bytes``), with the score matrix's gradient and the softmax's input gradient in
    flight (fp32, ``num_heads x seq_length`` values per token each). Selective activation checkpointing keeps no
    score matrix (its policy saves the kernels' outputs, and math is matmuls and a softmax): it appears in the
    recompute only. Traced: ``training.measure.plan_agreement``'s math rows."""
    if s.attention_backend != "math" or s.precision in QUANTIZED_BYTES:
        return moments
    in_flight = 2 * 4.0 * s.shape.num_heads * s.seq_length * s.tokens
    mlp = mlp_saved_bytes(s) * s.tokens
    out = dict(moments)
    for name, held in (("last block backward", "saved activations"),
                       ("block backward, after its recompute", "recomputed block")):  # fmt: skip
        if name in moments:
            parts = moments[name]
            out[f"{name}, in its attention (math)"] = {
                **parts,
                held: parts[held] - mlp,
                "gradients in flight": in_flight,
            }
    return out


def mlp_saved_bytes(s: Setup) -> float:
    """Bytes per token a block keeps for its MLP's backward (torch path): the normed input, gate/up, SiLU and their
    product, and the norm's fp32 rstd."""
    return s.compute_bytes * (s.shape.hidden_size + 4 * s.shape.ffn_hidden_size) + 4.0


def saved_per_block(s: Setup) -> list[float]:
    """Bytes each block keeps for its backward pass through the forward: checkpointed blocks their input (full)
    or ``selective_saved_bytes``, the others every activation (``layer_activation_bytes`` and RoPE's cos/sin; in
    bf16 for NVFP4's ``high_precision_blocks``)."""
    t, checkpointed, edges = s.tokens, set(s.checkpointed_blocks), s.high_precision_blocks
    whole = layer_activation_bytes(s) * t + rope_layer_bytes(s) + document_mask_layer_bytes(s)
    whole_bf16 = layer_activation_bytes(replace(s, precision="bf16")) * t + rope_layer_bytes(s)
    kept = float(s.compute_bytes * s.shape.hidden_size * t)
    if s.activation_checkpointing == "selective":
        kept = selective_saved_bytes(s) * t
    return [
        kept if index in checkpointed else whole_bf16 if index in edges else whole
        for index in range(s.shape.num_layers)
    ]


def rope_layer_bytes(s: Setup) -> float:
    """Per block, independent of the micro-batch: the torch block's RoPE saves cos and sin (in the compute
    dtype, ``[seq, head_dim]``) once for the query and once for the key (``rotary.apply_rotary``). TE's fused RoPE
    saves only the shared fp32 frequencies (``rope_table_bytes``)."""
    if s.position_encoding != "rope" or s.precision in QUANTIZED_BYTES:
        return 0.0
    return 4.0 * s.compute_bytes * s.seq_length * (s.shape.hidden_size // s.shape.num_heads)


def document_mask_bytes(s: Setup) -> float:
    """The torch path's block-causal mask of a packed micro-batch (``training/trainer/doc_mask.block_causal_mask``:
    ``[batch, 1, seq, seq]`` bool, one byte per pair of tokens), made once per micro-batch and given to every block;
    counted through the whole step (checkpointed blocks keep it for their recompute; without activation
    checkpointing it is freed after the forward pass, so this over-counts the backward by batch x seq^2 bytes).
    0 on Transformer Engine's path (``cu_seqlens``, no mask) and without packed documents."""
    if not s.packed_documents or s.precision in QUANTIZED_BYTES:
        return 0.0
    return float(s.batch_size * s.seq_length * s.seq_length)


def document_mask_layer_bytes(s: Setup) -> float:
    """What a packed micro-batch adds on the torch path to each block that keeps its activations (and to a block
    being recomputed), beyond ``layer_activation_bytes``. Read in torch's SDPA (``aten/src/ATen/native/
    transformers``; the same at 2.9 and 2.13):

    * the additive bias: ``scaled_dot_product_attention`` turns the boolean mask into ``where(mask, 0, -inf)`` in
      the compute dtype (``convert_boolean_attn_mask``: a new ``[batch, 1, seq, seq]`` tensor per block; padded to
      a multiple of 8 keys when seq_length is not one, ``preprocess_mask``), expands it over the heads as a view,
      and the kernel that takes a mask (memory-efficient attention on a GPU; cuDNN's takes one as well) saves it
      for its backward (their derivatives take ``attn_bias``): c x batch x seq x seq bytes, about 3x the bool
      mask's in bf16 per block;
    * grouped-query attention: with a mask the key and value are repeated to every query head
      (``model.causal_attention``), and SDPA saves the repeated ones; the fused QKV output is then no longer kept
      alive by the value (a view of it), so per token c x (h - 3kv) with RoPE (the query, key and value h wide
      each, instead of QKV h + 2kv plus the rotated query and key h + kv), c x 2h without it (the query still a
      view of QKV); nothing without grouped-query attention;
    * RoPE per document: cos and sin per token (``[batch, seq, 1, head_dim]``) instead of per position, for the
      query and the key: 4 c (batch - 1) seq head_dim more than ``rope_layer_bytes``.

    With ``attention_backend`` math only the last: its kernel (``_scaled_dot_product_attention_math``) adds the
    bias to the fp32 scores in place and saves the softmax, the scaled query and fp32 copies of the key and value
    repeated to every query head, exactly what it saves for ``enable_gqa`` without a mask (``math_attention_bytes``
    counts them): neither the bias nor the 16-bit repeated key and value outlive the call (traced in
    tests/training/test_fine_tuning_request.py)."""
    if not s.packed_documents or s.precision in QUANTIZED_BYTES:
        return 0.0
    c, b, seq = s.compute_bytes, s.batch_size, s.seq_length
    h, kv = s.shape.hidden_size, s.shape.kv_heads * s.shape.head_dim
    rope = s.position_encoding == "rope"
    per_token_rope = 4 * c * (b - 1) * seq * (h // s.shape.num_heads) if rope else 0
    if s.attention_backend == "math":
        return float(per_token_rope)
    bias = c * b * seq * (-(-seq // 8) * 8)
    repeated = 0 if kv == h else (h - 3 * kv if rope else 2 * h)
    return float(bias + c * repeated * s.tokens + per_token_rope)


def rope_table_bytes(s: Setup) -> float:
    """The rotary frequencies every block gets (``rotary.Rope``: ``[seq, 1, 1, head_dim]`` fp32, cached)."""
    if s.position_encoding != "rope":
        return 0.0
    return 4.0 * s.seq_length * (s.shape.hidden_size // s.shape.num_heads)


def _weights(s: Setup) -> dict[str, float]:
    """Per-GPU bytes of the weight-sized terms (independent of the micro-batch)."""
    shape, w = s.shape, s.shard_size
    p, pb, pr = shape.parameter_count(), shape.block_parameter_count(), shape.root_parameter_count()
    blocks = p - pr
    quantized = s.quantized_model_init and s.precision in QUANTIZED_BYTES
    q = QUANTIZED_BYTES.get(s.precision, 0.0)
    c = s.compute_bytes
    gathered = 2 * q if quantized else float(c)  # bytes per value of a gathered block weight
    return {
        "sharded parameters": ((2 * q if quantized else 4) * blocks + 4 * pr) / w,
        # the moments, and with quantized primary weights the blocks' fp32 masters (``master_weights.py``)
        "AdamW state": (8 * p + (4 * blocks if quantized else 0)) / w,
        "block gradient (sharded)": (2 if quantized else 4) * pb / w,
        "root weights (unsharded)": c * pr,
        "block weights (unsharded)": gathered * pb,
        "prefetched all-gather": gathered * pb if shape.num_layers > 1 else 0.0,
        "reduce-scatter input": 4 * pb,
        "quantized weight copy (per layer)": q * pb if s.precision in QUANTIZED_BYTES else 0.0,
        "head gradient": c * shape.vocab_size * shape.hidden_size,
        "all gradients (sharded)": ((2 if quantized else 4) * blocks + 4 * pr) / w,
    }


def loss_bytes(s: Setup) -> float:
    """The loss's vocabulary-sized tensors at their peak (its backward). Unchunked: 12 bytes per token and
    vocabulary entry for the whole micro-batch. Chunked (``training/trainer/loss.py``): one chunk's fp32 logits
    and their compute-dtype gradient (6 bytes per token and entry) plus the fp32 log-sum-exp of every token."""
    if s.loss_chunk_tokens <= 0:
        return LOSS_BYTES_PER_V * s.shape.vocab_size * s.tokens
    v, chunk = s.shape.vocab_size, min(s.tokens, s.loss_chunk_tokens)
    if (
        s.compute_bytes == 4
    ):  # fp32: the gradient is already in the compute dtype, the head's sum made in place
        return 4.0 * v * chunk + 4.0 * s.tokens
    # the head gradient's fp32 sum is counted apart (``head_gradient_sum_bytes``); next to it either one chunk's
    # logits and gradient (6 bytes per entry), or one chunk's gradient and its product with the chunk's input (2Vh)
    return (
        max(CHUNKED_LOSS_BYTES_PER_V * v * chunk, 2.0 * v * chunk + 2.0 * v * s.shape.hidden_size)
        + 4.0 * s.tokens
    )


def head_gradient_bytes_in_loss(s: Setup) -> float:
    """The head's weight gradient while the loss's backward runs: the chunked loss sums it in fp32 for 16-bit
    weights (``training/trainer/loss.py``), otherwise it is the gradient itself in the weight's dtype."""
    vh = s.shape.vocab_size * s.shape.hidden_size
    return 4.0 * vh if s.loss_chunk_tokens > 0 else float(s.compute_bytes * vh)


def _moments(s: Setup) -> dict[str, dict[str, float]]:
    """The parts (bytes) at each candidate peak moment of one training step."""
    wt = _weights(s)
    shape, t = s.shape, s.tokens
    h, f, layers = shape.hidden_size, shape.ffn_hidden_size, shape.num_layers
    c = s.compute_bytes
    pb = shape.block_parameter_count()
    quantized = s.quantized_model_init and s.precision in QUANTIZED_BYTES
    act_layer = layer_activation_bytes(s)
    per_layer = rope_layer_bytes(s)
    base = {k: wt[k] for k in ("sharded parameters", "AdamW state", "root weights (unsharded)")}
    # the whole optimizer step's tokens are on the device (every micro-batch copied at its start)
    inputs = {
        "inputs (tokens, targets)": 16.0 * t * s.grad_accum_steps,
        "rotary frequencies": rope_table_bytes(s),
        "document mask": document_mask_bytes(s),
    }
    blocks = saved_per_block(s)
    checkpointed = s.checkpointed_blocks
    saved = {"saved activations": sum(blocks)}
    uncheckpointed = layers - len(checkpointed)
    qcopies = {"quantized weight copies": wt["quantized weight copy (per layer)"] * (uncheckpointed or 1)}
    # gradient accumulation: FSDP2 keeps every parameter's unsharded gradient, in the fp32 reduce dtype, from one
    # micro-batch to the next (set_requires_gradient_sync(False)); the last micro-batch frees each block's as it is
    # reduce-scattered (the blocks above the moment's block are done)
    accumulated = 4.0 * shape.parameter_count() if s.grad_accum_steps > 1 else 0.0
    accumulation = {"accumulated gradients (fp32, unsharded)": accumulated}
    last_block = {"block weights (unsharded)": wt["block weights (unsharded)"]}
    # With AC the peak comes in the second block's backward (the first one's reduce-scatter input still held),
    # with a third block's all-gather prefetched when there is one; without AC at the first block's reduce-scatter.
    prefetch_at = 2 if s.ac_on else 1
    in_backward = {
        "block weights (unsharded)": wt["block weights (unsharded)"],
        "prefetched all-gather": wt["prefetched all-gather"] if layers > prefetch_at else 0.0,
        "reduce-scatter input": wt["reduce-scatter input"],
        "gradients (sharded, so far)": wt["block gradient (sharded)"],
        "head gradient": wt["head gradient"],
    }
    moments: dict[str, dict[str, float]] = {
        "loss backward": {
            **base,
            **last_block,
            **saved,
            **qcopies,
            "final norm and head inputs": 2.0 * c * h * t,
            "loss (vocabulary-sized)": loss_bytes(s),
            # the chunked loss's backward makes the head's weight gradient and the head input's gradient itself
            **(
                {"head gradient": head_gradient_bytes_in_loss(s), "loss input gradient": c * h * t}
                if s.loss_chunk_tokens > 0
                else {}
            ),
            **inputs,
            **accumulation,
        },
    }
    if checkpointed:
        # the topmost checkpointed block's backward: the blocks above it are done (their activations freed)
        top = checkpointed[-1]
        held = {"saved activations": sum(blocks[: top + 1])}
        cached = selective_saved_bytes(s) - c * h if s.activation_checkpointing == "selective" else 0.0
        done = {"accumulated gradients (fp32, unsharded)": max(accumulated - 4.0 * pb * (layers - top), 0.0)}
        if s.activation_checkpointing_interval > 1 and top == layers - 1:
            # the top block is the first backward: no earlier block's reduce-scatter input is held yet
            in_backward = {**in_backward, "reduce-scatter input": 0.0}
        moments["block backward, after its recompute"] = {
            **base,
            **in_backward,
            "gradients (sharded, so far)": 2 * wt["block gradient (sharded)"],
            **held,
            **qcopies,
            "recomputed block": (act_layer - cached) * t + per_layer + document_mask_layer_bytes(s),
            "gradients in flight": AC_RECOMPUTE_BYTES_PER_H * c / 2 * h * t,
            **inputs,
            **done,
        }
        moments["block backward, its end"] = {
            **base,
            **in_backward,
            **held,
            **qcopies,
            "unsharded gradients": c * pb,
            "gradients in flight": AC_TAIL_BYTES_PER_HF * c / 2 * (h + f) * t,
            **inputs,
            **done,
        }
    if uncheckpointed:
        moments[
            "last block backward"
        ] = {  # inside its MLP: SwiGLU's gradients out, the next block prefetched
            **base,
            **last_block,
            "prefetched all-gather": wt["prefetched all-gather"],
            "gradients (sharded, so far)": wt["block gradient (sharded)"],
            **saved,
            **qcopies,
            "head gradient": wt["head gradient"],
            "gradients in flight": c * (2.0 * f + h) * t,
            **inputs,
            **accumulation,
        }
        if layers > 1:
            moments["block backward, its reduce-scatter"] = {
                **base,
                **in_backward,
                "unsharded gradients": c * pb,
                "saved activations": sum(blocks[: layers - 2]),
                "quantized weight copies": wt["quantized weight copy (per layer)"]
                * max(uncheckpointed - 2, 0),
                "gradients in flight": 9.0 * c * h * t,
                **inputs,
                **accumulation,
            }
    moments["root reduce-scatter"] = {  # FSDP2 reshards (frees the root's gathered weights) before it reduces
        "sharded parameters": wt["sharded parameters"],
        "AdamW state": wt["AdamW state"],
        "gradients (sharded)": wt["all gradients (sharded)"],
        "root gradients (unsharded)": c * shape.root_parameter_count(),
        "reduce-scatter input": 4.0 * shape.root_parameter_count(),
        **inputs,
    }
    moments["optimizer step"] = {
        "sharded parameters": wt["sharded parameters"],
        "AdamW state": wt["AdamW state"],
        "gradients (sharded)": wt["all gradients (sharded)"],
        # torch.optim.AdamW's foreach path makes one temporary per moment list; the fused kernel (adamw_impl
        # auto on a GPU) none; with master weights, each block gradient's fp32 copy on its master
        "AdamW temporaries": (
            0.0 if s.adamw_impl in ("auto", "fused") else 4.0 * shape.parameter_count() / s.shard_size
        )
        + (
            4.0 * (shape.parameter_count() - shape.root_parameter_count()) / s.shard_size
            if quantized
            else 0.0
        ),
    }
    return moments


def lora_memory(s: Setup, moments: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """LoRA's terms (``lora_rank`` > 0; ``training/trainer/lora.py``) in place of full fine-tuning's, at every moment.
    The frozen base keeps its sharded fp32 weights and its gathered ones, and has no gradient (unsharded, reduced,
    sharded or accumulated), no AdamW moments and no head or root gradient; the adapters (Pa parameters, Pab per
    block: rank x (in + out) per targeted projection) have all of those: their sharded fp32 weights 4Pa/W, AdamW
    8Pa/W, gradients as full fine-tuning's scaled by Pab/Pb (a block's) or Pa/P (every block's), and their
    gathered weights beside the block's. Saved activations: the base's (the adapters' A matrices keep each
    linear layer's input, so nothing of full fine-tuning's goes away with all-linear; partial targets are
    counted as all, an upper bound) plus, per token and block not checkpointed, each adapter's rank-wide A output
    and, with ``lora_dropout``, each adapted layer's dropped input and its mask (``lora_activation_bytes``)."""
    if not s.lora_rank:
        return moments
    shape, w = s.shape, s.world_size
    pab = lora_block_parameters(s)
    pa, pb, p = pab * shape.num_layers, shape.block_parameter_count(), shape.parameter_count()
    block, whole = pab / pb, pa / p
    scaled = {"gradients (sharded, so far)": block, "unsharded gradients": block,
              "accumulated gradients (fp32, unsharded)": whole, "AdamW temporaries": whole,
              "head gradient": 0.0, "root gradients (unsharded)": 0.0,
              "block weights (unsharded)": 1 + block, "prefetched all-gather": 1 + block}  # fmt: skip
    held = max(shape.num_layers - len(s.checkpointed_blocks), 1)
    out = {}
    for moment, parts in moments.items():
        new = {key: value * scaled.get(key, 1.0) for key, value in parts.items()}
        if "reduce-scatter input" in new:  # the root has no adapter; a block reduces only its adapters'
            new["reduce-scatter input"] = 0.0 if moment == "root reduce-scatter" else 4.0 * pab
        if "gradients (sharded)" in new:
            new["gradients (sharded)"] = 4.0 * pa / w
        new["sharded parameters"] = new.get("sharded parameters", 0.0) + 4.0 * pa / w
        new["AdamW state"] = 8.0 * pa / w
        if "saved activations" in new:
            selective = len(s.checkpointed_blocks) if s.activation_checkpointing == "selective" else 0
            new["adapter activations"] = s.tokens * (
                lora_activation_bytes(s) * held + lora_selective_extra_bytes(s) * selective
            )
        out[moment] = new
    return out


def lora_block_parameters(s: Setup) -> int:
    """One block's adapter parameters: rank x (in + out) for each targeted projection."""
    return shapes.lora_block_parameter_count(s.shape, s.lora_rank, s.lora_targets)


def lora_selective_extra_bytes(s: Setup) -> float:
    """Bytes per token a ``selective`` block keeps beyond full fine-tuning's with LoRA: the policy saves every
    other matmul's output (``activation_checkpoint._selective_contexts``), and an adapted linear layer runs three
    (its base, the stacked A, the block-diagonal B; with dropout one A GEMM per targeted projection, each on its own
    mask), so the saved ones shift; with all-linear and no dropout the block keeps the QKV and gate/up outputs
    twice (base and B) and the output and down layers' rank-wide A outputs."""
    h, f, c = s.shape.hidden_size, s.shape.ffn_hidden_size, s.compute_bytes
    kv = s.shape.kv_heads * s.shape.head_dim
    layers = (("qkv", h + 2 * kv, ("q_proj", "k_proj", "v_proj")), ("out", h, ("o_proj",)),
              ("gate_up", 2 * f, ("gate_proj", "up_proj")), ("down", h, ("down_proj",)))  # fmt: skip
    plain, adapted = [], []
    for _, width, parts in layers:
        plain.append(width)
        targeted = [p for p in parts if p in s.lora_targets]
        downs = [s.lora_rank] * len(targeted) if s.lora_dropout > 0 else [s.lora_rank * len(targeted)]
        adapted += [width, *downs, width] if targeted else [width]
    return c * (sum(adapted[0::2]) - sum(plain[0::2]))


def lora_activation_bytes(s: Setup) -> float:
    """Bytes per token one block's adapters save beyond the base's: each A output (rank values) and, with dropout,
    each targeted projection's dropped input and its one-byte mask (one mask per projection, as peft's: q, k and v
    of the fused QKV layer each keep theirs)."""
    h, f, c = s.shape.hidden_size, s.shape.ffn_hidden_size, s.compute_bytes
    saved = float(c * s.lora_rank * len(s.lora_targets))
    if s.lora_dropout > 0:
        saved += sum((c + 1) * (f if t == "down_proj" else h) for t in s.lora_targets)
    return saved


def estimate_memory(s: Setup) -> Memory:
    """The per-GPU peak: the largest moment's tensors plus the allowance, against the GPU's memory."""
    moments = lora_memory(s, math_attention_moments(s, _moments(s)))
    moment, parts = max(moments.items(), key=lambda item: sum(item[1].values()))
    tensors = sum(parts.values())
    allowance = ALLOWANCE_FIXED_GIB * GIB + ALLOWANCE_FRACTION * tensors
    gpu = hardware.GPU_INSTANCE_TYPES[s.instance_type].gpu_memory_gb * 1e9
    return Memory(
        moment=moment,
        parts={k: v / GIB for k, v in parts.items() if v > 0},
        tensors_gib=tensors / GIB,
        allowance_gib=allowance / GIB,
        peak_gib=(tensors + allowance) / GIB,
        gpu_gib=gpu / GIB,
        limit_gib=HEADROOM * gpu / GIB,
    )


# ----------------------------------------------------------------------------------------------------------
# Advice: the smallest changes that fit
# ----------------------------------------------------------------------------------------------------------


def advice(s: Setup, *, max_instance_count: int = 64, instance_types: Sequence[str] = ()) -> list[str]:
    """The smallest single changes (or AC plus a batch size) under which ``s`` fits, each with its estimate."""
    out: list[str] = []

    def fits(candidate: Setup) -> Memory | None:
        memory = estimate_memory(candidate)
        return memory if memory.fits else None

    ac_alone = not s.ac_on and fits(replace(s, activation_checkpointing="full"))
    if ac_alone:
        out.append(f"activation_checkpointing true ({ac_alone.peak_gib:.1f} GiB)")
    for ac in dict.fromkeys((s.activation_checkpointing, "full")):
        batch = next(
            (
                b
                for b in range(s.batch_size - 1, 0, -1)
                if fits(replace(s, batch_size=b, activation_checkpointing=ac))
            ),
            None,
        )
        if batch is not None:
            m = estimate_memory(replace(s, batch_size=batch, activation_checkpointing=ac))
            with_ac = " with activation_checkpointing true" if ac == "full" and not s.ac_on else ""
            out.append(f"batch_size {batch}{with_ac} ({m.peak_gib:.1f} GiB)")
            break
    for ac in dict.fromkeys((s.activation_checkpointing, "full")):
        if ac == "full" and ac_alone:
            break  # more instances on top of a change that already fits is not a smallest change
        more = replace(s, activation_checkpointing=ac)
        count = next(
            (
                k
                for k in range(s.instance_count + 1, max_instance_count + 1)
                if fits(replace(more, instance_count=k))
            ),
            None,
        )
        if count is not None:
            m = estimate_memory(replace(more, instance_count=count))
            with_ac = " with activation_checkpointing true" if ac == "full" and not s.ac_on else ""
            out.append(f"instance_count {count}{with_ac} ({m.peak_gib:.1f} GiB)")
            break
    bigger = [
        t
        for t in instance_types
        if t != s.instance_type
        and hardware.GPU_INSTANCE_TYPES[t].supports(s.precision)
        and fits(replace(s, instance_type=t))
    ]
    if bigger:
        out.append("instance_type " + " or ".join(bigger))
    return out


# ----------------------------------------------------------------------------------------------------------
# The estimate's band: the MFU a configuration the article did not measure may reach, and where each end comes from
# ----------------------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------------------
# Time and cost
# ----------------------------------------------------------------------------------------------------------


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
    configuration, image and instance: :mod:`training.request.measured`)."""
    network: network.StepNetwork | None = None
    """The step's collectives on this layout (:func:`step_network`); None where the instance type's links are not
    in ``network.INTERCONNECTS``."""
    spread: Spread | None = None
    """The estimate's low and high ends; None for ``published`` and ``measured`` figures."""


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
    given a ``measured`` record that stands for this request (:func:`training.request.measured.find`), its
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
    return Timing(tps, mfu_bf16, step, run, cost, warning, source, basis, net, band_spread)


def step_network(s: Setup, compute_seconds: float) -> network.StepNetwork | None:
    """The collectives of one optimizer step of ``s`` on its layout (``s.replicate`` x ``s.shard_size``), against
    ``compute_seconds`` of compute (:mod:`training.request.network`). The article's throughput points were
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


def memory_check(
    s: Setup, records: Sequence[Mapping[str, Any]], *, image_tag: str | None, this: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The plan's memory error against the stored measurements of this instance type and image: each record's
    configuration re-planned now, its tensors estimate (GB) against the measured peak allocated over ranks.
    ``this`` is the record that stands for ``s`` (its own error is reported apart). None without records."""
    found = measured.same_hardware(records, instance_type=s.instance_type, image_tag=image_tag)
    errors, missed = [], 0
    for record in found:
        key, peak = record["key"], record["measured"].get("max_allocated_gb")
        other = setup_from_request(
            {"instance_type": key["instance_type"], "instance_count": key["instance_count"],
             "hyperparameters": dict(key["settings"])}
        )  # fmt: skip
        estimate = estimate_memory(other)
        if record["measured"].get("status") == "oom":
            missed += int(estimate.fits)
            continue
        if peak:
            errors.append((record, 100.0 * (estimate.tensors_gib * GIB / 1e9 - peak) / peak))
    if not errors and not missed:
        return None
    mine = next((error for record, error in errors if this is not None and record is not None and
                 record["key"] == this["key"]), None)  # fmt: skip
    absolute = [abs(error) for _, error in errors]
    return {
        "records": len(errors),
        "mean_abs_error_pct": round(sum(absolute) / len(absolute), 1) if absolute else None,
        "max_abs_error_pct": round(max(absolute), 1) if absolute else None,
        "this_request_error_pct": None if mine is None else round(mine, 1),
        "oom_predicted_to_fit": missed,
        "compared": "the plan's tensors (GB) against the measured peak allocated (max over ranks)",
    }


# ----------------------------------------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    setup: Setup
    memory: Memory
    timing: Timing
    advice: list[str] = field(default_factory=list)
    measured: dict[str, Any] | None = None
    """The stored record whose measured throughput the timing uses (None: the article's figures or an estimate)."""
    memory_check: dict[str, Any] | None = None
    """The plan's memory error against the stored measurements of this instance and image (:func:`memory_check`)."""
    data: dict[str, Any] | None = None
    """Prepared conversation data: its windows of ``seq_length``, the epochs ``max_steps`` makes and how it was
    truncated (``training.request.fine_tuning.data_plan``); None for other data."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (what the CLI's --json prints and the execution's summary carries)."""
        m, t, s = self.memory, self.timing, self.setup
        return {
            "peak_gib": round(m.peak_gib, 2),
            "tensors_gib": round(m.tensors_gib, 2),
            "allowance_gib": round(m.allowance_gib, 2),
            "limit_gib": round(m.limit_gib, 2),
            "gpu_gib": round(m.gpu_gib, 2),
            "fits": m.fits,
            "moment": m.moment,
            "parts_gib": {k: round(v, 3) for k, v in m.parts.items()},
            "world_size": s.world_size,
            "parameters": s.shape.parameter_count(),
            "tokens_per_sec_per_gpu": round(t.tokens_per_sec_per_gpu),
            "step_seconds": round(t.step_seconds, 4),
            "run_seconds": round(t.run_seconds),
            "cost_usd": None if t.cost_usd is None else round(t.cost_usd, 2),
            "warning": t.warning,
            "advice": self.advice,
            "throughput_source": t.source,
            "throughput_basis": t.basis,
            "throughput_spread": None if t.spread is None else t.spread.to_dict(),
            "measured": None if self.measured is None else self.measured["measured"],
            "memory_check": self.memory_check,
            "price_source": hardware.PRICES_AS_OF,
            "data_parallel": {"replicate": s.replicate, "shard": s.shard_size},
            "network": None if t.network is None else t.network.to_dict(),
            **({"data": self.data} if self.data is not None else {}),
        }


def make_plan(
    request: Mapping[str, Any],
    *,
    max_instance_count: int = 64,
    instance_types: Sequence[str] = (),
    measurements: Sequence[Mapping[str, Any]] = (),
    image_tag: str | None = None,
    versions: Mapping[str, str | None] | None = None,
    architecture: Mapping[str, Any] | None = None,
) -> Plan:
    """The plan of one plain execution input (:func:`parse_request`, then :func:`plan_of`); ``architecture``: the
    ``init_from`` model's settings."""
    values, s = parse_request(request, architecture)
    return plan_of(
        s,
        values,
        max_instance_count=max_instance_count,
        instance_types=instance_types,
        measurements=measurements,
        image_tag=image_tag,
        versions=versions,
    )


def plan_of(
    s: Setup,
    values: Mapping[str, Any],
    *,
    max_instance_count: int = 64,
    instance_types: Sequence[str] = (),
    measurements: Sequence[Mapping[str, Any]] = (),
    image_tag: str | None = None,
    versions: Mapping[str, str | None] | None = None,
    check_memory: bool = True,
) -> Plan:
    """The plan of the setup ``s`` of parsed settings ``values`` (advice only when it does not fit).
    ``measurements``: stored tuning records (:mod:`training.request.measured`); the one that stands for these
    settings on the image ``image_tag`` (and ``versions``) gives the throughput instead of the estimate,
    and, with ``check_memory``, all of that instance and image check the memory estimate (each record re-planned:
    :func:`memory_check`; False, e.g. for each of a tuning run's candidates, which would re-plan every record once per
    candidate)."""
    memory = estimate_memory(s)
    hints = (
        [] if memory.fits else advice(s, max_instance_count=max_instance_count, instance_types=instance_types)
    )
    record = measured.find(
        measurements,
        values,
        instance_type=s.instance_type,
        instance_count=s.instance_count,
        image_tag=image_tag,
        versions=versions,
    )
    check = (
        memory_check(s, measurements, image_tag=image_tag, this=record)
        if measurements and check_memory
        else None
    )
    return Plan(s, memory, estimate_time(s, record), hints, record, check)


def refusal(plan: Plan) -> str | None:
    """One line refusing ``plan`` when it does not fit (estimate by part, the limit, the changes that fit)."""
    m = plan.memory
    if m.fits:
        return None
    ranked = sorted(m.parts.items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{k} {v:.1f}" for k, v in ranked[:5])
    if len(ranked) > 5:
        parts += f", other {sum(v for _, v in ranked[5:]):.1f}"
    fixes = (
        "; ".join(plan.advice)
        if plan.advice
        else "no change of activation checkpointing, batch size or instance count fits"
    )
    return (
        f"memory: estimated peak {m.peak_gib:.1f} GiB per GPU ({parts}, allowance {m.allowance_gib:.1f}; at "
        f"{m.moment}) exceeds {m.limit_gib:.1f} GiB ({HEADROOM:.0%} of {plan.setup.instance_type}'s "
        f"{m.gpu_gib:.1f} GiB); fits with: {fixes}; or set ignore_memory_estimate true to launch anyway"
    )


# ----------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------


def throughput_line(d: Mapping[str, Any]) -> str:
    """The plan's throughput, step, run and cost (of :meth:`Plan.to_dict`), with an estimate's low-high spread
    after each figure and its assumptions after its source."""
    band = d.get("throughput_spread")

    def between(key: str, text: Any) -> str:
        return "" if band is None or band[key] is None else f" ({text(band[key][0])}-{text(band[key][1])})"

    cost = (
        "unknown (no price)"
        if d["cost_usd"] is None
        else f"${d['cost_usd']:,.2f}{between('cost_usd', lambda v: f'${v:,.2f}')} (prices of {d['price_source']})"
    )
    source = d["throughput_source"] + (f"; {band['assumptions']}" if band else "")
    return (
        f"throughput ~{d['tokens_per_sec_per_gpu']:,}{between('tokens_per_sec_per_gpu', lambda v: f'{v:,}')} "
        f"tokens/s per GPU ({d['throughput_basis']}: {source}), step {d['step_seconds']:.3f} s"
        f"{between('step_seconds', lambda v: f'{v:.3f}')}, run {metric_lines.format_duration(d['run_seconds'])}"
        f"{between('run_seconds', metric_lines.format_duration)}, cost {cost}"
    )


def format_plan(plan: Plan) -> str:
    """The plan as plain text (the operator CLI draws its own rich table from :meth:`Plan.to_dict`)."""
    d = plan.to_dict()
    lines = [
        f"peak {d['peak_gib']:.2f} GiB per GPU (at {d['moment']}), limit {d['limit_gib']:.2f} GiB: "
        + ("fits" if d["fits"] else "DOES NOT FIT")
    ]
    for name, gib in sorted(d["parts_gib"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:<40} {gib:9.3f} GiB")
    lines.append(
        f"  {'allowance (context, workspaces, NCCL, fragmentation)':<40} {d['allowance_gib']:9.3f} GiB"
    )
    lines.append(throughput_line(d))
    if d["network"]:
        n = d["network"]
        lines.append(
            f"network ({n['layout']}): {n['efa_gb_per_instance']:.1f} GB per instance over EFA and "
            f"{n['nvlink_gb_per_gpu']:.1f} GB per GPU over NVLink per step, busy {n['busy_seconds']:.3f} s, "
            f"exposed {n['exposed_seconds']:.3f} s ({100 * n['share']:.1f}% of the step; links: {n['source']})"
        )
    if d.get("data"):
        lines.append(f"data: {d['data']['summary']}")
    if d["warning"]:
        lines.append(f"warning: {d['warning']}")
    if d["advice"]:
        lines.append("fits with: " + "; ".join(d["advice"]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.request.plan", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("file", help="the execution input (JSON file; - for standard input)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        request = json.loads(text)
        if not isinstance(request, dict):
            raise ValueError("the execution input must be a JSON object")
        plan = make_plan(request)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
