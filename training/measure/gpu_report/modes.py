"""What the report measures, in its two modes: ``gpu`` (one H100 or H200: Llama 3.2 1B at 8K tokens) and ``smoke``
(a CPU: a tiny model, the same code path, the same files); the GPUs it knows; the phases' shares of the budget;
and the start-up times it assumes until it has measured its own.

Every figure here that is not the plan's is an assumption, said so where it is used: no GPU has run this kit when
it was written. The real run replaces the start-up and compile assumptions with what its own trials measured
(``sweep.Calibration``) before it decides what else fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training.contract import hardware, settings_parse, settings_table, shapes
from training.measure.gpu_report.budget import Share

BUDGET_SECONDS = 480.0
"""The issue's budget: 8 minutes of wall time for the whole report, every process start included."""
PLAN_INSTANCE_TYPE = "ml.p5.4xlarge"
"""The plan's one-GPU instance type (one H100): the memory plan of one GPU (world size 1). An H200 is planned as
the same one-GPU set-up against its own memory (the contract's 141 GB); both have the same published bf16 peak."""


@dataclass(frozen=True)
class Gpu:
    """A GPU the report knows: its name (``hardware.PEAK_TFLOPS`` key) and its memory (the contract's GB)."""

    name: str
    memory_gb: float

    @property
    def bf16_peak_tflops(self) -> float:
        return hardware.PEAK_TFLOPS[self.name]["bf16"]


GPUS: Mapping[str, Gpu] = {
    "H100": Gpu("H100", hardware.GPU_INSTANCE_TYPES["ml.p5.4xlarge"].gpu_memory_gb),
    "H200": Gpu("H200", hardware.GPU_INSTANCE_TYPES["ml.p5e.48xlarge"].gpu_memory_gb),
}


@dataclass(frozen=True)
class StartUp:
    """Assumed seconds (until measured) of what the plan does not count: a trial's start to its first step
    without compile (``train.sh``'s settings check, ``torchrun``, the worker's imports, NCCL, the model built and
    initialized), ``torch.compile``'s warm-up on top, a torchtitan run's start, a worker's start (Python, torch,
    CUDA context)."""

    trial: float
    compile: float
    titan: float
    worker: float


GPU_START_UP = StartUp(trial=20.0, compile=45.0, titan=25.0, worker=10.0)
"""Assumed for one H100/H200 (16 CPU cores): not measured when written; the run measures its own."""
CPU_START_UP = StartUp(trial=12.0, compile=60.0, titan=3.0, worker=6.0)
"""This project's 2-core CPU machine: a tiny model's trial took 8-24 s from start to its end, idle to loaded
(``python -m training.measure.tune_overhead``)."""


@dataclass(frozen=True)
class Mode:
    """One mode's whole configuration."""

    name: str
    model: Mapping[str, Any]
    """Trainer settings that give the swept model's shape (and its RoPE)."""
    seq_length: int
    micro_batches: tuple[int, ...]
    ac_modes: tuple[str, ...]
    compile_values: tuple[str, ...]
    attention_values: tuple[str, ...]
    warmup_steps: int
    measured_steps: int
    titan_steps: tuple[int, int]
    """torchtitan's warm-up and timed steps."""
    numerics_model: Mapping[str, Any]
    """Trainer settings of the bf16-against-fp32 runs (a model small enough for fp32 in the phase's share)."""
    numerics_steps: int
    loss_check: Mapping[str, int]
    """tokens, hidden, vocab, chunk of the chunked-against-unchunked loss check."""
    sdpa_check: Mapping[str, int]
    """batch, heads, kv_heads, seq, head_dim of the SDPA backends' check."""
    profile_steps: tuple[int, int]
    """Steps before the profiler records, and steps recorded."""
    shares: tuple[tuple[str, float, str], ...]
    """(phase, fraction of the budget, what it does)."""
    start_up: StartUp
    budget: float = BUDGET_SECONDS
    base_settings: Mapping[str, Any] = field(default_factory=dict)

    def phase_shares(self, budget: float) -> list[Share]:
        """The phases' shares in seconds of ``budget`` (the fractions sum to 1)."""
        return [Share(name, fraction * budget, what) for name, fraction, what in self.shares]

    def shape(self) -> shapes.ModelShape:
        return settings_parse.model_shape(settings_parse.parse_hyperparameters(dict(self.model)))


SHARES: tuple[tuple[str, float, str], ...] = (
    ("setup", 0.02, "find the GPU, install the carried wheels, plan the sweep"),
    ("sweep", 0.38, "our trainer through the tuning driver: one fresh process per trial"),
    ("profile", 0.10, "torch.profiler on the fastest trial's settings"),
    (
        "torchtitan",
        0.27,
        "torchtitan's own loop, same model, sequence, micro-batch, bf16; compile on, then off",
    ),
    ("numerics", 0.17, "bf16 against fp32 (the tuner's convergence rule), chunked loss, SDPA backends"),
    ("report", 0.03, "charts, tables, the JSON of every record"),
    ("reserve", 0.03, "slack for a process killed at a phase's end (its output pipe closes within seconds)"),
)

COMMON_SETTINGS: Mapping[str, Any] = {
    "precision": "bf16",
    "validation_interval": 0,
    "gc_interval": 50,
    "lr_warmup_steps": 2,
}

GPU_MODE = Mode(
    name="gpu",
    model={"model_preset": "llama3.2-1b"},
    seq_length=8192,
    micro_batches=(1, 2, 4, 8, 16),
    ac_modes=("none", "selective", "full"),
    compile_values=("true", "false"),
    attention_values=("cudnn", "flash"),
    warmup_steps=3,
    measured_steps=10,
    titan_steps=(2, 6),
    numerics_model={
        "model_preset": "custom",
        "num_layers": 2,
        "hidden_size": 2048,
        "num_heads": 32,
        "num_kv_heads": 8,
        "ffn_hidden_size": 8192,
        "vocab_size": 2048,
        "seq_length": 512,
        "batch_size": 1,
        "learning_rate": 1e-3,
        "lr_warmup_steps": 5,
        "compile": "false",
    },  # fmt: skip
    numerics_steps=60,
    loss_check={
        "tokens": 8192,
        "hidden": 2048,
        "vocab": 128_256,
        "chunk": settings_table.LOSS_CHUNK_TOKENS_DEFAULT,
    },
    sdpa_check={"batch": 1, "heads": 32, "kv_heads": 8, "seq": 4096, "head_dim": 64},
    profile_steps=(1, 2),
    shares=SHARES,
    start_up=GPU_START_UP,
    base_settings=COMMON_SETTINGS,
)

TINY = {"model_preset": "custom", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
        "ffn_hidden_size": 128, "vocab_size": 256}  # fmt: skip

SMOKE_MODE = Mode(
    name="smoke",
    model=TINY,
    seq_length=32,
    micro_batches=(1, 2),
    ac_modes=("none", "full"),
    compile_values=("false",),
    attention_values=("flash",),
    warmup_steps=2,
    measured_steps=4,
    titan_steps=(1, 2),
    numerics_model={
        **TINY,
        "seq_length": 32,
        "batch_size": 2,
        "learning_rate": 3e-3,
        "lr_warmup_steps": 5,
        "compile": "false",
    },  # fmt: skip
    numerics_steps=20,
    loss_check={"tokens": 256, "hidden": 64, "vocab": 256, "chunk": 64},
    sdpa_check={"batch": 1, "heads": 4, "kv_heads": 2, "seq": 64, "head_dim": 16},
    profile_steps=(1, 2),
    shares=SHARES,
    start_up=CPU_START_UP,
    budget=300.0,
    base_settings=COMMON_SETTINGS,
)

MODES: Mapping[str, Mode] = {"gpu": GPU_MODE, "smoke": SMOKE_MODE}
