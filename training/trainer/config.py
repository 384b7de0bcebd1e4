"""Command line -> validated, frozen ``TrainConfig``.

The options are generated from ``training.request.contract.HYPERPARAMETERS`` (both ``--num_layers`` and ``--num-layers``
spellings, values as strings such as ``True``/``true``), so the trainer accepts exactly what the CDK side sends.
Every error names the setting and exits non-zero before any process group is started.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from training.request import contract, hf_config
from training.trainer.refusal import refuse
from training.trainer.sagemaker_job import in_sagemaker

# Trainer-only switches (not SageMaker hyperparameters): tests and local runs use them.
TRAINER_ONLY_SETTINGS = (
    contract.Hyperparameter(
        "deterministic",
        "bool",
        False,
        "Use deterministic algorithms (bit-exact reruns and resumes; slower on GPU).",
    ),
    contract.Hyperparameter(
        "data_dir",
        "str",
        None,
        "Folder of token files for dataset=channel (default: the train channel, SM_CHANNEL_TRAIN).",
    ),
    contract.Hyperparameter(
        "tensorboard_dir",
        "str",
        None,
        "Write TensorBoard event files to this folder (default: the job's TensorBoard LocalPath in SageMaker "
        "when the job has a TensorBoardOutputConfig, none elsewhere).",
    ),
)

LOCAL_OUTPUT_DIR = "trainer-output"
"""Outside SageMaker, checkpoints and the model go under this folder of the working directory by default."""

_LOCAL_DIRS = {"checkpoint_dir": f"{LOCAL_OUTPUT_DIR}/checkpoints", "model_dir": f"{LOCAL_OUTPUT_DIR}/model"}


def local_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with checkpoint_dir and model_dir defaulting to ``./trainer-output/...`` outside SageMaker (the
    contract's /opt/ml paths are the defaults inside a job)."""
    if in_sagemaker():
        return raw
    return {**_LOCAL_DIRS, **raw}


@dataclass(frozen=True)
class TrainConfig:
    """Every setting that took effect: the contract's hyperparameters plus the trainer-only switches."""

    precision: str
    fp8_recipe: str
    quantized_model_init: bool
    model_preset: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int
    num_kv_heads: int
    tie_embeddings: bool
    rms_norm_eps: float
    init_from: str | None
    position_encoding: str
    rope_theta: float
    rope_scaling: str
    rope_scaling_factor: float | None
    rope_low_freq_factor: float | None
    rope_high_freq_factor: float | None
    rope_original_max_position_embeddings: int | None
    seq_length: int
    batch_size: int
    activation_checkpointing: str
    loss_chunk_tokens: int
    max_steps: int
    learning_rate: float
    lr_warmup_steps: int
    weight_decay: float
    grad_clip: float
    seed: int
    dataset: str
    token_dtype: str
    log_interval: int
    validation_interval: int
    validation_batches: int
    throughput_warmup_steps: int
    checkpoint_interval: int
    keep_checkpoints: int
    checkpoint_dir: str
    model_dir: str
    on_unusable_checkpoints: str
    activation_checkpointing_interval: int = 1
    grad_accum_steps: int = 1
    compile: str = "auto"
    attention_backend: str = "auto"
    adamw_impl: str = "auto"
    master_weights: bool = True
    nvfp4_bf16_blocks: int = 1
    gc_interval: int = 50
    async_checkpoint: bool = True
    expandable_segments: bool = True
    lora_rank: int = 0
    lora_alpha: float | None = None
    lora_dropout: float = 0.0
    lora_targets: str = contract.LORA_ALL_LINEAR
    packing: bool = True
    deterministic: bool = False
    data_dir: str | None = None
    tensorboard_dir: str | None = None

    @property
    def shape(self) -> contract.ModelShape:
        return contract.model_shape(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Parser(argparse.ArgumentParser):
    """argparse, whose command-line errors (an unknown option, a missing value) are refusals like any other: one
    ``error:`` line (not argparse's usage block), exit status 2, the SageMaker job's failure reason."""

    def error(self, message: str):  # type: ignore[override]
        raise SystemExit(refuse(f"invalid command line: {message} (see --help)"))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m training.trainer",
        description="FSDP2 decoder-only LM trainer. Every option accepts --snake_case and --kebab-case.",
    )
    for spec in (*contract.HYPERPARAMETERS, *TRAINER_ONLY_SETTINGS):
        default = spec.default
        if default is None:
            default = "preset" if spec.name in contract.ARCHITECTURE_NAMES else "unset"
        elif spec.name in _LOCAL_DIRS:
            default = f"{default} in SageMaker, ./{_LOCAL_DIRS[spec.name]} elsewhere"
        parser.add_argument(
            *spec.cli_flags,
            dest=spec.name,
            default=None,
            metavar="VALUE",
            help=f"{spec.help} Allowed: {spec.allowed()}. Default: {default}.",
        )
    parser.add_argument(
        "--check-only",
        "--check_only",
        dest="check_only",
        action="store_true",
        help="Validate the settings and the hardware for the precision, print the config line, and exit.",
    )
    return parser


def config_from_mapping(raw: dict[str, Any]) -> TrainConfig:
    """Validate raw settings (strings or typed values) into a TrainConfig; raises contract.ContractError. With
    ``init_from``, the model's shape and RoPE settings come from that folder's config.json."""
    raw = dict(raw)
    extras = {
        spec.name: spec.parse(raw.pop(spec.name)) if spec.name in raw else spec.default
        for spec in TRAINER_ONLY_SETTINGS
    }
    return TrainConfig(**contract.parse_hyperparameters(raw, init_from_architecture(raw)), **extras)


def init_from_architecture(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The settings the ``init_from`` folder's config.json gives (None without ``init_from``)."""
    given = [value for key, value in raw.items() if contract.normalize_name(key) == "init_from"]
    folder = contract.HYPERPARAMETERS_BY_NAME["init_from"].parse(given[0]) if given else None
    if folder is None:
        return None
    return hf_config.architecture(hf_config.read_local(folder), folder)


def parse_args(argv: Sequence[str] | None = None) -> tuple[TrainConfig, bool]:
    """Parse the command line; on a bad setting print ``error: invalid setting <field>: <why>`` (and, under
    SageMaker, write it as the job's failure reason) and exit with status 2."""
    parser = build_parser()
    namespace = vars(parser.parse_args(argv))
    check_only = namespace.pop("check_only")
    raw = local_defaults({key: value for key, value in namespace.items() if value is not None})
    try:
        return config_from_mapping(raw), check_only
    except contract.ContractError as err:
        raise SystemExit(refuse(f"invalid setting {err}")) from None
