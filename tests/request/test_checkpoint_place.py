"""Where a decided job keeps its checkpoints (``training.request.job``): the backend ``auto`` picks by instance count,
the run's own prefix under the workflow's checkpoint prefix (the one the execution role's grants cover) as an
S3-direct trainer's ``checkpoint_dir``, and the refusals named before anything launches."""

from __future__ import annotations

from training.contract.container import CHECKPOINT_LOCAL_PATH
from training.request.decision import decide_request
from training.request.job import job_checkpoint_uri
from training.request.rules import RequestRules

RULES = RequestRules(bucket_name="team-bucket", checkpoint_prefix="ckpts/", workflow_segment="Team-Workflow")


def _decided(raw: dict, execution: str = "run-7") -> dict[str, str]:
    decision = decide_request(raw, RULES, execution=execution)
    assert decision.problems == [], decision.problems
    return decision.hyperparameters


def test_several_instances_write_the_runs_own_prefix_inside_the_granted_one():
    hyperparameters = _decided({"instance_count": 2})
    assert hyperparameters["checkpoint_backend"] == "s3"
    assert hyperparameters["checkpoint_dir"] == "s3://team-bucket/ckpts/Team-Workflow/run-7/"
    assert hyperparameters["checkpoint_dir"].startswith(f"s3://{RULES.bucket_name}/{RULES.checkpoint_prefix}")


def test_one_instance_keeps_the_folder_unless_asked():
    assert _decided({})["checkpoint_dir"] == CHECKPOINT_LOCAL_PATH
    asked = _decided({"hyperparameters": {"checkpoint_backend": "s3"}})
    assert asked["checkpoint_dir"] == "s3://team-bucket/ckpts/Team-Workflow/run-7/"
    folder = _decided({"instance_count": 2, "hyperparameters": {"checkpoint_backend": "folder"}})
    assert folder["checkpoint_dir"] == CHECKPOINT_LOCAL_PATH and folder["checkpoint_backend"] == "folder"


def test_a_checkpoint_dir_of_the_requests_own_is_refused_by_name():
    """Another bucket or prefix would be outside the role's grants (and outside the run's folder the check keeps
    apart): the request cannot name one; the workflow sets it."""
    problems = decide_request(
        {"instance_count": 2, "hyperparameters": {"checkpoint_dir": "s3://other-bucket/anywhere/"}}, RULES
    ).problems
    assert any(p.startswith("hyperparameters.checkpoint_dir") for p in problems), problems


def test_a_tuning_run_asking_for_s3_checkpoints_is_refused_naming_the_setting():
    problems = decide_request(
        {"hyperparameters": {"checkpoint_backend": "s3"}, "tune": {}}, RULES, execution="run-7"
    ).problems
    assert any(p.startswith("hyperparameters.checkpoint_backend: a tuning run keeps") for p in problems), (
        problems
    )


def test_an_unknown_backend_is_refused_with_the_choices():
    problems = decide_request({"hyperparameters": {"checkpoint_backend": "nfs"}}, RULES).problems
    assert any("checkpoint_backend" in p and "auto" in p and "s3" in p and "folder" in p for p in problems)


def test_a_jobs_checkpoints_are_found_for_either_backend():
    folder = {"CheckpointConfig": {"S3Uri": "s3://b/ckpts/W/run-1/"}, "HyperParameters": {}}
    direct = {"HyperParameters": {"checkpoint_dir": "s3://b/ckpts/W/run-2/", "checkpoint_backend": "s3"}}
    assert job_checkpoint_uri(folder) == "s3://b/ckpts/W/run-1/"
    assert job_checkpoint_uri(direct) == "s3://b/ckpts/W/run-2/"
    assert job_checkpoint_uri({"HyperParameters": {"checkpoint_dir": "/opt/ml/checkpoints"}}) is None
