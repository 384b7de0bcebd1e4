"""What the request check reads is bounded by what its Lambda function holds (issue 53 item 5,
``training.request.read_limits``): files within the old byte limits that took hundreds of MB parsed (a 16 MB
``metadata.json``: 443 MB), and the files that had no limit (``config.json``, task YAML, an evaluated run's
``metadata.json``, a checkpoint's ``COMPLETE``), are refused by name before they are parsed, never a crash of the
Lambda; the estimate the refusal rests on bounds what Python's parser takes for every shape; and the check's peak
memory on the largest files it accepts, measured in a process of its own as the Lambda runs it, stays within the
function's memory."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from types import SimpleNamespace

import pytest

from tests.training.runner import ROOT, env
from training.measure.request_check_memory import CHAT_METADATA, FILLER, LLAMA_8B_CONFIG
from training.request import evaluate_block, read_limits
from training.request.decision import decide_request
from training.request.reads import Reads
from training.request.rules import RequestRules

REGION = "us-west-2"
RULES = RequestRules(region=REGION, bucket_name="limits-bucket")
BUCKET = RULES.bucket_name
MODEL, DATA = f"s3://{BUCKET}/data/model/", f"s3://{BUCKET}/data/chats/"
OVER_BUDGET = b"[" + b",".join([FILLER] * 250_000) + b"]"
"""2 MB of one-key objects: within the old 16 MB and 64 MB limits, about 50 MB parsed."""


@pytest.fixture
def s3():
    from moto import mock_aws

    with mock_aws():
        import boto3

        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        files = {
            "data/model/config.json": json.dumps(LLAMA_8B_CONFIG).encode(),
            "data/model/tokenizer_config.json": json.dumps({"chat_template": "{{ messages }}"}).encode(),
            "data/model/tokenizer.json": b"{}",
            "data/model/model.safetensors": b"{}",
            "data/chats/metadata.json": json.dumps(CHAT_METADATA).encode(),
            **{f"data/chats/train.{suffix}": b"\0" * 16 for suffix in ("bin", "mask", "docs")},
        }
        for key, body in files.items():
            client.put_object(Bucket=BUCKET, Key=key, Body=body)
        yield client


def padded(document: dict, pad: bytes = OVER_BUDGET) -> bytes:
    return json.dumps({**document, "pad": []}).encode()[:-3] + b" " + pad + b"}"


def decide(s3, **fields):
    raw = {"init_from": MODEL, "train_data_uri": DATA, "precision": "bf16", "seq_length": 1024,
           "hyperparameters": {"max_steps": "100"}, **fields}  # fmt: skip
    return decide_request(raw, RULES, reads=Reads(s3, before_launch=True), execution="run-1").problems


SHAPES = {
    "empty objects": lambda n: b"[" + b",".join([b"{}"] * n) + b"]",
    "one-key objects": lambda n: b"[" + b",".join([FILLER] * n) + b"]",
    "distinct keys": lambda n: b"{" + b",".join(b'"%d":0' % i for i in range(n)) + b"}",
    "length pairs": lambda n: b"[" + b",".join(b"[%d,%d]" % (1000 + i, 300 + i) for i in range(n)) + b"]",
    "floats": lambda n: b"[" + b",".join([b"1.5"] * n) + b"]",
    "large ints": lambda n: b"[" + b",".join(b"%d" % (10**6 + i) for i in range(n)) + b"]",
    "short strings": lambda n: b"[" + b",".join(b'"%d"' % i for i in range(n)) + b"]",
    "a long string": lambda n: b'"' + b"x" * (40 * n) + b'"',
    "escaped characters": lambda n: b'"' + b"\\ud83d\\ude00" * n + b'"',
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_estimate_bounds_what_the_parser_takes(shape):
    raw = SHAPES[shape](50_000)
    tracemalloc.start()
    try:
        parsed = json.loads(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del parsed
    assert peak <= read_limits.estimated_json_bytes(raw), (shape, peak, read_limits.estimated_json_bytes(raw))


def test_json_the_lambda_cannot_hold_is_refused_by_name_before_it_is_parsed(s3):
    """Within the old limits (16 MB for metadata.json, 64 MB for a model folder's file) and without any (config.json),
    each was parsed whole: now each is refused naming the file."""
    s3.put_object(Bucket=BUCKET, Key="data/chats/metadata.json", Body=padded(CHAT_METADATA))
    (problem,) = decide(s3)
    assert problem.startswith(f"train_data_uri: {DATA}metadata.json would take about ")
    assert (
        "more than the 48 MB the request check holds of one file (its Lambda function has 256 MB)" in problem
    )
    s3.put_object(Bucket=BUCKET, Key="data/chats/metadata.json", Body=json.dumps(CHAT_METADATA).encode())
    s3.put_object(Bucket=BUCKET, Key="data/model/tokenizer_config.json", Body=padded({"chat_template": "x"}))
    (problem,) = decide(s3)
    assert problem.startswith(f"init_from: {MODEL}tokenizer_config.json would take about ")
    s3.put_object(Bucket=BUCKET, Key="data/model/tokenizer_config.json", Body=b'{"chat_template": "x"}')
    big = padded(LLAMA_8B_CONFIG, b'"' + b"x" * read_limits.MAX_JSON_BYTES + b'"')
    s3.put_object(Bucket=BUCKET, Key="data/model/config.json", Body=big)
    problem = decide(s3)[0]  # the model's first (then the data against the test's stand-in template)
    assert problem == (
        f"init_from: s3://{BUCKET}/data/model/config.json takes {len(big):,} bytes, more than the 8,388,608 the "
        "request check reads of such a file (its Lambda function has 256 MB)"
    )


def test_json_nested_past_the_parsers_recursion_is_refused_by_name(s3):
    s3.put_object(Bucket=BUCKET, Key="data/model/config.json", Body=b"[" * 100_000 + b"]" * 100_000)
    problem = decide(s3)[0]
    assert problem == f"init_from: {MODEL}: config.json nests its arrays or objects too deeply to be read"


def test_a_checkpoint_marker_the_lambda_cannot_hold_is_not_a_checkpoint(s3):
    key = f"{RULES.checkpoint_prefix}earlier/step_00000100/"
    s3.put_object(Bucket=BUCKET, Key=key + ".metadata", Body=b"m")
    marker = padded({"world_size": 8, "step": 100, "files": {".metadata": 1}})
    s3.put_object(Bucket=BUCKET, Key=key + "COMPLETE", Body=marker)
    problems = decide_request({"resume_from": "earlier", "hyperparameters": {"max_steps": "200"}}, RULES,
                              reads=Reads(s3, before_launch=True), execution="later").problems  # fmt: skip
    assert problems == [
        f"resume_from: execution earlier has no complete checkpoint under s3://{BUCKET}/checkpoints/earlier/; "
        'got "earlier"'
    ]


def test_an_evaluations_task_file_and_metadata_beyond_the_limits_are_refused_by_name(s3):
    tasks = f"s3://{BUCKET}/data/tasks/"
    s3.put_object(
        Bucket=BUCKET, Key="data/tasks/big.yaml", Body=b"task: t\n" + b"#" * read_limits.MAX_TEXT_BYTES
    )
    block = SimpleNamespace(task_data_uri=tasks, tasks=["t"])
    assert evaluate_block.task_problems(s3, block) == [
        f"evaluate.task_data_uri: s3://{BUCKET}/data/tasks/big.yaml takes 8,388,616 bytes, more than the "
        "8,388,608 the request check reads of such a file (its Lambda function has 256 MB)"
    ]
    s3.put_object(Bucket=BUCKET, Key="data/chats/metadata.json", Body=padded(CHAT_METADATA))
    (problem,) = evaluate_block.tokenizer_problems(s3, DATA, "job-1")
    assert problem.startswith(
        f"evaluate: job-1 was trained on {DATA}, whose metadata.json names its tokenizer, but "
        f"{DATA}metadata.json would take about "
    )


@pytest.mark.slow
def test_the_checks_peak_on_the_largest_files_it_accepts_fits_the_lambda():
    """``training/measure/request_check_memory.py``: every case's peak resident memory, in a process of its own,
    leaves the Lambda runtime's own (a few MB beyond Python's) room under the function's memory."""
    done = subprocess.run([sys.executable, "-m", "training.measure.request_check_memory"], env=env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    largest = float(done.stdout.splitlines()[-1].split()[1])
    assert largest < read_limits.LAMBDA_MEMORY_MB - 48, done.stdout
