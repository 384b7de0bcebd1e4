"""The plan's checkpoint figures: the state's size, S3 direct scaling with the instances, SageMaker's folder copy
not, every rate with its source."""

from __future__ import annotations

import pytest

from training.request import checkpoint_time


def test_a_70b_state_is_about_840_gb_and_two_instances_halve_the_s3_resume():
    one, two = (checkpoint_time.checkpoint_times(70.6e9, n) for n in (1, 2))
    assert one.state_gb == pytest.approx(847.2)
    assert two.resume_s3 == pytest.approx(one.resume_s3 / 2)
    assert two.upload == pytest.approx(one.upload / 2)
    assert two.resume_folder == one.resume_folder  # every instance copies the whole prefix
    assert two.pause == pytest.approx(one.pause / 2)


def test_the_prefix_request_rate_caps_the_upload_of_many_instances():
    many = checkpoint_time.checkpoint_times(70.6e9, 8)
    assert many.upload == pytest.approx(847.2 / (3500 * 8 * 1024 * 1024 / 1e9))


def test_the_rows_cover_8b_and_70b_on_one_and_two_instances_and_name_their_sources():
    lines = checkpoint_time.rows()
    assert len(lines) == 5 and lines[1].startswith("8B") and lines[4].startswith("70B")
    for source in ("PCI-SIG", "148.8 s", "throughput_target_gbps", "3,500 PUT", "CheckpointConfig"):
        assert source in checkpoint_time.SOURCES


def test_the_folder_backend_holds_the_step_to_hash_its_files_where_s3_direct_hashes_behind_it():
    one = checkpoint_time.checkpoint_times(8.03e9, 1)
    assert one.folder_seal == pytest.approx(96.36 / 8 / 0.65)
    assert one.folder_seal > 10 * one.pause
