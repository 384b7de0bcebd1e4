"""``blackwell-training tune`` / ``tune-apply`` / ``result`` / ``plan`` against the workflow in moto: the trials and
cost before launch (offline and deployed), a tuning run followed to its ranked table, the winning request written
from the run's own input, and the plan's throughput an "estimate" before a tuning run's records exist and
"measured" after."""

from __future__ import annotations

import json
import time

from moto.sagemaker.models import sagemaker_backends

from tests.workflow.harness import ACCOUNT, REGION, Outcome
from tests.workflow.stacks import IMAGE_TAG
from training.contract import hardware
from training.tune import report
from training.tune.outcome import TrialResult
from training.tune.stability import Spread

B200 = hardware.DEFAULT_INSTANCE_TYPE
TUNE = {"search_space": {"batch_size": [1, 2, 4], "activation_checkpointing": ["full"]}, "max_trials": 3}
"""With a request of batch_size 4: 4 sequences per optimizer step, split by each candidate's accumulation."""


def tuning_report(name: str, bucket: str) -> dict[str, str]:
    """The files a tuning job on 8 x B200 leaves in its checkpoint folder's tune/ (the driver's own functions)."""
    base = {"precision": "bf16", "batch_size": "4", "seq_length": "8192", "activation_checkpointing": "none",
            "max_steps": "1000"}  # fmt: skip
    place = report.Where(B200, 1, "cuda", "B200", 8, IMAGE_TAG, "2.9.0", "2.11.0", "tune-job-7",
                         "2026-11-23T10:00:00+00:00", "algo-1")  # fmt: skip
    rows = []
    for index, (batch, seconds) in enumerate(((4, 1.2), (2, 0.9), (1, None)), start=1):
        settings = {"batch_size": batch, "activation_checkpointing": "full", "grad_accum_steps": 4 // batch}
        result = TrialResult(index, settings, status="ok")
        if seconds is None:
            result.status, result.error = "oom", "torch.OutOfMemoryError: CUDA out of memory"
        else:
            result.step_times = [seconds] * 12
            result.spread = Spread.of(result.step_times)
            result.summary, result.config = (
                {"max_allocated_gb": 30.0, "max_reserved_gb": 34.0},
                {"world_size": "8"},
            )
        rows.append(report.make_row(result, base, place))
    rows = report.rank(rows)
    best = report.winner(rows)
    return {
        "report.json": report.report_json(
            rows, place, {"notes": ["measured on 8 x B200"], "convergence": []}
        ),
        "winner.json": json.dumps({"trial": best.trial, "settings": best.settings}),
        "measurements.json": json.dumps({"records": report.records(rows, base, place)}),
    }


def tuning_job(deployed):
    """A new tuning run's prefix, name and report folder, and the CLI's sleep while it waits: the job writes its
    report into its checkpoint folder (SageMaker uploads it), then completes."""
    prefix = deployed.prefix()
    deployed.plan(prefix, Outcome("InProgress"))
    name = f"tune-{prefix}"
    folder = f"checkpoints/Test-Workflow/{name}/tune/"

    def job_runs(_seconds: float) -> None:
        job = deployed.wait_for_job(prefix)
        if not deployed.workflow.s3.list_objects_v2(Bucket=deployed.bucket, Prefix=folder).get("KeyCount"):
            for file, body in tuning_report(name, deployed.bucket).items():
                deployed.workflow.s3.put_object(Bucket=deployed.bucket, Key=folder + file, Body=body)
            deployed.finish(job)
        time.sleep(0.05)

    return prefix, name, folder, job_runs


def test_tune_dry_run_shows_the_trials_and_the_cost_offline(cli, tmp_path):
    request = tmp_path / "run.json"
    request.write_text(
        json.dumps({"precision": "bf16", "batch_size": 4, "tune": {**TUNE, "max_cost_usd": 150}})
    )
    result = cli("tune", str(request), "--dry-run")
    assert result.status == 0, result.err
    assert "Tuning plan: 3 trials of 3 combinations on 1 x ml.p6-b200.48xlarge" in result.out
    assert (
        result.out.count(" estimate ") == 3  # each trial says its basis, on a line of its own
        and "at most $" in result.out
        and "left out: 0 predicted not to fit" in result.out
    )
    data = json.loads(cli("tune", str(request), "--dry-run", "--json").out)
    assert [t["settings"]["batch_size"] for t in data["plan"]["trials"]] == [4, 2, 1]
    assert data["plan"]["max_cost_usd"] <= 150


def test_tune_refuses_before_starting_naming_the_field(deployed, cli):
    prefix = deployed.prefix()
    for tune, words in (
        ({"search_space": {}}, "tune.search_space: must name at least one setting"),
        ({"max_trials": 99}, "tune.max_trials: must be an integer in [1, 32]; got 99"),
        ({"max_cost_usd": 2}, "tune.max_cost_usd: must cover at least one trial"),
    ):
        result = cli("tune", "-", "--set", f"job_name_prefix={prefix}", stdin=json.dumps({"tune": tune}))
        assert result.status == 2 and words in result.err, result.err
    assert deployed.workflow.jobs(prefix) == []
    assert not any(e.startswith(prefix) for e in deployed.executions())  # nothing started


def test_a_tuning_run_is_followed_to_its_ranked_table_and_its_winning_request(deployed, cli, tmp_path):
    prefix, name, folder, job_runs = tuning_job(deployed)

    winner_settings = ("--set", "batch_size=2", "--set", "activation_checkpointing=full",
                       "--set", "hyperparameters.grad_accum_steps=2")  # fmt: skip
    before = json.loads(cli("plan", "--deployed", "--json", *winner_settings).out)
    assert before["throughput_basis"] == "estimate"
    request = {
        "job_name_prefix": prefix,
        "precision": "bf16",
        "batch_size": 4,
        "tags": {"team": "llm"},
        "tune": TUNE,
    }
    out = tmp_path / "winner.json"
    result = cli("tune", "-", "--name", name, "--wait", "--interval", "1", "--apply", str(out),
                 stdin=json.dumps(request), sleep=job_runs)  # fmt: skip
    assert result.status == 0, result.err + result.out
    assert "Tuning plan: 3 trials" in result.out and f"started tuning run {name}" in result.out
    assert "Tuning: measured on 8 x B200 for 1 x ml.p6-b200.48xlarge (image v1" in result.out
    assert "oom: torch.OutOfMemoryError: CUDA out of memory" in result.out
    assert (
        'winner: {"batch_size": 2, "activation_checkpointing": "full", "grad_accum_steps": 2}' in result.out
    )
    (job,) = deployed.workflow.jobs(prefix)
    assert json.loads(out.read_text()) == {
        "job_name_prefix": prefix, "precision": "bf16", "tags": {"team": "llm"}, "batch_size": 2,
        "activation_checkpointing": "full", "hyperparameters": {"grad_accum_steps": 2},
    }  # fmt: skip
    assert cli("validate", str(out)).status == 0  # ready to submit
    again = cli("tune-apply", name, str(out))
    assert again.status == 3 and "exists already" in again.err
    shown = cli("result", name)
    assert (
        shown.status == 0
        and "Tuning: measured on 8 x B200" in shown.out
        and f"report: s3://{deployed.bucket}/{folder}" in shown.out
    )
    assert (
        json.loads(cli("result", name, "--json").out)["tune_report"]["winner"]["settings"]["batch_size"] == 2
    )
    after = json.loads(cli("plan", "--deployed", "--json", *winner_settings).out)
    assert after["throughput_basis"] == "measured" and after["tokens_per_sec_per_gpu"] == round(
        4 * 8192 / 0.9
    )
    assert "tuning job tune-job-7" in after["throughput_source"]
    text = cli("plan", "--deployed", *winner_settings).out
    assert "tokens/s per GPU (measured)" in text and "memory estimate against 2 stored measurement(s)" in text
    offline = json.loads(cli("plan", "--json", *winner_settings).out)
    assert offline["throughput_basis"] == "estimate"  # offline: no image, no records


def test_tune_apply_of_a_run_without_a_report_says_so(deployed, cli, tmp_path):
    prefix = deployed.prefix()
    deployed.plan(prefix, Outcome("Completed"))
    name = f"run-{prefix}"
    assert cli("submit", "--name", name, "--set", f"job_name_prefix={prefix}").status == 0
    deployed.wait_until_ended(name)
    result = cli("tune-apply", name, str(tmp_path / "w.json"))
    assert result.status == 3 and f"run {name} has no tuning report at s3://" in result.err


def test_a_tuning_run_starting_from_init_from_plans_with_the_models_config_and_starts(deployed, cli):
    """The CLI reads the init_from folder's config.json (as the workflow does) before it plans and checks the
    tuning run, so `tune` with init_from is shown and started; offline it is refused, naming init_from."""
    from training.contract.settings_parse import parse_hyperparameters
    from training.request import hf_config

    prefix = deployed.prefix()
    folder = f"corpus/{prefix}/llama/"
    config = hf_config.to_config(parse_hyperparameters({"model_preset": "llama3.2-3b"}))
    deployed.workflow.s3.put_object(
        Bucket=deployed.bucket, Key=f"{folder}config.json", Body=json.dumps(config)
    )
    deployed.workflow.s3.put_object(Bucket=deployed.bucket, Key=f"{folder}model.safetensors", Body=b"w")
    request = {"job_name_prefix": prefix, "init_from": f"s3://{deployed.bucket}/{folder}", "batch_size": 2,
               "tune": {"search_space": {"batch_size": [1, 2]}, "max_trials": 2}}  # fmt: skip
    offline_request = {
        **request,
        "init_from": f"s3://{deployed.bucket}/data/llama/",
    }  # cdk.json's data source
    offline = cli("tune", "-", "--dry-run", stdin=json.dumps(offline_request))
    assert (
        offline.status == 2
        and "init_from: the tuning plan needs the model folder's config.json" in offline.err
    ), offline.err
    validated = cli(
        "validate", "-", "--json", stdin=json.dumps(offline_request)
    )  # valid, the candidates not checked
    assert any(line.startswith("init_from: the model folder's config.json") for line in json.loads(validated.out)[
        "not_checked"])  # fmt: skip
    shown = json.loads(cli("tune", "-", "--dry-run", "--deployed", "--json", stdin=json.dumps(request)).out)
    assert [t["settings"]["batch_size"] for t in shown["plan"]["trials"]] == [2, 1]
    same_shape = {k: v for k, v in request.items() if k != "init_from"}
    same_shape["hyperparameters"] = {"model_preset": "llama3.2-3b"}
    preset = json.loads(cli("tune", "-", "--dry-run", "--json", stdin=json.dumps(same_shape)).out)
    default = json.loads(
        cli("tune", "-", "--dry-run", "--json", stdin=json.dumps(same_shape | {"hyperparameters": {}})).out
    )
    peaks = [t["predicted_peak_gib"] for t in shown["plan"]["trials"]]
    assert peaks == [t["predicted_peak_gib"] for t in preset["plan"]["trials"]]  # planned with the 3B's shape
    assert peaks != [t["predicted_peak_gib"] for t in default["plan"]["trials"]]
    deployed.plan(prefix, Outcome("InProgress"))
    name = f"tune-{prefix}"
    started = cli("tune", "-", "--name", name, stdin=json.dumps(request))
    assert started.status == 0, started.err
    job = deployed.wait_for_job(prefix)
    hyperparameters = sagemaker_backends[ACCOUNT][REGION].training_jobs[job].hyper_parameters
    assert hyperparameters["tune_trials"] == "batch_size=2,grad_accum_steps=1;batch_size=1,grad_accum_steps=2"
    assert hyperparameters["init_from"] == "/opt/ml/input/data/weights"  # the model folder's channel
    deployed.finish(job)
    assert deployed.wait_until_ended(name)["status"] == "SUCCEEDED"


def test_tune_json_wait_apply_prints_one_json_object(deployed, cli, tmp_path):
    prefix, name, _, job_runs = tuning_job(deployed)
    out = tmp_path / "winner.json"
    request = {"job_name_prefix": prefix, "precision": "bf16", "batch_size": 4, "tune": TUNE}
    result = cli("tune", "-", "--name", name, "--json", "--wait", "--interval", "1", "--apply", str(out),
                 stdin=json.dumps(request), sleep=job_runs)  # fmt: skip
    assert result.status == 0, result.err + result.out
    data = json.loads(result.out)  # the whole output is one object
    assert set(data) == {"plan", "name", "arn", "links", "status", "report", "written"}
    assert data["name"] == name and data["status"]["status"] == "SUCCEEDED"
    assert data["report"]["winner"]["settings"]["batch_size"] == 2
    assert data["written"] == {"written": str(out), "request": json.loads(out.read_text())}
