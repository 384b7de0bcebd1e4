"""The evaluation job: ``python -m training.evaluate --tasks hellaswag,piqa [--limit N] ...`` (``evaluate.sh``).

1. Offline: ``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` are set to 1 before lm-eval,
   ``datasets`` or ``transformers`` is imported, so nothing is fetched from the Hub (the job also runs with network
   isolation); the task data comes only from the task folder.
2. The model: the ``model`` channel (a training job's ``model.tar.gz``: its ``hf/`` folder is extracted), or any
   Hugging Face folder given as ``--model_dir``; refused without tokenizer files (``model_folder``).
3. The tasks: every name must be defined by the task folder's YAML (the ``tasks`` channel, or ``--tasks_dir``).
4. lm-eval scores them (``harness``); each task's scores are printed as one ``evaluation task=...`` line (the
   contract's format, which the job's metric definitions read), written to ``scores.json``, lm-eval's whole
   ``results.json`` and ``evaluation.json`` (what was evaluated) in the output folder (the job's
   ``output.tar.gz``; run by hand, a new folder under ``evaluations/``, never one holding results), and logged to MLflow when its variables
   are set (``training.trainer.observe.mlflow_log``: the run being evaluated, metrics ``eval/<task>/<field>``): only when
   run by hand, since the workflow's evaluation job is always network-isolated and is given no MLflow variables.

A refusal (bad setting, no model, no tokenizer, unknown task) is one ``error: ...`` line, exit status 2 and, in a
SageMaker job, the job's failure reason (``training.trainer.refusal``, docs/exit-status.md); a failure of lm-eval
itself is exit status 1 with ``evaluation failed: <error>`` as the failure reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training.contract import container, evaluation, settings_table

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
LOCAL_OUTPUT_DIR = "evaluations"
"""Outside a job, each evaluation writes into a new folder under this one by default."""
OUTPUT_FILES = ("scores.json", "results.json", "evaluation.json")
"""What an evaluation writes: the scores, lm-eval's results, and what was evaluated how (``evaluation.json``: the
model folder, the tasks, the settings, and the run's own settings when its ``settings.json`` is beside the model),
which ``blackwell-training compare`` reads from local folders."""
RUN_FIELDS = ("precision", "max_steps", "model_preset", "init_from", "parameters", "dataset", "data_dir")


def _channel(name: str) -> str:
    return os.environ.get(f"SM_CHANNEL_{name.upper()}", f"/opt/ml/input/data/{name}")


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="python -m training.evaluate", description=__doc__.splitlines()[0])
    for spec in evaluation.EVALUATION_SETTINGS:
        parse.add_argument(*spec.cli_flags, dest=spec.name, default=spec.default, help=spec.help)
    parse.add_argument("--model_dir", "--model-dir", default=_channel(container.MODEL_CHANNEL),
                       help="A Hugging Face folder, a model folder holding hf/, or a model.tar.gz (or its folder).")  # fmt: skip
    parse.add_argument("--tasks_dir", "--tasks-dir", default=_channel(container.TASKS_CHANNEL),
                       help="The task folder: lm-eval task YAML files and their data files.")  # fmt: skip
    parse.add_argument("--output_dir", "--output-dir", default=os.environ.get("SM_OUTPUT_DATA_DIR"),
                       help="Where scores.json, results.json and evaluation.json are written: a folder that holds "
                       "none of them (default: the job's output data folder in SageMaker, elsewhere a new "
                       f"{LOCAL_OUTPUT_DIR}/<model>-<UTC time>/ per evaluation).")  # fmt: skip
    return parse


def output_folder(given: str | None, model_dir: str, now: datetime | None = None) -> Path:
    """Where this evaluation writes: ``given``, or a new folder of its own; refused (``ContractError``) when it
    already holds results, which are never written over."""
    if given is None:
        stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
        model = Path(model_dir).resolve()
        name = model.parent.name if model.name in ("model", container.HF_EXPORT_DIR) else model.name
        folder = Path(LOCAL_OUTPUT_DIR) / f"{name or 'model'}-{stamp}"
        return folder.with_name(f"{folder.name}-{os.getpid()}") if folder.exists() else folder
    folder = Path(given)
    taken = [name for name in OUTPUT_FILES if (folder / name).exists()]
    if taken:
        raise settings_table.ContractError(
            "output_dir", f"{folder} already holds {', '.join(taken)} of an evaluation; choose a new folder"
        )
    return folder


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """The contract's evaluation settings, parsed (raises ``ContractError`` naming the first bad one)."""
    values = {spec.name: spec.parse(getattr(args, spec.name)) for spec in evaluation.EVALUATION_SETTINGS}
    tasks = [t.strip() for t in str(values["tasks"]).split(",") if t.strip()]
    bad = [t for t in tasks if not evaluation.TASK_NAME.match(t)]
    if not tasks or bad or len(tasks) > evaluation.MAX_EVALUATION_TASKS or len(set(tasks)) != len(tasks):
        raise settings_table.ContractError(
            "tasks",
            f"must be 1 to {evaluation.MAX_EVALUATION_TASKS} distinct task names (letters, digits, _ . -), comma "
            f"separated; got {values['tasks']!r}",
        )
    values["tasks"] = tasks
    return values


def check_tasks(tasks: list[str], tasks_dir: Path) -> None:
    from training.evaluate import harness

    if not tasks_dir.is_dir():
        raise settings_table.ContractError(
            "tasks_dir", f"{tasks_dir} is not a folder (the '{container.TASKS_CHANNEL}' channel)"
        )
    known = harness.known_tasks(tasks_dir)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise settings_table.ContractError(
            "tasks",
            f"{', '.join(unknown)} not defined in {tasks_dir} (its YAML files define: {', '.join(known) or 'nothing'})",
        )


def run_settings(folder: Path) -> dict[str, Any] | None:
    """What the trainer recorded of the run (its ``settings.json``, in the model folder that holds the export, or
    the newest ``settings-N.json`` there); None when there is none (a job's model channel, another tool's model)."""
    for place in (folder, folder.parent):
        found = sorted(place.glob("settings*.json"), key=lambda p: (len(p.name), p.name))
        if found:
            try:
                recorded = json.loads(found[-1].read_text())
            except (OSError, ValueError):
                return None
            return {key: recorded.get(key) for key in RUN_FIELDS} | {"file": str(found[-1])}
    return None


def report(
    scores: dict[str, dict[str, Any]],
    results: dict[str, Any],
    output_dir: Path,
    settings: dict,
    model: Path | None = None,
) -> None:
    """Print the metric lines, write scores.json, results.json and evaluation.json, log to MLflow when
    configured."""
    for task, values in scores.items():
        print(evaluation.format_evaluation_line(task, values, values.get("samples")), flush=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "scores.json").write_text(json.dumps(scores, indent=2) + "\n")
    kept = {k: v for k, v in results.items() if k != "samples"}
    (output_dir / "results.json").write_text(json.dumps(kept, indent=2, default=str) + "\n")
    evaluated = {"model": str(model) if model else None, "settings": settings,
                 "run": run_settings(model) if model else None}  # fmt: skip
    (output_dir / "evaluation.json").write_text(json.dumps(evaluated, indent=2, default=str) + "\n")
    print(f"scores written to {output_dir}", flush=True)
    from training.trainer.observe.mlflow_log import MlflowLog

    mlflow = MlflowLog.from_environment(print)
    if mlflow is not None:
        mlflow.start({f"eval_{k}": (",".join(v) if isinstance(v, list) else v) for k, v in settings.items()})
        metrics = {f"eval/{t}/{f}": v for t, vs in scores.items() for f, v in vs.items() if f != "samples"}
        mlflow.metrics(0, metrics)
        mlflow.close()


def main(argv: list[str] | None = None) -> int:
    os.environ.update(OFFLINE)
    from training.evaluate import harness, model_folder
    from training.trainer.refusal import refuse

    args = parser().parse_args(argv)
    try:
        settings = settings_of(args)
        tasks_dir = Path(args.tasks_dir).resolve()
        check_tasks(settings["tasks"], tasks_dir)
        output_dir = output_folder(args.output_dir, args.model_dir)
        work = Path(tempfile.mkdtemp(prefix="evaluate-model-"))
        folder = model_folder.locate(args.model_dir, work)
        model_folder.check_tokenizer(folder)
    except settings_table.ContractError as err:
        return refuse(f"invalid setting {err}", report=True)
    except model_folder.ModelFolderError as err:
        return refuse(str(err), report=True)
    print(f"evaluating {folder} on {', '.join(settings['tasks'])} (limit {settings['limit']})", flush=True)
    try:
        results = harness.run(folder, tasks_dir, settings["tasks"], settings)
    except Exception as err:  # the traceback stays on stderr; its first line becomes the job's failure reason
        from training.trainer.sagemaker_job import write_failure

        write_failure(
            f"evaluation failed: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"[:1000]
        )
        raise
    report(harness.scores(results), results, output_dir, settings, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
