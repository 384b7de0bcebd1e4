"""The one contract between the infrastructure (``constructs_lib``) and the trainer (``training.trainer``).

Everything that crosses from a Step Functions execution to the trainer's log lines is named here, once:

* the hyperparameters SageMaker passes to ``train.sh`` (names, types, ranges, allowed values, defaults);
* the precisions and which GPUs can run them;
* the GPU training instance types and their GPUs;
* the metric lines the trainer prints and the regexes SageMaker's ``MetricDefinitions`` use to read them;
* the fixed paths inside the training container.

Pure Python (standard library only, no torch): the CDK app imports it at synth time and the trainer at run time.
Nothing here imports ``constructs_lib``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# --------------------------------------------------------------------------------------------------------------
# Precisions and hardware
# --------------------------------------------------------------------------------------------------------------

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


AC_MODES: tuple[str, ...] = ("none", "full", "selective")
"""``activation_checkpointing``: ``none``; ``full`` recomputes a whole block in backward (saving only its input);
``selective`` is op-level (torchtitan's policy): the outputs of matmuls and attention are saved (every second
matmul recomputed), everything else (norms, RoPE, SwiGLU's activation, residual adds) recomputed. ``true`` and
``false`` (the execution input's historical booleans) mean ``full`` and ``none``."""
AC_ALIASES: Mapping[str, str] = {"true": "full", "false": "none", "yes": "full", "no": "none", "1": "full",
                                 "0": "none"}  # fmt: skip

SWITCH_CHOICES: tuple[str, ...] = ("auto", "true", "false")
"""A lever's switch: ``auto`` resolves at start from the hardware (and is logged), or forced on or off."""

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

TOP_LEVEL_SETTINGS: tuple[str, ...] = (
    "precision",
    "num_layers",
    "batch_size",
    "seq_length",
    "activation_checkpointing",
)
"""Trainer settings that are top-level fields of the workflow's execution input (not inside ``hyperparameters``):
the request check and ``training.request.plan`` merge them over the ``hyperparameters`` the same way."""
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

# --------------------------------------------------------------------------------------------------------------
# Paths and channels inside the training container
# --------------------------------------------------------------------------------------------------------------

CONTAINER_CODE_DIR = "/opt/ml/code"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
MODEL_DIR = "/opt/ml/model"
TRAIN_CHANNEL = "train"
RESUME_CHANNEL = "resume"
"""Read-only input channel with one complete checkpoint of an earlier run (the workflow's ``resume_from``)."""
WEIGHTS_CHANNEL = "weights"
"""Read-only input channel with the Hugging Face model folder the run starts from (the workflow's ``init_from``,
an S3 prefix; the trainer's ``init_from`` is then ``SM_CHANNEL_WEIGHTS``, ``/opt/ml/input/data/weights``)."""
WEIGHTS_CHANNEL_DIR = f"/opt/ml/input/data/{WEIGHTS_CHANNEL}"
DATA_METADATA_FILE = "metadata.json"
"""Written by ``training.trainer.prepare`` next to the token files (token dtype, vocabulary size, tokenizer, token
counts, the files of each split); the request check reads exactly this name to learn a run's tokenizer."""
INIT_FROM_TRAVELLING_FILES: tuple[str, ...] = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
)
"""Files of an ``init_from`` model folder that travel to the run's Hugging Face export (``training.trainer.export_hf``:
its tokenizer and generation settings). When any but ``generation_config.json`` is there, the export's tokenizer is
the folder's (not the data's)."""
INIT_FROM_TOKENIZERS: tuple[str, ...] = ("tokenizer.json", "tokenizer.model")
"""Of those, the files that make a tokenizer ``AutoTokenizer`` can load (a fast tokenizer, or SentencePiece)."""
ENTRY_POINT = "train.sh"
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
"""Where the trainer writes TensorBoard event files in a job: the workflow's ``TensorBoardOutputConfig.LocalPath``
(SageMaker syncs that folder to its ``S3OutputPath`` during training). Also the API's default LocalPath."""
TENSORBOARD_CONFIG_FILE = "/opt/ml/input/config/tensorboardoutputconfig.json"
"""Written by SageMaker into the container when the job has a ``TensorBoardOutputConfig``."""

# MLflow (SageMaker managed MLflow through the sagemaker-mlflow plugin): the workflow sets these variables in the
# job's environment when a tracking server is configured; the trainer logs only when the first one is set.
MLFLOW_TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
"""The tracking server's ARN (``arn:aws:sagemaker:...:mlflow-tracking-server/NAME``), or any MLflow URI."""
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
"""The experiment: the workflow (state machine) name."""
MLFLOW_RUN_NAME_ENV = "BLACKWELL_MLFLOW_RUN_NAME"
"""The run: the Step Functions execution name, the same for every launch of that execution."""

OUTPUT_DIR = "/opt/ml/output"
"""SageMaker's output folder; a ``failure`` file written there becomes the job's ``FailureReason`` (first 1024
characters). The toolkit passes it to the entry point as ``SM_OUTPUT_DIR``."""
FAILURE_FILE = "failure"

CHECKPOINT_DIR_NAME = re.compile(r"^step_(\d{8})(?:-([2-9]|[1-9][0-9]+))?$")
"""A checkpoint folder: ``step_00000100``, or ``step_00000100-2`` (-3, ...) when a run reached a step whose folder
name was already taken (an incomplete folder it must leave as it is). Of two folders of one step the higher number
is the newer. Suffixed names (``.tmp``, ``.unusable``) are never checkpoints to load."""

SET_ASIDE_SUFFIX = ".unusable"
"""A checkpoint folder the trainer found damaged is set aside by a small file beside it, ``step_00000100.unusable``
(JSON: why, which job), never by moving it: under SageMaker ``/opt/ml/checkpoints`` is mirrored to S3 and a local
rename is a deletion of the S3 prefix plus a full re-upload. A folder with that file is never loaded, counted by
``keep_checkpoints``, written into or deleted, and ``resume_from`` never picks it."""

UNUSABLE_CHECKPOINT_ACTIONS: tuple[str, ...] = ("restart", "fail")
"""``on_unusable_checkpoints``: what the trainer does when ``checkpoint_dir`` holds checkpoints and none is usable."""
HF_EXPORT_DIR = "hf"
"""The Hugging Face ``LlamaForCausalLM`` folder a finished run writes into ``MODEL_DIR`` (so into the job's
``model.tar.gz``), next to ``model.pt`` (``training.trainer.export_hf``); the workflow's summary names it."""
PEFT_EXPORT_DIR = "adapter"
"""The PEFT LoRA adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) a finished LoRA run
(``lora_rank`` > 0) writes next to ``model.pt`` and the merged ``hf/`` folder (``training.trainer.export_peft``)."""

# --------------------------------------------------------------------------------------------------------------
# Model presets (the seed article's range, Llama-style shapes)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder's shape. ``num_kv_heads``: key/value heads of grouped-query attention (None: one per
    query head, multi-head attention); ``tie_embeddings``: the LM head is the input embedding's matrix."""

    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int = 32_000
    num_kv_heads: int | None = None
    tie_embeddings: bool = False

    @property
    def kv_heads(self) -> int:
        """Key/value heads in effect (``num_heads`` when ``num_kv_heads`` is None)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def parameter_count(self) -> int:
        """Parameters of the decoder-only LM (embedding, head unless tied, RMSNorm, SwiGLU MLP, no biases)."""
        return self.num_layers * self.block_parameter_count() + self.root_parameter_count()

    def block_parameter_count(self) -> int:
        """Parameters of one block: attention's query and output projections (h x h each), key and value
        projections (h x kv_heads * head_dim each), the SwiGLU MLP's three, two RMSNorm weights."""
        h = self.hidden_size
        kv_width = self.kv_heads * self.head_dim
        return 2 * h * h + 2 * h * kv_width + 3 * h * self.ffn_hidden_size + 2 * h

    def root_parameter_count(self) -> int:
        """Parameters outside the blocks: the embedding, the LM head (none of its own when tied) and the final
        RMSNorm."""
        matrices = 1 if self.tie_embeddings else 2
        return matrices * self.vocab_size * self.hidden_size + self.hidden_size


MODEL_PRESETS: Mapping[str, ModelShape] = {
    "1b": ModelShape(num_layers=16, hidden_size=2048, num_heads=16, ffn_hidden_size=5632),
    "8b": ModelShape(num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=14336),
    "14b": ModelShape(num_layers=40, hidden_size=5120, num_heads=40, ffn_hidden_size=17920),
    "32b": ModelShape(num_layers=64, hidden_size=6144, num_heads=48, ffn_hidden_size=20480),
    "64b": ModelShape(num_layers=80, hidden_size=8192, num_heads=64, ffn_hidden_size=22016),
    # Meta's Llama 3.x, exactly (docs/open-weights.md says how each value was checked): hidden_size,
    # num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size, vocab_size and
    # tie_word_embeddings of each model's config.json; their RoPE settings are in PRESET_SETTINGS.
    "llama3.2-1b": ModelShape(16, 2048, 32, 8192, 128_256, num_kv_heads=8, tie_embeddings=True),
    "llama3.2-3b": ModelShape(28, 3072, 24, 8192, 128_256, num_kv_heads=8, tie_embeddings=True),
    "llama3.1-8b": ModelShape(32, 4096, 32, 14336, 128_256, num_kv_heads=8),
    "llama3.1-70b": ModelShape(80, 8192, 64, 28672, 128_256, num_kv_heads=8),
}
MODEL_PRESET_NAMES: tuple[str, ...] = (*MODEL_PRESETS, "custom")

ROPE_SCALINGS: tuple[str, ...] = ("none", "llama3")
"""``rope_scaling`` values: none, or Llama 3.1's frequency-dependent scaling (Hugging Face ``rope_type`` llama3)."""
LLAMA3_ROPE_SETTINGS: tuple[str, ...] = (
    "rope_scaling_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_position_embeddings",
)
"""The four parameters of ``rope_scaling=llama3`` (Hugging Face's ``factor``, ``low_freq_factor``,
``high_freq_factor``, ``original_max_position_embeddings``)."""


def _llama3_rope(factor: float) -> Mapping[str, Any]:
    return {
        "rope_theta": 500_000.0,
        "rope_scaling": "llama3",
        "rope_scaling_factor": factor,
        "rope_low_freq_factor": 1.0,
        "rope_high_freq_factor": 4.0,
        "rope_original_max_position_embeddings": 8192,
    }


PRESET_SETTINGS: Mapping[str, Mapping[str, Any]] = {
    "llama3.2-1b": _llama3_rope(32.0),
    "llama3.2-3b": _llama3_rope(32.0),
    "llama3.1-8b": _llama3_rope(8.0),
    "llama3.1-70b": _llama3_rope(8.0),
}
"""Settings other than the shape that a preset gives when the request leaves them out: the Llama presets' RoPE
(``rope_theta`` 500000 and ``rope_scaling`` llama3 with factor 32 for 3.2, 8 for 3.1, as their config.json)."""

NORM_EPS = 1e-5
"""The default epsilon of every RMSNorm of the model (the ``rms_norm_eps`` setting): Llama 3.x's published value
(``rms_norm_eps`` 1e-05 in each Llama 3.x model's config.json), which every preset keeps. An ``init_from`` model's
comes from its config.json (``hf_config.architecture``)."""
NORM_EPS_RANGE: tuple[float, float] = (1e-12, 1e-2)
"""The ``rms_norm_eps`` values allowed (a setting, or an ``init_from`` model's config.json)."""

POSITION_ENCODINGS: tuple[str, ...] = ("rope", "none")
"""``position_encoding`` values: rotary embeddings (Llama's), or none (NoPE)."""


def flops_per_token(shape: ModelShape, seq_length: int, lora_parameters: int = 0) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), the PaLM/Megatron convention:
    ``6 * N + 12 * L * H * S`` with N the parameters taking part in matmuls (all but the input embedding, a
    lookup; the LM head counts, also when it is the embedding's matrix). The second term is attention's QK^T and
    AV matmuls, counted in full although the causal mask skips about half (grouped-query attention changes
    neither: every query head attends over the whole head_dim). Used by the trainer's MFU and by
    ``training.request.plan``'s time estimate.

    LoRA (``lora_parameters`` > 0, the adapters' count, ``lora_parameters``): the frozen weights run their forward
    and input-gradient GEMMs but no weight-gradient GEMM, ``4 * N``, and the adapters all three, ``6 * Na``; the
    attention term is unchanged. About 2/3 of full fine-tuning's, as Megatron-Bridge counts a LoRA run's TFLOP/s
    (NVIDIA-NeMo/Megatron-Bridge issue 2409) and NeMo AutoModel its MFU ((1 + 1 + Na / N) / 3)."""
    lm_head = shape.vocab_size * shape.hidden_size  # a matmul whether or not it shares the embedding's matrix
    matmul_params = shape.num_layers * shape.block_parameter_count() + shape.hidden_size + lm_head
    attention = 12.0 * shape.num_layers * shape.hidden_size * seq_length
    if lora_parameters:
        return 4.0 * matmul_params + 6.0 * lora_parameters + attention
    return 6.0 * matmul_params + attention


# --------------------------------------------------------------------------------------------------------------
# Hyperparameters: what SageMaker passes to train.sh (as strings), and what the trainer accepts
# --------------------------------------------------------------------------------------------------------------


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
"""``lora_targets``' short names -> the ``LlamaForCausalLM`` module (after ``model.layers.<i>.``) that gets the
adapter: every linear layer of a Llama block, which is what peft's ``all-linear`` selects there."""


def lora_target_modules(text: str) -> tuple[str, ...]:
    """The Llama projections (``q_proj``, ..., ``down_proj``, in block order) that ``lora_targets`` names; raises
    ContractError for a name a Llama block has no projection of, or an empty or repeated list."""
    if text.strip().lower() == LORA_ALL_LINEAR:
        return tuple(module.rsplit(".", 1)[1] for module in LORA_TARGETS.values())
    names = [part.strip().lower() for part in text.split(",")]
    allowed = f"{LORA_ALL_LINEAR}, or a comma-separated list of {', '.join(LORA_TARGETS)}"
    chosen: list[str] = []
    for name in names:
        short = name.removesuffix("_proj")
        if short not in LORA_TARGETS:
            what = "an empty entry" if not name else f"{name!r}, which a Llama block has no projection of"
            raise ContractError("lora_targets", f"must be {allowed}; got {text!r} with {what}")
        if short in chosen:
            raise ContractError("lora_targets", f"names {short} twice; got {text!r}")
        chosen.append(short)
    return tuple(LORA_TARGETS[s].rsplit(".", 1)[1] for s in LORA_TARGETS if s in chosen)


def lora_block_parameter_count(shape: ModelShape, rank: int, targets: Sequence[str]) -> int:
    """One block's LoRA adapter parameters (``training/trainer/lora.py``): rank x (in + out) for each targeted
    projection (``q_proj``, ..., ``down_proj``)."""
    h, f, kv = shape.hidden_size, shape.ffn_hidden_size, shape.kv_heads * shape.head_dim
    dims = {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h), "gate_proj": (f, h),
            "up_proj": (f, h), "down_proj": (h, f)}  # fmt: skip
    return sum(rank * (dims[t][0] + dims[t][1]) for t in targets)


def lora_parameters(values: Mapping[str, Any]) -> int:
    """The LoRA adapters' parameters of parsed settings (or a saved run's config): every block's; 0 without LoRA."""
    rank = int(values.get("lora_rank") or 0)
    if not rank:
        return 0
    targets = lora_target_modules(values.get("lora_targets") or LORA_ALL_LINEAR)
    shape = model_shape(values)
    return shape.num_layers * lora_block_parameter_count(shape, rank, targets)


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
        "from the model's config.json (rms_norm_eps; without one, transformers' LlamaConfig default 1e-6).",
        *NORM_EPS_RANGE,
    ),
    Hyperparameter(
        "init_from",
        "str",
        None,
        "A Hugging Face LlamaForCausalLM folder (config.json and safetensors) to start from instead of random "
        "weights: the model's shape and RoPE settings come from its config.json (explicit settings must agree). "
        "In the workflow: the input field init_from, an S3 prefix mounted as the weights channel.",
    ),
    Hyperparameter(
        "position_encoding",
        "choice",
        "rope",
        "rope: rotary position embeddings as Llama applies them (rotate-half on query and key; the model "
        "exports to Hugging Face LlamaForCausalLM); none: no position encoding (NoPE, models trained before "
        "RoPE existed here; cannot be exported).",
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
        "RoPE frequency scaling: none, or llama3 (Llama 3.1's, with the four rope_* settings below; the Llama "
        "presets set it).",
        choices=ROPE_SCALINGS,
    ),
    Hyperparameter(
        "rope_scaling_factor", "float", None, "rope_scaling=llama3: factor (3.1: 8, 3.2: 32).", 1.0, 1e6
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
        "checkpoint_dir", "str", CHECKPOINT_LOCAL_PATH, "Where checkpoints are written and resumed."
    ),
    Hyperparameter("model_dir", "str", MODEL_DIR, "Where the final model is saved."),
)
HYPERPARAMETERS_BY_NAME: Mapping[str, Hyperparameter] = {hp.name: hp for hp in HYPERPARAMETERS}

MODEL_DIM_NAMES: tuple[str, ...] = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size")

SEQ_LENGTH_MULTIPLE: Mapping[str, int] = {
    "fp32": 8,
    "fp16": 8,
    "bf16": 8,
    "fp8": 16,
    "mxfp8": 32,
    "nvfp4": 32,
}
"""``seq_length`` and model dims must be multiples of this for the precision's kernels (FP8 GEMMs need
16-aligned dims; MXFP8 and NVFP4 scale blocks of 32 and 16 values, so 32 covers both). ``precision=fp8`` runs
MXFP8 where its recipe resolves to it (``fp8_recipe`` mxfp8, or auto on SM 10.x): ``dims_multiple``."""


def dims_multiple(precision: str, fp8_recipe: str = "auto", sm: tuple[int, int] | None = None) -> int:
    """The multiple ``seq_length`` and the model's widths need for the recipe that will run: ``precision``'s,
    or MXFP8's 32 when ``precision=fp8`` resolves to MXFP8 on a GPU of compute capability ``sm``
    (``fp8_recipe_for``; TE 2.11 ``MXFP8Quantizer.is_quantizable``: both dims multiples of 32). ``sm`` None (the
    GPU not known yet): what the recipe alone decides; the request check and the trainer know the GPU."""
    if precision == "fp8" and fp8_recipe_for(fp8_recipe, sm) == "mxfp8":
        return SEQ_LENGTH_MULTIPLE["mxfp8"]
    return SEQ_LENGTH_MULTIPLE[precision]


def check_dims(values: Mapping[str, Any], sm: tuple[int, int] | None = None) -> None:
    """``seq_length``, ``hidden_size``, ``ffn_hidden_size`` (and, for block-scaled formats, the fused QKV
    projection's rows, hidden + 2 x key/value width) are multiples of ``dims_multiple`` on a GPU of ``sm``."""
    precision = values["precision"]
    multiple = dims_multiple(precision, values.get("fp8_recipe", "auto"), sm)
    why = f"precision={precision}"
    if precision == "fp8" and multiple != SEQ_LENGTH_MULTIPLE["fp8"]:
        on = f" on SM {sm[0]}.{sm[1]}" if sm is not None and values.get("fp8_recipe") == "auto" else ""
        why += f" with fp8_recipe={values.get('fp8_recipe')} (MXFP8BlockScaling{on}: blocks of 32 values)"
    for field in ("seq_length", "hidden_size", "ffn_hidden_size"):
        if values[field] % multiple:
            raise ContractError(field, f"must be a multiple of {multiple} for {why}; got {values[field]}")
    head_dim = values["hidden_size"] // values["num_heads"]
    qkv_rows = values["hidden_size"] + 2 * values["num_kv_heads"] * head_dim
    if multiple >= SEQ_LENGTH_MULTIPLE["mxfp8"] and qkv_rows % multiple:
        raise ContractError(
            "num_kv_heads",
            f"hidden_size + 2 x num_kv_heads x head_dim (the fused QKV projection's rows) must be a multiple of "
            f"{multiple} for {why}; got {qkv_rows} with num_kv_heads={values['num_kv_heads']}",
        )


def normalize_name(name: str) -> str:
    """``num-layers`` / ``--num-layers`` / ``NUM_LAYERS`` -> ``num_layers``."""
    return name.lstrip("-").replace("-", "_").lower()


def parse_hyperparameters(
    raw: Mapping[str, Any],
    architecture: Mapping[str, Any] | None = None,
    *,
    sm: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Parse and cross-check raw settings (names in either spelling); return every setting with defaults filled.

    Raises ContractError naming the first bad field. Model dims come from ``model_preset`` unless set explicitly;
    with ``model_preset=custom`` all five dims must be given. ``architecture``: the settings an ``init_from``
    model's config.json gives (``training.request.hf_config.architecture``); they replace the preset's, and an
    explicit setting (or preset) that contradicts them is refused, naming it and the folder's value. ``sm``: the
    compute capability of the GPU the run will have (the request check knows it from the instance type), for the
    rules that depend on it (``check_dims``).
    """
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = normalize_name(key)
        spec = HYPERPARAMETERS_BY_NAME.get(name)
        if spec is None:
            raise ContractError(name, f"unknown setting; allowed: {', '.join(HYPERPARAMETERS_BY_NAME)}")
        values[name] = spec.parse(value)
    if architecture is not None:
        _take_architecture(values, architecture)
    preset = values.get("model_preset") or HYPERPARAMETERS_BY_NAME["model_preset"].default
    _fill_preset_settings(values, preset)
    for spec in HYPERPARAMETERS:
        if values.get(spec.name) is None:
            values[spec.name] = spec.default
    for dim in MODEL_DIM_NAMES:
        if values[dim] is None:
            if preset == "custom":
                raise ContractError(dim, "must be set when model_preset=custom")
            values[dim] = getattr(MODEL_PRESETS[preset], dim)
    shaped = MODEL_PRESETS.get(preset)
    if values["num_kv_heads"] is None:
        values["num_kv_heads"] = (shaped and shaped.num_kv_heads) or values["num_heads"]
    if values["tie_embeddings"] is None:
        values["tie_embeddings"] = bool(shaped and shaped.tie_embeddings)
    if values["lora_alpha"] is None and values["lora_rank"]:
        values["lora_alpha"] = 2.0 * values["lora_rank"]  # the documented default: 2 x rank
    check_consistency(values, sm)
    return values


def override_settings(
    values: Mapping[str, Any], overrides: Mapping[str, Any], *, sm: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Parsed settings ``values`` (``parse_hyperparameters``' result) with ``overrides`` set (each parsed by its own
    setting) and the cross-setting rules checked again: what ``parse_hyperparameters`` gives for the same raw
    settings with the overrides, when none of them is a model-shape setting (a tuning candidate). Raises
    ContractError naming the first bad field."""
    out = dict(values)
    for key, value in overrides.items():
        name = normalize_name(key)
        spec = HYPERPARAMETERS_BY_NAME.get(name)
        if spec is None:
            raise ContractError(name, f"unknown setting; allowed: {', '.join(HYPERPARAMETERS_BY_NAME)}")
        out[name] = spec.parse(value)
    check_consistency(out, sm)
    return out


ARCHITECTURE_NAMES: tuple[str, ...] = (*MODEL_DIM_NAMES, "num_kv_heads", "tie_embeddings")
"""Every setting of the model's shape (the fields of ``ModelShape``)."""
ROPE_NAMES: tuple[str, ...] = ("position_encoding", "rope_theta", "rope_scaling", *LLAMA3_ROPE_SETTINGS)
"""Every setting of the position encoding."""


def model_shape(values: Mapping[str, Any]) -> ModelShape:
    """The ``ModelShape`` of parsed settings (``parse_hyperparameters``' result, or a saved run's config; a config
    saved before grouped-query attention and tying existed has neither)."""
    shape = {name: values[name] for name in MODEL_DIM_NAMES}
    return ModelShape(
        **{name: int(value) for name, value in shape.items()},
        num_kv_heads=int(values.get("num_kv_heads") or values["num_heads"]),
        tie_embeddings=bool(values.get("tie_embeddings") or False),
    )


def _fill_preset_settings(values: dict[str, Any], preset: str) -> None:
    """The preset's other settings (``PRESET_SETTINGS``) where the request leaves them out; its llama3 RoPE
    parameters only while ``rope_scaling`` is the preset's."""
    settings = PRESET_SETTINGS.get(preset, {})
    own_scaling = values.get("rope_scaling") in (None, settings.get("rope_scaling"))
    for name, value in settings.items():
        if values.get(name) is None and (own_scaling or name not in LLAMA3_ROPE_SETTINGS):
            values[name] = value


def _take_architecture(values: dict[str, Any], architecture: Mapping[str, Any]) -> None:
    """Set ``architecture``'s settings into ``values``, refusing an explicit setting or preset that differs."""
    for name, value in architecture.items():
        given = values.get(name)
        if given is not None and given != value:
            wanted = "left out" if value is None else f"{_fmt_value(value)} or left out"
            raise ContractError(
                name,
                f"must be {wanted}: the init_from model's config.json has {name}={_fmt_value(value)}; got "
                f"{_fmt_value(given)}",
            )
    preset = values.get("model_preset")
    matching = [name for name in MODEL_PRESETS if _preset_settings(name) == _preset_view(architecture, name)]
    if preset not in (None, "custom") and preset not in matching:
        shape = ", ".join(f"{n}={_fmt_value(architecture[n])}" for n in ARCHITECTURE_NAMES)
        raise ContractError(
            "model_preset",
            f"{preset} is not the init_from model (its config.json: {shape}); leave model_preset out or use "
            f"{matching[0] if matching else 'custom'}",
        )
    values.update(architecture)
    values["model_preset"] = preset or (matching[0] if matching else "custom")


def _preset_settings(preset: str) -> dict[str, Any]:
    """A preset's architecture and RoPE settings, as an ``init_from`` architecture would give them."""
    shape = MODEL_PRESETS[preset]
    settings: dict[str, Any] = {name: getattr(shape, name) for name in ARCHITECTURE_NAMES}
    settings["num_kv_heads"] = shape.kv_heads
    rope = {"rope_theta": HYPERPARAMETERS_BY_NAME["rope_theta"].default, "rope_scaling": "none"}
    return {**settings, **rope, "rms_norm_eps": NORM_EPS, **PRESET_SETTINGS.get(preset, {})}


def _preset_view(architecture: Mapping[str, Any], preset: str) -> dict[str, Any]:
    return {name: architecture.get(name) for name in _preset_settings(preset)}


def _fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def check_consistency(values: Mapping[str, Any], sm: tuple[int, int] | None = None) -> None:
    """Cross-field rules that no single field can express (``sm``: the run's GPU, when known)."""
    precision = values["precision"]
    if values["hidden_size"] % values["num_heads"]:
        raise ContractError(
            "num_heads", f"must divide hidden_size ({values['hidden_size']}); got {values['num_heads']}"
        )
    head_dim = values["hidden_size"] // values["num_heads"]
    if head_dim % 8:
        raise ContractError("num_heads", f"hidden_size / num_heads must be a multiple of 8; got {head_dim}")
    if values["num_heads"] % values["num_kv_heads"]:
        raise ContractError(
            "num_kv_heads", f"must divide num_heads ({values['num_heads']}); got {values['num_kv_heads']}"
        )
    check_dims(values, sm)
    check_fp8_recipe(values, sm)
    if values["quantized_model_init"] and precision not in QUANTIZED_INIT_PRECISIONS:
        raise ContractError(
            "quantized_model_init",
            f"works only with precision {' or '.join(sorted(QUANTIZED_INIT_PRECISIONS))}; got precision={precision}",
        )
    _check_rope_scaling(values)
    check_levers(values)
    check_lora(values)


def check_fp8_recipe(values: Mapping[str, Any], sm: tuple[int, int] | None) -> None:
    """``precision=fp8`` with ``fp8_recipe=mxfp8`` runs TE's ``MXFP8BlockScaling``, which needs a data-centre
    Blackwell GPU (SM 10.x), as ``precision=mxfp8`` does (``precision_supported_on``); refused on a GPU of another
    ``sm`` (None: the GPU is not known, nothing to check)."""
    if sm is None or values["precision"] != "fp8" or values["fp8_recipe"] != "mxfp8":
        return
    if not precision_supported_on("mxfp8", sm):
        raise ContractError(
            "fp8_recipe",
            f"mxfp8 (TE MXFP8BlockScaling) needs a data-centre Blackwell GPU (SM 10.x), and this run's GPUs are SM "
            f"{sm[0]}.{sm[1]}: use auto (current scaling there), current or delayed; got mxfp8 with precision=fp8",
        )


def _check_rope_scaling(values: Mapping[str, Any]) -> None:
    """``rope_scaling=llama3`` needs RoPE and its four parameters (high above low); ``none`` takes none of them."""
    if values["rope_scaling"] == "none":
        for name in LLAMA3_ROPE_SETTINGS:
            if values.get(name) is not None:
                raise ContractError(
                    name, f"only with rope_scaling=llama3; got {values[name]!r} with rope_scaling=none"
                )
        return
    if values["position_encoding"] != "rope":
        raise ContractError(
            "rope_scaling",
            f"{values['rope_scaling']} needs position_encoding=rope; got {values['position_encoding']}",
        )
    for name in LLAMA3_ROPE_SETTINGS:
        if values.get(name) is None:
            raise ContractError(name, f"must be set when rope_scaling={values['rope_scaling']}")
    if values["rope_high_freq_factor"] <= values["rope_low_freq_factor"]:
        raise ContractError(
            "rope_high_freq_factor",
            f"must be above rope_low_freq_factor ({values['rope_low_freq_factor']:g}); got "
            f"{values['rope_high_freq_factor']:g}",
        )


def check_levers(values: Mapping[str, Any]) -> None:
    """The speed levers' cross-field rules (``LEVERS``): combinations that cannot run are refused by name."""
    precision = values["precision"]
    if values["quantized_model_init"] and not values["master_weights"]:
        raise ContractError(
            "master_weights",
            "must be true with quantized_model_init: FP8 primary weights without fp32 master weights round "
            "small updates away (the trainer's AdamW keeps fp32 masters); set master_weights true or "
            "quantized_model_init false",
        )
    if precision in TE_PRECISIONS and values["compile"] == "true":
        raise ContractError(
            "compile",
            f"true cannot compile precision={precision}: Transformer Engine 2.11's layers run eagerly "
            "(torch.compile breaks its graph at every TE module); use compile auto or false",
        )
    if precision in TE_PRECISIONS and values["activation_checkpointing"] == "selective":
        raise ContractError(
            "activation_checkpointing",
            f"selective cannot run with precision={precision}: Transformer Engine's GEMMs are not ATen ops an "
            "op-level policy can save, and only te.distributed.checkpoint keeps its FP8 scaling state across a "
            "recompute; use full (optionally with activation_checkpointing_interval)",
        )
    if precision in TE_PRECISIONS and values["attention_backend"] != "auto":
        raise ContractError(
            "attention_backend",
            f"must be auto with precision={precision}: Transformer Engine chooses its own attention kernel "
            f"(logged at start); got {values['attention_backend']}",
        )
    if precision == "nvfp4" and 2 * values["nvfp4_bf16_blocks"] >= values["num_layers"]:
        raise ContractError(
            "nvfp4_bf16_blocks",
            f"must leave a block in nvfp4: 2 x {values['nvfp4_bf16_blocks']} first and last blocks is not "
            f"below num_layers {values['num_layers']}",
        )
    if values["activation_checkpointing_interval"] > values["num_layers"]:
        raise ContractError(
            "activation_checkpointing_interval",
            f"must be at most num_layers ({values['num_layers']}); got {values['activation_checkpointing_interval']}",
        )


LORA_SETTINGS: tuple[str, ...] = ("lora_alpha", "lora_dropout", "lora_targets")
"""The LoRA settings that only ``lora_rank`` > 0 uses."""


def check_lora(values: Mapping[str, Any]) -> None:
    """LoRA's cross-field rules: adapters wrap the torch path's linear layers (``training/trainer/lora.py``), so
    no Transformer Engine precision and no quantized primary weights; ``lora_targets`` names Llama projections;
    the other LoRA settings only with ``lora_rank`` > 0."""
    if not values.get("lora_rank"):
        for name in LORA_SETTINGS:
            default = HYPERPARAMETERS_BY_NAME[name].default
            if values.get(name) is not None and values[name] != default:
                raise ContractError(
                    name, f"only with lora_rank > 0 (LoRA); got {values[name]!r} with lora_rank=0"
                )
        return
    lora_target_modules(values["lora_targets"])
    if values["quantized_model_init"]:
        raise ContractError(
            "quantized_model_init",
            f"must be false with LoRA (lora_rank={values['lora_rank']}): the adapters wrap the torch path's "
            "linear layers, whose frozen base weights are not quantized",
        )
    precision = values["precision"]
    if precision in TE_PRECISIONS:
        raise ContractError(
            "precision",
            f"{precision} cannot train LoRA adapters (lora_rank={values['lora_rank']}): the adapters wrap the "
            "torch path's linear layers, not Transformer Engine's; use precision bf16 (or fp16, fp32)",
        )


def to_sagemaker_hyperparameters(values: Mapping[str, Any]) -> dict[str, str]:
    """Render settings as SageMaker ``HyperParameters`` (string to string), with the contract's names."""
    out: dict[str, str] = {}
    for key, value in values.items():
        name = normalize_name(key)
        if name not in HYPERPARAMETERS_BY_NAME:
            raise ContractError(name, f"unknown setting; allowed: {', '.join(HYPERPARAMETERS_BY_NAME)}")
        out[name] = format_setting(value)
    return out


# --------------------------------------------------------------------------------------------------------------
# Tuning jobs: one SageMaker job that runs many short trials of the trainer (training/tune/)
# --------------------------------------------------------------------------------------------------------------

GRAD_ACCUM_SETTING = "grad_accum_steps"
"""The lever that keeps a candidate's tokens per optimizer step those of the request it tunes, whatever its
micro-batch (``training.request.tuning``)."""

TUNABLE_SETTINGS: tuple[str, ...] = (
    "batch_size",
    "activation_checkpointing",
    "precision",
    "seq_length",
    "loss_chunk_tokens",
    "fp8_recipe",
    "quantized_model_init",
    *(lever.name for lever in LEVERS if lever.name != GRAD_ACCUM_SETTING),
)
"""Trainer settings a tuning run's search space may vary (every speed lever but the accumulation, which each
candidate sets to keep the request's tokens per optimizer step); every other setting is the base request's."""

TUNE_TRIALS = "tune_trials"
"""The hyperparameter that makes ``train.sh`` run the tuning driver (``python -m training.tune``) instead of one
training run: the ordered trial list, :func:`format_trials`."""
TUNE_REPORT_FOLDER = "tune"
"""The tuning report's folder in the job's checkpoint folder (``<checkpoint_dir>/tune/``; SageMaker uploads it to
the execution's checkpoint prefix), where the workflow reads :data:`TUNE_WINNER_FILE` and copies
:data:`TUNE_RECORDS_FILE` to the measurements the request check reads."""
TUNE_WINNER_FILE = "winner.json"
TUNE_RECORDS_FILE = "measurements.json"
TUNE_REPORT_FILE = "report.json"
"""The whole report (every row, where it was measured, convergence): what ``blackwell-training result`` reads."""
TUNE_REQUEST_FILE = "winning_request.json"
TRIAL_PROBE = "probe"
"""``probe=true`` in a trial: the plan predicts it does not fit (just past the memory edge); it is run to test that
edge, and never chosen as the winner unless it ran ``ok``."""

TUNE_HYPERPARAMETERS: tuple[Hyperparameter, ...] = (
    Hyperparameter(TUNE_TRIALS, "str", None, "The ordered trials: settings=values, separated by ';'."),
    Hyperparameter("tune_warmup_steps", "int", 3, "Steps of each trial left out of its timing.", 1, 1000),
    Hyperparameter(
        "tune_max_measured_steps", "int", 30, "Timed steps of a trial at most (the cap).", 3, 100_000
    ),
    Hyperparameter(
        "tune_window_steps", "int", 8, "Timed steps whose variation decides that a trial is stable.", 3, 1000
    ),
    Hyperparameter(
        "tune_cv_target",
        "float",
        0.02,
        "A trial stops once the coefficient of variation of its last window of step times is below this (0: "
        "never early; run to the cap).",
        0.0,
        1.0,
    ),
    Hyperparameter(
        "tune_trial_timeout_seconds",
        "int",
        900,
        "Hard limit of one trial (start-up included); its whole process group is killed after it.",
        5,
        86_400,
    ),
    Hyperparameter(
        "tune_deadline_seconds",
        "int",
        None,
        "Seconds after the driver starts by which every trial must have ended (a trial whose timeout would pass "
        "it is not started): the job's time budget less the time to write the report.",
        1,
        28 * 86_400,
    ),
    Hyperparameter("tune_instance_type", "str", None, "The instance type the trials run on (for costs)."),
    Hyperparameter("tune_image_uri", "str", None, "The training image (its tag keys the measurements)."),
    Hyperparameter(
        "tune_convergence_precisions",
        "str",
        "",
        "Precisions (comma-separated) whose loss curves are compared with the reference's on the winner.",
    ),
    Hyperparameter(
        "tune_convergence_reference",
        "choice",
        "bf16",
        "The precision the others' loss curves are compared with.",
        choices=PRECISIONS,
    ),
    Hyperparameter("tune_convergence_steps", "int", 200, "Steps of each convergence run.", 10, 1_000_000),
    Hyperparameter(
        "tune_convergence_timeout_seconds",
        "int",
        3600,
        "Hard limit of one convergence run.",
        5,
        28 * 86_400,
    ),
    Hyperparameter(
        "tune_trial_memory_limit_gb",
        "float",
        None,
        "Address-space limit of every process of a trial (RLIMIT_AS): a host-memory guard for CPU runs and "
        "tests; leave it unset on GPUs (CUDA maps far more address space than it uses).",
        0.1,
        1e6,
    ),
)
TUNE_HYPERPARAMETERS_BY_NAME: Mapping[str, Hyperparameter] = {hp.name: hp for hp in TUNE_HYPERPARAMETERS}


def trial_settings() -> tuple[str, ...]:
    """The settings a trial may set: the tunable ones, and the accumulation that keeps tokens per step."""
    return (*TUNABLE_SETTINGS, GRAD_ACCUM_SETTING)


def format_setting(value: Any) -> str:
    """A setting's value as a hyperparameter or command-line value (``true``/``false`` for booleans)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def format_trials(trials: Sequence[Mapping[str, Any]]) -> str:
    """``batch_size=4,activation_checkpointing=true;batch_size=8,...``: text that SageMaker's toolkit passes to
    ``train.sh`` unchanged (a JSON list would arrive as a Python repr: the toolkit JSON-decodes every value)."""
    return ";".join(",".join(f"{k}={format_setting(v)}" for k, v in trial.items()) for trial in trials)


def parse_trials(text: str) -> list[dict[str, Any]]:
    """The trials of :func:`format_trials`' text, each value parsed by its setting's rules (``probe`` a bool)."""
    trials: list[dict[str, Any]] = []
    allowed = trial_settings()
    for number, part in enumerate(text.split(";"), start=1):
        trial: dict[str, Any] = {}
        for item in filter(None, part.split(",")):
            key, sep, value = item.partition("=")
            name = normalize_name(key)
            if not sep or (name not in allowed and name != TRIAL_PROBE):
                raise ContractError(
                    TUNE_TRIALS,
                    f"trial {number}: {item!r} is not setting=value of one of {', '.join((*allowed, TRIAL_PROBE))}",
                )
            if name == TRIAL_PROBE:
                trial[name] = _parse_bool(value)
            else:
                trial[name] = HYPERPARAMETERS_BY_NAME[name].parse(value)
        if not trial:
            raise ContractError(TUNE_TRIALS, f"trial {number} is empty")
        trials.append(trial)
    return trials


MEASUREMENT_KEY_SETTINGS: tuple[str, ...] = (
    *ARCHITECTURE_NAMES,
    "position_encoding",
    "precision",
    "fp8_recipe",
    "quantized_model_init",
    "activation_checkpointing",
    "batch_size",
    "seq_length",
    "loss_chunk_tokens",
    *(lever.name for lever in LEVERS),
    "lora_rank",
    "lora_targets",
    "lora_dropout",
)
"""The trainer settings that change a measured throughput or peak memory (the model's shape, the precision, the
micro-batch and sequence, activation checkpointing, the chunked loss and every speed lever, accumulation
included): with the instance type and count, the image tag and its torch and Transformer Engine versions they key a
measurement (``training.request.measured``)."""


def measurement_key_settings() -> tuple[str, ...]:
    return MEASUREMENT_KEY_SETTINGS


def image_tag(image_uri: str) -> str:
    """The tag (or ``sha256:`` digest) of an image URI ``registry/repo:tag`` / ``registry/repo@sha256:...``; the
    project tags its image with the content hash of ``training/``, so a tag names one image."""
    if "@" in image_uri:
        return image_uri.rsplit("@", 1)[1]
    last = image_uri.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else "latest"


# --------------------------------------------------------------------------------------------------------------
# Metric lines (printed by rank 0) and the regexes SageMaker reads them with
# --------------------------------------------------------------------------------------------------------------

STEP_METRICS: tuple[str, ...] = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_sec",
    "tflops_per_gpu",
    "mfu",
    "mfu_bf16",
    "peak_mem_gb",
    "step_time",
    "trained_tokens",
    "padding",
)
"""Fields of a ``step=N ...`` line, in print order. Throughput fields exclude the warm-up steps. ``mfu`` is against
the peak of the run's own precision (``PEAK_TFLOPS``); ``mfu_bf16``, printed for the low precisions
(``TE_PRECISIONS``: fp8, mxfp8, nvfp4), is the same TFLOP/s against the GPU's bf16 peak: the bf16-equivalent MFU,
comparable with a bf16 run's ``mfu``. ``trained_tokens``: the targets the last step's loss counted, over every rank
and micro-batch (conversation data trains only the assistant's tokens); ``padding``: the share of that step's
window positions that hold padding (0 for token streams; with packing, what is left at the end of each window)."""

SUMMARY_METRICS: tuple[str, ...] = (
    "steps",
    "final_loss",
    "tokens_per_sec",
    "tflops_per_gpu",
    "mfu",
    "mfu_bf16",
    "peak_mem_gb",
    "max_allocated_gb",
    "max_reserved_gb",
    "alloc_retries",
    "alloc_ooms",
    "train_seconds",
    "val_loss",
    "unusable_checkpoints",
    "val_accuracy",
    "empty_micro_batches",
)
"""Fields of the final ``summary ...`` line (``mfu_bf16`` as in ``STEP_METRICS``; ``val_loss`` and ``val_accuracy``
(the share of counted validation targets the model's argmax predicts) only when the data has a validation split;
``empty_micro_batches`` only when some micro-batch had no target to count (every one ignored): it contributed
nothing to its step;
``unusable_checkpoints`` only when checkpoints were found and none was usable, so the run restarted from step 0:
the line then ends ``restarted_from: none (N checkpoints unusable)``). ``peak_mem_gb`` is rank 0's; the
:data:`MEMORY_SUMMARY_METRICS` are over every rank."""

MEMORY_SUMMARY_METRICS: tuple[str, ...] = (
    "max_allocated_gb",
    "max_reserved_gb",
    "alloc_retries",
    "alloc_ooms",
)
"""Memory over every rank, in the summary line (``training.trainer.metrics.memory_over_ranks``):
``max_allocated_gb`` the largest peak of any rank (CUDA: ``max_memory_allocated``; CPU: the peak resident set
size); on CUDA only, ``max_reserved_gb`` the largest peak the caching allocator reserved, ``alloc_retries`` the
allocator's retries after a failed ``cudaMalloc`` (it freed its cache and tried again: a sign of near-OOM) and
``alloc_ooms`` the allocations that failed even then, summed over ranks (``torch.cuda.memory_stats``'s
``num_alloc_retries`` and ``num_ooms``)."""

VALIDATION_METRICS: tuple[str, ...] = ("val_loss", "val_accuracy")
"""Fields of a ``validation step=N/M val_loss=... val_accuracy=...`` line (every ``validation_interval`` steps and
at the end): the mean loss over every counted target of the held-out split, and the token accuracy (the share of
those targets the logits' argmax predicts)."""

_NUMBER = r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)"


def format_step_line(
    step: int,
    metrics: Mapping[str, float],
    max_steps: int | None = None,
    elapsed: float | None = None,
    eta: float | None = None,
) -> str:
    """``step=10/100 10.0% elapsed=0:00:05 eta=0:00:45 loss=2.3456 lr=... step_time=0.5321``; metric fields in
    STEP_METRICS order, absent ones left out; the progress part only when ``max_steps`` is given."""
    head = [f"step={step}"]
    if max_steps:
        head = [f"step={step}/{max_steps}", f"{100 * step / max_steps:.1f}%"]
        if elapsed is not None:
            head.append(f"elapsed={format_duration(elapsed)}")
        if eta is not None:
            head.append(f"eta={format_duration(eta)}")
    return " ".join([*head, *(f"{k}={_fmt_metric(metrics[k])}" for k in STEP_METRICS if k in metrics)])


def format_validation_line(
    step: int, max_steps: int, val_loss: float, val_accuracy: float | None = None
) -> str:
    """``validation step=10/100 val_loss=2.3456 val_accuracy=0.5123`` (``val_accuracy`` when given)."""
    line = f"validation step={step}/{max_steps} val_loss={_fmt_metric(val_loss)}"
    return line if val_accuracy is None else f"{line} val_accuracy={_fmt_metric(val_accuracy)}"


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (hours grow past 24)."""
    minutes, secs = divmod(int(round(max(0.0, seconds))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def format_summary_line(metrics: Mapping[str, float]) -> str:
    """``summary steps=... final_loss=...``; with ``unusable_checkpoints`` (N) it ends
    ``unusable_checkpoints=N restarted_from: none (N checkpoints unusable)``."""
    parts = ["summary", *(f"{k}={_fmt_metric(metrics[k])}" for k in SUMMARY_METRICS if k in metrics)]
    if "unusable_checkpoints" in metrics:
        parts.append(f"restarted_from: {restarted_from_none(int(metrics['unusable_checkpoints']))}")
    return " ".join(parts)


def restarted_from_none(unusable: int) -> str:
    """Where a run that found only unusable checkpoints started from: ``none (N checkpoints unusable)`` (its
    summary line says ``restarted_from: ...``, the operator CLI's ``result`` shows it)."""
    return f"none ({unusable} checkpoint{'' if unusable == 1 else 's'} unusable)"


def format_config_line(settings: Mapping[str, Any]) -> str:
    """``config key=value ...`` with every setting that took effect, sorted by key."""
    return " ".join(["config", *(f"{k}={_fmt_config(settings[k])}" for k in sorted(settings))])


def _fmt_metric(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.6g}"


def _fmt_config(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace(" ", "_")


@dataclass(frozen=True)
class MetricDefinition:
    name: str
    regex: str

    def as_sagemaker(self) -> dict[str, str]:
        return {"Name": self.name, "Regex": self.regex}


def metric_definitions() -> tuple[MetricDefinition, ...]:
    """SageMaker ``MetricDefinitions`` matching the trainer's lines: ``train:<field>`` for each step-line field,
    ``val_loss`` for each validation line (the word-boundary ``loss=`` never matches inside ``val_loss=``), ``final:<field>`` for
    each summary field (at most 40 in all, regexes at most 500 chars)."""
    defs = [MetricDefinition(f"train:{k}", rf"\bstep=[0-9]+\S* .*?\b{k}={_NUMBER}") for k in STEP_METRICS]
    defs += [
        MetricDefinition(k, rf"\bvalidation step=[0-9]+\S* .*?\b{k}={_NUMBER}") for k in VALIDATION_METRICS
    ]
    defs += [
        MetricDefinition(f"final:{k}", rf"\bsummary .*?\b{k}={_NUMBER}")
        for k in SUMMARY_METRICS
        if k != "steps"
    ]
    return tuple(defs)


TRAINING_METRICS_NAMESPACE = "/aws/sagemaker/TrainingJobs"
"""Where SageMaker publishes the ``MetricDefinitions`` metrics (dimension ``TrainingJobName``) and the per-host
instance metrics (dimension ``Host`` = ``<job>/algo-<n>``)."""
TRAINING_JOB_DIMENSION = "TrainingJobName"
HOST_DIMENSION = "Host"
HOST_GPU_METRICS: tuple[str, ...] = ("GPUUtilization", "GPUMemoryUtilization")
"""Per-host GPU metrics SageMaker publishes every minute: percent summed over the host's GPUs (0-800 on 8 GPUs)."""


def metric_name(field: str, kind: str = "train") -> str:
    """The CloudWatch name of a trainer metric: ``kind`` ``train`` (step lines), ``validation`` or ``final``
    (summary line), e.g. ``train:loss``, ``val_loss``, ``final:mfu``; a ValueError for a name that
    ``metric_definitions`` does not define (so a renamed metric fails wherever it is used)."""
    name = {"train": f"train:{field}", "validation": field, "final": f"final:{field}"}.get(kind)
    defined = {definition.name for definition in metric_definitions()}
    if name not in defined:
        raise ValueError(
            f"no metric definition for {kind} field {field!r}; defined: {', '.join(sorted(defined))}"
        )
    return name


def parse_metric_line(line: str) -> dict[str, float]:
    """Extract every metric SageMaker would see in ``line`` (by running the same regexes), keyed by metric name."""
    found: dict[str, float] = {}
    for definition in metric_definitions():
        match = re.search(definition.regex, line)
        if match:
            found[definition.name] = float(match.group(1))
    return found


_STEP_LINE = re.compile(r"(?<!validation )\bstep=([0-9]+)(?:/[0-9]+ [0-9.]+%)?((?: [a-z0-9_]+=\S+)*)")
_SUMMARY_LINE = re.compile(r"\bsummary((?: [a-z0-9_]+=\S+)+)")
_CONFIG_LINE = re.compile(r"^(?:.*?[:\]] )?config((?: [a-z0-9_]+=\S*)+)\s*$")


def _fields(text: str, names: tuple[str, ...]) -> dict[str, float]:
    found: dict[str, float] = {}
    for item in text.split():
        key, _, value = item.partition("=")
        if key in names:
            try:
                found[key] = float(value)
            except ValueError:
                continue
    return found


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {field: value})`` of a line made by :func:`format_step_line` (anywhere in ``line``, so a
    launcher's prefix such as ``[rank0]:`` is fine); None for any other line."""
    match = _STEP_LINE.search(line)
    if not match:
        return None
    return int(match.group(1)), _fields(match.group(2), STEP_METRICS)


_VALIDATION_LINE = re.compile(r"\bvalidation step=([0-9]+)(?:/[0-9]+)?((?: [a-z_]+=\S+)+)")


def parse_validation_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {"val_loss": ...})`` of a line made by :func:`format_validation_line`; None for any other line."""
    match = _VALIDATION_LINE.search(line)
    if not match:
        return None
    return int(match.group(1)), _fields(match.group(2), VALIDATION_METRICS)


def parse_summary_line(line: str) -> dict[str, float] | None:
    """The fields of a line made by :func:`format_summary_line`; None for any other line."""
    match = _SUMMARY_LINE.search(line)
    return _fields(match.group(1), SUMMARY_METRICS) if match else None


def parse_config_line(line: str) -> dict[str, str] | None:
    """The settings of a line made by :func:`format_config_line` (values as printed); None for any other line."""
    match = _CONFIG_LINE.match(line.strip())
    if not match:
        return None
    return dict(item.partition("=")[::2] for item in match.group(1).split())


# --------------------------------------------------------------------------------------------------------------
# Evaluation: lm-evaluation-harness on a finished run's Hugging Face export (training/evaluate/), in the same image
# --------------------------------------------------------------------------------------------------------------

PROGRAM_ENV = "SAGEMAKER_PROGRAM"
"""The variable that names the job's program to the SageMaker toolkit; a job's ``Environment`` overrides the
image's own (``ENTRY_POINT``), which is how one image runs both kinds of job."""
EVALUATE_ENTRY_POINT = "evaluate.sh"
"""The evaluation job's program (``training/evaluate.sh``): ``python -m training.evaluate`` with its settings."""
MODEL_CHANNEL = "model"
"""Read-only channel of an evaluation job: the evaluated training job's ``model.tar.gz`` (its ``hf/`` folder)."""
EVALUATION_INSTANCE_TYPE = "ml.p5.4xlarge"
"""The evaluation job's instance type when the request names none, no training plan holds the capacity and the
model's exported weights fit one GPU: one H100 (80 GB). lm-eval scores one model replica, on one GPU unless its
weights do not fit there (``training.evaluate.harness``), so the other GPUs of an 8-GPU training instance would sit
idle; this is the one single-GPU type of ``GPU_INSTANCE_TYPES`` (botocore's ``TrainingInstanceType`` also lists
single-GPU ``ml.g6e``/``ml.g7e`` sizes, which the workflow does not allow), at 6.88 USD an hour against 113.93 for
``ml.p6-b200.48xlarge`` (``ON_DEMAND_USD_PER_HOUR``). It holds the bf16 export of every preset up to 14b
(``evaluation_fits``); the 32b, 64b and 70b presets are evaluated on the training's instance type."""
EVALUATION_WEIGHTS_SHARE = 0.8
"""The share of GPU memory an evaluated model's weights may take: above it of one GPU, the harness spreads the
model over all the instance's GPUs; above it of all of them, the request check refuses the instance type (the rest
holds lm-eval's batch: activations and the log-probabilities over the vocabulary)."""


def export_weight_bytes(parameters: int, precision: str) -> int:
    """Bytes of a run's exported weights (``training.trainer.export_hf``): float32 for fp32 runs, else bfloat16."""
    return parameters * (4 if precision == "fp32" else 2)


def evaluation_fits(instance_type: str, weight_bytes: int, *, one_gpu: bool = False) -> bool:
    """Whether weights of ``weight_bytes`` fit ``instance_type`` for an evaluation: within
    ``EVALUATION_WEIGHTS_SHARE`` of one GPU's memory (``one_gpu``) or of all its GPUs' together."""
    gpu = GPU_INSTANCE_TYPES[instance_type]
    memory = gpu.gpu_memory_gb * 1e9 * (1 if one_gpu else gpu.gpus)
    return weight_bytes <= EVALUATION_WEIGHTS_SHARE * memory


TASKS_CHANNEL = "tasks"
"""Read-only channel of an evaluation job: the task folder (lm-eval task YAML files and their local data)."""
STANDARD_TASK_CHANCE: Mapping[str, float] = {
    "hellaswag": 0.25,
    "arc_easy": 0.25,
    "piqa": 0.5,
    "winogrande": 0.5,
}
"""The standard small-model set (``python -m training.evaluate.prepare_tasks``) and each task's accuracy by chance:
one over the number of choices (4 endings; ARC-Easy's 4 options on almost every question; 2 solutions; 2
options). Zero-shot log-likelihood (rank) classification, as lm-eval and OLMo-core's small-model groups score it."""
DEFAULT_EVALUATION_TASKS: tuple[str, ...] = tuple(STANDARD_TASK_CHANCE)
EVALUATION_METRICS: tuple[str, ...] = ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")
"""Fields of an ``evaluation task=...`` line: lm-eval's accuracy, its length-normalized accuracy (by the choice's
characters) and their standard errors (a task whose YAML lists no acc_norm, such as winogrande, has none)."""
MAX_EVALUATION_TASKS = 10
"""At most this many tasks per evaluation: 4 metric definitions each, and SageMaker allows 40 per job."""
TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""A task (or group) name an evaluation may ask for: as lm-eval names its tasks, and safe in a metric name."""


def evaluation_metric_name(task: str, field: str) -> str:
    """``eval:hellaswag:acc``: the CloudWatch (and summary) name of one task's score."""
    if field not in EVALUATION_METRICS:
        raise ValueError(f"no evaluation metric {field!r}; defined: {', '.join(EVALUATION_METRICS)}")
    return f"eval:{task}:{field}"


def format_evaluation_line(task: str, scores: Mapping[str, float], samples: int | None = None) -> str:
    """``evaluation task=hellaswag acc=0.2512 acc_stderr=0.00433 ... samples=10042`` (fields in EVALUATION_METRICS
    order, absent ones left out)."""
    parts = ["evaluation", f"task={task}"]
    parts += [f"{k}={_fmt_metric(float(scores[k]))}" for k in EVALUATION_METRICS if scores.get(k) is not None]
    if samples is not None:
        parts.append(f"samples={samples}")
    return " ".join(parts)


_EVALUATION_LINE = re.compile(r"\bevaluation task=(\S+)((?: [a-z_]+=\S+)*)")


def parse_evaluation_line(line: str) -> tuple[str, dict[str, float]] | None:
    """``(task, {field: value})`` of a line made by :func:`format_evaluation_line`; None for any other line."""
    match = _EVALUATION_LINE.search(line)
    return (match.group(1), _fields(match.group(2), EVALUATION_METRICS)) if match else None


def evaluation_metric_definitions(tasks: tuple[str, ...] | list[str]) -> tuple[MetricDefinition, ...]:
    """SageMaker ``MetricDefinitions`` of an evaluation job of ``tasks``: ``eval:<task>:<field>`` read from that
    task's ``evaluation task=<task> ...`` line (the word boundary keeps ``acc=`` out of ``acc_norm=``)."""
    return tuple(
        MetricDefinition(
            evaluation_metric_name(task, field),
            rf"\bevaluation task={re.escape(task)} .*?\b{field}={_NUMBER}",
        )
        for task in tasks
        for field in EVALUATION_METRICS
    )


EVALUATION_SETTINGS: tuple[Hyperparameter, ...] = (
    Hyperparameter("tasks", "str", ",".join(DEFAULT_EVALUATION_TASKS), "Comma-separated task names."),
    Hyperparameter(
        "limit", "int", None, "Examples per task (for trying a set-up; scores need all).", 1, 10**8
    ),
    Hyperparameter(
        "batch_size",
        "int",
        32,
        "Requests per forward pass (scores can move slightly with it: lm-eval #1645).",
        1,
        4096,
    ),
    Hyperparameter(
        "dtype",
        "choice",
        "auto",
        "Weights' dtype in the evaluation (auto: as exported).",
        choices=("auto", "bfloat16", "float16", "float32"),
    ),
    Hyperparameter("seed", "int", 1234, "lm-eval's random, numpy and torch seeds.", 0, 2**31 - 1),
)
"""The evaluation job's settings (its ``HyperParameters``, the arguments of ``evaluate.sh``)."""
EVALUATION_SETTINGS_BY_NAME: Mapping[str, Hyperparameter] = {s.name: s for s in EVALUATION_SETTINGS}
