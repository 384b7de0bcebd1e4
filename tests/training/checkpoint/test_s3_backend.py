"""The S3 checkpoint backend against a real S3-compatible server on loopback (moto's server mode, started once per
session): 2 gloo ranks save in the background while the next step runs, seal, verify and load; a layout change on
resume; a kill during an upload; a missing shard; a marker without shards; conditional creation never
overwriting."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from tests.training.runner import ROOT, env
from training.trainer.checkpoint import marker
from training.trainer.checkpoint.s3 import S3Storage
from training.trainer.checkpoint.s3_store import S3Store

PROBE = "tests.training.checkpoint.s3_probe"


def one_rank(uri: str, rank: int = 0, world_size: int = 1) -> S3Storage:
    """The backend as rank ``rank`` of ``world_size`` sees it (collectives on the test's one-process group)."""
    return S3Storage(uri, SimpleNamespace(rank=rank, world_size=world_size, local_rank=rank, cpu_group=None))


def _torchrun(nproc: int, *args: str, server, timeout: float = 180) -> subprocess.Popen:
    command = ["torchrun", "--standalone", f"--nproc-per-node={nproc}",
               "-m", PROBE, *args]  # fmt: skip
    return subprocess.Popen(
        command,
        env={**env(), **server.env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run(nproc: int, *args: str, server) -> str:
    proc = _torchrun(nproc, *args, server=server)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, output
    return output


@pytest.fixture(scope="module")
def saved(s3_server, tmp_path_factory):
    """One 2-rank run: a background save overlapping the next step, sealed, then verified and loaded by both
    ranks; and a 1-rank resume of it (another layout). Shared by the tests below."""
    bucket = "ckpt-shared-run"
    s3_server.client().create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/checkpoints/test/run-1/"
    out = tmp_path_factory.mktemp("s3_probe")
    _run(2, "save", "--uri", uri, "--out", str(out), server=s3_server)
    _run(1, "load", "--uri", uri, "--out", str(out), server=s3_server)
    results = {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}
    return uri, results


def test_a_background_save_is_sealed_with_every_objects_size_and_checksum(saved, s3_server):
    uri, _ = saved
    bucket, prefix = uri[5:].split("/", 1)
    listed = {
        o["Key"][len(prefix) :]: o["Size"]
        for o in s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    }
    names = {key.split("/", 1)[1] for key in listed}
    assert {key.split("/")[0] for key in listed} == {"step_00000001"}
    assert names == {
        "STARTED", "COMPLETE", ".metadata", "__0_0.distcp", "__1_0.distcp",
        "rank_00000.pt", "rank_00001.pt", "rank_00000.receipt", "rank_00001.receipt",
    }  # fmt: skip
    marker = json.loads(
        s3_server.client().get_object(Bucket=bucket, Key=prefix + "step_00000001/COMPLETE")["Body"].read()
    )
    assert marker["files"] == {k.split("/", 1)[1]: v for k, v in listed.items() if not k.endswith("COMPLETE")}
    assert marker["world_size"] == 2 and marker["step"] == 1 and set(marker["sha256"]) == set(marker["files"])


def test_resume_on_the_same_layout_restores_the_state_as_saved_not_the_step_that_overlapped(saved):
    _, results = saved
    for rank in (0, 1):
        result = results[f"save_{rank}"]
        assert "problem" not in result, result
        assert result["model"] == result["expected"]  # the state before the overlapping step, exactly
        assert result["trainer"] == {"step": 1, "rank": rank}
    # DCP writes each replicated value once (on either rank), so rank 0 may read a few bytes of rank 1's object
    assert results["save_1"]["needed"] == ["__1_0.distcp"]
    assert results["save_0"]["needed"] in (["__0_0.distcp"], ["__0_0.distcp", "__1_0.distcp"])


def test_resume_on_another_layout_reads_both_shards_into_one_rank(saved):
    _, results = saved
    one = results["load_1_0"]
    assert "problem" not in one, one
    assert one["model"] == results["save_0"]["expected"]
    assert one["needed"] == ["__0_0.distcp", "__1_0.distcp"]
    assert one["trainer"] == {"step": 1, "rank": 0}  # another world size resumes from rank 0's trainer state


def _copy_checkpoint(s3_server, uri: str, bucket: str, prefix: str) -> None:
    source_bucket, source_prefix = uri[5:].split("/", 1)
    client = s3_server.client()
    for entry in client.list_objects_v2(Bucket=source_bucket, Prefix=source_prefix)["Contents"]:
        key = prefix + entry["Key"][len(source_prefix) :]
        client.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": source_bucket, "Key": entry["Key"]})


def _verdict(uri: str, process_group) -> tuple[str, str | None]:
    store = one_rank(uri)
    name = store.find().sealed[-1]
    found, problem = store.read_marker(name)
    return name, problem if found is None else store.verify(name, found)


def test_a_missing_shard_is_named(saved, s3_server, s3_bucket, process_group):
    _copy_checkpoint(s3_server, saved[0], s3_bucket, "run/")
    s3_server.client().delete_object(Bucket=s3_bucket, Key="run/step_00000001/__1_0.distcp")
    assert _verdict(f"s3://{s3_bucket}/run/", process_group) == ("step_00000001", "__1_0.distcp is missing")


def test_a_marker_without_shards_is_named(saved, s3_server, s3_bucket, process_group):
    source_bucket, source_prefix = saved[0][5:].split("/", 1)
    marker = s3_server.client().get_object(Bucket=source_bucket, Key=source_prefix + "step_00000001/COMPLETE")
    s3_server.client().put_object(
        Bucket=s3_bucket, Key="run/step_00000002/COMPLETE", Body=marker["Body"].read()
    )
    name, problem = _verdict(f"s3://{s3_bucket}/run/", process_group)
    assert name == "step_00000002" and problem is not None and problem.endswith(" is missing")


def test_a_changed_shard_of_the_same_size_fails_its_checksum(saved, s3_server, s3_bucket, process_group):
    _copy_checkpoint(s3_server, saved[0], s3_bucket, "run/")
    client = s3_server.client()
    key = "run/step_00000001/.metadata"
    body = bytearray(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    body[-1] ^= 0xFF
    client.put_object(Bucket=s3_bucket, Key=key, Body=bytes(body))
    assert _verdict(f"s3://{s3_bucket}/run/", process_group)[1] == "rank 0: checksum mismatch in .metadata"


def test_each_object_is_checked_by_one_rank_its_writer_first():
    names = [".metadata", "STARTED", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "rank_00000.pt"]
    shares = [one_rank("s3://bucket/run/", rank, 2).share(names) for rank in (0, 1)]
    assert shares[0] == ["__0_0.distcp", "__2_0.distcp", ".metadata", "rank_00000.pt"]
    assert shares[1] == ["__1_0.distcp", "STARTED"]


def test_a_set_aside_checkpoint_is_left_as_it_is_and_skipped(saved, s3_server, s3_bucket, process_group):
    _copy_checkpoint(s3_server, saved[0], s3_bucket, "run/")
    store = one_rank(f"s3://{s3_bucket}/run/")
    before = store.store.listing().checkpoints["step_00000001"]
    store.set_aside("step_00000001", "a test's reason", "job-1")
    store.set_aside("step_00000001", "a second reason", "job-2")  # the first record stays
    after = store.store.listing()
    assert after.sealed() == [] and after.set_aside == {"step_00000001"}
    assert after.checkpoints["step_00000001"] == before
    assert json.loads(store.store.read("step_00000001.unusable"))["reason"] == "a test's reason"
    assert store.find().set_aside == [("step_00000001", "a test's reason")]
    assert store.begin(1, {"world_size": 1}).name == "step_00000001-2"  # a new save never writes there


def test_a_kill_during_an_upload_leaves_an_incomplete_checkpoint_never_sealed(
    s3_server, s3_bucket, tmp_path, process_group
):
    uri = f"s3://{s3_bucket}/run/"
    proc = _torchrun(1, "kill", "--uri", uri, "--out", str(tmp_path), server=s3_server)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0 and "SIGKILL" in output, output
    listing = S3Store(uri).listing()
    assert listing.sealed() == [] and listing.incomplete() == ["step_00000001"]
    objects = listing.checkpoints["step_00000001"]
    assert set(objects) == {"STARTED", "rank_00000.pt"}  # the shard's upload never completed: no object
    store = one_rank(uri)
    assert (
        store._adopt("step_00000001", objects)
        == "rank_00000.receipt is missing: rank 0's upload did not finish"
    )
    assert store.adopt_written() == [] and store.find().incomplete == [
        ("step_00000001", "no COMPLETE marker, ")
    ]
    assert store.begin(1, {"world_size": 1}).name == "step_00000001-2"


def test_control_objects_are_created_once_never_overwritten(s3_bucket, process_group):
    store = S3Store(f"s3://{s3_bucket}/run")
    assert store.create("step_00000001/COMPLETE", b"first") is True
    assert store.create("step_00000001/COMPLETE", b"second") is False
    assert store.read("step_00000001/COMPLETE") == b"first"


def test_pruning_deletes_the_marker_first_and_only_this_runs_beyond_keep(
    saved, s3_server, s3_bucket, process_group
):
    _copy_checkpoint(s3_server, saved[0], s3_bucket, "run/")
    client = s3_server.client()
    for key in ("run/step_00000007/COMPLETE", "run/step_00000007/__0_0.distcp", "run/notes.txt"):
        client.put_object(Bucket=s3_bucket, Key=key, Body=b"x")
    store = one_rank(f"s3://{s3_bucket}/run/")
    store.prune(1, {"step_00000001"}, None)  # the only one of this run: kept
    assert store.store.listing().sealed() == ["step_00000001", "step_00000007"]
    store.prune(1, {"step_00000001", "step_00000007"}, None)
    left = store.store.listing()
    assert "step_00000001" not in left.checkpoints and left.sealed() == ["step_00000007"]
    assert left.others == ["notes.txt"]


def test_a_receipt_set_from_every_rank_seals_a_save_later(saved, s3_server, s3_bucket, process_group):
    _copy_checkpoint(s3_server, saved[0], s3_bucket, "run/")
    s3_server.client().delete_object(Bucket=s3_bucket, Key="run/step_00000001/COMPLETE")
    store = one_rank(f"s3://{s3_bucket}/run/")
    assert store.store.listing().incomplete() == ["step_00000001"]
    assert store.adopt_written() == [("step_00000001", "step_00000001")]
    name = store.find().sealed[-1]
    found, problem = store.read_marker(name)
    assert problem is None and store.verify(name, found) is None
    original = json.loads(client_get(s3_server, saved[0], "step_00000001/COMPLETE"))
    assert marker.parse(store.store.read(f"{name}/COMPLETE"))[0]["sha256"] == original["sha256"]
    assert store.read_trainer_state(name, "rank_00000.pt") == {"step": 1, "rank": 0}


def client_get(s3_server, uri: str, key: str) -> bytes:
    bucket, prefix = uri[5:].split("/", 1)
    return s3_server.client().get_object(Bucket=bucket, Key=prefix + key)["Body"].read()


def test_a_save_with_a_foreign_started_or_receipt_is_left_unsealed_never_a_crash(s3_bucket, process_group):
    """An unsealed save whose STARTED records no world size, or whose receipt is not one, is not whole: the next
    start leaves it an interrupted write (found when the trainer's damage test wrote STARTED as ``{}``)."""
    store = one_rank(f"s3://{s3_bucket}/run/")
    store.store.create("step_00000001/STARTED", b"{}")
    store.store.create("step_00000002/STARTED", b'{"world_size": 1}')
    store.store.create("step_00000002/rank_00000.receipt", b'["not", "a receipt"]')
    store.store.create("step_00000002/.metadata", b"x")
    assert store.adopt_written() == []
    assert store.find().incomplete == [
        ("step_00000001", "no COMPLETE marker, "),
        ("step_00000002", "no COMPLETE marker, "),
    ]
