"""training.evaluate.standard_tasks and prepare_tasks: the local task definitions give lm-eval the very requests its own
task definitions give (same contexts, continuations and targets), offline; the preparation command's refusals."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import lm_eval
import pytest
import yaml

from tests.training.runner import ROOT
from training.contract import evaluation
from training.evaluate import harness, prepare_tasks
from training.evaluate.standard_tasks import STANDARD_TASKS

LM_EVAL_TASKS = Path(lm_eval.__file__).parent / "tasks"
BUILT_IN = {"hellaswag": ("hellaswag", "hellaswag.yaml"), "arc_easy": ("arc", "arc_easy.yaml"),
            "piqa": ("piqa", "piqa.yaml"), "winogrande": ("winogrande", "default.yaml")}  # fmt: skip

# A few rows in each public dataset's own fields (as datasets.load_dataset returns them), with the quirks lm-eval's
# processing exists for: WikiHow's bracketed artifacts and a lower-case ctx_b (hellaswag), a 3-option question and
# numeric answer keys (ARC), quotes in a solution (PIQA), a blank in mid-sentence (Winogrande).
RAW = {
    "hellaswag": [
        {"ind": 4, "activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow.",
         "ctx_b": "then", "ctx": "...", "endings": [", the man adds wax [title] to the windshield.",
         " a man puts on a christmas coat.", "the man continues removing the snow [step] on his car.",
         ", the man adds wax on the windshield and cuts."], "source_id": "a", "split": "val",
         "split_type": "indomain", "label": "3"},
        {"ind": 9, "activity_label": "Home and Garden", "ctx_a": "[header] How to grow tomatoes  [title] Pick a spot.",
         "ctx_b": "choose", "ctx": "...", "endings": ["a sunny spot.", "the cellar.", "a box.", "[title] Dig."],
         "source_id": "b", "split": "val", "split_type": "zeroshot", "label": "0"},
    ],
    "arc_easy": [
        {"id": "q1", "question": "Which is a mammal?", "choices": {"text": ["shark", "whale", "trout", "eel"],
         "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
        {"id": "q2", "question": "What melts ice fastest?", "choices": {"text": ["salt", "sand", "snow"],
         "label": ["1", "2", "3"]}, "answerKey": "1"},
    ],
    "piqa": [
        {"goal": "To open a jar,", "sol1": "twist the lid \"counterclockwise\".", "sol2": "twist the jar's bottom.",
         "label": 0},
        {"goal": "keep bread fresh", "sol1": "leave it in the sun", "sol2": "store it in a sealed bag", "label": 1},
    ],
    "winogrande": [
        {"sentence": "The trophy didn't fit in the suitcase because the _ was too big.", "option1": "trophy",
         "option2": "suitcase", "answer": "1"},
        {"sentence": "Sarah gave Maria a gift because _ had a birthday.", "option1": "Sarah", "option2": "Maria",
         "answer": "2"},
    ],
}  # fmt: skip


def _raw_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "raw"
    folder.mkdir()
    for name, rows in RAW.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _requests(tasks_dir: Path, name: str) -> list[tuple]:
    """Every request lm-eval builds for task ``name`` of ``tasks_dir``: (doc id, context, continuation), and the
    documents' targets."""
    manager = harness.task_manager(tasks_dir)
    with harness._working_directory(tasks_dir):
        task = manager.load([name])["tasks"][name]
        task.build_all_requests(limit=None, rank=0, world_size=1)
    requests = sorted((i.doc_id, *i.arguments) for i in task.instances)
    targets = [task.doc_to_target(doc) for doc in task.eval_docs]
    return [*requests, ("targets", *targets)]


def _built_in_with_local_data(name: str, tmp_path: Path, raw: Path) -> Path:
    """lm-eval's own task folder for ``name`` (YAML and helper modules, unchanged), with only its data source
    replaced by the same raw rows."""
    folder_name, yaml_name = BUILT_IN[name]
    folder = tmp_path / f"builtin_{name}"
    shutil.copytree(LM_EVAL_TASKS / folder_name, folder, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    for other in folder.glob("*.yaml"):
        if other.name != yaml_name:
            other.unlink()
    spec = (folder / yaml_name).read_text()
    split = STANDARD_TASKS[name].split
    source = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    {split}: {raw / f'{name}.jsonl'}\n"
    lines = [ln for ln in spec.splitlines() if not ln.startswith(("dataset_path:", "dataset_name:"))]
    (folder / yaml_name).write_text(source + "\n".join(lines) + "\n")
    if split == "test":  # the built-in YAML names train/validation splits the local file does not have
        text = (folder / yaml_name).read_text()
        text = text.replace("training_split: train", "training_split: null")
        (folder / yaml_name).write_text(
            text.replace("validation_split: validation", "validation_split: null")
        )
    else:
        (folder / yaml_name).write_text(
            (folder / yaml_name).read_text().replace("training_split: train", "training_split: null")
        )
    return folder


@pytest.mark.parametrize("name", list(STANDARD_TASKS))
def test_each_standard_task_gives_lm_evals_own_requests(tmp_path, name, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    raw = _raw_dir(tmp_path)
    ours = tmp_path / "tasks"
    assert prepare_tasks.prepare([name], str(ours), from_dir=str(raw)) == {name: 2}
    built_in = _built_in_with_local_data(name, tmp_path, raw)
    assert _requests(ours, name) == _requests(built_in, name)
    # the same metrics as lm-eval's YAML lists
    theirs = [m["metric"] for m in yaml.safe_load(
        "\n".join(ln for ln in (built_in / BUILT_IN[name][1]).read_text().splitlines() if "!function" not in ln)
    )["metric_list"]]  # fmt: skip
    assert [m["metric"] for m in STANDARD_TASKS[name].config()["metric_list"]] == theirs


def test_the_standard_set_is_the_contracts():
    assert (
        tuple(STANDARD_TASKS) == evaluation.DEFAULT_EVALUATION_TASKS == tuple(evaluation.STANDARD_TASK_CHANCE)
    )


def test_prepare_writes_yaml_and_data_and_overwrites_nothing(tmp_path, capsys):
    raw = _raw_dir(tmp_path)
    out = tmp_path / "tasks"
    assert prepare_tasks.main(["--output", str(out), "--from-dir", str(raw)]) == 0
    printed = capsys.readouterr().out
    assert "hellaswag: 2 examples (Rowan/hellaswag, split validation)" in printed
    assert '"task_data_uri": "s3://<bucket>/data/evaluation-tasks/"' in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{n}.yaml" for n in STANDARD_TASKS] + [t.data_file for t in STANDARD_TASKS.values()]
    )
    assert sorted(harness.known_tasks(out)) == sorted(STANDARD_TASKS)
    before = (out / "piqa.yaml").read_text()
    assert prepare_tasks.main(["--output", str(out), "--from-dir", str(raw), "--tasks", "piqa"]) == 2
    assert "already holds piqa.yaml, piqa.validation.jsonl" in capsys.readouterr().err
    assert (out / "piqa.yaml").read_text() == before


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--tasks", "mmlu"], "tasks: must be among hellaswag, arc_easy, piqa, winogrande; got mmlu"),
        (
            ["--tasks", "piqa", "--from-dir", "/nonexistent"],
            "from-dir: /nonexistent/piqa.jsonl does not exist",
        ),
    ],
)
def test_prepare_refuses_with_the_option_named(tmp_path, capsys, argv, fragment):
    assert prepare_tasks.main(["--output", str(tmp_path / "out"), *argv]) == 2
    assert fragment in capsys.readouterr().err


def test_rows_without_the_datasets_fields_are_refused_and_leave_no_file(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "winogrande.jsonl").write_text(json.dumps({"sentence": "no blank here", "option1": "a"}) + "\n")
    assert (
        prepare_tasks.main(
            ["--output", str(tmp_path / "out"), "--tasks", "winogrande", "--from-dir", str(raw)]
        )
        == 2
    )
    assert "winogrande: row 1 lacks the fields of allenai/winogrande" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # the folder it made is not left behind, empty


def test_the_hub_is_not_read_when_offline(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert prepare_tasks.main(["--output", str(tmp_path / "out"), "--tasks", "piqa"]) == 2
    assert "HF_DATASETS_OFFLINE or HF_HUB_OFFLINE is set" in capsys.readouterr().err


WITHOUT_BACKOFF = """
import runpy, sys, time, types
import huggingface_hub.utils._http as http
waits = []
http.time = types.SimpleNamespace(**{**vars(time), "sleep": waits.append})
sys.argv[0] = "prepare_tasks"
try:
    runpy.run_module("training.evaluate.prepare_tasks", run_name="__main__")
finally:
    print(f"backoff not waited: {sum(waits)} s in {len(waits)} waits", file=sys.stderr)
"""
"""``python -m training.evaluate.prepare_tasks``, but huggingface_hub's backoff between its retries of an unreachable
Hub (``utils._http.http_backoff``: 1, 2, 4, 8 and 8 s) is not waited: the retries and the failure are the same, the
23 s are not; the total goes to stderr (a last line the test reads and drops)."""


@pytest.mark.slow
def test_without_a_network_the_hub_failure_is_one_line(tmp_path):
    """No HF_*_OFFLINE variable, but no way out (every proxy a closed local port, a cache of its own): datasets'
    own ConnectionError and its traceback become one line naming the task, the dataset and what to do; exit 2; no
    folder left behind. (huggingface_hub retries 5 times, 23 s of backoff, before it gives up: not waited here.)"""
    import subprocess
    import sys

    closed = "http://127.0.0.1:9"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update({name: closed for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")})
    env.update(HF_HOME=str(tmp_path / "hf"), NO_PROXY="", no_proxy="", PYTHONPATH=str(ROOT))
    out = tmp_path / "tasks"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_BACKOFF, "--output", str(out), "--tasks", "piqa"],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    *lines, waited = done.stderr.strip().splitlines()
    retried = re.fullmatch(r"backoff not waited: [\d.]+ s in [1-9]\d* waits", waited)
    assert retried, done.stderr[-3000:]
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = lines
    assert line.startswith("error: piqa: cannot read baber/piqa (validation) from the Hugging Face Hub: ")
    assert line.endswith("(run where the Hub is reachable, or pass --from-dir)")
    assert (
        not out.exists()
        and done.stdout == "piqa: reading baber/piqa (validation) from the Hugging Face Hub\n"
    )
