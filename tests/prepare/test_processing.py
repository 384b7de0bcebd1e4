"""The Processing job's script as N local instances: each a process with its own ``/opt/ml/processing``-shaped
folder holding its share of the input objects (as ``ShardedByS3Key`` hands them out), all listing the input and
writing the output through a real S3-compatible server on loopback (moto's server mode). One instance and four,
and a local run into a folder (``python -m training.prepare --sharded``, as docs/data.md prints it), give the same
objects byte for byte; a rerun writes nothing new."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.training.input_formats import write_corpus
from training.prepare.store import LocalStore
from training.request import data_manifest as manifest

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "data"
FRACTION = "0.2"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-west-2"}  # fmt: skip
    client = boto3.client("s3", region_name="us-west-2", endpoint_url=env["AWS_ENDPOINT_URL"],
                          aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    corpus = tmp_path_factory.mktemp("corpus")
    write_corpus(corpus)
    for path in sorted(p for p in corpus.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"raw/{path.relative_to(corpus).as_posix()}")
    yield client, env, corpus
    server.stop()


def instances(tmp: Path, client, count: int, prefix: str = "raw/") -> list[Path]:
    """``count`` instance folders, each with its share of ``prefix``'s objects under opt/ml/processing/input/data
    (every ``count``-th key, starting from a different one than SageMaker might: the output must not care)."""
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"])[::-1]
    folders = []
    for index in range(count):
        data = tmp / f"algo-{index + 1}" / "opt/ml/processing/input/data"
        data.mkdir(parents=True)
        for key in keys[index::count]:
            target = data / key.removeprefix(prefix)
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(BUCKET, key, str(target))
        folders.append(data)
    return folders


def launch(env: dict[str, str], output: str, local_input: Path, workers: int = 1, prefix: str = "raw/",
           extra: tuple[str, ...] = ()) -> subprocess.Popen:  # fmt: skip
    command = [sys.executable, "-m", "training.prepare.job", "--input", f"s3://{BUCKET}/{prefix}", "--output", output,
               "--local-input", str(local_input), "--validation-fraction", FRACTION, "--workers", str(workers),
               *extra]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def objects(client, prefix: str) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {
        o["Key"][len(prefix) :]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed
    }


def test_one_instance_and_four_and_a_local_run_write_the_same_bytes(s3, tmp_path):
    client, env, corpus = s3
    runs = {"one": instances(tmp_path / "one", client, 1), "four": instances(tmp_path / "four", client, 4)}
    started = [launch(env, f"s3://{BUCKET}/prepared/one/", runs["one"][0], workers=2)]
    started += [launch(env, f"s3://{BUCKET}/prepared/four/", folder) for folder in runs["four"]]
    logs = [process.communicate(timeout=600)[0] for process in started]
    assert [p.returncode for p in started] == [0] * 5, "\n".join(logs)
    assert sum("manifest s3://" in log for log in logs[1:]) >= 1  # the last of the four wrote it
    local = tmp_path / "local"
    done = subprocess.run([sys.executable, "-m", "training.prepare", "--sharded", str(corpus), "--output", str(local),
                           "--validation-fraction", FRACTION, "--workers", "1"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    one, four = objects(client, "prepared/one/"), objects(client, "prepared/four/")
    assert manifest.MANIFEST_FILE in one and len([n for n in one if n.endswith("record.json")]) == 7
    assert one == four
    assert {n: (local / n).read_bytes() for n in LocalStore(local).listing()} == one
    # a rerun of the four finds every shard complete (by checksum) and writes nothing
    again = [launch(env, f"s3://{BUCKET}/prepared/four/", folder) for folder in runs["four"]]
    logs = [process.communicate(timeout=600)[0] for process in again]
    assert [p.returncode for p in again] == [0] * 4, "\n".join(logs)
    assert all(", 0 to prepare" in log for log in logs)
    assert objects(client, "prepared/four/") == four


def test_preference_pairs_on_one_instance_and_three_are_the_same_bytes(s3, tmp_path):
    """Issue 55 item 3 for preference pairs (``--kind pairs``, the model folder as the model channel): one instance
    and three, each with its share of the objects, write the same objects (a local ``--sharded`` run writes the
    Processing script's bytes: test_local_sharded's test of pairs)."""
    from tests.prepare.test_local_sharded import write_pairs
    from tests.training.chat_models import model_folder

    client, env, _ = s3
    model = model_folder(tmp_path / "model", "qwen2.5")
    for path in write_pairs(tmp_path / "pairs"):
        client.upload_file(str(path), BUCKET, f"raw-pairs/{path.name}")
    extra = ("--kind", "pairs", "--model", str(model), "--max-tokens", "258", "--too-long", "truncate")
    runs = {
        n: instances(tmp_path / n, client, count, "raw-pairs/") for n, count in (("one", 1), ("three", 3))
    }
    started = [launch(env, f"s3://{BUCKET}/pairs/{name}/", folder, prefix="raw-pairs/", extra=extra)
               for name, folders in runs.items() for folder in folders]  # fmt: skip
    logs = [process.communicate(timeout=600)[0] for process in started]
    assert [p.returncode for p in started] == [0] * 4, "\n".join(logs)
    one, three = objects(client, "pairs/one/"), objects(client, "pairs/three/")
    assert b'"kind": "preference"' in one[manifest.MANIFEST_FILE]
    assert len([n for n in one if n.endswith("record.json")]) == 3 and one == three
