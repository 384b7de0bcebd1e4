"""The memory estimate: one request's per-GPU peak memory by part, in closed form (``estimate_memory`` of a
``Setup``, what the estimate needs from a request; ``inputs`` makes one).

The memory model (bytes per GPU; P parameters, Pb one block's, Pr the root's = embedding + head + final norm,
W = GPUs per instance x instance_count, T = micro-batch x sequence tokens, h/f/V/nh the model's widths):

* persistent: sharded fp32 parameters 4P/W, AdamW's two fp32 moments 8P/W (gradients are set to None after each
  step, so they exist only in the backward pass: 4Pb/W per finished block);
* FSDP2 buffers (``training/trainer/distributed/parallel.py``: bf16 all-gather, fp32 reduce-scatter, every block but the last
  resharded after forward, the root never): the root's unsharded bf16 weights 2Pr for the whole step, one block's
  unsharded bf16 weights 2Pb, the next block's prefetched all-gather 2Pb, and in the backward pass the previous
  block's fp32 reduce-scatter input 4Pb (FSDP2 frees it only at the next reduce-scatter) and the head's bf16
  weight gradient 2Vh (kept until the root's reduce-scatter at the end);
* saved activations per layer (``training/trainer/model/decoder.TorchBlock`` with CUDA's flash attention and fused
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
  blocks' fp32 master weights (``training/trainer/distributed/master_weights.py``; they start from the fp32 values
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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from training.contract import hardware, shapes
from training.models.config import ModelConfig
from training.plan.memory_attention import (
    document_mask_bytes,
    family_saved_bytes,
    kv_width,
    mask_layer_bytes,
    math_attention_bytes,
    math_attention_moments,
    q_width,
    recompute_gradient_bytes,
    rope_layer_bytes,
    rope_table_bytes,
    window_mask_bytes,
)
from training.plan.memory_terms import (
    AC_RECOMPUTE_BYTES_PER_H,
    AC_TAIL_BYTES_PER_HF,
    ALLOWANCE_FIXED_GIB,
    ALLOWANCE_FRACTION,
    CHUNKED_LOSS_BYTES_PER_V,
    GIB,
    HEADROOM,
    LOSS_BYTES_PER_V,
    QUANTIZED_BYTES,
    Memory,
)


@dataclass(frozen=True)
class Setup:
    """What the estimate needs from a request (its merged, parsed settings)."""

    shape: shapes.ModelShape | ModelConfig
    """The model's dimensions: a Llama-style ``ModelShape``, or another family's ``ModelConfig`` (the same names,
    with its own ``head_dim`` and query width), as ``settings_parse.model_shape`` gives them."""
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


def layer_activation_bytes(s: Setup) -> float:
    """Bytes per token one block saves for its backward pass without activation checkpointing.

    Grouped-query attention makes the key and value ``kv_heads * head_dim`` wide (h without it). RoPE
    (``position_encoding`` rope) adds the rotated query and key (h + kv values): new tensors that attention
    saves, while the QKV projection's output stays alive through the value, a view of it (torch path: traced;
    TE path: its fused RoPE also returns new query and key tensors, assumed to be saved the same way)."""
    h, f, nh = s.shape.hidden_size, s.shape.ffn_hidden_size, s.shape.num_heads
    qw, kv = q_width(s), kv_width(s)  # query width (h for Llama); key/value width (h without GQA)
    c = s.compute_bytes
    # flash attention's fp32 log-sum-exp per query head (math's score matrix instead), two RMSNorm rstd, and the
    # family's extra norms (``family_saved_bytes``)
    stats = 4 * nh + 8 + math_attention_bytes(s) + family_saved_bytes(s)
    rope = c * (qw + kv) if s.position_encoding == "rope" else 0  # the rotated query and key
    if s.precision in QUANTIZED_BYTES:
        q = QUANTIZED_BYTES[s.precision]
        # x, q/k/v (qw + 2kv), attention output, residual in bf16; three GEMM inputs quantized (q(2h + qw)); fc1
        # output in bf16 for SwiGLU's backward (4f); fc2's input quantized (qf)
        return 2 * (2 * h + 2 * qw + 2 * kv) + q * (2 * h + qw) + (4 + q) * f + stats + rope
    # block input, normed input, QKV (qw + 2kv), attention output (qw), residual, normed input; gate/up, SiLU,
    # product
    return c * (4 * h + 2 * qw + 2 * kv + 4 * f) + stats + rope


def selective_saved_bytes(s: Setup) -> float:
    """Bytes per token a ``selective`` block keeps (``training/trainer/distributed/activation_checkpoint.py``, torchtitan's
    op-level policy): its input (h), the QKV projection's output (h + 2kv: the query, and the key and value
    ``kv_heads * head_dim`` wide each, h without grouped-query attention), attention's output (h) and fp32
    log-sum-exp (4 bytes per head), the gate/up projection's output (2f); the output and down projections (every
    second matmul) and everything else are recomputed."""
    h, f, nh = s.shape.hidden_size, s.shape.ffn_hidden_size, s.shape.num_heads
    qw, kv = q_width(s), kv_width(s)
    return s.compute_bytes * (h + 2 * qw + 2 * kv + 2 * f) + 4 * nh


def saved_per_block(s: Setup) -> list[float]:
    """Bytes each block keeps for its backward pass through the forward: checkpointed blocks their input (full)
    or ``selective_saved_bytes``, the others every activation (``layer_activation_bytes`` and RoPE's cos/sin; in
    bf16 for NVFP4's ``high_precision_blocks``)."""
    t, checkpointed, edges = s.tokens, set(s.checkpointed_blocks), s.high_precision_blocks
    whole = layer_activation_bytes(s) * t + rope_layer_bytes(s)
    whole_bf16 = layer_activation_bytes(replace(s, precision="bf16")) * t + rope_layer_bytes(s)
    kept = float(s.compute_bytes * s.shape.hidden_size * t)
    if s.activation_checkpointing == "selective":
        kept = selective_saved_bytes(s) * t
    return [
        kept
        if index in checkpointed
        else whole_bf16
        if index in edges
        else whole + mask_layer_bytes(s, index)
        for index in range(s.shape.num_layers)
    ]


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
        "window mask": window_mask_bytes(s),
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
        # the recomputed block that holds the most (a masked one: a sliding-window layer of Gemma 3)
        worst = max(checkpointed, key=lambda i: mask_layer_bytes(s, i) + recompute_gradient_bytes(s, i))
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
            "recomputed block": (act_layer - cached) * t + per_layer + mask_layer_bytes(s, worst),
            "gradients in flight": (AC_RECOMPUTE_BYTES_PER_H * c / 2 * h + recompute_gradient_bytes(s, worst))
            * t,
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
    """LoRA's terms (``lora_rank`` > 0; ``training/trainer/model/lora.py``) in place of full fine-tuning's, at every moment.
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
