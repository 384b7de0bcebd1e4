"""``evaluate``, ``compare`` and the scores in ``result``, against the stack in moto (see ``conftest.py``): the real
synthesized workflow runs the evaluation-only execution, its job lives in moto's SageMaker with the scores SageMaker
would have read from its log lines."""

from __future__ import annotations

import json

import pytest

from tests.workflow.harness import OUTCOMES, Outcome
from training.contract.container import EVALUATE_ENTRY_POINT, MODEL_CHANNEL

FINAL = (("final:final_loss", 2.25), ("final:val_loss", 2.5))
SCORES = (("eval:piqa:acc", 0.625), ("eval:piqa:acc_stderr", 0.0113), ("eval:piqa:acc_norm", 0.6375),
          ("eval:piqa:acc_norm_stderr", 0.0112))  # fmt: skip


@pytest.fixture(scope="module")
def data(deployed):
    """Prepared data with a tokenizer, byte-level data, and a task folder defining piqa, under corpus/."""
    s3, bucket = deployed.workflow.s3, deployed.bucket
    for folder, kind in (("words", "tokenizers"), ("bytes", "byte-level UTF-8")):
        meta = {"tokenizer": {"kind": kind, "file": "tokenizer.json"}}
        s3.put_object(Bucket=bucket, Key=f"corpus/{folder}/metadata.json", Body=json.dumps(meta))
        s3.put_object(Bucket=bucket, Key=f"corpus/{folder}/train.bin", Body=b"t")
    s3.put_object(Bucket=bucket, Key="corpus/words/tokenizer.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key="corpus/tasks/piqa.yaml", Body=b"task: piqa\n")
    return f"s3://{bucket}/corpus/"


def _trained(
    cli, deployed, data, folder: str = "words", precision: str = "bf16", outcome=None
) -> tuple[str, str]:
    prefix = deployed.prefix()
    deployed.plan(prefix, outcome or Outcome(final_metrics=FINAL), Outcome(final_metrics=SCORES))
    name = f"run-{prefix}"
    result = cli("submit", "--name", name, "--set", f"job_name_prefix={prefix}", "--set", f"precision={precision}",
                 "--set", f"train_data_uri={data}{folder}/", "--wait")  # fmt: skip
    return name, prefix if result.status == 0 else result.err


def test_evaluate_a_finished_run_then_result_and_compare_show_its_scores(deployed, cli, data):
    name, prefix = _trained(cli, deployed, data)
    started = cli(
        "evaluate", name, "--tasks-uri", f"{data}tasks/", "--tasks", "piqa", "--limit", "50", "--json"
    )
    assert started.status == 0, started.err
    evaluation = json.loads(started.out)
    assert evaluation["name"].startswith(f"{name}-eval-") and evaluation["evaluates"] == name
    assert deployed.wait_until_ended(evaluation["name"])["status"] == "SUCCEEDED"
    train_request, eval_request = OUTCOMES.requests[prefix]  # the run's training job, then the evaluation's
    assert eval_request["Environment"]["SAGEMAKER_PROGRAM"] == EVALUATE_ENTRY_POINT
    assert eval_request["HyperParameters"] == {"tasks": "piqa", "batch_size": "32", "limit": "50"}
    channels = {
        c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in eval_request["InputDataConfig"]
    }
    assert channels[MODEL_CHANNEL].endswith(f"/{train_request['TrainingJobName']}/output/model.tar.gz")
    # result of the evaluation run: its scores and the run it evaluated
    summary = json.loads(cli("result", evaluation["name"], "--json").out)
    assert summary["evaluation"]["scores"] == {"piqa": {k.split(":")[2]: v for k, v in SCORES}}
    assert summary["evaluation"]["evaluated"]["run"] == name
    text = cli("result", evaluation["name"]).out
    assert "score piqa" in text and "acc 0.625 ± 0.011, acc_norm 0.637 ± 0.011 (chance 0.50)" in text
    # the training run's own result finds the later evaluation (tagged with the run it evaluated)
    assert json.loads(cli("result", name, "--json").out)["evaluation"]["scores"]["piqa"]["acc"] == 0.625


def test_compare_prints_scores_beside_the_final_losses(deployed, cli, data):
    first, _ = _trained(cli, deployed, data, precision="bf16")
    second, prefix = _trained(cli, deployed, data, precision="fp8")
    for run in (first, second):
        started = cli(
            "evaluate", run, "--tasks-uri", f"{data}tasks/", "--tasks", "piqa", "--name", f"{run}-e"
        )
        assert started.status == 0, started.err
        assert deployed.wait_until_ended(f"{run}-e")["status"] == "SUCCEEDED"
    rows = json.loads(cli("compare", first, f"{second}-e", "--json").out)
    assert [(r["run"], r["trained_run"], r["precision"], r["final_loss"], r["val_loss"]) for r in rows] == [
        (first, first, "bf16", 2.25, 2.5), (f"{second}-e", second, "fp8", 2.25, 2.5)]  # fmt: skip
    assert all(r["scores"]["piqa"]["acc_norm"] == 0.6375 for r in rows)
    table = cli("compare", first, f"{second}-e").out
    assert (
        "piqa (chance 0.50)" in table and "final loss" in table and "0.625 ± 0.011 / 0.637 ± 0.011" in table
    )
    assert f"{second}-e (of {second})" in table and "2.2500" in table


def test_a_run_without_an_exported_model_is_refused_before_anything_starts(deployed, cli, data):
    failed, _ = _trained(cli, deployed, data, outcome=Outcome("Failed", "AlgorithmError: boom"))
    result = cli("evaluate", failed, "--tasks-uri", f"{data}tasks/")
    assert result.status == 3
    assert result.err.startswith(
        f"error: run {failed} has no exported model to evaluate (FAILED, its training job"
    )
    before = set(deployed.executions())
    byte_level, _ = _trained(cli, deployed, data, folder="bytes")
    refused = cli("evaluate", byte_level, "--tasks-uri", f"{data}tasks/", "--tasks", "piqa")
    assert refused.status == 2 and "was trained on byte-level tokens" in refused.err
    unknown = cli("evaluate", byte_level, "--tasks-uri", f"{data}tasks/", "--tasks", "mmlu")
    assert unknown.status == 2 and "evaluate.tasks: mmlu not defined in the task folder" in unknown.err
    outside = cli("evaluate", byte_level, "--tasks-uri", "s3://elsewhere/tasks/")
    assert outside.status == 2 and "evaluate.task_data_uri: must be the task folder" in outside.err
    assert set(deployed.executions()) - before == {byte_level}  # no evaluation started


def test_result_shows_no_later_scores_when_the_caller_may_not_search():
    from botocore.exceptions import ClientError

    from constructs_lib.cli.evaluation import later_evaluation

    class Refusing:
        def search(self, **_kwargs):
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "Search")

    class Runs:
        def client(self, _service):
            return Refusing()

    assert later_evaluation(Runs(), "run-1") is None


def _local_results(folder, model_dir, precision: str, max_steps: int, acc: float) -> None:
    """A results folder as ``python -m training.evaluate`` writes it (its own ``report``), for a model folder whose
    run left its settings.json beside the Hugging Face export."""
    from training.evaluate.run import report

    hf = model_dir / "hf"
    hf.mkdir(parents=True)
    (model_dir / "settings.json").write_text(json.dumps({"precision": precision, "max_steps": max_steps}))
    scores = {
        "colours": {"acc": acc, "acc_stderr": 0.07, "acc_norm": acc, "acc_norm_stderr": 0.07, "samples": 24}
    }
    report(scores, {"results": {}}, folder, {"tasks": ["colours"]}, hf)


def test_compare_of_local_results_folders_needs_no_aws(tmp_path, monkeypatch, capsys):
    """Local results folders side by side: their scores, and the precision and max_steps of the runs whose models
    they evaluated; no region, no credentials, no AWS call (a run name beside them is refused in one line)."""
    from constructs_lib.cli.main import main

    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.chdir(tmp_path)
    _local_results(tmp_path / "long", tmp_path / "runs" / "a" / "model", "fp32", 300, 0.875)
    _local_results(tmp_path / "short", tmp_path / "runs" / "b" / "model", "bf16", 30, 0.25)
    capsys.readouterr()
    assert main(["compare", "long", "short", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["precision"], r["max_steps"]) for r in rows] == [
        ("long", "fp32", 300),
        ("short", "bf16", 30),
    ]
    assert rows[0]["scores"] == {
        "colours": {"acc": 0.875, "acc_stderr": 0.07, "acc_norm": 0.875, "acc_norm_stderr": 0.07}
    }
    assert rows[1]["trained_run"] == str(tmp_path / "runs" / "b" / "model" / "hf")
    assert main(["compare", "long", "short"]) == 0
    table = capsys.readouterr().out
    assert "0.875 ± 0.070 / 0.875 ± 0.070" in table and "0.250 ± 0.070" in table and "colours" in table
    assert "final loss" not in table  # a results folder has no losses: no column of dashes
    assert main(["compare", "long", "some-run"]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "long are local results folders but some-run are not" in line
