"""Command line -> validated, frozen ``TrainConfig``.

The options are generated from ``training.contract.settings_table.HYPERPARAMETERS`` (both ``--num_layers`` and ``--num-layers``
spellings, values as strings such as ``True``/``true``), so the trainer accepts exactly what the CDK side sends.
Every error names the setting and exits non-zero before any process group is started.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.contract import container, settings_parse, settings_table
from training.models import settings as model_settings
from training.models.config import ModelConfig
from training.request import hf_config
from training.trainer.refusal import refuse
from training.trainer.sagemaker_job import in_sagemaker

# Trainer-only switches (not SageMaker hyperparameters): tests and local runs use them.
TRAINER_ONLY_SETTINGS = (
    settings_table.Hyperparameter(
        "deterministic",
        "bool",
        False,
        "Use deterministic algorithms (bit-exact reruns and resumes; slower on GPU).",
    ),
    settings_table.Hyperparameter(
        "data_dir",
        "str",
        None,
        "Folder of token files for dataset=channel (default: the train channel, SM_CHANNEL_TRAIN).",
    ),
    settings_table.Hyperparameter(
        "tensorboard_dir",
        "str",
        None,
        "Write TensorBoard event files to this folder (default: the job's TensorBoard LocalPath in SageMaker "
        "when the job has a TensorBoardOutputConfig, none elsewhere).",
    ),
)

LOCAL_OUTPUT_DIR = "trainer-output"
"""Outside SageMaker, each run's checkpoints and model go under a folder of its own in this folder of the working
directory by default: ``trainer-output/<run>/checkpoints`` and ``.../model`` (:func:`run_folder`)."""
_LOCAL_DIRS = {"checkpoint_dir": "checkpoints", "model_dir": "model"}
SAME_RUN_SETTINGS = ("checkpoint_dir", "checkpoint_backend", "model_dir", "max_steps")
"""Settings whose change continues the same run (its folder): the output folders themselves, and ``max_steps``
(raising it trains on from the run's checkpoints, as docs/trainer.md says)."""


def local_defaults(
    raw: dict[str, Any], kind: str = "", salt: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``raw`` with checkpoint_dir and model_dir defaulting to the run's own folder under ``./trainer-output/``
    outside SageMaker (the contract's /opt/ml paths are the defaults inside a job). ``kind`` prefixes the folder's
    name and ``salt`` (the tuning job's own options) tells its runs apart; raises ``settings_table.ContractError`` for a
    bad setting, as :func:`config_from_mapping` does."""
    if in_sagemaker() or all(name in raw for name in _LOCAL_DIRS):
        return raw
    folder = run_folder(raw, kind, salt)
    return {**{name: f"{folder}/{sub}" for name, sub in _LOCAL_DIRS.items()}, **raw}


def run_folder(raw: Mapping[str, Any], kind: str = "", salt: Mapping[str, Any] | None = None) -> str:
    """``trainer-output/<model>-<precision>-<hash>``: one folder per run, named by what it trains, whose hash covers
    every setting that differs from its default (so a new setting in the contract renames no folder) but
    :data:`SAME_RUN_SETTINGS`. The same command again, or with another ``max_steps``, continues the run in it;
    any other change (model, data, precision, batch, schedule, ...) gets a folder of its own. Every rank of a
    ``torchrun`` derives the same name from the same settings."""
    placeholder = dict.fromkeys(_LOCAL_DIRS, ".")
    chosen = config_from_mapping({**raw, **placeholder}).as_dict()
    defaults = config_from_mapping(placeholder).as_dict()
    differing = {k: v for k, v in chosen.items() if k not in SAME_RUN_SETTINGS and v != defaults.get(k)}
    text = json.dumps([differing, dict(salt or {})], sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    if chosen["init_from"]:
        model = Path(str(chosen["init_from"]).rstrip("/")).name or "init_from"
    elif chosen["model_preset"] == "custom":
        model = f"custom-{chosen['num_layers']}x{chosen['hidden_size']}"
    else:
        model = str(chosen["model_preset"])
    name = "-".join(part for part in (kind, model, str(chosen["precision"]), digest) if part)
    return f"{LOCAL_OUTPUT_DIR}/{re.sub(r'[^A-Za-z0-9._-]', '_', name)}"


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
    """Windows per GPU per micro-batch: as given, or what ``batch_tokens`` makes on this run's GPUs."""
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
    checkpoint_backend: str = "auto"
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
    lora_targets: str = settings_table.LORA_ALL_LINEAR
    packing: bool = True
    objective: str = "auto"
    dpo_beta: float = 0.1
    dpo_loss: str = "sigmoid"
    dpo_sft_weight: float = 0.0
    dpo_reference: str = "auto"
    data_parallel_replicate: int | str = "auto"
    deterministic: bool = False
    data_dir: str | None = None
    tensorboard_dir: str | None = None
    model_config: dict[str, Any] | None = None
    """The model's ``ModelConfig.summary()`` when the flat settings do not describe it whole (another family than
    Llama, from ``init_from`` or a named size: ``training.models.settings``); None for a Llama of its settings."""
    init_from_source: str | None = None
    batch_tokens: int | None = None
    """The batch as given in tokens per optimizer step (``batch_size`` is what it made); None: ``batch_size`` given."""

    @functools.cached_property
    def shape(self) -> ModelConfig:
        """The model (``training.models.config.ModelConfig``: the family's block, its counts and shapes)."""
        return model_settings.model_config(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


SETTINGS_FILE = "settings.json"
"""Every setting a run took (the contract's, the trainer-only ones and what it ran on), as JSON in its model folder;
the ``config`` line shows the few that say what runs and this file's path."""
CONFIG_LINE_KEYS = (
    "model_preset", "init_from", "num_layers", "hidden_size", "parameters", "precision", "compute_dtype", "dataset",
    "data_dir", "seq_length", "batch_size", "grad_accum_steps", "activation_checkpointing", "max_steps",
    "learning_rate", "world_size", "device", "gpu", "checkpoint_dir",
)  # fmt: skip
"""What the ``config`` line always shows, in this order: what the run trains, how, on what and where (the settings
file is in the model folder), and what the CLI's progress and curves and the tuning driver read from it
(``max_steps``, ``batch_size``, ``grad_accum_steps``, ``seq_length``, ``world_size``, ``device``, ``gpu``). Unset
ones (``init_from``, ``data_dir``) are left out; every other setting that differs from its default follows them."""


def config_line(settings: Mapping[str, Any], settings_file: Path | None = None) -> str:
    """``config key=value ...`` (``metric_lines.parse_config_line`` reads it): :data:`CONFIG_LINE_KEYS` of
    ``settings``, then the other settings that differ from their defaults, then ``settings=`` the file with every
    one (when there is one)."""
    defaults = config_from_mapping(dict.fromkeys(_LOCAL_DIRS, ".")).as_dict()
    shown = {key: settings[key] for key in CONFIG_LINE_KEYS if settings.get(key) is not None}
    if settings.get("model_config"):  # the whole config is in the settings file; the line names its family
        shown["model_family"] = settings["model_config"]["family"]
    shown |= {
        key: value
        for key, value in sorted(settings.items())
        if key in defaults and key not in (*_LOCAL_DIRS, *shown, "model_config") and value != defaults[key]
    }
    if settings_file is not None:
        shown["settings"] = settings_file
    text = {
        k: ("true" if v else "false") if isinstance(v, bool) else str(v).replace(" ", "_")
        for k, v in shown.items()
    }
    return " ".join(["config", *(f"{key}={value}" for key, value in text.items())])


def _settings_text(settings: Mapping[str, Any]) -> str:
    return json.dumps(dict(settings), indent=2, sort_keys=True, default=str) + "\n"


def settings_file(settings: Mapping[str, Any], model_dir: str) -> Path:
    """The file that holds ``settings`` in ``model_dir``: ``settings.json``, or, when a file of that name holds
    other settings (an earlier launch's), ``settings-2.json`` (``-3``, ...); one that holds the same is the one.
    Nothing is written here (:func:`write_settings` does, once the run is to train)."""
    folder, text = Path(model_dir), _settings_text(settings)
    stem, suffix = SETTINGS_FILE.rsplit(".", 1)
    for number in range(1, 1000):
        path = folder / (SETTINGS_FILE if number == 1 else f"{stem}-{number}.{suffix}")
        if not path.exists() or path.read_text(encoding="utf-8", errors="replace") == text:
            return path
    raise RuntimeError(f"{folder}: 999 settings files already; choose another model_dir")


def write_settings(settings: Mapping[str, Any], model_dir: str) -> Path:
    """``settings`` into :func:`settings_file` unless it holds them already; never over another file. Returns it.
    The trainer writes it once the run is to train: a run already complete, or refused, writes nothing."""
    path = settings_file(settings, model_dir)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(_settings_text(settings))
    return path


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
    for spec in (*settings_table.HYPERPARAMETERS, *TRAINER_ONLY_SETTINGS):
        default = spec.default
        if default is None:
            default = "preset" if spec.name in settings_table.ARCHITECTURE_NAMES else "unset"
        elif spec.name in _LOCAL_DIRS:
            default = (
                f"{default} in SageMaker, elsewhere ./{LOCAL_OUTPUT_DIR}/<run>/{_LOCAL_DIRS[spec.name]}, a folder per "
                "run named by its settings (the same settings, any max_steps, continue it)"
            )
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


def config_from_mapping(raw: dict[str, Any], world_size: int | None = None) -> TrainConfig:
    """Validate raw settings (strings or typed values) into a TrainConfig; raises settings_table.ContractError. With
    ``init_from``, the model's shape and RoPE settings come from that folder's config.json. ``world_size``: the
    run's processes, which turn a ``batch_tokens`` into its ``batch_size`` (default: ``WORLD_SIZE``, which
    ``torchrun`` and ``train.sh``'s check set for every process; 1 alone)."""
    raw = dict(raw)
    extras = {
        spec.name: spec.parse(raw.pop(spec.name)) if spec.name in raw else spec.default
        for spec in TRAINER_ONLY_SETTINGS
    }
    world = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    values = settings_parse.parse_hyperparameters(raw, init_from_architecture(raw), world_size=world)
    check_checkpoint_place(values["checkpoint_dir"], values["checkpoint_backend"])
    return TrainConfig(**values, **extras)


S3_DIR = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/(?:[^/]+/)*$")
"""An S3 checkpoint place: ``s3://bucket/`` or ``s3://bucket/prefix/`` (a bucket's name, key segments)."""


def check_checkpoint_place(checkpoint_dir: str, backend: str) -> None:
    """``checkpoint_dir`` fits ``checkpoint_backend``: an ``s3://bucket/prefix/`` URI for ``s3`` (and for ``auto``
    when it is one), a folder for ``folder``; raises ``settings_table.ContractError`` naming the setting."""
    is_uri = checkpoint_dir.startswith(container.S3_SCHEME)
    if backend == "folder" and is_uri:
        raise settings_table.ContractError(
            "checkpoint_dir", f"checkpoint_backend=folder needs a folder, not an S3 URI; got {checkpoint_dir}"
        )
    if backend == "s3" and not is_uri:
        raise settings_table.ContractError(
            "checkpoint_dir",
            f"checkpoint_backend=s3 needs the run's S3 prefix, s3://bucket/prefix/; got {checkpoint_dir}",
        )
    if is_uri and not S3_DIR.match(checkpoint_dir.rstrip("/") + "/"):
        raise settings_table.ContractError(
            "checkpoint_dir",
            f"must be s3://bucket/prefix/ (a bucket's name, then key segments); got {checkpoint_dir}",
        )


def init_from_architecture(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The settings the ``init_from`` folder's config.json gives (None without ``init_from``)."""
    given = [value for key, value in raw.items() if settings_parse.normalize_name(key) == "init_from"]
    folder = settings_table.HYPERPARAMETERS_BY_NAME["init_from"].parse(given[0]) if given else None
    if folder is None:
        return None
    return hf_config.architecture(hf_config.read_local(folder), folder)


def parse_args(argv: Sequence[str] | None = None) -> tuple[TrainConfig, bool]:
    """Parse the command line; on a bad setting print ``error: invalid setting <field>: <why>`` (and, under
    SageMaker, write it as the job's failure reason) and exit with status 2."""
    parser = build_parser()
    namespace = vars(parser.parse_args(argv))
    check_only = namespace.pop("check_only")
    try:
        raw = local_defaults({key: value for key, value in namespace.items() if value is not None})
        return config_from_mapping(raw), check_only
    except settings_table.ContractError as err:
        raise SystemExit(refuse(f"invalid setting {err}")) from None
