"""Tuning runs through the synthesized state machine in moto: a ``tune`` input launches one tuning job (the same
image, instance type and count, the request check's trials and bounds), its summary names the report and the
winner and stores the measurement records, the next request's plan uses them ("measured"), and every refusal
comes before anything is launched, naming its field."""

from __future__ import annotations

import json
import uuid

import aws_cdk as cdk
import pytest

from constructs_lib._shared.nag import logical_id
from tests.cdk_helpers import synth_with_nag
from tests.workflow.harness import OUTCOMES, REGION, Outcome, definition_of, moto_workflow
from tests.workflow.stacks import IMAGE_TAG, build_workflow
from training.contract import container, hardware, settings_table
from training.contract import tuning as contract_tuning
from training.plan import inputs
from training.request import tuning, tuning_plan
from training.request.rules import RequestRules
from training.tune import report, session
from training.tune.outcome import TrialResult
from training.tune.stability import Spread

SEGMENT = "Test-Workflow"
TUNE = {"search_space": {"batch_size": [1, 2, 4], "activation_checkpointing": ["full"]}, "max_trials": 3}
BASE = {"batch_size": 4}
"""4 sequences per optimizer step, which each candidate's micro-batch and accumulation split."""


@pytest.fixture(scope="module")
def synthesized():
    holder = {}

    def build(app: cdk.App) -> None:
        holder["workflow"] = build_workflow(app, capacity_retry_wait=cdk.Duration.seconds(1))

    result = synth_with_nag(build)
    assert result.violations == ()
    template = result.templates["Test.template.json"]
    return holder["workflow"], template, "fake-" + logical_id(holder["workflow"].bucket).lower()


@pytest.fixture(scope="module")
def workflow(synthesized):
    _, template, bucket = synthesized
    with moto_workflow(definition_of(template)) as wf:
        wf.s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        yield wf


@pytest.fixture(scope="module")
def rules(workflow) -> RequestRules:
    return RequestRules.from_state_machine_definition(workflow.definition)


def _prefix() -> str:
    return "u" + uuid.uuid4().hex[:12]


def _summary(result: dict) -> dict:
    assert result["status"] == "SUCCEEDED", result
    return json.loads(result["output"])


def records_file(hyperparameters: dict[str, str], measured: dict[int, float]) -> str:
    """The ``measurements.json`` a tuning job on 8 x B200 with this image writes (the driver's own functions), for
    trials of micro-batch -> median step seconds."""
    base = {k: v for k, v in hyperparameters.items() if k in settings_table.HYPERPARAMETERS_BY_NAME}
    place = report.Where(hardware.DEFAULT_INSTANCE_TYPE, 1, "cuda", "B200", 8, IMAGE_TAG, "2.9.0", "2.11.0",
                         "tune-job", "2026-11-23T10:00:00+00:00", "algo-1")  # fmt: skip
    rows = []
    for index, (batch, seconds) in enumerate(measured.items(), start=1):
        result = TrialResult(index, {"batch_size": batch, "activation_checkpointing": True}, status="ok")
        result.step_times = [seconds] * 12
        result.spread = Spread.of(result.step_times)
        result.summary, result.config = (
            {"max_allocated_gb": 20.0 + batch, "max_reserved_gb": 24.0 + batch},
            {"world_size": "8"},
        )
        rows.append(report.make_row(result, base, place))
    return json.dumps({"records": report.records(report.rank(rows), base, place)})


def test_a_tune_input_runs_one_tuning_job_whose_summary_names_the_report_the_winner_and_the_records(
    workflow, synthesized, rules
):
    _, _, bucket = synthesized
    prefix, name = _prefix(), f"tune-{uuid.uuid4().hex[:8]}"
    folder = f"checkpoints/{SEGMENT}/{name}/tune/"
    winner = {"trial": 2, "settings": {"batch_size": 2, "activation_checkpointing": True}, "mfu": 0.31}
    OUTCOMES.plan(prefix, Outcome(uploads=((bucket, folder + "winner.json", json.dumps(winner)),)))
    result = workflow.run({"job_name_prefix": prefix, **BASE, "tune": TUNE}, name)
    summary = _summary(result)
    (request,) = OUTCOMES.requests[prefix]  # one job for every trial
    tuned = tuning_plan.plan_tuning(
        *inputs.parse_request({**rules.full_defaults(), **BASE, "tune": TUNE}), tuning.parse_tune(TUNE, hardware.DEFAULT_INSTANCE_TYPE)[0],
        max_runtime_seconds=86_400,
    )  # fmt: skip
    hyperparameters = request["HyperParameters"]
    assert len(tuned.trials) == 3 and {c.overrides["grad_accum_steps"] for c in tuned.trials} == {1, 2, 4}
    assert contract_tuning.parse_trials(hyperparameters["tune_trials"]) == [c.trial() for c in tuned.trials]
    assert hyperparameters["tune_image_uri"] == request["AlgorithmSpecification"]["TrainingImage"]
    assert hyperparameters["tune_instance_type"] == request["ResourceConfig"]["InstanceType"]
    assert hyperparameters["checkpoint_dir"] == container.CHECKPOINT_LOCAL_PATH  # the report's folder
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == tuned.max_runtime_seconds
    assert request["CheckpointConfig"]["S3Uri"] == f"s3://{bucket}/checkpoints/{SEGMENT}/{name}/"
    tune = summary["tune"]
    assert tune["report_uri"] == f"s3://{bucket}/{folder}"
    assert tune["winner"] == {"value": winner}
    assert tune["outcome"] == f"winner: trial 2; the report is at s3://{bucket}/{folder}"
    assert tune["plan"]["trials"][0]["settings"] == tuned.trials[0].overrides
    assert "model_artifacts" not in summary and summary["job_name"] == workflow.jobs(prefix)[0]
    # no measurements.json was written by this (moto) job: the copy failed, and the summary says so
    assert tune["measurements"]["Error"].startswith("S3.") or "NoSuchKey" in json.dumps(tune["measurements"])


def test_the_stored_measurements_turn_the_next_plan_from_estimate_to_measured(workflow, synthesized, rules):
    _, _, bucket = synthesized
    request = {"batch_size": 2, "activation_checkpointing": True}
    before = _summary(workflow.run({"job_name_prefix": _prefix(), **request}))
    assert before["plan"]["throughput_basis"] == "estimate"
    prefix, name = _prefix(), f"tune-{uuid.uuid4().hex[:8]}"
    folder = f"checkpoints/{SEGMENT}/{name}/tune/"
    hyperparameters = {**rules.full_defaults()["hyperparameters"], "precision": "bf16", "seq_length": "8192",
                       "batch_size": "1", "activation_checkpointing": "false"}  # fmt: skip
    records = records_file(hyperparameters, {2: 0.5, 4: 0.9})
    uploads = (
        (bucket, folder + "winner.json", json.dumps({"trial": 1})),
        (bucket, folder + "measurements.json", records),
    )
    OUTCOMES.plan(prefix, Outcome(uploads=uploads))
    tuned = _summary(workflow.run({"job_name_prefix": prefix, **BASE, "tune": TUNE}, name))["tune"]
    key = f"tuning/measurements/{IMAGE_TAG}/{SEGMENT}/{name}.json"
    assert tuned["records_key"] == key and tuned["measurements"]["etag"]
    assert workflow.s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode() == records
    after = _summary(workflow.run({"job_name_prefix": _prefix(), **request}))["plan"]
    assert after["throughput_basis"] == "measured"
    assert after["tokens_per_sec_per_gpu"] == round(2 * 8192 / 0.5)
    assert "tuning job tune-job" in after["throughput_source"]
    assert after["memory_check"]["records"] == 2
    other = _summary(
        workflow.run({"job_name_prefix": _prefix(), "batch_size": 8, "activation_checkpointing": True})
    )
    assert other["plan"]["throughput_basis"] == "estimate"  # not measured: estimated


def test_a_missing_winner_is_reported_not_failed(workflow):
    summary = _summary(workflow.run({"job_name_prefix": _prefix(), **BASE, "tune": TUNE}))
    assert "Error" in summary["tune"]["winner"] and summary["status"] == "Completed"
    assert summary["tune"]["outcome"].startswith("no winner read: the job left no s3://")


def test_a_tuning_job_where_no_trial_ran_ok_summarizes_no_winner_with_its_report_and_stored_records(
    workflow, synthesized, rules
):
    """The driver's own files when every trial ran out of memory: winner.json names none, the records of the OOM
    trials are there. The execution succeeds, its summary says 'no winner' with the report's S3 location, and the
    OOM records are stored where the planner reads them."""
    _, _, bucket = synthesized
    name = f"tune-{uuid.uuid4().hex[:8]}"
    folder = f"checkpoints/{SEGMENT}/{name}/tune/"
    base = {k: v for k, v in {**rules.full_defaults()["hyperparameters"], "precision": "bf16", "seq_length": "8192",
            "batch_size": "4"}.items() if k in settings_table.HYPERPARAMETERS_BY_NAME}  # fmt: skip
    place = report.Where(hardware.DEFAULT_INSTANCE_TYPE, 1, "cuda", "B200", 8, IMAGE_TAG, "2.9.0", "2.11.0",
                         "tune-job", "2026-11-23T10:00:00+00:00", "algo-1")  # fmt: skip
    results = [TrialResult(i, {"batch_size": b, "grad_accum_steps": 4 // b}, status="oom", error="CUDA out of memory")
               for i, b in enumerate((4, 2), start=1)]  # fmt: skip
    rows = report.rank([report.make_row(r, base, place) for r in results])
    winner = session.winner_summary(report.winner(rows), None, place)
    records = json.dumps({"records": report.records(rows, base, place)})
    prefix = _prefix()
    OUTCOMES.plan(prefix, Outcome(uploads=((bucket, folder + contract_tuning.TUNE_WINNER_FILE, json.dumps(winner)),
                                           (bucket, folder + contract_tuning.TUNE_RECORDS_FILE, records))))  # fmt: skip
    summary = _summary(workflow.run({"job_name_prefix": prefix, **BASE, "tune": TUNE}, name))
    tune = summary["tune"]
    assert summary["status"] == "Completed" and tune["winner"] == {"value": {"trial": None, "settings": None}}
    assert tune["outcome"] == (
        "no winner: no trial ran ok; the status, error and log of every trial are in the report at "
        f"s3://{bucket}/{folder}"
    )
    assert tune["report_uri"] == f"s3://{bucket}/{folder}" and tune["measurements"]["etag"]
    stored = json.loads(workflow.s3.get_object(Bucket=bucket, Key=tune["records_key"])["Body"].read())
    assert [r["measured"]["status"] for r in stored["records"]] == ["oom", "oom"]


@pytest.mark.parametrize(
    ("tune", "cause"),
    [
        ({"search_space": {}}, "tune.search_space: must name at least one setting to vary"),
        ({"search_space": {"optimizer": ["sgd"]}}, "tune.search_space.optimizer: unknown setting; allowed: batch_size"),
        ({"search_space": {"batch_size": [4096], "activation_checkpointing": [False]}},
         "tune.search_space: no candidate of the 1 combinations is predicted to fit"),
        ({"max_cost_usd": 1}, "tune.max_cost_usd: must cover at least one trial ($"),
        ({"max_trials": 0}, "tune.max_trials: must be an integer in [1, 32]; got 0"),
        ({"max_trials": 100}, "tune.max_trials: must be an integer in [1, 32]; got 100"),
        ({"trial_timeout_seconds": 5}, "tune.trial_timeout_seconds: must be an integer in [60, 14400]; got 5"),
        ([1], "tune: must be an object of tuning settings"),
    ],
)  # fmt: skip
def test_a_bad_tune_is_refused_before_anything_is_launched_naming_the_field(workflow, tune, cause):
    prefix = _prefix()
    result = workflow.run({"job_name_prefix": prefix, "tune": tune})
    assert result["status"] == "FAILED" and result["error"] == "InvalidInput", result
    assert cause in result["cause"], result["cause"]
    assert workflow.jobs(prefix) == [] and prefix not in OUTCOMES.requests


def test_a_tune_cannot_resume(workflow):
    result = workflow.run({"tune": {}, "resume_from": "earlier-run"})
    assert (
        result["error"] == "InvalidInput"
        and "tune: a tuning run starts every trial afresh" in result["cause"]
    )


def test_a_tune_with_init_from_needs_the_models_config_which_only_the_workflow_reads(rules):
    """Offline its candidates wait for the model's shape: not refused (the workflow accepts it), said skipped."""
    from training.request.decision import prepare_request

    offline = prepare_request({"tune": {}, "init_from": f"s3://{rules.bucket_name}/data/llama/"}, rules)
    assert offline.problems == [] and offline.tune is None
    assert any(line.startswith("init_from: the model folder's config.json (read from S3 before launch)")
               and "a tuning run's candidates" in line for line in offline.skipped), offline.skipped  # fmt: skip


def test_a_tune_does_not_evaluate(rules):
    from training.request.decision import prepare_request

    both = prepare_request({"tune": {}, "evaluate": {"tasks": ["hellaswag"]}}, rules)
    assert any(p.startswith("tune: a tuning run trains no model to evaluate") for p in both.problems), (
        both.problems
    )
