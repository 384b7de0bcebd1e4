"""The tuning driver's parts: ``python -m training.tune --tune_trials "batch_size=4;batch_size=8" --<trainer setting> ...``
(``train.sh`` runs it when the job's hyperparameters have ``tune_trials``; the other ``tune_*`` ones are
``tuning.TUNE_HYPERPARAMETERS``, everything else is the base request's trainer settings).

Each trial is a fresh ``train.sh`` of :mod:`training.tune.trial` in a process group of its own
(:mod:`training.tune.runner`): the base settings with the trial's own, a short run (warm-up, then timed steps until
the step time is stable or the cap), one checkpoint save, into a scratch folder removed afterwards. A trial that
fails, runs out of memory or out of time never stops the next one. Then, optionally, the convergence runs; then
the report (table, charts, winner, winning request, measurement records, every trial's log) in
``<checkpoint_dir>/tune/`` (in a job SageMaker uploads it with the checkpoints). Exit 0 once the report is written,
with a winner or without one (``winner.json`` then names none: no trial ran ok; the workflow summarizes it so);
2 for bad settings (nothing run). SIGTERM (the job stopped) ends the current trial and
writes the report of what ran.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training.contract import container, hardware, settings_parse, settings_table, tuning
from training.trainer import config, objective, refusal, sagemaker_job
from training.trainer.checkpoint.stop import PID_DIR_ENV
from training.tune import runner, stability
from training.tune.hosts import Hosts
from training.tune.outcome import TrialResult, classify
from training.tune.report import Where

SCRATCH_ENV = "TUNE_SCRATCH_DIR"
"""Where trials write their checkpoints (removed after each trial). Default: ``/opt/ml/tune-scratch`` in a job (the
ML volume, which SageMaker does not sync), the system's temporary folder elsewhere."""
MLFLOW_ENVIRONMENT = (
    container.MLFLOW_TRACKING_URI_ENV,
    container.MLFLOW_EXPERIMENT_ENV,
    container.MLFLOW_RUN_NAME_ENV,
)
"""Left out of a trial's environment: a trial is a measurement, not a run to track."""
MIN_TRIAL_SECONDS = 30.0
"""A trial is not started with less than this left before the deadline."""


@dataclass
class Job:
    """The tuning job's settings: ``base`` (the trainer settings every trial starts from, as given), ``options``
    (the ``tune_*`` ones, parsed) and the ``trials``."""

    base: dict[str, str]
    options: dict[str, Any]
    trials: list[dict[str, Any]]
    architecture: dict[str, Any] | None = None
    """The ``init_from`` model's settings (its config.json), when the base starts from one: they give the shape."""
    started: float = field(default_factory=time.monotonic)
    stop_requested: bool = False
    current_group: int | None = None

    @property
    def deadline(self) -> float | None:
        seconds = self.options.get("tune_deadline_seconds")
        return None if seconds is None else self.started + seconds


def parse_args(argv: list[str]) -> Job:
    """``--key value`` (or ``--key=value``) pairs into a :class:`Job`; raises ``settings_table.ContractError``.
    The objective is decided once, here, as the trainer decides it (``objective.check``: an objective that does not
    fit the data is refused before any trial); on preference data the base names ``objective`` dpo, so that every
    trial's plan, its measurement record's key (``tuning.measured_step``) and the winning request say that a DPO
    step was timed."""
    raw: dict[str, str] = {}
    items = iter(argv)
    for item in items:
        if not item.startswith("-"):
            raise settings_table.ContractError(item, "expected --setting value pairs")
        key, sep, value = item.partition("=")
        raw[settings_parse.normalize_name(key)] = value if sep else next(items, "")
    options = {
        spec.name: spec.parse(raw.pop(spec.name)) if spec.name in raw else spec.default
        for spec in tuning.TUNE_HYPERPARAMETERS
    }
    trials = tuning.parse_trials(options[tuning.TUNE_TRIALS] or "")
    base = config.local_defaults(raw, kind="tune", salt=options)  # a folder of its own, never a run's
    checked = config.config_from_mapping(base)  # every base setting checked by the trainer's own rules
    if objective.check(checked) == "dpo":
        base["objective"] = "dpo"  # auto on preference data, named: see :func:`parse_args`
    return Job(base, options, trials, config.init_from_architecture(base))


def versions() -> tuple[str | None, str | None]:
    """torch's and Transformer Engine's installed versions (without importing either)."""
    found = []
    for names in (("torch",), ("transformer_engine", "transformer-engine")):
        version = None
        for name in names:
            try:
                version = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        found.append(version)
    return found[0], found[1]


def scratch_root() -> Path:
    chosen = os.environ.get(SCRATCH_ENV)
    if chosen:
        return Path(chosen)
    if sagemaker_job.in_sagemaker() and Path("/opt/ml").is_dir():
        return Path("/opt/ml/tune-scratch")
    return Path(tempfile.gettempdir())


def train_sh() -> Path:
    """``train.sh`` beside the package (the image: /opt/ml/code/train.sh) or in it (the repository)."""
    package_root = Path(__file__).resolve().parents[2]
    beside = package_root / container.ENTRY_POINT
    return beside if beside.is_file() else package_root / "training" / container.ENTRY_POINT


def trial_settings(job: Job, overrides: Mapping[str, Any], folder: Path, *, steps: int, warmup: int,
                   save: bool) -> dict[str, str]:  # fmt: skip
    """A trial's command-line settings: the base, the trial's own, and the trial's mechanics (its steps, one step
    per line, its one checkpoint save at the end unless it stops early and saves then, its own folders)."""
    settings = dict(job.base)
    settings.update(
        {k: settings_parse.format_setting(v) for k, v in overrides.items() if k != tuning.TRIAL_PROBE}
    )
    settings.update(
        max_steps=str(steps),
        throughput_warmup_steps=str(warmup),
        log_interval="1",
        checkpoint_interval=str(steps if save else 0),
        keep_checkpoints="1",
        checkpoint_dir=str(folder / "checkpoints"),
        model_dir=str(folder / "model"),
        tensorboard_dir=str(folder / "tensorboard"),
    )
    return settings


def trial_environment(job: Job, index: int, folder: Path, cv_target: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in MLFLOW_ENVIRONMENT}
    base_port = int(os.environ.get("MASTER_PORT", "29500"))
    env.setdefault("PYTHON", sys.executable)  # train.sh's interpreter: the driver's own
    env.update(
        TRAINER_MODULE="training.tune.trial",
        PYTHONUNBUFFERED="1",
        MASTER_PORT=str(base_port + 1 + index),  # a fresh rendezvous port per trial across hosts
        # the trial's own failure reason, refusal record and PIDs: a trial's failure is not the job's
        SM_OUTPUT_DIR=str(folder / "output"),
        **{PID_DIR_ENV: str(folder / "pids"), refusal.MARKER_ENV: str(folder / "refusal")},
        **{stability.WINDOW_ENV: str(job.options["tune_window_steps"]), stability.CV_ENV: repr(cv_target)},
    )
    return env


def run_trial(job: Job, index: int, overrides: Mapping[str, Any], logs: Path, *, convergence: bool = False,
              gpu_memory_gb: float | None = None, save: bool = True) -> TrialResult:  # fmt: skip
    """Run one trial (or, with ``convergence``, one fixed-length convergence run) and classify it. ``save``
    False leaves out a trial's one checkpoint save (a measurement that only times steps: the GPU report)."""
    options = job.options
    result = TrialResult(index, {k: v for k, v in overrides.items() if k != tuning.TRIAL_PROBE},
                         probe=bool(overrides.get(tuning.TRIAL_PROBE)))  # fmt: skip
    timeout = float(
        options["tune_convergence_timeout_seconds" if convergence else "tune_trial_timeout_seconds"]
    )
    if job.deadline is not None:
        left = job.deadline - time.monotonic()
        if left < MIN_TRIAL_SECONDS:
            result.error = f"not started: {max(left, 0):.0f} s left before the job's deadline"
            return result
        timeout = min(timeout, left)
    if job.stop_requested:
        result.error = "not started: the job was stopped"
        return result
    root = scratch_root()
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"trial-{index:02d}-", dir=root))
    if convergence:
        steps, warmup = options["tune_convergence_steps"], min(options["tune_warmup_steps"], 3)
        settings = trial_settings(job, overrides, folder, steps=steps, warmup=warmup, save=False)
    else:
        warmup = options["tune_warmup_steps"]
        settings = trial_settings(job, overrides, folder, steps=warmup + options["tune_max_measured_steps"],
                                  warmup=warmup, save=save)  # fmt: skip
    log_path = logs / f"{'convergence' if convergence else 'trial'}-{index:02d}.log"
    result.log = str(log_path)
    try:
        settings_parse.parse_hyperparameters(
            {k: v for k, v in settings.items() if k in settings_table.HYPERPARAMETERS_BY_NAME},
            job.architecture,
        )
    except settings_table.ContractError as err:
        result.status, result.error = "failed", f"invalid setting {err}"
        shutil.rmtree(folder, ignore_errors=True)
        return result
    command = ["/bin/sh", str(train_sh()), *runner.cli_args(settings)]
    env = trial_environment(job, index, folder, 0.0 if convergence else options["tune_cv_target"])
    finished = runner.run(command, env=env, log_path=log_path, timeout=timeout,
                          memory_limit_gb=options["tune_trial_memory_limit_gb"], on_start=lambda pid: _track(job, pid))  # fmt: skip
    job.current_group = None
    classify(
        result, finished, gpu_memory_gb=gpu_memory_gb, memory_limit_gb=options["tune_trial_memory_limit_gb"]
    )
    if job.stop_requested and result.status != "ok":
        result.status, result.error = "failed", f"stopped: the job received SIGTERM ({result.error})"
    shutil.rmtree(folder, ignore_errors=True)
    return result


def _track(job: Job, pid: int) -> None:
    job.current_group = pid


def on_sigterm(job: Job):
    """SageMaker stops the job: kill the running trial's group, start no other, write what ran."""

    def handle(signum: int, frame: Any) -> None:
        job.stop_requested = True
        if job.current_group is not None:
            runner.kill_tree(job.current_group)

    return handle


def where(job: Job, hosts: Hosts, results: list[TrialResult]) -> Where:
    """Where the trials ran (the first trial's config line says the device, GPU and world size)."""
    seen = next((r.config for r in results if r.config), {})
    torch_version, te_version = versions()
    image = job.options.get("tune_image_uri")
    return Where(
        instance_type=job.options.get("tune_instance_type") or os.environ.get("SM_CURRENT_INSTANCE_TYPE")
        or hardware.DEFAULT_INSTANCE_TYPE,
        instance_count=hosts.count,
        device=seen.get("device", "unknown"),
        gpu=None if seen.get("gpu") in (None, "none") else seen.get("gpu"),
        world_size=int(seen["world_size"]) if "world_size" in seen else None,
        image_tag=tuning.image_tag(image) if image else "local",
        torch_version=torch_version,
        te_version=te_version,
        job=sagemaker_job.job_name(),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        host=socket.gethostname(),
    )  # fmt: skip


def say(line: str) -> None:
    print(f"tune: {line}", flush=True)
