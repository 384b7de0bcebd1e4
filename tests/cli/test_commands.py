"""Every subcommand of ``blackwell-training`` against the stack in moto (see ``conftest.py``): the real synthesized
workflow executes, its jobs live in moto's SageMaker, and their logs are lines in the trainer's real format."""

from __future__ import annotations

import io
import json
import time
from dataclasses import replace
from pathlib import Path

import boto3

from constructs_lib.cli.api import TrainingRuns
from constructs_lib.cli.main import main
from constructs_lib.cli.records import Job
from tests.cli.conftest import DEPLOYED_DATA_SOURCES, DEPLOYED_MAX_INSTANCE_COUNT, STACK, Terminal
from tests.workflow.harness import ACCOUNT, REGION, Outcome, capacity_error
from tests.workflow.test_requests import _seal_checkpoint
from training.contract.metric_lines import (
    format_config_line,
    format_step_line,
    format_summary_line,
    parse_metric_line,
)

B200_PER_HOUR = 113.93  # training.contract.hardware.ON_DEMAND_USD_PER_HOUR for the default instance type


def _step(step: int, loss: float) -> str:
    return format_step_line(
        step,
        {
            "loss": loss,
            "lr": 3e-4,
            "grad_norm": 1.1,
            "tokens_per_sec": 51200.0,
            "mfu": 0.405,
            "step_time": 0.25,
        },
    )


SUMMARY = format_summary_line(
    {"steps": 100, "final_loss": 1.875, "tokens_per_sec": 51000.0, "mfu": 0.4, "train_seconds": 26.0}
)


class World:
    """The test's ``sleep``: each poll of the CLI advances the run by one scripted event."""

    def __init__(self, deployed, prefix: str, *events):
        self.deployed, self.prefix, self.events, self.polls = deployed, prefix, list(events), 0

    def __call__(self, _seconds: float) -> None:
        self.polls += 1
        assert self.polls < 600, "the run never ended"
        if self.events:
            job = self.deployed.wait_for_job(self.prefix)
            self.events.pop(0)(job)
        time.sleep(0.05)


def _submit(cli, deployed, outcome: Outcome, *extra: str) -> tuple[str, str]:
    prefix = deployed.prefix()
    deployed.plan(prefix, outcome)
    name = f"run-{prefix}"
    result = cli("submit", "--name", name, "--set", f"job_name_prefix={prefix}", *extra)
    assert result.status == 0, result.err
    return prefix, name


# ---- submit --wait / watch --------------------------------------------------------------------------------------


def test_submit_wait_follows_the_run_to_success(deployed, cli):
    prefix = deployed.prefix()
    deployed.plan(prefix, Outcome("InProgress"))
    world = World(
        deployed,
        prefix,
        lambda job: deployed.log(job, "algo-1", format_config_line({"max_steps": 100, "precision": "bf16"})),
        lambda job: deployed.log(job, "algo-1", _step(50, 2.5)),
        lambda job: (deployed.log(job, "algo-1", _step(100, 1.875), SUMMARY), deployed.finish(job)),
    )
    name = f"run-{prefix}"
    result = cli(
        "submit",
        "-",
        "--name",
        name,
        "--set",
        f"job_name_prefix={prefix}",
        "--wait",
        "--interval",
        "1",
        stdin='{"precision": "bf16", "hyperparameters": {"max_steps": "100"}}',
        sleep=world,
    )
    assert result.status == 0, result.err + result.out
    lines = result.out.splitlines()
    assert lines[0].startswith("Plan: ") and "(fits)" in lines[0]  # the plan comes first
    started = lines.index(f"started run {name}")
    assert f"#/v2/executions/details/arn:aws:states:{REGION}:" in lines[started + 1]
    (job,) = deployed.workflow.jobs(prefix)
    assert (
        f"RUNNING | job {job} InProgress | step 50/100 loss 2.5 tokens/s 51,200 MFU 40.5% ETA 0:00:12"
        in lines
    )
    assert any(line.startswith("SUCCEEDED | job ") and "step 100/100" in line for line in lines)
    assert lines[-1] == f"run {name} SUCCEEDED; `blackwell-training result {name}` sums it up"
    assert result.err == ""


def test_submit_wait_reports_the_failure_reason_and_exits_non_zero(deployed, cli):
    prefix = deployed.prefix()
    deployed.plan(prefix, Outcome("Failed", "AlgorithmError: ExecuteUserScriptError: exit code 1"))
    name = f"run-{prefix}"
    result = cli("submit", "--name", name, "--set", f"job_name_prefix={prefix}", "--wait")
    assert result.status == 1
    (job,) = deployed.workflow.jobs(prefix)
    assert result.out.splitlines()[-1] == (
        f"run {name} FAILED: TrainingJobFailed: Training job {job} ended Failed: "
        "AlgorithmError: ExecuteUserScriptError: exit code 1"
    )


def test_watch_json_prints_one_snapshot_per_poll_and_ends_with_the_run(deployed, cli):
    prefix, name = _submit(cli, deployed, Outcome("InProgress"))
    world = World(deployed, prefix, lambda job: deployed.log(job, "algo-1", _step(10, 3.0)), deployed.finish)
    result = cli("watch", name, "--json", sleep=world)
    assert result.status == 0, result.err
    snapshots = [json.loads(line) for line in result.out.splitlines()]
    assert snapshots[-1]["status"] == "SUCCEEDED"
    assert snapshots[-1]["progress"]["step"] == 10
    assert snapshots[-1]["progress"]["max_steps"] == 1000  # the contract's default, from the job's settings
    assert all(s["name"] == name for s in snapshots)


def test_watch_in_a_terminal_draws_a_progress_bar(deployed, cli):
    prefix, name = _submit(cli, deployed, Outcome("InProgress"))
    world = World(
        deployed,
        prefix,
        lambda job: deployed.log(job, "algo-1", format_config_line({"max_steps": 40}), _step(20, 3.0)),
        lambda job: (deployed.log(job, "algo-1", _step(40, 2.0)), deployed.finish(job)),
    )
    screen, errors = Terminal(), io.StringIO()
    status = main(
        ["watch", name, "--interval", "1"], stdin=io.StringIO(), stdout=screen, stderr=errors, sleep=world
    )
    assert status == 0, errors.getvalue()
    text = screen.getvalue()
    assert "\x1b[" in text  # drawn with terminal control sequences
    assert "100%" in text and "SUCCEEDED | job " in text and "step 40/40 loss 2" in text
    assert text.rstrip().endswith(f"run {name} SUCCEEDED; `blackwell-training result {name}` sums it up")


# ---- runs -------------------------------------------------------------------------------------------------------


def test_runs_lists_status_job_instances_launches_duration_and_cost(deployed, cli):
    _, ok = _submit(cli, deployed, Outcome())
    prefix, retried = deployed.prefix(), None
    deployed.plan(prefix, capacity_error(1), Outcome(training_seconds=600, billable_seconds=600))
    retried = f"run-{prefix}"
    assert (
        cli(
            "submit", "--name", retried, "--set", f"job_name_prefix={prefix}", "--set", "use_spot=true"
        ).status
        == 0
    )
    for name in (ok, retried):
        deployed.wait_until_ended(name)

    result = cli("runs", "--json", "--limit", "50")
    assert result.status == 0, result.err
    listed = {run["name"]: run for run in json.loads(result.out)}
    first, second = listed[ok], listed[retried]
    assert first["status"] == "SUCCEEDED" and first["job_status"] == "Completed"
    assert (first["instance_type"], first["instance_count"], first["launches"]) == (
        "ml.p6-b200.48xlarge",
        1,
        1,
    )
    assert first["billable_seconds"] == 3600 and round(first["cost_usd"], 2) == B200_PER_HOUR
    assert first["duration_seconds"] is not None and first["duration_seconds"] >= 0
    assert second["launches"] == 2 and second["job"].startswith(prefix)
    assert round(second["cost_usd"], 4) == round(B200_PER_HOUR * 600 / 3600, 4)

    table = cli("runs").out
    assert f"Runs of {STACK} ({REGION})" in table
    row = next(line for line in table.splitlines() if ok in line)
    assert "SUCCEEDED" in row and "1 x ml.p6-b200.48xlarge" in row and f"${B200_PER_HOUR:,.2f}" in row


# ---- logs -------------------------------------------------------------------------------------------------------


def test_logs_follow_prints_every_host_until_the_run_ends(deployed, cli):
    prefix, name = _submit(cli, deployed, Outcome("InProgress"))
    world = World(
        deployed,
        prefix,
        lambda job: deployed.log(job, "algo-1", format_config_line({"max_steps": 100}), _step(10, 3.5)),
        lambda job: deployed.log(job, "algo-2", "worker on algo-2 ready"),
        lambda job: (deployed.log(job, "algo-1", _step(20, 3.25), SUMMARY), deployed.finish(job)),
    )
    result = cli("logs", name, "--follow", sleep=world)
    assert result.status == 0, result.err
    assert result.out.splitlines() == [
        f"[algo-1] {format_config_line({'max_steps': 100})}",
        f"[algo-1] {_step(10, 3.5)}",
        "[algo-2] worker on algo-2 ready",
        f"[algo-1] {_step(20, 3.25)}",
        f"[algo-1] {SUMMARY}",
    ]
    assert deployed.execution(name)["status"] == "SUCCEEDED"

    again = cli("logs", name, "--json")  # without --follow: what is there, once
    events = [json.loads(line) for line in again.out.splitlines()]
    assert [e["host"] for e in events] == ["algo-1", "algo-1", "algo-2", "algo-1", "algo-1"]
    assert events[-1]["message"] == SUMMARY


# ---- stop -------------------------------------------------------------------------------------------------------


def test_stop_asks_first_and_stops_with_yes(deployed, cli):
    prefix, name = _submit(cli, deployed, Outcome("InProgress"))
    job = deployed.wait_for_job(prefix)
    try:
        refused = cli("stop", name)  # standard input is not a terminal: no silent stop
        assert refused.status == 3
        assert refused.err.strip() == (
            f"error: stopping run {name} needs confirmation: run it in a terminal or pass --yes"
        )
        declined = cli("stop", name, stdin="n\n", tty=True)
        assert declined.status == 0 and "not stopped" in declined.out
        assert f"Stop run {name} and its training job {job}?" in declined.out
        assert deployed.execution(name)["status"] == "RUNNING"

        stopped = cli("stop", name, "--yes")
        assert stopped.status == 0, stopped.err
        assert f"stopping run {name}" in stopped.out
        deployed.finish(job, "Stopped")  # what Step Functions' StopTrainingJob does to the job
        execution = deployed.wait_until_ended(name)  # the default 30 s: a guard, not a measure
        assert execution["status"] == "ABORTED"

        again = cli("stop", name, "--yes")
        assert again.status == 3 and "has already ended (ABORTED)" in again.err
    finally:
        deployed.finish(job, "Stopped")  # what StopTrainingJob does; ends moto's poll of the job


# ---- result -----------------------------------------------------------------------------------------------------


def test_result_sums_up_a_successful_run(deployed, cli):
    prefix, name = _submit(cli, deployed, Outcome())
    job = deployed.wait_for_job(prefix)
    deployed.log(job, "algo-1", _step(100, 1.875), SUMMARY)
    deployed.wait_until_ended(name)

    result = cli("result", name, "--json")
    assert result.status == 0, result.err
    summary = json.loads(result.out)
    assert summary["status"] == "SUCCEEDED" and summary["job"] == job
    assert summary["model_artifacts"].endswith(f"/output/{job}/output/model.tar.gz")
    assert summary["hugging_face_model"] == {"archive": summary["model_artifacts"], "folder": "hf/"}
    assert summary["checkpoint_uri"].endswith(
        f"/checkpoints/Test-Workflow/{name}/"
    )  # the workflow's own segment
    assert (summary["training_seconds"], summary["billable_seconds"]) == (3600, 3600)
    assert round(summary["cost_usd"], 2) == B200_PER_HOUR
    assert summary["trainer_summary"] == {
        "steps": 100,
        "final_loss": 1.875,
        "tokens_per_sec": 51000,
        "mfu": 0.4,
        "train_seconds": 26,
    }
    assert "train:progress" in summary["final_metrics"]  # moto's canned final metric
    assert summary["restarted_from"] is None
    assert set(summary["links"]) == {"execution", "training_job", "logs"}
    assert summary["links"]["training_job"].endswith(f"#/jobs/{job}")

    text = cli("result", name).out
    assert f"Run {name}: SUCCEEDED" in text and f"${B200_PER_HOUR:,.2f}" in text
    assert "trainer final_loss" in text and "1.875" in text
    assert "Hugging Face model" in text and "hf/ in s3://" in text
    assert (
        summary["plan"]["fits"] and summary["memory_estimate_ignored"] is False
    )  # the plan it launched with
    assert "estimate: peak memory" in text and "estimate: throughput" in text and "; measured 51,000" in text
    low, high = summary["plan"]["throughput_spread"]["tokens_per_sec_per_gpu"]  # an estimate shows its band
    assert summary["plan"]["throughput_basis"] == "estimate" and f"({low:,}-{high:,}) tokens/s" in text

    api = TrainingRuns(stack_name=STACK, region=REGION).result(name)  # the Python API says the same
    assert {k: api[k] for k in ("job", "cost_usd", "trainer_summary")} == {
        k: summary[k] for k in ("job", "cost_usd", "trainer_summary")
    }


def test_result_says_when_the_trainer_restarted_from_step_0_because_no_checkpoint_was_usable(deployed, cli):
    line = format_summary_line({"steps": 100, "final_loss": 1.875, "unusable_checkpoints": 2})
    metrics = tuple(
        parse_metric_line(line).items()
    )  # what SageMaker reads from the line with the job's regexes
    prefix, name = _submit(cli, deployed, Outcome(final_metrics=metrics))
    deployed.log(deployed.wait_for_job(prefix), "algo-1", _step(100, 1.875), line)
    deployed.wait_until_ended(name)
    summary = json.loads(cli("result", name, "--json").out)
    assert summary["final_metrics"]["final:unusable_checkpoints"] == 2  # the workflow's summary carries it
    assert summary["restarted_from"] == "none (2 checkpoints unusable)"
    assert summary["trainer_summary"]["unusable_checkpoints"] == 2
    text = cli("result", name).out
    assert "restarted from" in text and "none (2 checkpoints unusable)" in text


def test_result_of_a_failed_run_names_the_reason_and_exits_non_zero(deployed, cli):
    prefix, name = _submit(cli, deployed, Outcome("Failed", "AlgorithmError: out of memory"))
    deployed.wait_until_ended(name)
    result = cli("result", name, "--json")
    assert result.status == 1
    summary = json.loads(result.out)
    assert summary["status"] == "FAILED" and summary["error"] == "TrainingJobFailed"
    assert summary["failure_reason"] == "AlgorithmError: out of memory"
    assert summary["cost_usd"] == 0.0  # moto's failed job billed nothing


def test_result_and_runs_print_brackets_in_a_failure_reason_as_they_are(deployed, cli):
    reason = "AlgorithmError: [/opt/ml/code] exited 1 [bold]see logs[/bold]"  # not rich markup
    prefix, name = _submit(cli, deployed, Outcome("Failed", reason))
    deployed.wait_until_ended(name)
    result = cli("result", name)
    assert result.status == 1 and "Traceback" not in result.err, result.err
    assert "[/opt/ml/code] exited 1 [bold]see logs[/bold]" in result.out
    assert cli("runs").status == 0


# ---- validate, and the local check of submit ---------------------------------------------------------------------


def test_validate_a_good_request(deployed, cli, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(
        json.dumps(
            {
                "precision": "mxfp8",
                "batch_size": 16,
                "activation_checkpointing": True,  # batch 16 without it cannot fit (the memory plan)
                "hyperparameters": {"max_steps": "2000"},
            }
        )
    )
    result = cli("validate", str(path))
    name_check = "the run's name: that its checkpoint folder holds no earlier run's (one S3 listing when it is started)"
    assert (result.status, result.err) == (0, "")
    assert result.out.splitlines() == [
        "valid",
        "not checked here (the workflow checks them before it launches):",
        f"  - {name_check}",
    ]
    assert json.loads(cli("validate", str(path), "--json").out) == {
        "valid": True,
        "problems": [],
        "notes": [],
        "not_checked": [name_check],
    }


def test_offline_validate_refuses_another_bucket_when_named_and_says_when_it_cannot_know(deployed, cli):
    elsewhere = json.dumps({"train_data_uri": "s3://someone-elses-bucket/data/tokens/"})
    unknown = cli("validate", "-", "--json", stdin=elsewhere)
    assert unknown.status == 0 and json.loads(unknown.out)["not_checked"][0].startswith(
        "the data sources' bucket: the workflow's bucket is not known here, so train_data_uri, init_from and "
        "evaluate.task_data_uri were matched on their key only, in any bucket (give --bucket NAME"
    )
    named = cli("validate", "-", "--bucket", deployed.bucket, stdin=elsewhere)
    assert named.status == 2 and _problems(named.err) == [
        f"train_data_uri: must be an s3:// prefix ending in '/' under one of s3://{deployed.bucket}/data/, or null; "
        'got "s3://someone-elses-bucket/data/tokens/"'
    ]
    own = json.dumps({"train_data_uri": f"s3://{deployed.bucket}/data/tokens/"})
    checked = json.loads(cli("validate", "-", "--json", "--bucket", deployed.bucket, stdin=own).out)
    assert checked["valid"] and not any(
        line.startswith("the data sources' bucket") for line in checked["not_checked"]
    )
    assert (
        "train_data_uri: that it holds the training data (one S3 listing before launch)"
        in checked["not_checked"]
    )


def test_validate_lists_every_problem_and_exits_2(deployed, cli):
    result = cli("validate", "-", "--set", "batch_size=0", stdin='{"precison": "bf16"}')
    assert result.status == 2
    problems = [line.removeprefix("  - ") for line in result.err.splitlines()[1:]]
    assert result.err.splitlines()[0] == "invalid request (2 problems):"
    assert any(p.startswith("precison: unknown input field") for p in problems)
    assert any(p.startswith("batch_size: must be an integer in [1, 4096]") for p in problems)
    assert "Traceback" not in result.err


def test_submit_checks_locally_before_starting_anything(deployed, cli):
    before = deployed.executions()
    result = cli("submit", "--set", "precision=fp4")
    assert result.status == 2 and "precision: must be one of" in result.err
    assert deployed.executions() == before


def _beyond_the_deployment(deployed) -> dict:
    """Valid under cdk.json's defaults (up to 4 instances, data under ``data/``), refused by the deployed workflow
    (synthesized with at most 2 instances and data only under ``corpus/``)."""
    return {"instance_count": 3, "train_data_uri": f"s3://{deployed.bucket}/data/tokens/"}


def _problems(err: str) -> list[str]:
    lines = err.splitlines()
    assert lines[0] == f"invalid request ({len(lines) - 1} problem{'s' if len(lines) > 2 else ''}):", err
    assert all(line.startswith("  - ") for line in lines[1:]), err
    return [line.removeprefix("  - ") for line in lines[1:]]


def test_submit_refuses_what_the_deployed_workflow_refuses_though_cdk_json_allows_it(deployed, cli):
    request = json.dumps(_beyond_the_deployment(deployed))
    assert cli("validate", "-", stdin=request).status == 0  # offline: cdk.json's rules allow it
    before = deployed.executions()

    result = cli("submit", "-", "--name", f"never-{deployed.prefix()}", stdin=request)

    assert result.status == 2 and result.out == "" and "Traceback" not in result.err
    problems = _problems(result.err)
    assert len(problems) == 2
    assert problems[0].startswith(f"instance_count: must be an integer in [1, {DEPLOYED_MAX_INSTANCE_COUNT}]")
    assert (
        problems[1].startswith("train_data_uri: ")
        and f"s3://{deployed.bucket}/{DEPLOYED_DATA_SOURCES[0]}" in (problems[1])
    )
    assert deployed.executions() == before  # nothing started
    # exactly what the state machine itself refuses, cause for cause
    executed = deployed.workflow.run(json.loads(request), f"direct-{deployed.prefix()}")
    assert (executed["status"], executed["error"]) == ("FAILED", "InvalidInput")
    assert executed["cause"] == "; ".join(problems)


def test_validate_deployed_uses_the_deployed_workflows_rules(deployed, cli):
    request = json.dumps(_beyond_the_deployment(deployed))
    submitted = _problems(cli("submit", "-", stdin=request).err)
    for flags in (["--deployed"], ["--stack", STACK]):
        result = cli("validate", "-", *flags, stdin=request)
        assert result.status == 2 and _problems(result.err) == submitted
        as_json = json.loads(cli("validate", "-", "--json", *flags, stdin=request).out)
        assert as_json == {"valid": False, "problems": submitted}
    deployed_valid = json.loads(
        cli("validate", "--json", "--deployed").out
    )  # S3 read: only the run's name left
    assert deployed_valid["valid"] and [line.split(":")[0] for line in deployed_valid["not_checked"]] == [
        "the run's name"
    ]
    assert cli("validate", "--deployed", "--stack", "NotThere").status == 3


def test_submit_accepts_what_the_deployed_workflow_allows(deployed, cli):
    s3 = boto3.client("s3", region_name=REGION)
    s3.put_object(Bucket=deployed.bucket, Key=f"{DEPLOYED_DATA_SOURCES[0]}tokens/shard-0.bin", Body=b"t")
    _, name = _submit(
        cli,
        deployed,
        Outcome(),
        "--set",
        f"instance_count={DEPLOYED_MAX_INSTANCE_COUNT}",
        "--set",
        f"train_data_uri=s3://{deployed.bucket}/{DEPLOYED_DATA_SOURCES[0]}tokens/",
    )
    assert deployed.wait_until_ended(name)["status"] == "SUCCEEDED"


def test_submit_refuses_resuming_a_run_without_a_complete_checkpoint(deployed, cli):
    before = deployed.executions()
    result = cli("submit", "--set", "resume_from=no-such-run")
    assert result.status == 2
    (problem,) = _problems(result.err)
    assert problem.startswith(
        "resume_from: execution no-such-run has no complete checkpoint under "
        f"s3://{deployed.bucket}/checkpoints/{deployed.rules.workflow_segment}/no-such-run/"
    )
    assert deployed.executions() == before


def test_submit_resumes_only_from_a_complete_checkpoint_of_this_workflow(deployed, cli):
    s3, segment = deployed.workflow.s3, deployed.rules.workflow_segment
    assert segment  # the deployed workflow keeps its runs in its own folder of the bucket
    earlier, foreign = f"earlier-{deployed.prefix()}", f"foreign-{deployed.prefix()}"
    _seal_checkpoint(s3, deployed.bucket, f"checkpoints/{segment}/{earlier}/", 100)
    _seal_checkpoint(s3, deployed.bucket, f"checkpoints/{foreign}/", 100)  # not under this workflow's segment
    before = deployed.executions()

    too_short = cli("submit", "--set", f"resume_from={earlier}", "--set", "hyperparameters.max_steps=100")
    elsewhere = cli("submit", "--set", f"resume_from={foreign}", "--set", "hyperparameters.max_steps=150")

    assert (too_short.status, elsewhere.status) == (2, 2)
    (short_problem,) = _problems(too_short.err)
    assert short_problem.startswith(
        "hyperparameters.max_steps: must be greater than the step of the checkpoint resumed from (100"
    )
    (elsewhere_problem,) = _problems(elsewhere.err)
    assert elsewhere_problem.startswith(f"resume_from: execution {foreign} has no complete checkpoint")
    assert deployed.executions() == before
    direct = deployed.workflow.run({"resume_from": foreign, "hyperparameters": {"max_steps": "150"}})
    assert (direct["error"], direct["cause"]) == ("InvalidInput", elsewhere_problem)  # the workflow agrees

    _, name = _submit(
        cli, deployed, Outcome(), "--set", f"resume_from={earlier}", "--set", "hyperparameters.max_steps=150"
    )
    assert deployed.wait_until_ended(name)["status"] == "SUCCEEDED"


def test_resume_check_is_left_to_the_workflow_when_s3_refuses_the_read(deployed, cli):
    runs = TrainingRuns(stack_name=STACK, region=REGION)
    elsewhere = replace(runs.rules, bucket_name="not-a-bucket-of-this-account")
    assert runs.check({"resume_from": "no-such-run"}, rules=elsewhere) == []
    assert runs.check({"resume_from": "no-such-run", "batch_size": 0}, rules=elsewhere)[0].startswith(
        "batch_size:"
    )


def test_submit_refuses_a_taken_or_malformed_name(deployed, cli):
    _, name = _submit(cli, deployed, Outcome())
    taken = cli("submit", "--name", name)
    assert (
        taken.status == 3
        and taken.err.strip() == f"error: a run named {name} already exists: choose another --name"
    )
    bad = cli("submit", "--name", "has space")
    assert bad.status == 2 and "--name: must be 1 to 80 of" in bad.err


def test_submit_json_gives_name_arn_and_links(deployed, cli):
    prefix = deployed.prefix()
    result = cli("submit", "--json", "--set", f"job_name_prefix={prefix}")
    assert result.status == 0, result.err
    started = json.loads(result.out)
    assert started["name"].startswith(f"{prefix}-") and started["arn"].endswith(f":{started['name']}")
    assert started["links"]["execution"] == (
        f"https://console.aws.amazon.com/states/home?region={REGION}#/v2/executions/details/{started['arn']}"
    )


# ---- errors: one line, no traceback -------------------------------------------------------------------------------


def test_unknown_run_is_one_line(deployed, cli):
    for command in ("watch", "logs", "result", "stop"):
        result = cli(command, "no-such-run")
        assert result.status == 3
        assert result.err.startswith("error: unknown run no-such-run: no such execution of arn:aws:states:")
        assert len(result.err.strip().splitlines()) == 1


def test_stack_not_deployed_is_one_line(deployed, cli):
    result = cli("runs", "--stack", "NotThere")
    assert result.status == 3
    assert result.err.strip() == (
        f"error: stack NotThere is not deployed in {REGION} (deploy it with `make deploy`, or pass --stack/--region)"
    )


def test_a_stack_whose_state_machine_has_no_request_rules_is_one_line(deployed, cli):
    bare = deployed.workflow.sfn.create_state_machine(
        name="not-a-training-workflow",
        definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}),
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/fake-state-machine-role",
    )["stateMachineArn"]
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {"StateMachineArn": {"Value": bare}},
    }
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName="NotTraining", TemplateBody=json.dumps(template)
    )
    for command in ("submit", "validate"):
        result = cli(command, "--stack", "NotTraining")
        assert result.status == 3 and len(result.err.splitlines()) == 1, result.err
        assert result.err.startswith(
            f"error: cannot read the request rules of state machine {bare} (definition: "
        )
    assert deployed.workflow.sfn.list_executions(stateMachineArn=bare)["executions"] == []


# ---- data that exists, warm pools, remote debugging ---------------------------------------------------------------


def test_submit_refuses_an_empty_data_prefix_before_starting(deployed, cli):
    before = deployed.executions()
    uri = f"s3://{deployed.bucket}/{DEPLOYED_DATA_SOURCES[0]}empty-{deployed.prefix()}/"
    result = cli("submit", "--set", f"train_data_uri={uri}")
    assert result.status == 2, result.err
    assert _problems(result.err) == [
        f'train_data_uri: must hold the training data, but no object is under it; got "{uri}"'
    ]
    assert deployed.executions() == before
    assert _problems(cli("validate", "--deployed", "--set", f"train_data_uri={uri}").err) == _problems(
        result.err
    )


def test_runs_shows_the_warm_pool_a_run_asked_for(deployed, cli):
    _, name = _submit(cli, deployed, Outcome(), "--set", "keep_alive_seconds=600")
    deployed.wait_until_ended(name)
    listed = {run["name"]: run for run in json.loads(cli("runs", "--json", "--limit", "50").out)}
    # moto 5.2.5's DescribeTrainingJob has no WarmPoolStatus: what the job asked for is shown
    assert listed[name]["warm_pool"] == "requested (600 s), no status yet"
    row = next(line for line in cli("runs").out.splitlines() if name in line)
    assert "requested (600 s), no status yet" in row


def test_warm_pool_status_from_describe_training_job_in_words():
    """DescribeTrainingJob's WarmPoolStatus (botocore's shape) as `runs` shows it."""
    job = Job.from_request({"TrainingJobName": "j", "ResourceConfig": {"KeepAlivePeriodInSeconds": 600}})
    job.update({"TrainingJobStatus": "Completed", "WarmPoolStatus": {"Status": "Available"}})
    assert job.warm_pool == "Available"
    job.update(
        {
            "WarmPoolStatus": {
                "Status": "Reused",
                "ResourceRetainedBillableTimeInSeconds": 1000,
                "ReusedByJob": "next-job",
            }
        }
    )
    assert job.warm_pool == "Reused, 1000 s billed, reused by next-job"
    assert Job.from_request({"TrainingJobName": "k", "ResourceConfig": {}}).warm_pool == "-"


def _tools(folder, *names: str):
    """Stand-ins for the AWS CLI and the Session Manager plugin: each records its arguments."""
    for name in names:
        tool = folder / name
        tool.write_text(f'#!/bin/sh\necho "$@" > "{folder}/{name}.args"\n')
        tool.chmod(0o755)
    return folder


def test_shell_opens_a_session_into_the_running_jobs_container(deployed, cli, tmp_path, monkeypatch):
    prefix, name = _submit(cli, deployed, Outcome("InProgress"), "--set", "remote_debug=true")
    job = deployed.wait_for_job(prefix)
    command = f"aws ssm start-session --target sagemaker-training-job:{job}_algo-1 --region {REGION}"
    try:
        printed = cli("shell", name, "--print")
        assert (printed.status, printed.out.strip()) == (0, command)
        assert json.loads(cli("shell", name, "--print", "--json").out)["command"] == command.split()

        monkeypatch.setenv("PATH", str(tmp_path))  # neither the AWS CLI nor the plugin
        missing = cli("shell", name)
        assert missing.status == 3 and missing.out.strip() == command
        assert "aws and session-manager-plugin not found on PATH" in missing.err

        monkeypatch.setenv("PATH", str(_tools(tmp_path, "aws", "session-manager-plugin")))
        opened = cli("shell", name)
        assert opened.status == 0, opened.err
        assert (tmp_path / "aws.args").read_text().strip() == command.removeprefix("aws ")

        beyond = cli("shell", name, "--host", "2", "--print")
        assert beyond.status == 3 and "--host: must be in [1, 1]" in beyond.err
    finally:
        deployed.finish(job, "Stopped")
    deployed.wait_until_ended(name)
    ended = cli("shell", name, "--print")
    assert ended.status == 3 and f"training job {job} is Stopped, not running" in ended.err


def test_shell_refuses_a_job_without_remote_debugging(deployed, cli):
    prefix, name = _submit(cli, deployed, Outcome("InProgress"))
    job = deployed.wait_for_job(prefix)
    try:
        result = cli("shell", name, "--print")
        assert result.status == 3 and f"training job {job} was started without remote debugging" in result.err
    finally:
        deployed.finish(job, "Stopped")
    deployed.wait_until_ended(name)


def prepared_chat_copies(tmp_path: Path) -> Path:
    """A weightless model folder (``tmp_path/model``, returned) and 300 prompt/completion examples prepared with
    its template into ``tmp_path/data``: local copies of a fine-tuning request's init_from and train_data_uri."""
    from tests.request.test_fine_tuning_request import weightless
    from training.prepare import chat

    model = weightless(tmp_path / "model")
    lines = [{"prompt": str(n), "completion": str(n + 1)} for n in range(300)]
    (tmp_path / "n.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    chat.prepare_chat([tmp_path / "n.jsonl"], str(tmp_path / "data"), str(model), validation_fraction=0.1)
    return model


def test_validate_and_plan_read_local_copies_of_a_fine_tuning_requests_folders(deployed, cli, tmp_path):
    """Offline, ``--init-from`` and ``--data-folder`` stand for the request's S3 folders: the conversation data
    is checked against the model's template (refused naming train_data_uri) and the plan counts its windows;
    without them validate says what it did not check."""
    model = prepared_chat_copies(tmp_path)
    request = json.dumps({"init_from": "s3://my-bucket/data/model/", "train_data_uri": "s3://my-bucket/data/chats/",
                          "precision": "bf16", "seq_length": 256, "batch_size": 1})  # fmt: skip
    folders = ("--init-from", str(model), "--data-folder", str(tmp_path / "data"))
    result = cli("validate", "-", *folders, stdin=request)
    assert (result.status, result.out.splitlines()[0]) == (0, "valid"), result.err
    folder_lines = ("  - init_from:", "  - train_data_uri: its metadata.json")
    assert not any(line.startswith(folder_lines) for line in result.out.splitlines())
    blind = json.loads(cli("validate", "-", "--json", stdin=request).out)["not_checked"]
    assert [
        line.split(" (")[0] for line in blind if line.startswith(("init_from:", "train_data_uri: its"))
    ] == [
        "init_from: the model folder's config.json",
        "train_data_uri: its metadata.json",
    ]
    no_data = cli("plan", "-", *folders, stdin=json.dumps({"init_from": "s3://my-bucket/data/model/"}))
    assert no_data.status == 2 and _problems(no_data.err) == [
        f"--data-folder {tmp_path / 'data'}: the request has no train_data_uri (the S3 folder the job would read); "
        "set it, and --data-folder gives that folder's local copy"
    ]
    missing = cli(
        "validate", "-", "--init-from", str(model), "--data-folder", str(tmp_path / "none"), stdin=request
    )
    assert missing.status == 2 and _problems(missing.err)[0].startswith(
        f"train_data_uri: {tmp_path / 'none'}: is not a folder (a local copy of s3://my-bucket/data/chats/"
    )
    deployed_too = cli("validate", "-", "--deployed", *folders, stdin=request)
    assert deployed_too.status == 2 and "--init-from, --data-folder: offline only" in deployed_too.err
    planned = json.loads(cli("plan", "-", "--json", *folders, stdin=request).out)
    assert planned["data"]["examples"] == 270 and planned["data"]["windows_exact"]
    printed = cli("plan", "-", *folders, stdin=request).out
    assert "data: 270 training examples in " in printed
    assert "step: 8 windows of 256 tokens (batch_size 1 x grad_accum_steps 1 x 8 GPUs) = 2,048 tokens; holding " \
           "about" in " ".join(printed.split())  # fmt: skip
    from tests.request.test_fine_tuning_request import weightless

    other = weightless(tmp_path / "other", "{{ messages[0]['content'] }}")
    refused = cli("validate", "-", "--init-from", str(other), "--data-folder", str(tmp_path / "data"),
                  stdin=request)  # fmt: skip
    assert (
        refused.status == 2
        and "train_data_uri: the chat template of s3://my-bucket/data/model/" in refused.err
    )


# ---- plan -------------------------------------------------------------------------------------------------------

SEED_HEADLINE = {"precision": "mxfp8", "seq_length": 8192, "batch_size": 16, "activation_checkpointing": True}
EIGHT_B_NO_AC = {"hyperparameters": {"model_preset": "8b"}, "seq_length": 8192, "batch_size": 8}


def test_plan_prints_memory_by_part_time_and_cost(deployed, cli):
    result = cli("plan", "-", stdin=json.dumps(SEED_HEADLINE))
    assert result.status == 0, result.err
    assert "(fits)" in result.out and "saved activations" in result.out and "AdamW state" in result.out
    assert "tokens/s per GPU" in result.out and "cost $" in result.out
    assert (
        "8 GPUs, shard 8:" in result.out
        and "network per step (shard 8): 0.0 GB per instance over EFA" in result.out
    )
    planned = json.loads(cli("plan", "-", "--json", stdin=json.dumps(SEED_HEADLINE)).out)
    assert planned["fits"] and planned["world_size"] == 8 and planned["peak_gib"] < planned["limit_gib"]
    assert abs(sum(planned["parts_gib"].values()) - planned["tensors_gib"]) < 0.05


def test_plan_on_two_instances_shows_the_layout_and_the_networks_share(deployed, cli):
    two = {**SEED_HEADLINE, "instance_count": 2}
    result = cli("plan", "-", stdin=json.dumps(two))
    assert result.status == 0, result.err
    planned = json.loads(cli("plan", "-", "--json", stdin=json.dumps(two)).out)
    assert planned["data_parallel"] == {"replicate": 2, "shard": 8}
    net = planned["network"]
    assert "16 GPUs, replicate 2 x shard 8:" in result.out
    assert (
        f"network per step (replicate 2 x shard 8): {net['efa_gb_per_instance']:.1f} GB per instance over EFA, "
        f"{net['nvlink_gb_per_gpu']:.1f} GB per GPU over NVLink; busy {net['busy_seconds']:.3f} s, exposed "
        f"{net['exposed_seconds']:.3f} s ({100 * net['share']:.1f}% of the step; links: "
    ) in result.out
    assert net["efa_gb_per_instance"] > 1
    pinned = cli("plan", "-", stdin=json.dumps({**two, "hyperparameters": {"data_parallel_replicate": "1"}}))
    assert "16 GPUs, shard 16:" in pinned.out


def test_plan_of_a_request_that_cannot_fit_exits_2_with_advice(deployed, cli):
    result = cli("plan", "-", stdin=json.dumps(EIGHT_B_NO_AC))
    assert result.status == 2
    assert "DOES NOT FIT" in result.out and "fits with: activation_checkpointing true" in result.out
    planned = json.loads(cli("plan", "-", "--json", stdin=json.dumps(EIGHT_B_NO_AC)).out)
    assert not planned["fits"] and planned["advice"][0].startswith("activation_checkpointing true")


def test_plan_of_an_invalid_request_lists_its_problems(deployed, cli):
    result = cli("plan", "--set", "batch_size=0")
    assert result.status == 2 and "batch_size: must be an integer in [1, 4096]" in result.err


def test_submit_prints_the_plan_before_it_starts(deployed, cli):
    prefix = deployed.prefix()
    deployed.plan(prefix, Outcome())
    result = cli("submit", "--name", f"run-{prefix}", "--set", f"job_name_prefix={prefix}")
    assert result.status == 0, result.err
    assert result.out.index("Plan: ") < result.out.index(f"started run run-{prefix}")
    as_json = json.loads(
        cli("submit", "--json", "--name", f"run-{prefix}-j", "--set", f"job_name_prefix={prefix}").out
    )
    assert as_json["plan"]["fits"] and as_json["plan"]["peak_gib"] > 0


def test_plan_takes_the_workflows_bucket_offline_as_validate_does(deployed, cli):
    elsewhere = json.dumps({"train_data_uri": "s3://someone-elses-bucket/data/tokens/"})
    named = cli("plan", "-", "--bucket", deployed.bucket, stdin=elsewhere)
    assert named.status == 2 and _problems(named.err) == [
        f"train_data_uri: must be an s3:// prefix ending in '/' under one of s3://{deployed.bucket}/data/, or null; "
        'got "s3://someone-elses-bucket/data/tokens/"'
    ]
    own = cli("plan", "-", "--json", "--bucket", deployed.bucket,
              stdin=json.dumps({"train_data_uri": f"s3://{deployed.bucket}/data/tokens/"}))  # fmt: skip
    assert own.status == 0, own.err
    both = cli("plan", "-", "--deployed", "--bucket", deployed.bucket, stdin=elsewhere)
    assert both.status == 2 and "--bucket: offline only" in both.err


def test_tune_dry_run_reads_local_copies_of_the_requests_folders_as_plan_does(cli, tmp_path):
    """Offline, tune --dry-run takes --init-from DIR (the model's shape) and --data-folder DIR (the candidates the
    conversation data cannot fill left out), as validate and plan do; a run started reads S3 and refuses them."""
    model = prepared_chat_copies(tmp_path)
    request = json.dumps({"init_from": "s3://my-bucket/data/model/", "train_data_uri": "s3://my-bucket/data/chats/",
                          "precision": "bf16", "seq_length": 256, "batch_size": 1,
                          "tune": {"search_space": {"batch_size": [1, 64]}, "max_trials": 2}})  # fmt: skip
    blind = cli("tune", "-", "--dry-run", stdin=request)
    assert blind.status == 2 and "or offline with a local copy of the folder (--init-from DIR)" in blind.err
    folders = ("--init-from", str(model), "--data-folder", str(tmp_path / "data"))
    shown = cli("tune", "-", "--dry-run", "--json", *folders, stdin=request)
    assert shown.status == 0, shown.err
    planned = json.loads(shown.out)["plan"]
    assert [t["settings"]["batch_size"] for t in planned["trials"] if not t["probe"]] == [1]
    assert any(
        r.startswith("batch_size=64") for r in planned["refused_by_the_trainer"]
    )  # 270 examples: too few
    started = cli("tune", "-", *folders, stdin=request)
    assert started.status == 2 and "--init-from, --data-folder: with --dry-run only" in started.err
