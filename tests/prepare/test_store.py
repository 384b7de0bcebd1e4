"""``S3Store`` under the Processing job role's permissions, against a real S3-compatible server on loopback (moto's
server mode).

The role may list the bucket only under its prefixes (``s3:ListBucket`` with an ``s3:prefix`` condition,
``constructs_lib/preparation/permissions.py``). S3 answers ``HeadObject``/``GetObject`` of a missing key with 403,
not 404, when the caller has no ``s3:ListBucket`` for that request (S3 API reference, HeadObject: "If you don't have
the s3:ListBucket permission, Amazon S3 returns an HTTP status code 403"), and those requests carry no ``s3:prefix``
to meet the condition. moto does not evaluate IAM conditions, so ``role_client`` applies that one documented rule on
top of the real server: every other answer is the server's.
"""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from constructs_lib.preparation import construct, job_request
from tests.training.input_formats import write_corpus
from training.prepare import job, kinds
from training.prepare.kinds import file_sha256
from training.prepare.store import S3Store, StoreError
from training.request import data_manifest as manifest

BUCKET = "data"


@pytest.fixture(scope="module")
def endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def role_client(endpoint: str):
    """A client as the job role sees S3: a missing key's HeadObject/GetObject is 403 AccessDenied."""
    client = boto3.client("s3", region_name="us-west-2", endpoint_url=endpoint, aws_access_key_id="test",
                          aws_secret_access_key="test")  # fmt: skip
    if BUCKET not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})

    def forbid_missing(params, model, **_):
        listed = client.list_objects_v2(Bucket=params["Bucket"], Prefix=params["Key"], MaxKeys=1)
        if [o["Key"] for o in listed.get("Contents", [])] != [params["Key"]]:
            raise ClientError({"Error": {"Code": "403" if model.name == "HeadObject" else "AccessDenied",
                                         "Message": "Forbidden"}}, model.name)  # fmt: skip

    for operation in ("HeadObject", "GetObject"):
        client.meta.events.register(f"before-parameter-build.s3.{operation}", forbid_missing)
    return client


def test_the_rule_applied_is_s3s_403_for_a_missing_key(endpoint):
    client = role_client(endpoint)
    with pytest.raises(ClientError) as missing:
        client.head_object(Bucket=BUCKET, Key="nothing/here")
    assert missing.value.response["Error"]["Code"] == "403"


def test_existence_is_asked_by_listing_so_a_missing_key_is_absent_not_forbidden(endpoint, tmp_path):
    client = role_client(endpoint)
    store = S3Store(f"s3://{BUCKET}/out/store/", client)
    assert store.head("a.bin") is None and store.get("a.bin") is None
    path = tmp_path / "a.bin"
    path.write_bytes(b"tokens")
    assert store.put("a.bin", path, file_sha256(path))
    # a longer key with it as prefix
    client.put_object(Bucket=BUCKET, Key="out/store/a.bin.longer", Body=b"x")
    assert store.head("a.bin") == (6, file_sha256(path)) and store.get("a.bin") == b"tokens"
    assert store.head("a.bi") is None and store.get("a.bi") is None  # a prefix of a key is not the key


def test_a_fresh_output_is_prepared_under_the_roles_permissions(endpoint, tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    here = job.local_inputs(corpus)
    store = S3Store(f"s3://{BUCKET}/prepared/fresh/", role_client(endpoint))
    outcome = job.run(
        job.Options(validation_fraction=0.2), store, sorted(here), here, workers=1, say=lambda _: None
    )
    assert outcome.manifest and outcome.prepared == len(here)
    assert manifest.MANIFEST_FILE in store.listing()
    again = job.run(
        job.Options(validation_fraction=0.2), store, sorted(here), here, workers=1, say=lambda _: None
    )
    assert again.skipped == len(here) and again.prepared == 0


def test_an_s3_refusal_is_one_error_line_and_the_exit_message(endpoint, tmp_path, monkeypatch, capsys):
    for name, value in (("AWS_ENDPOINT_URL", endpoint), ("AWS_ACCESS_KEY_ID", "test"),
                        ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-west-2")):  # fmt: skip
        monkeypatch.setenv(name, value)
    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    message = tmp_path / "output" / "message"
    code = job.main(["--input", str(corpus), "--output", "s3://no-such-bucket/prepared/", "--workers", "1",
                     "--exit-message", str(message)])  # fmt: skip
    line = capsys.readouterr().err.strip()
    assert code == 2 and line.startswith("error: ") and "NoSuchBucket" in line and "\n" not in line
    assert message.read_text() == line


def test_shards_are_written_under_the_scratch_given(endpoint, tmp_path):
    corpus, scratch, seen = tmp_path / "corpus", tmp_path / "volume" / "scratch", []
    write_corpus(corpus)
    here = job.local_inputs(corpus)
    store = S3Store(f"s3://{BUCKET}/prepared/scratch/", role_client(endpoint))
    say = lambda line: seen.extend(p.name for p in scratch.glob("prepare-*"))  # noqa: E731
    job.run(
        job.Options(validation_fraction=0.2),
        store,
        sorted(here),
        here,
        workers=1,
        say=say,
        scratch=str(scratch),
    )
    assert seen and list(scratch.iterdir()) == []  # used while preparing, emptied after


def test_the_state_machines_paths_are_the_scripts():
    assert job_request.EXIT_MESSAGE == job.EXIT_MESSAGE and job_request.SCRATCH == job.PROCESSING_SCRATCH
    assert tuple(kinds.KINDS) == construct.KINDS and construct.TOO_LONG == kinds.TOO_LONG


def test_a_file_above_the_multipart_size_goes_up_in_parts_and_is_never_overwritten(endpoint, tmp_path):
    """S3's single PUT stops at 5 GB: a big shard file goes up through s3transfer's managed multipart upload (here
    with the threshold lowered to 8 MiB and 5 MiB parts, S3's smallest), completed only where no object is."""
    client, parts = role_client(endpoint), []
    client.meta.events.register("before-call.s3.UploadPart", lambda **_: parts.append(1))
    store = S3Store(f"s3://{BUCKET}/out/big/", client, multipart_bytes=8 << 20, part_bytes=5 << 20)
    big, other = tmp_path / "train.bin", tmp_path / "other.bin"
    big.write_bytes(bytes(range(256)) * (12 << 12))  # 12 MiB
    other.write_bytes(b"\1" * (12 << 20))
    assert store.put("train.bin", big, file_sha256(big))
    assert len(parts) == 3
    assert store.head("train.bin") == (12 << 20, file_sha256(big))  # a rerun's check of a complete shard
    assert store.put("train.bin", big, file_sha256(big)) is False  # the same bytes: nothing to do
    with pytest.raises(StoreError, match="already exists with other bytes"):
        store.put("train.bin", other, file_sha256(other))
    assert store.get("train.bin") == big.read_bytes()
