"""The command line without a deployment: errors from the AWS side as one line, ``AWS_ENDPOINT_URL``, the console
script, help, and a start-up that does not load aws_cdk."""

from __future__ import annotations

import importlib
import io
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from constructs_lib.cli.api import TrainingRuns
from constructs_lib.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """An environment with no AWS credentials anywhere (no env, no files, no instance metadata)."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ENDPOINT_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.chdir(tmp_path)


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), stdin=io.StringIO(), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def test_no_credentials_is_one_line(no_aws):
    status, out, err = _run("runs", "--region", "us-west-2")
    assert status == 3 and out == ""
    assert err == (
        "error: no AWS credentials found: run `aws configure` or `aws sso login`, set AWS_PROFILE or pass --profile\n"
    )


def test_unknown_profile_is_one_line(no_aws):
    status, _, err = _run("runs", "--profile", "nobody")
    assert status == 3 and err == "error: AWS profile not found: nobody (see ~/.aws/config)\n"


def test_no_region_is_one_line(no_aws, monkeypatch):
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    status, _, err = _run("runs")  # no --region, no env, no cdk.json here
    assert (
        status == 3
        and err == "error: no AWS region: pass --region, set AWS_REGION, or set region in cdk.json\n"
    )


def test_aws_endpoint_url_is_honoured(no_aws, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    runs = TrainingRuns(region="us-west-2")
    assert runs.client("stepfunctions").meta.endpoint_url == "http://127.0.0.1:9"
    status, _, err = _run("runs", "--region", "us-west-2")  # nothing listens there: the call went to it
    assert status == 3
    assert err == "error: cannot reach AWS at http://127.0.0.1:9/ (network, region or AWS_ENDPOINT_URL?)\n"


def test_bad_command_line_exits_2_with_usage(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["watch"])
    assert stopped.value.code == 2
    assert "the following arguments are required: run" in capsys.readouterr().err


def test_help_lists_every_subcommand_and_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for command in ("validate", "submit", "runs", "watch", "logs", "stop", "result"):
        assert command in text
    assert "Exit status: 0 success; 1 the run failed" in text


def test_console_script_is_declared_and_resolves():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attribute = scripts["blackwell-training"].partition(":")
    assert callable(getattr(importlib.import_module(module), attribute))


def test_python_dash_m_runs_the_same_command(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "constructs_lib.cli", "validate", "--set", "batch_size=0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "batch_size: must be an integer in [1, 4096]" in done.stderr and "Traceback" not in done.stderr


def test_the_command_does_not_load_aws_cdk():
    code = (
        "import sys, constructs_lib.cli.main, constructs_lib.cli.api, constructs_lib.request_validation; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aws_cdk', 'jsii', 'constructs')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
