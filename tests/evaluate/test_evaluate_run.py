"""The evaluation job's entry point (``evaluate.sh`` -> ``python -m training.evaluate``) on a tiny model this test trains
and exports, offline: a task the model memorized scores 1.0, the same questions with shuffled answers score what
chance gives; and the refusals before anything is scored (no tokenizer, unknown task, no export)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from tests.training.runner import TINY, env, run_single, toolkit_job
from training.contract import container, evaluation, settings_table
from training.evaluate import model_folder, run
from training.prepare import corpus
from training.trainer.checkpoint import export_hf

COLOURS = ["red", "blue", "green", "yellow"]
ITEMS = 24
ANSWERS = [random.Random(7 + i).randrange(4) for i in range(ITEMS)]
SHUFFLED = random.Random(11).sample(ANSWERS, ITEMS)
"""The control: the same answers, shuffled across the questions."""


def _question(i: int) -> str:
    """15 word-level tokens: with the answer and the end-of-document token a line is 17, one training window of
    seq_length 16, so every line is learnt at the position lm-eval scores it at (the start)."""
    return f"Question: please tell me exactly what colour is the item{i} here ? Answer:"


def _task(folder: Path, name: str, labels: list[int]) -> None:
    (folder / f"{name}.jsonl").write_text(
        "".join(
            json.dumps({"q": _question(i), "choices": COLOURS, "label": labels[i]}) + "\n"
            for i in range(ITEMS)
        )
    )
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {name}.jsonl\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{q}}'\ndoc_to_target: label\n"
        "doc_to_choice: choices\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A tiny model trained on "question answer" lines until it knows every answer, exported with its word-level
    tokenizer and packed as SageMaker packs /opt/ml/model; and a task folder: the memorized task and the
    shuffled-answer control."""
    tmp = tmp_path_factory.mktemp("evaluate")
    lines = [f"{_question(i)} {COLOURS[ANSWERS[i]]}" for i in range(ITEMS)]
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]))
    tokenizer.save(str(tmp / "tokenizer.json"))
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "lines.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    meta = corpus.prepare([str(tmp / "corpus")], str(tmp / "data"), tokenizer=str(tmp / "tokenizer.json"),
                           validation_fraction=0, block_tokens=16)  # fmt: skip
    settings = {**TINY, "vocab_size": str(meta["vocab_size"]), "seq_length": "16", "batch_size": "8",
                "max_steps": "300", "learning_rate": "0.01", "lr_warmup_steps": "10", "log_interval": "50",
                "checkpoint_interval": "0", "dataset": "channel", "data_dir": str(tmp / "data"),
                "checkpoint_dir": str(tmp / "ckpt"), "model_dir": str(tmp / "model")}  # fmt: skip
    status, output = run_single(settings, timeout=300)
    assert status == 0, output
    channel = tmp / "channel"
    channel.mkdir()
    with tarfile.open(channel / "model.tar.gz", "w:gz") as tar:  # as SageMaker packs /opt/ml/model
        for path in sorted((tmp / "model").iterdir()):
            tar.add(path, arcname=path.name)
    tasks = tmp / "tasks"
    tasks.mkdir()
    _task(tasks, "memorized", ANSWERS)
    _task(tasks, "shuffled", SHUFFLED)
    return {"tmp": tmp, "channel": channel, "tasks": tasks, "model": tmp / "model"}


def _offline_env(tmp: Path) -> dict[str, str]:
    """No network: the Hugging Face offline switches, and every proxy pointing at a closed local port."""
    out = env()
    out.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp / "hf"), PYTHON=os.sys.executable,
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="")  # fmt: skip
    return out


def _evaluation_job(trained: dict[str, Path], tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """An evaluation job's /opt/ml under ``tmp_path`` for the real sagemaker-training toolkit: the job's
    Environment (SAGEMAKER_PROGRAM=evaluate.sh) over the image's, the hyperparameters as Step Functions sends them,
    the model and tasks channels, no network (the offline switches; every proxy at a closed local port)."""
    command, child_env = toolkit_job(tmp_path, {"tasks": "memorized,shuffled", "batch_size": "16"})
    base = tmp_path / "opt_ml"
    data = base / "input" / "data"
    (data / container.MODEL_CHANNEL).mkdir(parents=True)
    shutil.copy(trained["channel"] / "model.tar.gz", data / container.MODEL_CHANNEL / "model.tar.gz")
    shutil.copytree(trained["tasks"], data / container.TASKS_CHANNEL)
    channels = {
        name: {"TrainingInputMode": "File"} for name in (container.MODEL_CHANNEL, container.TASKS_CHANNEL)
    }
    (base / "input" / "config" / "inputdataconfig.json").write_text(json.dumps(channels))
    child_env.update(
        {k: v for k, v in _offline_env(tmp_path).items() if k.startswith(("HF_", "HTTP", "NO_"))}
    )
    child_env[container.PROGRAM_ENV] = container.EVALUATE_ENTRY_POINT
    return command, child_env, base


@pytest.mark.slow
def test_a_memorized_task_scores_1_and_shuffled_answers_score_chance(trained, tmp_path):
    """As in an evaluation job, offline; then a refusal becomes the job's failure reason."""
    command, child_env, base = _evaluation_job(trained, tmp_path)
    proc = subprocess.run(command, env=child_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dict(filter(None, (evaluation.parse_evaluation_line(line) for line in proc.stdout.splitlines())))
    scores = json.loads((base / "output" / "data" / "scores.json").read_text())
    for task in (
        "memorized",
        "shuffled",
    ):  # the printed lines (6 significant digits) say what scores.json says
        assert lines[task] == pytest.approx(
            {k: v for k, v in scores[task].items() if k != "samples"}, rel=1e-5
        )
    assert scores["memorized"]["acc"] == 1.0 and scores["memorized"]["acc_norm"] == 1.0
    assert scores["memorized"]["samples"] == ITEMS and scores["memorized"]["acc_stderr"] == 0.0
    # the model answers what it memorized, so a shuffled label is right exactly where it falls on that answer
    chance = sum(a == s for a, s in zip(ANSWERS, SHUFFLED, strict=True)) / ITEMS
    assert scores["shuffled"]["acc"] == pytest.approx(chance) and 0.1 <= chance <= 0.4
    assert scores["shuffled"]["acc_stderr"] > 0.05
    results = json.loads((base / "output" / "data" / "results.json").read_text())
    assert results["lm_eval_version"] == "0.4.13" and set(results["results"]) == {"memorized", "shuffled"}
    (base / "input" / "config" / "hyperparameters.json").write_text(json.dumps({"tasks": "mmlu"}))
    proc = subprocess.run(command, env=child_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    failure = (base / "output" / container.FAILURE_FILE).read_text()
    assert (
        failure.startswith("invalid setting tasks: mmlu not defined in ")
        and "define: memorized, shuffled" in failure
    )


def test_scores_go_to_the_evaluated_runs_mlflow_run_when_its_variables_are_set(tmp_path, monkeypatch):
    """Run by hand with MLflow's variables set (the workflow's evaluation jobs, always network-isolated, get none):
    the MLflow client the image has, on a file store standing in for the tracking server, and the run named
    gets eval/<task>/<field> metrics and the evaluation's settings."""
    import mlflow

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv(
        "MLFLOW_ALLOW_FILE_STORE", "true"
    )  # MLflow 3 keeps the file store for tests behind a flag
    monkeypatch.setenv(container.MLFLOW_TRACKING_URI_ENV, uri)
    monkeypatch.setenv(container.MLFLOW_EXPERIMENT_ENV, "Test-Workflow")
    monkeypatch.setenv(container.MLFLOW_RUN_NAME_ENV, "run-1")
    scores = {"piqa": {"acc": 0.6, "acc_stderr": 0.01, "samples": 1838}}
    settings = {"tasks": ["piqa"], "limit": None, "batch_size": 32, "dtype": "auto", "seed": 1234}
    run.report(scores, {"results": {}}, tmp_path / "out", settings)
    client = mlflow.MlflowClient(tracking_uri=uri)
    (found,) = client.search_runs([client.get_experiment_by_name("Test-Workflow").experiment_id])
    assert found.info.run_name == "run-1" and found.info.status == "FINISHED"
    assert found.data.metrics == {"eval/piqa/acc": 0.6, "eval/piqa/acc_stderr": 0.01}
    assert found.data.params["eval_tasks"] == "piqa" and found.data.params["eval_batch_size"] == "32"


def _hf_folder(tmp_path: Path, readme: str = "") -> Path:
    """A loadable Llama folder of random weights (no tokenizer files)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "hf"
    config = LlamaConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    if readme:
        (folder / "README.md").write_text(readme)
    return folder


@pytest.fixture
def offline(monkeypatch, tmp_path):
    for name, value in run.OFFLINE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


def test_a_byte_level_model_is_refused_with_the_reason(tmp_path, capsys, offline):
    text = export_hf.write_tokenizer(
        {"dataset": "channel", "tokenizer": {"kind": "byte-level UTF-8", "eos_id": 256}}, tmp_path, 64
    )
    folder = _hf_folder(tmp_path, readme=f"## Tokenizer\n\n{text}\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _task(tasks, "memorized", ANSWERS)
    capsys.readouterr()
    status = run.main(["--tasks", "memorized", "--model_dir", str(folder), "--tasks_dir", str(tasks)])
    error = capsys.readouterr().err
    assert status == 2 and error.startswith(f"error: model: {folder} has no tokenizer files")
    assert "trained on byte-level tokens" in error and "--tokenizer tokenizer.json" in error


def test_an_unknown_task_is_refused_naming_the_folders_tasks(tmp_path, capsys, offline):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _task(tasks, "memorized", ANSWERS)
    status = run.main(["--tasks", "memorized,mmlu", "--model_dir", str(tmp_path), "--tasks_dir", str(tasks)])
    assert status == 2
    assert capsys.readouterr().err.strip() == (
        f"error: invalid setting tasks: mmlu not defined in {tasks} (its YAML files define: memorized)"
    )


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--tasks", "a,a"], "tasks: must be 1 to 10 distinct task names"),
        (["--tasks", ",".join(f"t{i}" for i in range(11))], "tasks: must be 1 to 10 distinct task names"),
        (["--limit", "0"], "limit: must be an integer in [1, 100000000]; got '0'"),
        (["--dtype", "int8"], "dtype: must be one of auto, bfloat16, float16, float32; got 'int8'"),
    ],
)
def test_bad_settings_are_refused_before_anything_loads(tmp_path, capsys, offline, argv, fragment):
    assert run.main([*argv, "--tasks_dir", str(tmp_path)]) == 2
    assert fragment in capsys.readouterr().err


def test_an_archive_without_the_export_says_why(tmp_path):
    (tmp_path / "model.pt").write_text("not a model")
    archive = tmp_path / "channel" / "model.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "model.pt", arcname="model.pt")
    with pytest.raises(
        model_folder.ModelFolderError, match=r"holds no hf/ folder: the run wrote no Hugging Face"
    ):
        model_folder.locate(archive.parent, tmp_path / "work")


def test_only_the_export_is_extracted_and_links_out_of_it_are_refused(tmp_path):
    folder = _hf_folder(tmp_path)
    archive = tmp_path / "model.tar.gz"
    (tmp_path / "model.pt").write_bytes(b"training state")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "model.pt", arcname="model.pt")
        tar.add(folder, arcname="hf")
    found = model_folder.locate(archive, tmp_path / "work")
    assert found == tmp_path / "work" / "hf" and (found / "config.json").is_file()
    assert not (tmp_path / "work" / "model.pt").exists()
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("hf/../../outside.txt")
        info.size = 1
        tar.addfile(info, __import__("io").BytesIO(b"x"))
    with pytest.raises(model_folder.ModelFolderError, match="cannot read"):
        model_folder.locate(evil, tmp_path / "work2")
    assert not (tmp_path / "outside.txt").exists()


def test_the_folder_itself_or_its_hf_folder_is_used_as_it_is(tmp_path):
    folder = _hf_folder(tmp_path)
    assert model_folder.locate(folder, tmp_path / "w") == folder
    assert model_folder.locate(tmp_path, tmp_path / "w") == folder


def test_a_failure_of_lm_eval_itself_becomes_the_jobs_failure_reason(tmp_path, monkeypatch, offline):
    from training.evaluate import harness

    folder = _hf_folder(tmp_path)
    (folder / "tokenizer.json").write_text("{}")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _task(tasks, "memorized", ANSWERS)
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path / "model"))  # as under the SageMaker toolkit
    monkeypatch.setenv("SM_OUTPUT_DIR", str(tmp_path / "output"))

    def broken(*_args, **_kwargs):
        raise RuntimeError("CUDA out of memory\nmore detail")

    monkeypatch.setattr(harness, "run", broken)
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        run.main(["--tasks", "memorized", "--model_dir", str(folder), "--tasks_dir", str(tasks)])
    failure = (tmp_path / "output" / container.FAILURE_FILE).read_text()
    assert failure == "evaluation failed: RuntimeError: CUDA out of memory\n"


def test_by_hand_each_evaluation_gets_a_folder_of_its_own_and_none_is_written_over(tmp_path, monkeypatch):
    """Outside a job an evaluation writes into a new folder under evaluations/ (named by the model and the time);
    a folder given that already holds an evaluation's files is refused before anything runs."""
    from datetime import UTC, datetime

    monkeypatch.chdir(tmp_path)
    now = datetime(2026, 7, 1, 12, 0, 0, tzinfo=UTC)
    assert run.output_folder(None, "trainer-output/custom-2x64-fp32-1234abcd/model", now) == Path(
        "evaluations/custom-2x64-fp32-1234abcd-20260701-120000"
    )
    assert run.output_folder(None, "my-model", now).name == "my-model-20260701-120000"
    taken = tmp_path / "scores"
    taken.mkdir()
    assert run.output_folder(str(taken), "m") == taken  # an empty folder is fine
    (taken / "scores.json").write_text("{}")
    with pytest.raises(settings_table.ContractError, match=r"^output_dir: .* already holds scores.json"):
        run.output_folder(str(taken), "m")
    # what the run recorded beside its model: its settings.json (the newest settings-N.json of several)
    model = tmp_path / "model"
    (model / "hf").mkdir(parents=True)
    assert run.run_settings(model / "hf") is None
    (model / "settings.json").write_text(json.dumps({"precision": "bf16", "max_steps": 10, "lr": 1}))
    (model / "settings-2.json").write_text(json.dumps({"precision": "bf16", "max_steps": 20}))
    recorded = run.run_settings(model / "hf")
    assert (recorded["precision"], recorded["max_steps"], recorded["file"]) == (
        "bf16",
        20,
        str(model / "settings-2.json"),
    )
