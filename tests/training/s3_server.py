"""A real S3-compatible server on loopback for the checkpoint tests (fixtures, through ``tests/training/conftest.py``): moto's server mode in a process of its own,
started once per test session; each test gets a bucket of its own and the environment (endpoint, region, test
credentials) that the trainer's S3 clients and the test's child processes read."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config

REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """The server's address and what a client needs to reach it."""

    url: str

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        }  # fmt: skip

    def client(self) -> Any:
        return boto3.client(
            "s3", endpoint_url=self.url, region_name=REGION, aws_access_key_id="testing",
            aws_secret_access_key="testing", config=Config(s3={"addressing_style": "path"}),
        )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_listening(port: int, server: subprocess.Popen, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"moto's server exited with status {server.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto's server did not listen on 127.0.0.1:{port} within {limit:.0f} s")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """``python -m moto.server`` on 127.0.0.1 (a free port), for the whole session; stopped at its end."""
    port = _free_port()
    log = (tmp_path_factory.mktemp("s3_server") / "moto.log").open("w")
    env = {**os.environ, "TMPDIR": str(tmp_path_factory.getbasetemp())}  # large objects spill to disk there
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        _wait_until_listening(port, server)
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch) -> Iterator[str]:
    """A fresh bucket on the session's server, with this process's environment pointing the clients at it."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    yield name
