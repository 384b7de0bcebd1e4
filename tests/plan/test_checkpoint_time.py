"""The plan's checkpoint figures: the state's size, S3 direct scaling with the instances, SageMaker's folder copy
not, the folder's seal holding the step, every rate with its source; and the plan of a request showing them on the
backend its job uses."""

from __future__ import annotations

import pytest

from training.plan import checkpoint_time
from training.plan.estimate import make_plan
from training.plan.report import format_plan


def test_a_70b_state_is_about_850_gb_and_two_instances_halve_the_s3_upload_and_resume():
    one, two = (checkpoint_time.checkpoint_times(70.6e9, n, "s3") for n in (1, 2))
    assert one.state_gb == pytest.approx(847.2)
    assert two.resume == pytest.approx(one.resume / 2)
    assert two.upload == pytest.approx(one.upload / 2)
    assert two.pause == pytest.approx(one.pause / 2)


def test_every_instance_copies_the_whole_prefix_for_the_folder_backend():
    one, two = (checkpoint_time.checkpoint_times(70.6e9, n, "folder", keep=3) for n in (1, 2))
    assert two.resume == one.resume  # every instance downloads every kept checkpoint, then hashes it all
    assert one.resume == pytest.approx(3 * 847.2 / 10 + 847.2 / 8 / 0.65)


def test_the_prefix_request_rate_caps_the_upload_of_many_instances():
    many = checkpoint_time.checkpoint_times(70.6e9, 16, "s3")
    assert many.upload == pytest.approx(847.2 / (3500 * 8 * 1024 * 1024 / 1e9))


def test_the_rows_cover_8b_and_70b_on_one_and_two_instances_and_name_their_sources():
    lines = checkpoint_time.table(checkpoint_time.parse_args([])).splitlines()
    assert len(lines) == 6 and lines[2].startswith("| 8B") and lines[5].startswith("| 70B")
    for source in (
        "PCI-SIG",
        "148.8 s",
        "throughput_target_gbps",
        "3,500 PUT",
        "CheckpointConfig",
        "0.65 GB/s",
    ):
        assert source in checkpoint_time.SOURCES


def test_the_folder_backend_holds_the_step_to_hash_its_files_where_s3_direct_hashes_behind_it():
    s3, folder = (checkpoint_time.checkpoint_times(8.03e9, 1, backend) for backend in ("s3", "folder"))
    assert folder.pause == pytest.approx(s3.pause + 96.36 / 8 / 0.65)
    assert folder.pause > 10 * s3.pause


@pytest.mark.parametrize(
    ("count", "setting", "backend"),
    [(1, None, "folder"), (2, None, "s3"), (1, "s3", "s3"), (2, "folder", "folder")],
)
def test_a_requests_plan_shows_the_checkpoints_of_the_backend_its_job_uses(count, setting, backend):
    hyperparameters = {"model_preset": "llama3.1-8b", "max_steps": 100}
    if setting:
        hyperparameters["checkpoint_backend"] = setting
    plan = make_plan({"instance_count": count, "hyperparameters": hyperparameters})
    shown = plan.to_dict()["checkpoint"]
    assert shown["backend"] == backend and shown["state_gb"] == pytest.approx(96.4, abs=0.1)
    assert "checkpoint_backend" in format_plan(plan) and "PCI-SIG" in format_plan(plan)


def test_a_lora_runs_checkpoint_holds_its_adapters_only():
    plan = make_plan({"hyperparameters": {"model_preset": "llama3.1-8b", "lora_rank": 16}})
    assert plan.to_dict()["checkpoint"]["state_gb"] < 1
