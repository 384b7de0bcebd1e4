"""The preparation commands (constructs_lib/cli/commands/prepare.py) against moto: the plan from a listing or a
local folder, the start of an execution, and its progress from the shards' records and the manifest."""

from __future__ import annotations

import argparse
import io
import json

import boto3
import pytest
from moto import mock_aws
from rich.console import Console

from constructs_lib.cli import preparation
from constructs_lib.cli.commands import prepare
from constructs_lib.cli.errors import OperatorError
from constructs_lib.cli.shell import Shell, shared_arguments
from training.prepare import plan

RATE = {
    "mb_per_second_per_core": 1.0,
    "tokens_per_second_per_core": 250_000,
    "bytes_per_token": 4.0,
    "where": "test",
}


def run(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    handlers = prepare.register(parser.add_subparsers(dest="command"), shared_arguments())
    args = parser.parse_args([*argv, "--region", "us-west-2"])
    out = io.StringIO()
    code = handlers[args.command](Shell(args, Console(file=out, width=400), io.StringIO(), lambda s: None))
    return code, out.getvalue()


@pytest.fixture(autouse=True)
def measured(monkeypatch):
    monkeypatch.setattr(plan, "MEASURED", RATE)


def test_the_plan_picks_the_fewest_instances_within_the_target_and_says_where_figures_come_from():
    one_tb = preparation.plan_for(4000, 10**12)
    instance = plan.PROCESSING_INSTANCE_TYPES["ml.c5.18xlarge"]
    vcpus, price = instance.vcpus, instance.usd_per_hour
    hours = plan.START_SECONDS / 3600 + 10**12 / (one_tb["instance_count"] * vcpus * 1e6) / 3600
    assert one_tb["hours"] == pytest.approx(hours) and one_tb["hours"] <= 2.0
    assert plan.plan(10**12, 4000, instance_count=one_tb["instance_count"] - 1).hours > 2.0
    assert one_tb["cost_usd"] == pytest.approx(hours * one_tb["instance_count"] * price)
    few = plan.plan(10**9, 3)
    assert few.processes == 3 and "only 3 input objects" in few.notes[0]


def test_plan_start_and_status_against_moto(tmp_path):
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket="data-bucket", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        for i in range(3):
            s3.put_object(Bucket="data-bucket", Key=f"raw/part-{i}.jsonl", Body=b'{"text": "x"}\n' * 1000)
        s3.put_object(Bucket="data-bucket", Key="raw/README", Body=b"not an input")
        code, out = run(["prepare-plan", "s3://data-bucket/raw/", "--json"])
        planned = json.loads(out)
        assert code == 0 and (planned["input_objects"], planned["input_bytes"]) == (3, 42_000)
        sfn = boto3.client("stepfunctions", region_name="us-west-2")
        definition = {"StartAt": "P", "States": {"P": {"Type": "Pass", "Parameters": {
            "u.$": "States.Format('s3://data-bucket/data/prepared/{}/', $.name)"}, "Next": "W"},
            "W": {"Type": "Wait", "Seconds": 3600, "End": True}}}  # fmt: skip
        arn = sfn.create_state_machine(name="prep", definition=json.dumps(definition),
                                       roleArn="arn:aws:iam::123456789012:role/r")["stateMachineArn"]  # fmt: skip
        code, out = run(["prepare", "corpus", "--input", "s3://data-bucket/raw/", "--model", "s3://data-bucket/tok/",
                         "--state-machine", arn, "--instance-count", "2"])  # fmt: skip
        assert code == 0 and "started preparation corpus: 2 x ml.c5.18xlarge" in out
        (execution,) = sfn.list_executions(stateMachineArn=arn)["executions"]
        sent = json.loads(sfn.describe_execution(executionArn=execution["executionArn"])["input"])
        assert sent == {"name": "corpus", "input_uri": "s3://data-bucket/raw/", "model_uri": "s3://data-bucket/tok/",
                        "instance_type": "ml.c5.18xlarge", "instance_count": 2}  # fmt: skip
        s3.put_object(Bucket="data-bucket", Key="data/prepared/corpus/shards/abc/record.json", Body=b"{}")
        output = "s3://data-bucket/data/prepared/corpus/"
        code, out = run(["prepare-status", output, "--input", "s3://data-bucket/raw/",
                         "--execution", execution["executionArn"]])  # fmt: skip
        assert out.strip() == "RUNNING: 1 of 3 shards complete (33%); no manifest yet"
        assert prepare._output_uri(sfn, execution["executionArn"]) == output
        # every option given is sent, a 0 too (a fraction of 0: nothing held out, not the default)
        code, out = run(["prepare", "chats", "--input", "s3://data-bucket/raw/", "--model", "s3://data-bucket/tok/",
                         "--state-machine", arn, "--kind", "chat", "--validation-fraction", "0",
                         "--template-seconds", "30"])  # fmt: skip
        (chats,) = [
            e
            for e in sfn.list_executions(stateMachineArn=arn)["executions"]
            if e["name"] != execution["name"]
        ]
        sent = json.loads(sfn.describe_execution(executionArn=chats["executionArn"])["input"])
        assert (sent["kind"], sent["validation_fraction"], sent["template_seconds"]) == ("chat", 0.0, 30.0)


def test_a_local_folder_is_planned_offline_by_the_cli_and_the_plan_command(tmp_path, capsys):
    (tmp_path / "a.jsonl.zst").write_bytes(b"x" * 5000)
    (tmp_path / "notes.bin").write_bytes(b"x" * 5000)
    code, out = run(["prepare-plan", str(tmp_path), "--instance-count", "1"])
    assert code == 0 and out.startswith("1 input objects, 0.00 GB: 1 x ml.c5.18xlarge (1 processes busy)")
    lines = out.splitlines()
    assert lines[1] == "  rate: 1.0 MB/s per process (test)"
    assert lines[2].startswith("  price: $3.06 per ml.c5.18xlarge hour (EC2 on-demand us-east-1, from the EC2 "
                               "Auto Scaling user guide's instance-weighting example table (https://")  # fmt: skip
    assert "only 1 input objects: 1 of each instance's 72 vCPUs busy" in out
    # python -m training.prepare.plan FOLDER prints the same lines
    assert plan.main([str(tmp_path), "--instance-count", "1"]) == 0
    assert capsys.readouterr().out == out
    code, out = run(
        ["prepare-plan", str(tmp_path), "--instance-type", "ml.c7i.48xlarge", "--usd-per-hour", "12.5"]
    )
    assert (
        code == 0
        and "at $12.50 an instance-hour" in out
        and "per ml.c7i.48xlarge hour (given (--usd-per-hour))" in out
    )
    # a price of 0 is refused naming the field (not read as "no price given"), and so is a folder with no input
    with pytest.raises(OperatorError, match="usd_per_hour: must be above 0; got 0"):
        run(["prepare-plan", str(tmp_path), "--usd-per-hour", "0"])
    with pytest.raises(OperatorError, match="input: no input objects"):
        run(["prepare-plan", str(_empty(tmp_path))])


def test_every_price_says_where_it_is_from():
    for name, instance in plan.PROCESSING_INSTANCE_TYPES.items():
        assert instance.usd_per_hour > 0 and instance.vcpus > 0, name
        assert "floor for SageMaker's ml.* rate" in instance.price_source, name
        assert (
            "https://" in instance.price_source
            or "not checked against a published source" in instance.price_source
        )
    with pytest.raises(ValueError, match="usd_per_hour: must be above 0; got 0"):
        plan.plan(10**9, 10, usd_per_hour=0)
    with pytest.raises(ValueError, match=r"^input: no input objects \(formats \.txt, "):
        plan.plan(0, 0)


def _empty(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "notes.bin").write_bytes(b"x")
    return folder
