"""One Processing instance against four, on real text: the same objects, byte for byte, and a local run's too.

    python -m training.measure.prepare_instances --tokenizer llama3/tokenizer.json \\
        --wikipedia enwiki-...-shortened.bz2 --news lee_background.cor --objects 16

The corpus (``tokenize_rate``'s) is cut into ``--objects`` JSON Lines objects and put on an S3-compatible server on
loopback (moto's server mode); the Processing script then runs as one instance with two processes and as four
instances with one process each (every instance a process of its own with its share of the objects in a folder of
its own, as ``ShardedByS3Key`` hands them out), and once locally into a folder (``python -m training.prepare
--sharded``). It prints the objects each wrote,
whether they are equal, and the SHA-256 of each split's token stream in the manifest's order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from training.measure.tokenize_rate import wikipedia_documents, write_objects

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.prepare_instances", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--tokenizer", required=True, help="A tokenizer.json.")
    parser.add_argument("--wikipedia", required=True, help="A MediaWiki XML dump, bz2.")
    parser.add_argument("--news", help="More English text, one document a line.")
    parser.add_argument("--objects", type=int, default=16, help="JSON Lines objects (16).")
    return parser.parse_args(argv)


def _job(
    args: argparse.Namespace, env: dict[str, str], output: str, local_input: Path, workers: int
) -> subprocess.Popen:
    command = [sys.executable, "-m", "training.prepare.job", "--input", "s3://data/raw/", "--output", output,
               "--local-input", str(local_input), "--tokenizer", args.tokenizer, "--workers", str(workers)]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def main(argv: list[str] | None = None) -> int:
    import boto3  # noqa: PLC0415 - development measurement: the dev extra's moto and boto3
    from moto.server import ThreadedMotoServer  # noqa: PLC0415

    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="prepare-instances-"))
    docs = wikipedia_documents(Path(args.wikipedia))
    if args.news:
        docs += [line for line in Path(args.news).read_text(encoding="utf-8").splitlines() if line.strip()]
    write_objects(docs, tmp / "corpus", args.objects)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
           "AWS_DEFAULT_REGION": "us-west-2", "PYTHONPATH": str(ROOT)}  # fmt: skip
    s3 = boto3.client("s3", region_name="us-west-2", endpoint_url=endpoint, aws_access_key_id="local",
                      aws_secret_access_key="local")  # fmt: skip
    s3.create_bucket(Bucket="data", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    keys = sorted(p.name for p in (tmp / "corpus").iterdir())
    for key in keys:
        s3.upload_file(str(tmp / "corpus" / key), "data", f"raw/{key}")
    for label, count, workers in (("one", 1, 2), ("four", 4, 1)):
        started = []
        for index in range(count):
            folder = tmp / label / f"algo-{index + 1}" / "opt/ml/processing/input/data"
            folder.mkdir(parents=True)
            for key in keys[index::count]:
                shutil.copy(tmp / "corpus" / key, folder / key)
            started.append(_job(args, env, f"s3://data/{label}/", folder, workers))
        for process in started:
            output = process.communicate()[0]
            if process.returncode:
                print(output)
                return 1
    subprocess.run([sys.executable, "-m", "training.prepare", "--sharded", str(tmp / "corpus"), "--output",
                    str(tmp / "local"), "--tokenizer", args.tokenizer, "--workers", "1"], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)  # fmt: skip

    def objects(prefix: str) -> dict[str, bytes]:
        listed = s3.list_objects_v2(Bucket="data", Prefix=prefix)["Contents"]
        return {
            o["Key"][len(prefix) :]: s3.get_object(Bucket="data", Key=o["Key"])["Body"].read() for o in listed
        }

    one, four = objects("one/"), objects("four/")
    local = {
        p.relative_to(tmp / "local").as_posix(): p.read_bytes()
        for p in (tmp / "local").rglob("*")
        if p.is_file()
    }
    meta = json.loads(one["metadata.json"])
    print(f"objects written: one instance {len(one)}, four {len(four)}, local {len(local)}; "
          f"{sum(map(len, one.values())):,} bytes")  # fmt: skip
    print(f"one instance == four: {one == four}; one instance == local: {one == local}")
    for split, entry in meta["splits"].items():
        sums = [
            hashlib.sha256(b"".join(files[n] for n in entry["files"])).hexdigest()
            for files in (one, four, local)
        ]
        print(
            f"{split}: {entry['tokens']:,} tokens; SHA-256 of the stream in the manifest's order: {', '.join(sums)}"
        )
    server.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
