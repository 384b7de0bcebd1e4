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


def test_the_command_does_not_load_aws_cdk_nor_the_sagemaker_sdk():
    code = (
        "import sys, constructs_lib.cli.main, constructs_lib.cli.api, constructs_lib.cli.direct, "
        "constructs_lib.workflow.request_check, constructs_lib.workflow.launch_request; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'aws_cdk', 'jsii', 'constructs', 'sagemaker'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# ---- bad input: exit 2 (the request or command line) or 3 (something to fix first), one line each, no traceback ----

BAD_INPUTS = {
    "malformed JSON": (
        {"run.json": b'{"precision": bf16}'},
        ["validate", "run.json"],
        2,
        "run.json: not valid JSON (",
    ),
    "missing file": (
        {},
        ["validate", "nope.json"],
        3,
        "error: cannot read nope.json: No such file or directory",
    ),
    "a folder": ({"dir/x": b""}, ["submit", "dir"], 3, "error: cannot read dir: Is a directory"),
    "not UTF-8": (
        {"run.json": b"\xff\xfe{}"},
        ["validate", "run.json"],
        2,
        "run.json: not UTF-8 text, so not JSON",
    ),
    "not an object": (
        {"run.json": b"[1]"},
        ["submit", "run.json"],
        2,
        "must be a JSON object of input fields",
    ),
    "--set without =": ({}, ["submit", "--set", "precision"], 2, "--set precision: must be KEY=VALUE"),
    "--set no setting name": (
        {},
        ["validate", "--set", "hyperparameters.=3"],
        2,
        "hyperparameters.NAME=VALUE",
    ),
    "unknown key": (
        {},
        ["validate", "--set", "precison=bf16"],
        2,
        "unknown input field (did you mean precision?)",
    ),
    "unknown setting": (
        {},
        ["validate", "--set", "hyperparameters.max_step=5"],
        2,
        "unknown trainer setting max_step (did you mean max_steps?)",
    ),
    "cdk.json not JSON": ({"cdk.json": b"{"}, ["validate"], 3, "cdk.json: not readable as JSON"),
    "cdk.json not an object": (
        {"cdk.json": b"[]"},
        ["runs"],
        3,
        'cdk.json: must be a JSON object whose "context"',
    ),
    "cdk.json context wrong type": (
        {"cdk.json": b'{"context": {"defaultInstanceType": ["ml.p6-b200.48xlarge"]}}'},
        ["validate"],
        3,
        "cdk.json: context defaultInstanceType: must be one of ml.p6-b200.48xlarge",
    ),
}


@pytest.mark.parametrize("files, argv, status, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_one_line_per_problem_never_a_traceback(no_aws, tmp_path, files, argv, status, message):
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    got, out, err = _run(*argv)  # an unexplained exception would escape main() and fail the test
    assert (got, out) == (status, ""), err
    assert message in err and "Traceback" not in err
    lines = err.splitlines()
    if status == 3:
        assert len(lines) == 1 and lines[0].startswith("error: ")
    else:
        assert lines[0] == "invalid request (1 problem):" and lines[1].startswith("  - ") and len(lines) == 2


def test_invalid_endpoint_url_is_one_line(no_aws, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "not-a-url")
    status, _, err = _run("runs", "--region", "us-west-2")
    assert status == 3
    assert err.startswith("error: cannot make an AWS ") and "Invalid endpoint: not-a-url" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["runs", "--limit", "0"], "argument --limit: must be an integer in [1, 1000]; got '0'"),
        (
            ["watch", "r", "--interval", "0"],
            "argument --interval: must be a positive number of seconds; got '0'",
        ),
        (
            ["logs", "r", "--interval", "nan"],
            "argument --interval: must be a positive number of seconds; got 'nan'",
        ),
    ],
)
def test_bad_numbers_on_the_command_line_exit_2_with_usage(no_aws, capsys, argv, message):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_the_command_loads_matplotlib_and_plotext_only_to_draw():
    code = (
        "import sys, constructs_lib.cli.main, constructs_lib.cli.api, constructs_lib.cli.curves; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'plotext', 'PIL')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
