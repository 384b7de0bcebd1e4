"""One tuning session, start to report: every host runs the trials in order; the leader ranks them and hands the
winner to the other hosts; every host runs the convergence runs on it (when asked); the leader writes the report
(tables, charts, winner, winning request, measurement records, logs) into ``<checkpoint_dir>/tune/``.

In a job that folder is the job's ``CheckpointConfig`` local path, which SageMaker uploads to the execution's
checkpoint prefix (``checkpoints/<segment>/<execution>/tune/``) while the job runs and at its end: no S3 call and
no permission of the container's own, so it works with network isolation too. The workflow then reads the winner
from there and stores the measurement records where the request check reads them."""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from training.contract import hardware, settings_parse, settings_table, tuning
from training.trainer import sagemaker_job
from training.trainer.checkpoint.stop import PID_DIR_ENV
from training.tune import charts, convergence, report, runner
from training.tune.driver import Job, run_trial, say, scratch_root, where
from training.tune.hosts import Hosts
from training.tune.outcome import TrialResult

REPORT_FOLDER = tuning.TUNE_REPORT_FOLDER
TAIL_LINES = 15


def report_folder(checkpoint_dir: str) -> Path:
    """``<checkpoint_dir>/tune``. Outside SageMaker an earlier report there is never written over (``tune-2``,
    ``tune-3``, ... instead). In a job the folder is where the workflow reads the winner; one found there comes from
    an earlier attempt of this same job (SageMaker restores the checkpoint folder from S3 when it retries an
    internal error): it is moved aside first, whole, to ``tune-attempt-N`` (uploaded like the rest), so nothing of
    it is written over or mixed into the new report."""
    root = Path(checkpoint_dir)
    first = root / REPORT_FOLDER
    if sagemaker_job.in_sagemaker():
        if first.is_dir() and any(first.iterdir()):
            aside = _free(root, f"{REPORT_FOLDER}-attempt-")
            first.rename(aside)
            say(f"{first} held the report of an earlier attempt of this job: moved to {aside}")
        first.mkdir(parents=True, exist_ok=True)
        return first
    if not first.exists() or not any(first.iterdir()):
        first.mkdir(parents=True, exist_ok=True)
        return first
    folder = _free(root, f"{REPORT_FOLDER}-", start=2)
    folder.mkdir(parents=True)
    return folder


def _free(root: Path, stem: str, start: int = 1) -> Path:
    """The first ``<root>/<stem>N`` (N from ``start``) that does not exist or is empty."""
    for number in range(start, 1000):
        folder = root / f"{stem}{number}"
        if not folder.exists() or not any(folder.iterdir()):
            return folder
    raise RuntimeError(f"{root}: 999 tuning reports already; choose another checkpoint_dir")


def register_pid() -> None:
    """Let the container's PID-1 entry point forward SageMaker's SIGTERM to this driver too."""
    pid_dir = os.environ.get(PID_DIR_ENV)
    if pid_dir:
        pid_file = Path(pid_dir) / str(os.getpid())
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.touch()
        atexit.register(pid_file.unlink, missing_ok=True)


def said(result: TrialResult) -> str:
    """One line about a finished trial."""
    head = f"trial {result.index} {report.describe(result.settings)}: {result.status}"
    if result.seconds is not None:
        head += f" after {result.seconds:.0f} s" + (
            f" (first step at {result.first_step_seconds:.1f} s)" if result.first_step_seconds else ""
        )
    if result.spread is not None and result.ran:
        s = result.spread
        head += (f", step {s.median:.4g} s median [{s.p10:.4g}-{s.p90:.4g}] cv {s.cv:.1%} over {s.steps} timed "
                 f"steps{' (stable, stopped early)' if result.stopped_early else ''}")  # fmt: skip
    if result.summary.get("max_allocated_gb") is not None:
        head += f", peak {result.summary['max_allocated_gb']:.2f} GB"
    if result.error:
        head += f": {result.error}"
    return head


def run_trials(job: Job, logs: Path, gpu_memory_gb: float | None) -> list[TrialResult]:
    results = []
    for index, trial in enumerate(job.trials, start=1):
        probe = " (probe past the predicted memory edge)" if trial.get(tuning.TRIAL_PROBE) else ""
        own = f" (its own timeout: {trial[tuning.TRIAL_TIMEOUT]} s)" if tuning.TRIAL_TIMEOUT in trial else ""
        say(f"trial {index}/{len(job.trials)}: {report.describe(trial)}{probe}{own}")
        result = run_trial(job, index, trial, logs, gpu_memory_gb=gpu_memory_gb)
        results.append(result)
        say(said(result))
        if result.status not in ("ok", "near-oom", "not-run") and result.log and Path(result.log).is_file():
            for line in Path(result.log).read_text(errors="replace").splitlines()[-TAIL_LINES:]:
                print(f"  | {line}", flush=True)
    return results


def run_convergence(
    job: Job, settings: Mapping[str, Any], logs: Path
) -> tuple[dict[str, TrialResult], list[str]]:
    """The winner's settings in the reference precision and each asked one, same seed and data, fixed steps
    (settings that only the other kind of precision runs adapted: ``convergence.run_settings``, noted)."""
    precisions = [p for p in str(job.options["tune_convergence_precisions"] or "").split(",") if p]
    reference = job.options["tune_convergence_reference"]
    runs, notes = {}, []
    for offset, precision in enumerate([reference, *[p for p in precisions if p != reference]], start=1):
        say(f"convergence run {precision}: {job.options['tune_convergence_steps']} steps of the winner")
        overrides, changed = convergence.run_settings(job.base, settings, precision)
        for note in changed:
            say(note)
        notes += changed
        runs[precision] = run_trial(job, 100 + offset, overrides, logs, convergence=True)
        say(f"convergence run {precision}: {runs[precision].status}"
            + (f": {runs[precision].error}" if runs[precision].error else ""))  # fmt: skip
    return runs, notes


def converge(
    job: Job, hosts: Hosts, best: report.Row | None, logs: Path, share_port: int
) -> tuple[dict[str, TrialResult], list[str]]:
    """The convergence runs (when asked for): the leader hands its winner to the other hosts, then every host runs
    them. A failed hand-over (a host gone, the exchange timed out) skips them, with a note for the report."""
    if not job.options["tune_convergence_precisions"]:
        return {}, []
    try:
        chosen = hosts.share(None if best is None else best.settings, share_port)
    except (OSError, ValueError) as error:  # TimeoutError is an OSError; ValueError: a torn message
        note = f"convergence runs skipped: the hand-over of the winner between hosts failed ({type(error).__name__}: {error})"
        say(note)
        return {}, [note]
    if not chosen:
        return {}, ["convergence runs skipped: no trial ran ok"]
    return run_convergence(job, chosen, logs)


def run(job: Job, hosts: Hosts, *, share_port: int) -> int:
    """Every trial, the report (written before any exchange between hosts, so a failed hand-over loses nothing),
    the convergence runs when asked for (then the report again, with them). Exit 0 whenever the report was
    written, with or without a winner (``winner.json`` says which): the workflow reads it either way."""
    register_pid()
    runner.become_subreaper()
    folder = report_folder(job.base["checkpoint_dir"]) if hosts.leader else None
    logs = folder / "trials" if folder else scratch_root() / "tune-logs"
    instance = hardware.GPU_INSTANCE_TYPES.get(job.options.get("tune_instance_type") or "")
    gpu_memory_gb = instance.gpu_memory_gb if instance else None
    say(
        f"{len(job.trials)} trials, each a fresh train.sh on {hosts.count} host(s); report in {folder or 'the leader'}"
    )
    results = run_trials(job, logs, gpu_memory_gb)
    base = {k: v for k, v in job.base.items() if k in settings_table.HYPERPARAMETERS_BY_NAME}
    place = where(job, hosts, results)
    rows = (
        report.rank(
            [
                report.make_row(r, base, place, job.architecture, job.options["tune_cv_target"])
                for r in results
            ]
        )
        if hosts.leader
        else []
    )
    best = report.winner(rows)
    for note in report.tokens_per_step_notes(rows, job.base, job.architecture) if rows else ():
        if note.startswith("WARNING"):
            say(note)
    if folder is not None:
        write(folder, job, rows, place, {}, gpu_memory_gb)
    runs, notes = converge(job, hosts, best, logs, share_port)
    if folder is None:
        return 0
    if runs or notes:
        write(folder, job, rows, place, runs, gpu_memory_gb, notes)
    say("ranked trials:\n" + report.plain(rows, place))
    if best is None:
        say(
            f"no winner: no trial ran ok ({len(rows)} tried); the report (every trial's status, error and log) is "
            f"in {folder}, which SageMaker uploads to the run's checkpoint prefix ({REPORT_FOLDER}/)"
        )
        return 0
    say(
        f"winner: trial {best.trial} {best.configuration}: {best.measured_tokens_per_sec:,.0f} tokens/s per GPU"
    )
    return 0


def compare_runs(job: Job, runs: Mapping[str, TrialResult]) -> list[dict[str, Any]]:
    reference = job.options["tune_convergence_reference"]
    ref = runs.get(reference)
    out = []
    for precision, result in runs.items():
        if precision == reference:
            continue
        if ref is None or not ref.ran or not result.ran:
            failed = [
                f"{p}: {r.status} ({r.error})"
                for p, r in ((reference, ref), (precision, result))
                if r and not r.ran
            ]
            out.append({"precision": precision, "reference": reference, "passed": False,
                        "why": "not compared: " + "; ".join(failed)})  # fmt: skip
            continue
        out.append(convergence.compare(precision, result.losses, reference, ref.losses).as_dict())
    return out


def write(folder: Path, job: Job, rows: Sequence[report.Row], place: report.Where,
          runs: Mapping[str, TrialResult], gpu_memory_gb: float | None,
          run_notes: Sequence[str] = ()) -> None:  # fmt: skip
    """Every file of the report into ``folder`` (``run_notes``: what the convergence runs changed or skipped)."""
    best = report.winner(rows)
    comparisons = compare_runs(job, runs)
    measured_on = (
        f"measured on {place.device} ({place.gpu or 'no GPU'}, world size {place.world_size}) for "
        f"{place.instance_count} x {place.instance_type}"
        + ("" if place.on_target else ": not the instance's GPUs, so no costs are projected")
    )  # fmt: skip
    stability = report.stability_notes(rows, job.options["tune_cv_target"], job.options["tune_window_steps"])
    notes = [
        *report.tokens_per_step_notes(rows, job.base, job.architecture),
        *stability,
        measured_on,
        *run_notes,
    ]
    options = {k: v for k, v in job.options.items() if k != tuning.TUNE_TRIALS}
    extra = {"convergence": comparisons, "notes": notes, "options": options}
    (folder / tuning.TUNE_REPORT_FILE).write_text(report.report_json(rows, place, extra))
    heading = f"# Tuning: {len(rows)} trials ({measured_on})"
    (folder / "table.md").write_text(report.markdown(rows, heading, notes, place))
    (folder / "table.csv").write_text(report.csv_text(rows))
    (folder / "table.txt").write_text(report.plain(rows, place))
    charts.throughput_and_memory(rows, place, folder / "throughput_memory.png", gpu_memory_gb)
    if place.device == "cuda":  # on a CPU the memory axis would be a process's resident set: nothing to plot
        charts.throughput_vs_memory(rows, place, folder / "throughput_vs_memory.png", gpu_memory_gb)
    if runs:
        curves = {p: r.losses for p, r in runs.items()}
        reference = job.options["tune_convergence_reference"]
        title = f"Loss from the same weights and data, against {reference}: " + ", ".join(
            f"{c['precision']} {'passes' if c['passed'] else 'FAILS'}" for c in comparisons
        )
        charts.loss_curves(curves, reference, convergence.SKIP_FRACTION, convergence.tolerance, title,
                           folder / "convergence.png")  # fmt: skip
    base = {k: v for k, v in job.base.items() if k in settings_table.HYPERPARAMETERS_BY_NAME}
    (folder / tuning.TUNE_WINNER_FILE).write_text(
        json.dumps(winner_summary(best, job, place), indent=2, default=str) + "\n"
    )
    if best is not None:
        request = winning_request(base, best.settings, place)
        (folder / tuning.TUNE_REQUEST_FILE).write_text(json.dumps(request, indent=2) + "\n")
    records = report.records(rows, base, place, job.architecture)
    (folder / tuning.TUNE_RECORDS_FILE).write_text(
        json.dumps({"records": records}, indent=1, default=str) + "\n"
    )


def winner_summary(best: report.Row | None, job: Job, place: report.Where) -> dict[str, Any]:
    """``winner.json``: what the workflow's summary shows (small, flat)."""
    if best is None:
        return {"trial": None, "settings": None}
    return {
        "trial": best.trial,
        "settings": best.settings,
        "configuration": best.configuration,
        "measured_tokens_per_sec_per_gpu": round(best.measured_tokens_per_sec or 0.0, 1),
        "predicted_tokens_per_sec_per_gpu": round(best.predicted_tokens_per_sec or 0.0, 1),
        "step_seconds_median": (best.step_seconds or {}).get("median"),
        "max_allocated_gb": best.measured_allocated_gb,
        "max_reserved_gb": best.measured_reserved_gb,
        "mfu": best.mfu,
        "usd_per_billion_tokens": best.usd_per_billion_tokens,
        "full_run_seconds": best.full_run_seconds,
        "full_run_usd": best.full_run_usd,
        "measured_on": f"{place.device} {place.gpu or ''}".strip(),
    }


def winning_request(
    base: Mapping[str, str], settings: Mapping[str, Any], place: report.Where
) -> dict[str, Any]:
    """An execution input for the winner: the instance, the top-level settings, the rest as hyperparameters (the
    platform's folders and the data switch left to the workflow; a run on channel data needs its
    ``train_data_uri`` added: ``blackwell-training tune-apply`` writes the complete request from the run's input)."""
    merged = {**base, **{k: settings_parse.format_setting(v) for k, v in settings.items()}}
    request: dict[str, Any] = {"instance_type": place.instance_type, "instance_count": place.instance_count}
    hyperparameters = {}
    for name, value in merged.items():
        if name in ("checkpoint_dir", "model_dir", "dataset"):
            continue
        if name in settings_table.TOP_LEVEL_SETTINGS:
            request[name] = settings_table.HYPERPARAMETERS_BY_NAME[name].parse(value)
        else:
            hyperparameters[name] = value
    request["hyperparameters"] = hyperparameters
    return request
