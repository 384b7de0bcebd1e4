"""The names a tuning job shares between the workflow, the tuning driver (``training/tune/``) and the request
check: the settings a search may vary, the tuning job's own hyperparameters and trial list, its report's files, and
the settings that key a stored measurement. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from training.contract.hardware import PRECISIONS
from training.contract.settings_parse import format_setting, normalize_name
from training.contract.settings_table import (
    ARCHITECTURE_NAMES,
    HYPERPARAMETERS_BY_NAME,
    LEVERS,
    ContractError,
    Hyperparameter,
    _parse_bool,
)

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
measurement (``training.plan.measured``)."""


def measurement_key_settings() -> tuple[str, ...]:
    return MEASUREMENT_KEY_SETTINGS


def dpo_reference(values: Mapping[str, Any]) -> str:
    """``dpo_reference`` resolved as the trainer resolves it (``preference.losses.DpoSettings.of``): auto is
    ``adapter_off`` with LoRA adapters, ``precomputed`` without."""
    chosen = values.get("dpo_reference") or "auto"
    if chosen == "auto":
        return "adapter_off" if values.get("lora_rank") else "precomputed"
    return str(chosen)


def measured_step(values: Mapping[str, Any], objective: str | None = None) -> dict[str, str]:
    """What a measurement's key adds to :data:`MEASUREMENT_KEY_SETTINGS` to say which step was timed: nothing for
    the next-token step (the key every record had before preference tuning, so those records keep standing), and
    for a DPO step ``objective`` dpo with its resolved ``dpo_reference`` (``adapter_off`` runs the model once more
    in every micro-batch: its step is about 1.5x the next-token step's, which a plan must not apply again).
    ``objective``: the run's objective resolved from its data (``auto`` on preference pairs is dpo); default: the
    settings' own, auto counting as next_token."""
    chosen = objective or values.get("objective") or "auto"
    if chosen != "dpo":
        return {}
    return {"objective": "dpo", "dpo_reference": dpo_reference(values)}


def image_tag(image_uri: str) -> str:
    """The tag (or ``sha256:`` digest) of an image URI ``registry/repo:tag`` / ``registry/repo@sha256:...``; the
    project tags its image with the content hash of ``training/``, so a tag names one image."""
    if "@" in image_uri:
        return image_uri.rsplit("@", 1)[1]
    last = image_uri.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else "latest"
