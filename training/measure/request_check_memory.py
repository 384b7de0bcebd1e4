"""Peak memory of the request check on the largest files it accepts (``training/request/read_limits.py``), as its
Lambda function runs it (``constructs_lib.workflow.request_check.decide``: ``decide_request`` with ``Reads`` of a
boto3 S3 client before launch, and the state it returns), in a fresh
process per case, against an S3-compatible server on loopback (moto's server mode, in this process: its memory is
not counted).

    python -m training.measure.request_check_memory          # every case; prints one line each, then the largest

Each file is the largest of its kind the check reads: every JSON file (the ``init_from`` folder's ``config.json``
and ``tokenizer_config.json``, conversation data's ``metadata.json``, a checkpoint's ``COMPLETE``) padded with
``{"a":0}`` objects (the shape that takes the most memory parsed for its estimate) up to the parse budget, the
``tokenizer.json`` (hashed only) at its byte limit, the chat template and task files at theirs. The figure is the
process's peak resident memory (``VmHWM``, what Lambda reports as Max Memory Used, less the runtime's own few
MB) and, for comparison, the same process before the decision (Python, boto3 and the decision's modules). Measured on
this machine's CPython (the Lambda runs 3.14); it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import socket
import subprocess
import sys
from typing import Any

from training.request import read_limits

BUCKET = "memory-bucket"
REGION = "us-west-2"
FILLER = b'{"a":0}'
LLAMA_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "rope_theta": 500000.0, "tie_word_embeddings": False, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}  # fmt: skip
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
CHAT_METADATA: dict[str, Any] = {
    "kind": "chat", "token_dtype": "uint32", "vocab_size": 128256, "max_token_id": 128009,
    "max_example_tokens": 900, "tokenizer": {"sha256": "0" * 64}, "chat_template": {"sha256": "0" * 64},
    "counts": {"examples": 4000}, "truncation": {"max_tokens": None, "too_long": "drop"},
    "splits": {"train": {"files": ["train.bin"], "masks": ["train.mask"], "documents": ["train.docs"],
                         "examples": 4000, "tokens": 3_600_000, "trained_tokens": 1_800_000,
                         "lengths": [[900, 4000]]}},
}  # fmt: skip


def largest_accepted(document: dict[str, Any]) -> bytes:
    """``document`` as JSON with a ``pad`` list of ``{"a":0}`` objects, as long as :func:`read_limits.check_json`
    accepts."""
    head = json.dumps({**document, "pad": []}).encode()[:-2]  # ends in "pad": [
    per = read_limits.estimated_json_bytes(FILLER + b",") - read_limits.estimated_json_bytes(b"")  # one more
    count = (read_limits.JSON_BUDGET_BYTES - read_limits.estimated_json_bytes(head + b"]}")) // per
    count = min(count, (read_limits.MAX_JSON_BYTES - len(head) - 2) // len(FILLER + b","))
    body = head + b",".join([FILLER] * count) + b"]}"
    read_limits.check_json(body, "largest")  # raises if the fit was wrong
    larger = head + b",".join([FILLER] * (count + 1)) + b"]}"
    if len(larger) <= read_limits.MAX_JSON_BYTES:
        try:
            read_limits.check_json(larger, "larger")
        except read_limits.TooLarge:
            return body  # the largest: one more object is refused
        raise AssertionError("largest_accepted: one more object would still be accepted")
    return body


def largest_text(document: dict[str, Any]) -> bytes:
    """``document`` as JSON with a ``pad`` string as long as :func:`read_limits.check_json` accepts (the most
    bytes: ``MAX_JSON_BYTES``)."""
    head = json.dumps({**document, "pad": ""}).encode()[:-2]  # ends in "pad": "
    spare = read_limits.JSON_BUDGET_BYTES - read_limits.estimated_json_bytes(head + b'"}')
    count = min(read_limits.MAX_JSON_BYTES - len(head) - 2, spare // read_limits.BYTES_PER_TEXT_BYTE)
    body = head + b"x" * count + b'"}'
    read_limits.check_json(body, "largest")
    return body


def objects() -> dict[str, bytes]:
    """Every case's objects under the bucket."""
    template_config = {"chat_template": TEMPLATE, "eos_token": "</s>"}
    return {
        "data/model/config.json": largest_accepted(LLAMA_8B_CONFIG),
        "data/model/tokenizer_config.json": largest_accepted(template_config),
        "data/model/tokenizer.json": b"t" * read_limits.MAX_HASHED_BYTES,
        "data/model/model.safetensors": b"{}",
        "data/jinja-model/config.json": largest_accepted(LLAMA_8B_CONFIG),
        "data/jinja-model/chat_template.jinja": b"x" * read_limits.MAX_TEXT_BYTES,
        "data/jinja-model/tokenizer_config.json": largest_accepted(template_config),
        "data/jinja-model/tokenizer.json": b"t" * read_limits.MAX_HASHED_BYTES,
        "data/jinja-model/model.safetensors": b"{}",
        "data/text-model/config.json": largest_text(LLAMA_8B_CONFIG),
        "data/text-model/tokenizer_config.json": largest_text(template_config),
        "data/text-model/tokenizer.json": b"t" * read_limits.MAX_HASHED_BYTES,
        "data/text-model/model.safetensors": b"{}",
        "data/text-chats/metadata.json": largest_text(CHAT_METADATA),
        "data/text-chats/train.bin": b"\0" * 16,
        "data/text-chats/train.mask": b"\0" * 4,
        "data/text-chats/train.docs": b"\0" * 8,
        "data/chats/metadata.json": largest_accepted(CHAT_METADATA),
        "data/chats/train.bin": b"\0" * 16,
        "data/chats/train.mask": b"\0" * 4,
        "data/chats/train.docs": b"\0" * 8,
        "checkpoints/earlier/step_00000100/.metadata": b"m" * 10,
        "checkpoints/earlier/step_00000100/COMPLETE": largest_accepted(
            {"world_size": 8, "step": 100, "files": {".metadata": 10}}
        ),
    }


CASES = {
    "conversations: config.json, tokenizer_config.json and metadata.json at the parse budget, tokenizer.json "
    "at its byte limit": {
        "init_from": f"s3://{BUCKET}/data/model/", "train_data_uri": f"s3://{BUCKET}/data/chats/",
        "precision": "bf16", "seq_length": 4096, "batch_size": 2, "hyperparameters": {"max_steps": "2000"},
    },
    "conversations with an 8 MB chat_template.jinja": {
        "init_from": f"s3://{BUCKET}/data/jinja-model/", "train_data_uri": f"s3://{BUCKET}/data/chats/",
        "precision": "bf16", "seq_length": 4096, "batch_size": 2, "hyperparameters": {"max_steps": "2000"},
    },
    "conversations: the same three files at their byte limit (8 MB each, a long string)": {
        "init_from": f"s3://{BUCKET}/data/text-model/", "train_data_uri": f"s3://{BUCKET}/data/text-chats/",
        "precision": "bf16", "seq_length": 4096, "batch_size": 2, "hyperparameters": {"max_steps": "2000"},
    },
    "resume_from: a COMPLETE marker at the parse budget": {
        "resume_from": "earlier", "hyperparameters": {"max_steps": "200"},
    },
}  # fmt: skip


def rules_json() -> str:
    from training.request.rules import RequestRules  # noqa: PLC0415

    return RequestRules(region=REGION, bucket_name=BUCKET).to_json()


def child(case: str, endpoint: str) -> None:
    """One decision in this process, as the Lambda makes it; prints its memory as JSON."""
    import boto3  # noqa: PLC0415

    from training.request.decision import decide_request  # noqa: PLC0415
    from training.request.reads import Reads  # noqa: PLC0415
    from training.request.rules import RequestRules  # noqa: PLC0415

    s3 = boto3.client("s3", region_name=REGION, endpoint_url=endpoint)
    s3.list_buckets()  # the client's own set-up, as the Lambda's first call makes it
    before = peak_mb()
    rules = RequestRules.from_json(rules_json())
    decision = decide_request(CASES[case], rules, reads=Reads(s3, before_launch=True), execution="memory-run")
    state = decision.state()
    peak = peak_mb()
    print(
        json.dumps(
            {"before_mb": before, "peak_mb": peak, "valid": state["valid"], "problems": decision.problems}
        )
    )


def peak_mb() -> float:
    """This process's peak resident memory (``VmHWM``: of its own image since exec; ``ru_maxrss`` would keep the
    parent's at the fork), ``ru_maxrss`` where there is no /proc."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            line = next(line for line in status if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure() -> list[dict[str, Any]]:
    """Every case in a fresh process; the server and the objects in this one."""
    import boto3  # noqa: PLC0415
    from moto.server import ThreadedMotoServer  # noqa: PLC0415

    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": REGION}  # fmt: skip
    os.environ.update({key: env[key] for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's request lines
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        s3 = boto3.client("s3", region_name=REGION, endpoint_url=endpoint)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        for key, body in objects().items():
            s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        results = []
        for case in CASES:
            command = [sys.executable, "-m", "training.measure.request_check_memory", "--child", case,
                       "--endpoint", endpoint]  # fmt: skip
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=True)
            results.append({"case": case, **json.loads(done.stdout.strip().splitlines()[-1])})
        return results
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.endpoint)
        return 0
    results = measure()
    for result in results:
        print(f"{result['peak_mb']:6.1f} MB peak ({result['before_mb']:.1f} MB before the decision): "
              f"{result['case']} ({len(result['problems'])} problems)")  # fmt: skip
    print(
        f"largest: {max(r['peak_mb'] for r in results):.1f} MB of the Lambda's {read_limits.LAMBDA_MEMORY_MB} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
