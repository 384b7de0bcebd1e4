"""The trainer's settings, once: every hyperparameter SageMaker passes to ``train.sh`` (name, type,
range, allowed values, default, help: ``HYPERPARAMETERS``, the speed levers ``LEVERS``), the ``Hyperparameter`` row that
parses one value, and ``ContractError``, the error that names a bad setting.

The cross-setting rules are ``settings_checks``; reading raw settings into parsed ones is ``settings_parse``. Part of
the contract between the infrastructure (``constructs_lib``) and the trainer: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from training.contract.container import (
    CHECKPOINT_BACKENDS,
    CHECKPOINT_LOCAL_PATH,
    MODEL_DIR,
    UNUSABLE_CHECKPOINT_ACTIONS,
)
from training.contract.hardware import FP8_RECIPES, PRECISIONS
from training.contract.shapes import (
    LLAMA3_ROPE_SETTINGS,
    MODEL_PRESET_NAMES,
    NORM_EPS,
    NORM_EPS_RANGE,
    POSITION_ENCODINGS,
    ROPE_SCALINGS,
)

AC_MODES: tuple[str, ...] = ("none", "full", "selective")
"""``activation_checkpointing``: ``none``; ``full`` recomputes a whole block in backward (saving only its input);
``selective`` is op-level (torchtitan's policy): the outputs of matmuls and attention are saved (every second
matmul recomputed), everything else (norms, RoPE, SwiGLU's activation, residual adds) recomputed. ``true`` and
``false`` (the execution input's historical booleans) mean ``full`` and ``none``."""
AC_ALIASES: Mapping[str, str] = {"true": "full", "false": "none", "yes": "full", "no": "none", "1": "full",
                                 "0": "none"}  # fmt: skip

SWITCH_CHOICES: tuple[str, ...] = ("auto", "true", "false")
"""A lever's switch: ``auto`` resolves at start from the hardware (and is logged), or forced on or off."""

TOP_LEVEL_SETTINGS: tuple[str, ...] = (
    "precision",
    "num_layers",
    "batch_size",
    "seq_length",
    "activation_checkpointing",
)
"""Trainer settings that are top-level fields of the workflow's execution input (not inside ``hyperparameters``):
the request check and ``training.plan`` merge them over the ``hyperparameters`` the same way."""


class ContractError(ValueError):
    """A setting is invalid. ``field`` names it; the message says what is allowed."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Hyperparameter:
    """One trainer setting. ``kind`` is int, float, bool, choice or str; ``default`` None means 'unset'."""

    name: str
    kind: str
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    aliases: Mapping[str, str] | None = None
    """For a choice: other spellings accepted for a choice (``true`` for ``full``)."""
    auto: bool = False
    """For an int: the word ``auto`` is accepted too (kept as the string ``"auto"``; resolved where it is used)."""

    @property
    def cli_flags(self) -> tuple[str, ...]:
        """The spellings ``train.sh`` and the trainer accept: ``--num_layers`` and ``--num-layers``."""
        return tuple(dict.fromkeys((f"--{self.name}", f"--{self.name.replace('_', '-')}")))

    def allowed(self) -> str:
        """Human description of the allowed values, used in every error message."""
        if self.kind == "choice":
            spelled = sorted(
                {v: k for k, v in (self.aliases or {}).items() if k in ("true", "false")}.items()
            )
            extra = f" ({', '.join(f'{alias} = {value}' for value, alias in spelled)})" if spelled else ""
            return "one of " + ", ".join(self.choices) + extra
        if self.kind == "bool":
            return "true or false"
        if self.kind in ("int", "float"):
            lo = "-inf" if self.minimum is None else _fmt(self.minimum)
            hi = "inf" if self.maximum is None else _fmt(self.maximum)
            number = f"{'an integer' if self.kind == 'int' else 'a number'} in [{lo}, {hi}]"
            return f"auto or {number}" if self.auto else number
        return "a string"

    def parse(self, raw: Any) -> Any:
        """Parse a raw value (a string from SageMaker, or a JSON value) into its type, or raise ContractError."""
        if raw is None:
            return None
        try:
            if self.kind == "bool":
                return _parse_bool(raw)
            if self.kind == "choice":
                value = str(raw).strip().lower()
                value = (self.aliases or {}).get(value, value)
                if value not in self.choices:
                    raise ValueError
                return value
            if self.kind == "str":
                return str(raw)
            if self.auto and isinstance(raw, str) and raw.strip().lower() == "auto":
                return "auto"
            number = _parse_number(raw, integer=self.kind == "int")
        except (TypeError, ValueError):
            raise ContractError(self.name, f"must be {self.allowed()}; got {raw!r}") from None
        if (self.minimum is not None and number < self.minimum) or (
            self.maximum is not None and number > self.maximum
        ):
            raise ContractError(self.name, f"must be {self.allowed()}; got {raw!r}")
        return number


def _parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    lowered = str(raw).strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(raw)


def _parse_number(raw: Any, *, integer: bool) -> float:
    """An int (``integer``) or a finite float from a string or a JSON number; bools and 2.5-as-int are refused."""
    if isinstance(raw, bool):
        raise ValueError(raw)
    if integer:
        value = int(raw.strip()) if isinstance(raw, str) else int(raw)
        if not isinstance(raw, str) and value != raw:
            raise ValueError(raw)
        return value
    number = float(raw.strip()) if isinstance(raw, str) else float(raw)
    if not math.isfinite(number):
        raise ValueError(raw)
    return number


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else repr(number)


ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "cudnn", "flash", "efficient", "math")
"""``attention_backend`` values (``torch.nn.attention.SDPBackend``'s CUDNN_ATTENTION, FLASH_ATTENTION,
EFFICIENT_ATTENTION, MATH); ``auto`` resolves at start to the fastest the GPU supports and is logged."""

LORA_MAX_RANK = 512
"""The largest ``lora_rank``: vLLM's largest ``--max-lora-rank`` (its ``LoRAConfig`` allows 1 to 512)."""
LORA_ALL_LINEAR = "all-linear"
LORA_TARGETS: Mapping[str, str] = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
"""``lora_targets``' short names -> the module (after ``model.layers.<i>.``) that gets the adapter, the same in every
supported family's Hugging Face class: every linear layer of a block, which is what peft's ``all-linear`` selects
there."""


LOSS_CHUNK_TOKENS_DEFAULT = 2048
"""Chosen by measurement (docs/measurements.md, "Chunked loss"): the traced peak memory and the CPU throughput."""

LEVERS: tuple[Hyperparameter, ...] = (
    Hyperparameter(
        "activation_checkpointing_interval",
        "int",
        1,
        "Apply activation_checkpointing to every k-th block only (blocks 0, k, 2k, ...); 1: every block.",
        1,
        512,
    ),
    Hyperparameter(
        "grad_accum_steps",
        "int",
        1,
        "Micro-batches per optimizer step (gradient accumulation; gradients are reduced once, on the last).",
        1,
        65_536,
    ),
    Hyperparameter(
        "compile",
        "choice",
        "auto",
        "torch.compile each block and the loss chunk: auto is on with a GPU on the torch path (fp32/fp16/bf16) "
        "and off on CPU; Transformer Engine precisions run eagerly.",
        choices=SWITCH_CHOICES,
        aliases={"yes": "true", "1": "true", "no": "false", "0": "false"},
    ),
    Hyperparameter(
        "attention_backend",
        "choice",
        "auto",
        "Scaled-dot-product attention kernel on the torch path: auto pins cuDNN then Flash on Hopper and "
        "Blackwell, Flash on Ampere; or one of cudnn, flash, efficient, math (math keeps each layer's whole fp32 "
        "score matrix, which the memory plan counts).",
        choices=ATTENTION_BACKENDS,
    ),
    Hyperparameter(
        "adamw_impl",
        "choice",
        "auto",
        "AdamW kernels: auto is fused on CUDA (foreach on CPU); with quantized_model_init they update fp32 master "
        "weights.",
        choices=("auto", "fused", "foreach"),
    ),
    Hyperparameter(
        "master_weights",
        "bool",
        True,
        "With quantized_model_init: AdamW updates fp32 master weights and writes them back into the quantized "
        "ones (false is refused: FP8 primary weights alone round small updates away).",
    ),
    Hyperparameter(
        "nvfp4_bf16_blocks",
        "int",
        1,
        "precision=nvfp4: this many first and last blocks run in bf16 (Megatron keeps them so); 0: none.",
        0,
        256,
    ),
    Hyperparameter(
        "gc_interval",
        "int",
        50,
        "Python's garbage collector is disabled and run (generation 1) every N steps, as torchtitan does; 0: "
        "Python's own automatic collection.",
        0,
        1_000_000,
    ),
    Hyperparameter(
        "async_checkpoint",
        "bool",
        True,
        "Save checkpoints with DCP's async_save: training continues while the files are written; sealed "
        "(checksums, COMPLETE) as soon as every rank's write has finished.",
    ),
    Hyperparameter(
        "expandable_segments",
        "bool",
        True,
        "PyTorch's CUDA caching allocator with expandable segments (less fragmentation).",
    ),
    Hyperparameter(
        "data_parallel_replicate",
        "int",
        "auto",
        "Hybrid sharding (HSDP): the GPUs form a replicas x shards mesh; each replica holds the model's states "
        "sharded over its GPUs and gradients are averaged across replicas. auto: the number of instances when "
        "one instance's GPUs hold the sharded states with room for the step (the plan's memory estimate), else 1 "
        "(every state sharded over every GPU); a number must divide the number of GPUs.",
        1,
        4096,
        auto=True,
    ),
)
"""The speed levers (docs/performance.md): each resolved at start where it says ``auto`` and logged."""

OBJECTIVES: tuple[str, ...] = ("auto", "next_token", "dpo")
"""``objective``: ``next_token`` (the next-token cross-entropy: pretraining, and conversations on their assistant
turns), ``dpo`` (direct preference optimization on prepared preference pairs), or ``auto``: what the data is
(``kind: preference`` in its ``metadata.json`` trains DPO, any other data the next-token loss)."""
DPO_LOSSES: tuple[str, ...] = ("sigmoid", "ipo", "sigmoid_norm")
"""``dpo_loss``: TRL's ``loss_type`` names for the same objectives (``trl/trainer/dpo_trainer.py``)."""
DPO_REFERENCES: tuple[str, ...] = ("auto", "precomputed", "adapter_off")
"""``dpo_reference``: where the reference model's log-probabilities come from."""
DPO_SETTINGS: tuple[str, ...] = ("dpo_beta", "dpo_loss", "dpo_sft_weight", "dpo_reference")
"""The settings only preference tuning uses."""

OBJECTIVE_SETTINGS: tuple[Hyperparameter, ...] = (
    Hyperparameter(
        "objective",
        "choice",
        "auto",
        "What the run minimizes: next_token (the next-token loss of pretraining and of conversations), dpo (preference "
        "tuning on chosen and rejected answers, data prepared from preference pairs), or auto: dpo for preference "
        "data, next_token for any other.",
        choices=OBJECTIVES,
    ),
    Hyperparameter(
        "dpo_beta",
        "float",
        0.1,
        "DPO: how far the policy may move from the reference (the rewards are beta x the log-probability ratios); "
        "for dpo_loss=ipo the regularization tau (TRL's beta).",
        1e-4,
        100.0,
    ),
    Hyperparameter(
        "dpo_loss",
        "choice",
        "sigmoid",
        "DPO loss: sigmoid (-log sigmoid of the reward margin, the DPO paper's), ipo (squared, on per-token average "
        "log-ratios), or sigmoid_norm (sigmoid on per-token average log-ratios: length-normalised).",
        choices=DPO_LOSSES,
    ),
    Hyperparameter(
        "dpo_sft_weight",
        "float",
        0.0,
        "DPO: weight of an added next-token loss on the chosen answers (their mean over the step's chosen tokens; "
        "TRL's loss_type sft); 0: none.",
        0.0,
        100.0,
    ),
    Hyperparameter(
        "dpo_reference",
        "choice",
        "auto",
        "DPO's reference log-probabilities: precomputed (one pass of the initial model over the data before step 1, "
        "stored in checkpoint_dir and reused by a resumed run), adapter_off (LoRA: the same model with its adapters "
        "switched off, every step), or auto: adapter_off with LoRA, precomputed otherwise.",
        choices=DPO_REFERENCES,
    ),
)
"""The objective and preference tuning's settings (docs/preference-tuning.md)."""

HYPERPARAMETERS: tuple[Hyperparameter, ...] = (
    Hyperparameter("precision", "choice", "bf16", "Numeric format of the GEMMs.", choices=PRECISIONS),
    Hyperparameter(
        "fp8_recipe",
        "choice",
        "auto",
        "Scaling recipe when precision=fp8: auto is current scaling on Ada/Hopper, MXFP8 on Blackwell (SM 10.x); "
        "mxfp8 needs Blackwell (refused on other GPUs, as precision mxfp8 is).",
        choices=FP8_RECIPES,
    ),
    Hyperparameter(
        "quantized_model_init",
        "bool",
        False,
        "Keep primary weights quantized (TE quantized_model_init); fp8 and mxfp8 only.",
    ),
    Hyperparameter(
        "model_preset", "choice", "1b", "Model size preset, or custom.", choices=MODEL_PRESET_NAMES
    ),
    Hyperparameter("num_layers", "int", None, "Transformer blocks (overrides the preset).", 1, 512),
    Hyperparameter("hidden_size", "int", None, "Model width (overrides the preset).", 8, 65536),
    Hyperparameter("num_heads", "int", None, "Attention heads (overrides the preset).", 1, 512),
    Hyperparameter("ffn_hidden_size", "int", None, "MLP width (overrides the preset).", 8, 262144),
    Hyperparameter("vocab_size", "int", None, "Vocabulary size (overrides the preset).", 2, 1_048_576),
    Hyperparameter(
        "num_kv_heads",
        "int",
        None,
        "Key/value heads of grouped-query attention; must divide num_heads (overrides the preset; presets "
        "without grouped-query attention and custom shapes: num_heads).",
        1,
        512,
    ),
    Hyperparameter(
        "tie_embeddings",
        "bool",
        None,
        "The LM head uses the input embedding's matrix (overrides the preset; custom shapes: false).",
    ),
    Hyperparameter(
        "rms_norm_eps",
        "float",
        NORM_EPS,
        "Epsilon of every RMSNorm (Llama 3.x and every preset: 1e-5; Llama 2: 1e-6). With init_from it comes "
        "from the model's config.json (rms_norm_eps; without one, 1e-6, the default of every supported family's transformers config).",
        *NORM_EPS_RANGE,
    ),
    Hyperparameter(
        "init_from",
        "str",
        None,
        "A Hugging Face model folder (config.json and safetensors) of a supported family (LlamaForCausalLM, "
        "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Gemma3ForCausalLM) to start from instead of random "
        "weights: the model's family, shape and RoPE settings come from its config.json (explicit settings must "
        "agree). In the workflow: the input field init_from, an S3 prefix mounted as the weights channel.",
    ),
    Hyperparameter(
        "init_from_source",
        "str",
        None,
        "What names the init_from model for those who load what the run exports: the base model a LoRA run's peft "
        "adapter records (adapter_config.json's base_model_name_or_path, which peft's AutoPeftModelForCausalLM "
        "loads) and the model cards name, such as a Hugging Face Hub model id. Default: init_from as an absolute "
        "path; in the workflow, the input field init_from's S3 URI. Only with init_from.",
    ),
    Hyperparameter(
        "position_encoding",
        "choice",
        "rope",
        "rope: rotary position embeddings as every supported family applies them (rotate-half on query and key; "
        "the model exports to its Hugging Face class); none: no position encoding (NoPE, Llama-style models "
        "trained before RoPE existed here; cannot be exported).",
        choices=POSITION_ENCODINGS,
    ),
    Hyperparameter(
        "rope_theta",
        "float",
        10000.0,
        "RoPE base (Llama 2: 10000, Llama 3: 500000); used when position_encoding=rope.",
        1.0,
        1e12,
    ),
    Hyperparameter(
        "rope_scaling",
        "choice",
        "none",
        "RoPE frequency scaling: none, llama3 (Llama 3.1's, with the four rope_* settings below; the Llama "
        "presets set it), or linear (every frequency divided by rope_scaling_factor; Gemma 3's global layers).",
        choices=ROPE_SCALINGS,
    ),
    Hyperparameter(
        "rope_scaling_factor",
        "float",
        None,
        "rope_scaling=llama3 or linear: factor (Llama 3.1: 8, 3.2: 32; Gemma 3: 8).",
        1.0,
        1e6,
    ),
    Hyperparameter(
        "rope_low_freq_factor", "float", None, "rope_scaling=llama3: low_freq_factor (Llama: 1).", 1e-6, 1e6
    ),
    Hyperparameter(
        "rope_high_freq_factor",
        "float",
        None,
        "rope_scaling=llama3: high_freq_factor, above rope_low_freq_factor (Llama: 4).",
        1e-6,
        1e6,
    ),
    Hyperparameter(
        "rope_original_max_position_embeddings",
        "int",
        None,
        "rope_scaling=llama3: original_max_position_embeddings, the context it was pretrained at (Llama: 8192).",
        1,
        16_777_216,
    ),
    Hyperparameter("seq_length", "int", 8192, "Tokens per sequence.", 8, 1_048_576),
    Hyperparameter("batch_size", "int", 1, "Micro-batch size per GPU (sequences).", 1, 4096),
    Hyperparameter(
        "batch_tokens",
        "int",
        None,
        "The batch in tokens instead of batch_size: tokens per optimizer step over every GPU, converted once at "
        "start into batch_size = batch_tokens / (seq_length x GPUs x grad_accum_steps), rounded down to whole "
        "windows (at least one per GPU; the plan and the run's first lines say the result). Not with batch_size.",
        1,
        10**12,
    ),
    Hyperparameter(
        "activation_checkpointing",
        "choice",
        "none",
        "Recompute activations in backward: none, full (whole blocks) or selective (op-level: matmul and attention "
        "outputs kept, the rest recomputed).",
        choices=AC_MODES,
        aliases=AC_ALIASES,
    ),
    Hyperparameter(
        "loss_chunk_tokens",
        "int",
        LOSS_CHUNK_TOKENS_DEFAULT,
        "Tokens per chunk of the LM head and cross-entropy, recomputed in backward, so the loss's memory is "
        "bounded by the chunk (0: unchunked, fp32 logits for the whole micro-batch).",
        0,
        1_048_576,
    ),
    Hyperparameter(
        "lora_rank",
        "int",
        0,
        "LoRA: train only low-rank adapters of this rank on the frozen base model (the init_from model's); 0 "
        "trains every weight. vLLM serves adapters up to rank 512.",
        0,
        LORA_MAX_RANK,
    ),
    Hyperparameter(
        "lora_alpha",
        "float",
        None,
        "LoRA scaling numerator: each adapter adds lora_alpha / lora_rank x B A to its weight (default 2 x "
        "lora_rank).",
        1e-6,
        1e6,
    ),
    Hyperparameter(
        "lora_dropout",
        "float",
        0.0,
        "LoRA: dropout on each adapter's input (as peft's lora_dropout), training only.",
        0.0,
        0.9,
    ),
    Hyperparameter(
        "lora_targets",
        "str",
        LORA_ALL_LINEAR,
        "LoRA: the projections that get adapters: all-linear (every projection of every block, as peft's "
        "all-linear; never the LM head or the embedding), or a comma-separated list of q, k, v, o, gate, up, "
        "down (Hugging Face's q_proj, ..., down_proj spellings too).",
    ),
    *LEVERS,
    Hyperparameter("max_steps", "int", 1000, "Optimizer steps to train for.", 1, 100_000_000),
    Hyperparameter("learning_rate", "float", 3e-4, "Peak learning rate (AdamW).", 0.0, 10.0),
    Hyperparameter("lr_warmup_steps", "int", 100, "Linear learning-rate warm-up steps.", 0, 100_000_000),
    Hyperparameter("weight_decay", "float", 0.1, "AdamW weight decay.", 0.0, 10.0),
    Hyperparameter("grad_clip", "float", 1.0, "Gradient-norm clip (0 disables).", 0.0, 1e6),
    Hyperparameter("seed", "int", 1234, "Random seed (model init, synthetic data).", 0, 2**31 - 1),
    Hyperparameter(
        "dataset",
        "choice",
        "synthetic",
        "synthetic tokens, or token files in the train channel.",
        choices=("synthetic", "channel"),
    ),
    Hyperparameter(
        "token_dtype",
        "choice",
        "uint16",
        "dtype of .bin token files in the train channel.",
        choices=("uint16", "uint32"),
    ),
    Hyperparameter(
        "packing",
        "bool",
        True,
        "Conversation data (prepared with --init-from): several examples per seq_length window, each attending "
        "only to itself with its positions restarting at 0 (best-fit decreasing); false: one example per window, "
        "padded. Ignored for other data.",
    ),
    *OBJECTIVE_SETTINGS,
    Hyperparameter("log_interval", "int", 10, "Print a metrics line every N steps.", 1, 1_000_000),
    Hyperparameter(
        "validation_interval",
        "int",
        200,
        "Report the validation loss every N steps and at the end (0: only at the end); needs prepared data "
        "with a validation split.",
        0,
        100_000_000,
    ),
    Hyperparameter("validation_batches", "int", 8, "Batches per rank in each validation loss.", 1, 1_000_000),
    Hyperparameter(
        "throughput_warmup_steps", "int", 3, "Steps left out of throughput figures.", 0, 1_000_000
    ),
    Hyperparameter(
        "checkpoint_interval",
        "int",
        500,
        "Save a checkpoint every N steps (0: only on exit).",
        0,
        100_000_000,
    ),
    Hyperparameter(
        "keep_checkpoints",
        "int",
        3,
        "Complete checkpoints to keep (counting only those this run wrote or loaded).",
        1,
        1000,
    ),
    Hyperparameter(
        "on_unusable_checkpoints",
        "choice",
        "restart",
        "When checkpoint_dir holds checkpoints but none is usable (all damaged or incomplete): restart from step "
        "0, or fail before step 1.",
        choices=UNUSABLE_CHECKPOINT_ACTIONS,
    ),
    Hyperparameter(
        "checkpoint_dir",
        "str",
        CHECKPOINT_LOCAL_PATH,
        "Where checkpoints are written and resumed: a folder, or the run's S3 prefix (s3://bucket/prefix/).",
    ),
    Hyperparameter(
        "checkpoint_backend",
        "choice",
        "auto",
        "Where checkpoints are kept: s3 (each rank writes its shards straight to the run's S3 prefix and reads "
        "back only what it needs), folder (checkpoint_dir on each node's disk; in a job SageMaker copies it to "
        "S3, and back to every instance when a job starts), auto (a workflow's job: s3 on several instances, "
        "folder on one; the trainer: s3 when checkpoint_dir is an s3:// URI).",
        choices=CHECKPOINT_BACKENDS,
    ),
    Hyperparameter("model_dir", "str", MODEL_DIR, "Where the final model is saved."),
)
HYPERPARAMETERS_BY_NAME: Mapping[str, Hyperparameter] = {hp.name: hp for hp in HYPERPARAMETERS}

MODEL_DIM_NAMES: tuple[str, ...] = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size")


ARCHITECTURE_NAMES: tuple[str, ...] = (*MODEL_DIM_NAMES, "num_kv_heads", "tie_embeddings")
"""Every setting of the model's shape (the fields of ``ModelShape``)."""
ROPE_NAMES: tuple[str, ...] = ("position_encoding", "rope_theta", "rope_scaling", *LLAMA3_ROPE_SETTINGS)
"""Every setting of the position encoding."""


LORA_SETTINGS: tuple[str, ...] = ("lora_alpha", "lora_dropout", "lora_targets")
"""The LoRA settings that only ``lora_rank`` > 0 uses."""
