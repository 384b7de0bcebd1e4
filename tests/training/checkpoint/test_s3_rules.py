"""The S3 backend's rules that need no collective: the marker read and checked against a listing, a save judged
whole from its receipts, and an upload that fails half-way never recorded."""

from __future__ import annotations

import hashlib
import json

import pytest

from training.trainer.checkpoint import marker, s3_dcp, s3_store


def _marker(files: dict[str, int]) -> dict:
    return {"world_size": 2, "files": files, "sha256": {name: "0" * 64 for name in files}}


def test_a_marker_must_list_a_size_for_each_file():
    good = _marker({"a": 1})
    assert marker.parse(json.dumps(good).encode()) == (good, None)
    for bad in (b"not json", b"[]", json.dumps({"files": {"a": "1"}, "sha256": {"a": "x"}}).encode()):
        found, problem = marker.parse(bad)
        assert found is None and problem.startswith("unreadable COMPLETE marker (")


@pytest.mark.parametrize(
    ("objects", "problem"),
    [
        ({"a": 1, "b": 2}, None),
        ({"a": 1}, "b is missing"),
        ({"a": 1, "b": 3}, "b has 3 bytes, COMPLETE lists 2"),
        ({"a": 1, "b": 2, "c": 5}, "c is not listed in COMPLETE"),
    ],
)
def test_the_listing_is_checked_against_the_marker(objects, problem):
    assert marker.size_problem(_marker({"a": 1, "b": 2}), objects) == problem


def test_a_save_is_whole_only_with_every_ranks_receipt_and_every_object_they_list():
    started = {"world_size": 2}
    receipts = {0: {".metadata": (5, "x"), "__0_0.distcp": (7, "y")}, 1: {"__1_0.distcp": (8, "z")}}
    objects = {".metadata": 5, "__0_0.distcp": 7, "__1_0.distcp": 8}
    assert s3_store.written_whole(objects, receipts, started) is None
    assert s3_store.written_whole(objects, {0: receipts[0]}, started) == (
        "rank_00001.receipt is missing: rank 1's upload did not finish"
    )
    assert s3_store.written_whole({**objects, "__1_0.distcp": 4}, receipts, started) == (
        "__1_0.distcp is missing or of another size than its receipt lists"
    )
    assert s3_store.written_whole(objects, receipts, None) == "no readable STARTED"
    assert s3_store.written_whole(objects, {0: {"__0_0.distcp": (7, "y")}, 1: receipts[1]}, started) == (
        "no .metadata: DCP's write did not finish"
    )


def test_the_listing_sorts_checkpoints_set_aside_records_and_other_keys():
    found = s3_store.Listing(
        checkpoints={"step_00000010": {"COMPLETE": 1}, "step_00000002": {"COMPLETE": 1}, "step_00000011": {"a": 1},
                     "step_00000003": {"COMPLETE": 1}},
        set_aside={"step_00000003"},
    )  # fmt: skip
    assert found.sealed() == ["step_00000002", "step_00000010"]
    assert found.incomplete() == ["step_00000011"]
    assert found.taken("step_00000003") and found.taken("step_00000011") and not found.taken("step_00000012")


class _Upload:
    """Stands in for the connector's upload stream: records what reached it and whether it was completed."""

    def __init__(self):
        self.data, self.completed = b"", False

    def write(self, data):
        self.data += bytes(data)

    def flush(self):
        pass

    def close(self):
        self.completed = True


def test_the_hashing_stream_passes_every_byte_and_completes_only_when_closed():
    upload = _Upload()
    stream = s3_dcp._HashingStream(upload)
    stream.write(b"abc")
    stream.write(memoryview(b"defg"))
    assert stream.tell() == 7 and upload.data == b"abcdefg" and not upload.completed
    del stream  # dropped half-way (an exception): never completes the upload by itself
    assert not upload.completed


def test_an_upload_that_fails_half_way_is_never_recorded(s3_bucket):
    fs = s3_dcp._HashingFileSystem(f"s3://{s3_bucket}/run/step_00000001", s3_dcp.DEFAULT_TUNING)
    with (
        pytest.raises(RuntimeError),
        fs.create_stream(f"s3://{s3_bucket}/run/step_00000001/__0_0.distcp", "wb") as out,
    ):
        out.write(b"x" * 1024)
        raise RuntimeError("the write failed")
    assert fs.digests == {}
    with fs.create_stream(f"s3://{s3_bucket}/run/step_00000001/__1_0.distcp", "wb") as out:
        out.write(b"y" * 10)
    assert fs.digests == {"__1_0.distcp": (10, hashlib.sha256(b"y" * 10).hexdigest())}
