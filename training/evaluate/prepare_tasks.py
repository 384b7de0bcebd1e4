"""Write the standard task folder for evaluation jobs: ``python -m training.evaluate.prepare_tasks --output tasks/``.

Run it where the Hugging Face Hub can be reached (the evaluation job itself has no network): each task's public
evaluation split is read with ``datasets.load_dataset`` (the dataset and split lm-eval's own task uses), prepared as
lm-eval's task prepares it (``standard_tasks``), and written beside its YAML::

    tasks/hellaswag.yaml      tasks/hellaswag.validation.jsonl
    tasks/arc_easy.yaml       tasks/arc_easy.test.jsonl
    ...

``--from-dir DIR`` reads the rows from ``DIR/<task>.jsonl`` instead (the dataset's own fields, one JSON object per
line: a mirror made elsewhere), with no network. Nothing is overwritten: the output folder must not hold these
files. Then upload the folder under one of the workflow's data prefixes and name it in the execution input's
``evaluate.task_data_uri`` (the command prints both).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from training.evaluate.standard_tasks import STANDARD_TASKS, StandardTask


class PrepareTasksError(ValueError):
    """Bad options or input; the message names the option or file."""


def hub_rows(task: StandardTask) -> Iterable[Mapping[str, Any]]:
    """The task's evaluation split from the Hugging Face Hub (needs the network and ``datasets``)."""
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise PrepareTasksError(
            "HF_DATASETS_OFFLINE or HF_HUB_OFFLINE is set: the public data cannot be read from the Hub here "
            "(unset them where the network is reachable, or pass --from-dir)"
        )
    try:
        import datasets
    except ImportError:
        raise PrepareTasksError(
            "the 'datasets' package is needed to read the Hub (pip install datasets)"
        ) from None
    import huggingface_hub.utils

    # Their retries' warnings (a dozen lines while the network is down) would bury the one line that says why.
    huggingface_hub.utils.logging.set_verbosity_error()
    datasets.utils.logging.set_verbosity_error()
    print(f"{task.name}: reading {task.hub_path} ({task.split}) from the Hugging Face Hub", flush=True)
    try:
        return datasets.load_dataset(task.hub_path, task.hub_name, split=task.split)
    except Exception as err:
        # No network, a proxy, the Hub down, a dataset moved: one line, not datasets' traceback.
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise PrepareTasksError(
            f"{task.name}: cannot read {task.hub_path} ({task.split}) from the Hugging Face Hub: "
            f"{type(err).__name__}: {reason} (run where the Hub is reachable, or pass --from-dir)"
        ) from None


def local_rows(task: StandardTask, folder: Path) -> list[dict[str, Any]]:
    path = folder / f"{task.name}.jsonl"
    if not path.is_file():
        raise PrepareTasksError(
            f"from-dir: {path} does not exist (one JSON object per line, the dataset's fields)"
        )
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    raise PrepareTasksError(f"from-dir: {path}:{number} is not JSON") from None
    return rows


def write_task(task: StandardTask, rows: Iterable[Mapping[str, Any]], out: Path) -> int:
    """``<task>.yaml`` and its data file in ``out`` (written whole: ``.partial`` then renamed); the row count."""
    import yaml

    data, spec = out / task.data_file, out / f"{task.name}.yaml"
    count = 0
    tmp = data.with_name(data.name + ".partial")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            for row in rows:
                try:
                    prepared = task.prepare_row(dict(row))
                except (KeyError, ValueError, TypeError) as err:
                    raise PrepareTasksError(
                        f"{task.name}: row {count + 1} lacks the fields of {task.hub_path} ({type(err).__name__}: {err})"
                    ) from None
                handle.write(json.dumps(prepared, ensure_ascii=False) + "\n")
                count += 1
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not count:
        tmp.unlink()
        raise PrepareTasksError(f"{task.name}: no rows")
    os.replace(tmp, data)
    spec.write_text(yaml.safe_dump(task.config(), sort_keys=False, allow_unicode=True))
    return count


def prepare(names: list[str], output: str, from_dir: str | None = None) -> dict[str, int]:
    """Write the named tasks into ``output``; their row counts."""
    unknown = [n for n in names if n not in STANDARD_TASKS]
    if unknown or not names:
        raise PrepareTasksError(
            f"tasks: must be among {', '.join(STANDARD_TASKS)}; got {', '.join(unknown) or 'none'}"
        )
    out = Path(output)
    taken = [
        p.name for n in names for p in (out / f"{n}.yaml", out / STANDARD_TASKS[n].data_file) if p.exists()
    ]
    if taken:
        raise PrepareTasksError(f"output: {out} already holds {', '.join(taken)}; choose an empty folder")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    try:
        for name in names:
            task = STANDARD_TASKS[name]
            rows = local_rows(task, Path(from_dir)) if from_dir else hub_rows(task)
            counts[name] = write_task(task, rows, out)
    except BaseException:
        if created and not any(out.iterdir()):
            out.rmdir()  # the folder this call made, left empty: not left behind
        raise
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.evaluate.prepare_tasks", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--output", required=True, help="Folder for the task YAML and data files (new or empty)."
    )
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=list(STANDARD_TASKS),
        help=f"Which ({' '.join(STANDARD_TASKS)}; default all).",
    )
    parser.add_argument("--from-dir", help="Read <task>.jsonl rows from this folder instead of the Hub.")
    args = parser.parse_args(argv)
    try:
        counts = prepare(args.tasks, args.output, args.from_dir)
    except PrepareTasksError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, count in counts.items():
        print(
            f"{name}: {count} examples ({STANDARD_TASKS[name].hub_path}, split {STANDARD_TASKS[name].split})"
        )
    print(f"upload with: aws s3 sync {args.output} s3://<bucket>/data/evaluation-tasks/")
    tasks = json.dumps(list(counts))
    print(
        f'evaluate with: "evaluate": {{"tasks": {tasks}, "task_data_uri": "s3://<bucket>/data/evaluation-tasks/"}}'
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
