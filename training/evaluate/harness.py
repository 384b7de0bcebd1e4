"""lm-evaluation-harness on one Hugging Face folder and one local task folder: its tasks, the run, the scores.

Only lm-eval's own machinery is used: ``TaskManager(include_path=<task folder>, include_defaults=False)`` indexes the
folder's YAML files (and nothing of lm-eval's built-in tasks, whose data would come from the Hub), ``HFLM`` loads the
folder with ``transformers``, ``simple_evaluate`` scores it. Relative ``data_files`` in a task YAML are read from the
task folder (the evaluation runs there). The caller sets the offline switches before importing this module.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from training.contract import evaluation


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def task_manager(tasks_dir: Path) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(tasks_dir), include_defaults=False)


def known_tasks(tasks_dir: Path) -> list[str]:
    """The task, group and tag names the folder's YAML files define."""
    return list(task_manager(tasks_dir).all_tasks)


def device_and_args(folder: Path) -> tuple[str, dict[str, Any]]:
    """``cuda`` when a GPU is visible (split over all of them, ``parallelize``, when the weights take more than
    ``evaluation.EVALUATION_WEIGHTS_SHARE`` of one), else ``cpu``."""
    import torch

    if not torch.cuda.is_available():
        return "cpu", {}
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    per_gpu = torch.cuda.get_device_properties(0).total_memory
    if torch.cuda.device_count() > 1 and weights > evaluation.EVALUATION_WEIGHTS_SHARE * per_gpu:
        return "cuda", {"parallelize": True}
    return "cuda", {}


def run(
    folder: Path,
    tasks_dir: Path,
    tasks: list[str],
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """lm-eval's results dict for ``tasks`` of ``tasks_dir`` on the model in ``folder`` (``settings``: the
    evaluation settings of the contract, parsed)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    device, extra = device_and_args(folder)
    if device == "cpu":  # its threads, as the trainer chooses them on the CPU
        from training.trainer.distributed import cpu_threads

        print(cpu_threads.configure(), flush=True)
    model = HFLM(
        pretrained=str(folder.resolve()),
        device=device,
        dtype=settings["dtype"],
        batch_size=settings["batch_size"],
        trust_remote_code=False,
        **extra,
    )
    manager = task_manager(tasks_dir)
    seed = settings["seed"]
    with _working_directory(tasks_dir):
        results = lm_eval.simple_evaluate(
            model=model,
            tasks=list(tasks),
            task_manager=manager,
            limit=settings["limit"],
            log_samples=False,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    if results is None:  # only on a non-zero rank of a multi-process launch, which this never is
        raise RuntimeError("lm-eval returned no results")
    return dict(results)


def scores(results: Mapping[str, Any]) -> dict[str, dict[str, float | int]]:
    """Each task's (and group's) ``acc``, ``acc_norm`` and their standard errors under lm-eval's default filter
    (``acc,none``), with ``samples``: the examples scored."""
    out: dict[str, dict[str, float | int]] = {}
    counts = results.get("n-samples") or {}
    for task, metrics in (results.get("results") or {}).items():
        found: dict[str, float | int] = {}
        for field in evaluation.EVALUATION_METRICS:
            value = metrics.get(f"{field},none")
            if isinstance(value, int | float) and value == value:  # lm-eval writes "N/A" when it has none
                found[field] = float(value)
        if not found:
            continue
        samples = (counts.get(task) or {}).get("effective")
        if samples is not None:
            found["samples"] = int(samples)
        out[task] = found
    return out
