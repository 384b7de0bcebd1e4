"""Measured throughput in the plan: a stored record stands for a request only under the key rules (same settings,
instance, GPU, image tag and versions); the plan says which figures it used and checks its memory estimate."""

from __future__ import annotations

from typing import Any

import pytest

from training.contract import settings_parse, tuning
from training.plan import band, inputs, measured, memory
from training.plan import estimate as plan_estimate

INSTANCE = "ml.p6-b200.48xlarge"
REQUEST = {"precision": "bf16", "batch_size": 4, "seq_length": 8192, "activation_checkpointing": True}


def record(
    request: dict[str, Any] = REQUEST,
    *,
    tag: str = "abc123",
    tps: float = 31_000.0,
    gpu: str = "B200",
    device: str = "cuda",
    torch_version: str = "2.9.0",
    at: str = "2026-11-20T10:00:00+00:00",
    status: str = "ok",
    allocated: float | None = 60.0,
    count: int = 1,
) -> dict[str, Any]:
    values = settings_parse.parse_hyperparameters(inputs.trainer_settings(request))
    key = measured.make_key(values, instance_type=INSTANCE, instance_count=count, image_tag=tag,
                            torch_version=torch_version, te_version="2.11.0")  # fmt: skip
    figures = {"status": status, "tokens_per_sec_per_gpu": tps, "max_allocated_gb": allocated,
               "step_seconds": {"steps": 20, "median": 1.0}}  # fmt: skip
    where = {"device": device, "gpu": gpu, "world_size": 8, "job": "tune-job-1", "measured_at": at}
    return measured.make_record(key, figures, where)


def test_without_records_the_plan_estimates_from_the_articles_points():
    planned = plan_estimate.make_plan(REQUEST).to_dict()
    assert planned["throughput_basis"] == "estimate" and planned["measured"] is None
    assert (
        planned["throughput_source"] == "scaled from " + band.REFERENCE_SOURCE
        and planned["memory_check"] is None
    )
    assert band.REFERENCE_URL in planned["throughput_source"]


def test_a_matching_record_gives_measured_throughput_and_says_where_it_was_measured():
    planned = plan_estimate.make_plan(REQUEST, measurements=[record()], image_tag="abc123").to_dict()
    assert planned["throughput_basis"] == "measured"
    assert planned["tokens_per_sec_per_gpu"] == 31_000
    assert (
        "tuning job tune-job-1" in planned["throughput_source"]
        and "image abc123" in planned["throughput_source"]
    )
    assert planned["step_seconds"] == pytest.approx(4 * 8192 / 31_000, rel=1e-3)


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({"tag": "def456"}, "another image tag"),
        ({"gpu": "H100"}, "measured on other GPUs"),
        ({"device": "cpu", "gpu": None}, "a CPU run"),
        ({"status": "oom"}, "it did not run"),
        ({"count": 2}, "another instance count"),
        ({"request": {**REQUEST, "batch_size": 8}}, "other settings"),
        ({"request": {**REQUEST, "hyperparameters": {"loss_chunk_tokens": 0}}}, "another loss chunk"),
    ],
)
def test_a_record_that_differs_in_any_part_of_its_key_is_not_used(changed, why):
    planned = plan_estimate.make_plan(REQUEST, measurements=[record(**changed)], image_tag="abc123")
    assert planned.timing.basis == "estimate", why


def test_versions_given_by_the_caller_must_match_and_the_newest_record_wins():
    old, new = (
        record(tps=20_000.0, at="2026-11-01T00:00:00+00:00"),
        record(tps=30_000.0, at="2026-11-21T00:00:00+00:00"),
    )
    values = settings_parse.parse_hyperparameters(inputs.trainer_settings(REQUEST))
    found = measured.find([old, new], values, instance_type=INSTANCE, instance_count=1, image_tag="abc123")
    assert found["measured"]["tokens_per_sec_per_gpu"] == 30_000.0
    stale = measured.find([new], values, instance_type=INSTANCE, instance_count=1, image_tag="abc123",
                          versions={"torch": "2.10.0", "transformer_engine": "2.11.0"})  # fmt: skip
    assert stale is None
    assert measured.find([new], values, instance_type=INSTANCE, instance_count=1, image_tag=None) is None


def test_the_plan_reports_its_memory_error_against_the_stored_measurements():
    other = {**REQUEST, "batch_size": 2}
    estimate = memory.estimate_memory(inputs.setup_from_request(REQUEST)).tensors_gib * 2**30 / 1e9
    records = [
        record(allocated=estimate * 1.25),
        record(other, allocated=None, status="oom"),
        record(tag="zzz"),
    ]
    check = plan_estimate.make_plan(REQUEST, measurements=records, image_tag="abc123").to_dict()[
        "memory_check"
    ]
    assert check["records"] == 1 and check["this_request_error_pct"] == pytest.approx(-20.0, abs=0.1)
    assert check["mean_abs_error_pct"] == pytest.approx(20.0, abs=0.1)
    assert check["oom_predicted_to_fit"] == 1  # batch 2 with AC is predicted to fit, and it ran out of memory


@pytest.mark.parametrize("tag", ["latest", None])
def test_no_record_is_matched_under_a_mutable_or_missing_image_tag(tag):
    """An image without a tag or tagged latest (tuning.image_tag says 'latest' for both) moves with each push:
    its records could be of an older image, so none stands for a request and none checks the memory estimate."""
    assert tuning.image_tag("123.dkr.ecr.us-west-2.amazonaws.com/repo") == "latest"
    assert tuning.image_tag("123.dkr.ecr.us-west-2.amazonaws.com/repo:latest") == "latest"
    planned = plan_estimate.make_plan(REQUEST, measurements=[record(tag="latest")], image_tag=tag)
    assert planned.timing.basis == "estimate" and planned.memory_check is None


def test_an_image_tag_pushed_again_with_other_versions_makes_its_older_records_stale():
    """Without versions from the caller, the tag's newest record says what the image holds now: a record of the
    same tag with another torch (e.g. the same training/ built on another base image) is not used."""
    older = record(tps=20_000.0, torch_version="2.8.0", at="2026-11-01T00:00:00+00:00")
    newer_other_settings = record({**REQUEST, "batch_size": 8}, at="2026-11-21T00:00:00+00:00")
    planned = plan_estimate.make_plan(REQUEST, measurements=[older, newer_other_settings], image_tag="abc123")
    assert planned.timing.basis == "estimate"  # the only record of these settings is of the older build
    assert planned.memory_check["records"] == 1  # only the current build's record checks the estimate
    current = record(tps=25_000.0, at="2026-11-22T00:00:00+00:00")
    planned = plan_estimate.make_plan(
        REQUEST, measurements=[older, newer_other_settings, current], image_tag="abc123"
    )
    assert planned.timing.basis == "measured" and planned.timing.tokens_per_sec_per_gpu == 25_000.0


def test_malformed_stored_records_are_skipped_when_read_never_fatal():
    import json

    import boto3
    from moto import mock_aws

    from training.request.reads import read_measurements
    from training.request.rules import RequestRules

    good = record()
    bad = [
        {**good, "schema": 99},
        {**good, "key": "not a key"},
        {**good, "key": {**good["key"], "instance_count": "1"}},
        {**good, "measured": {**good["measured"], "tokens_per_sec_per_gpu": "fast"}},
        {**good, "measured": {**good["measured"], "max_allocated_gb": "60"}},
        "a string",
    ]
    assert measured.well_formed(good) and not any(measured.well_formed(r) for r in bad)
    assert measured.well_formed({**good, "measured": {"status": "oom", "tokens_per_sec_per_gpu": None}})
    rules = RequestRules(region="us-west-2", bucket_name="records-bucket",
                         image_uri="1.dkr.ecr.us-west-2.amazonaws.com/r:abc123").with_limits()  # fmt: skip
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(
            Bucket="records-bucket", CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
        )
        prefix = rules.measurements_prefix()
        s3.put_object(
            Bucket="records-bucket", Key=f"{prefix}a.json", Body=json.dumps({"records": [good, *bad]})
        )
        s3.put_object(Bucket="records-bucket", Key=f"{prefix}b.json", Body=json.dumps({"records": "none"}))
        s3.put_object(Bucket="records-bucket", Key=f"{prefix}c.json", Body=b"not json")
        assert read_measurements(s3, rules) == [good]
