"""``blackwell-training plan`` offline: a local copy of the ``init_from`` folder (``--init-from``), and tuning records
from a local report or file (``--measurements``, ``--image``) matched by the workflow's own rules (no AWS)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from constructs_lib.cli.errors import InvalidRequest
from constructs_lib.cli.main import main
from constructs_lib.cli.request import plan_request
from training.contract import shapes, tuning
from training.plan import inputs, measured
from training.request.reads import read_local_init_from, read_local_measurements
from training.request.rules import RequestRules

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072,
          "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
          "vocab_size": 128256, "tie_word_embeddings": True, "rope_theta": 500000.0}  # fmt: skip
REQUEST = {"init_from": "s3://model-bucket/data/llama/", "activation_checkpointing": True}
TAG = "abc123"


def model_folder(path: Path, config: dict | None = None, weights: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or CONFIG))
    if weights:
        (path / "model.safetensors").write_bytes(b"w")
    return path


def record_for(
    request: dict, architecture: dict | None, *, gpu: str = "B200", tag: str = TAG, tps: float = 12345.0
):
    """A record as a tuning run stores it for ``request``'s settings (``training.tune.report.records``' shape)."""
    values, s = inputs.parse_request(request, architecture)
    key = measured.make_key(values, instance_type=s.instance_type, instance_count=s.instance_count, image_tag=tag,
                            torch_version="2.9.0", te_version="2.11.0")  # fmt: skip
    figures = {"status": "ok", "tokens_per_sec_per_gpu": tps, "step_seconds": {"median": 1.0, "steps": 20},
               "max_allocated_gb": 30.0}  # fmt: skip
    where = {
        "device": "cuda",
        "gpu": gpu,
        "world_size": 8,
        "job": "tune-job-1",
        "measured_at": "2026-11-01T00:00:00",
    }
    return measured.make_record(key, figures, where)


def test_a_local_copy_of_the_init_from_folder_plans_as_the_s3_folder_does(tmp_path):
    import boto3
    from moto import mock_aws

    rules = RequestRules(region="us-west-2", bucket_name="model-bucket").with_limits()
    local = plan_request(REQUEST, rules, init_from=model_folder(tmp_path / "llama"))
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket="model-bucket", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        s3.put_object(Bucket="model-bucket", Key="data/llama/config.json", Body=json.dumps(CONFIG).encode())
        s3.put_object(Bucket="model-bucket", Key="data/llama/model.safetensors", Body=b"w")
        from_s3 = plan_request(REQUEST, rules, s3=s3)
    assert local == from_s3
    assert local["parameters"] == shapes.MODEL_PRESETS["llama3.2-3b"].parameter_count()


def test_a_local_folder_the_trainer_cannot_start_from_is_refused_as_the_s3_one_is(tmp_path):
    rules = RequestRules(region="us-west-2", bucket_name="model-bucket").with_limits()
    assert read_local_init_from(tmp_path / "none")[1] == [
        f"init_from: {tmp_path / 'none'}: is not a folder (it must hold a Hugging Face model: config.json and "
        "safetensors)"
    ]
    no_weights = model_folder(tmp_path / "no-weights", weights=False)
    with pytest.raises(InvalidRequest, match="holds no safetensors weights"):
        plan_request(REQUEST, rules, init_from=no_weights)
    other = model_folder(tmp_path / "gpt2", {**CONFIG, "model_type": "gpt2"})
    with pytest.raises(InvalidRequest, match="init_from: .*gpt2"):
        plan_request(REQUEST, rules, init_from=other)
    with pytest.raises(InvalidRequest, match="--init-from .*: the request has no init_from"):
        plan_request({}, rules, init_from=model_folder(tmp_path / "llama"))


def test_local_records_files_and_report_folders_are_read_and_others_named(tmp_path):
    good = record_for({}, None)
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / tuning.TUNE_RECORDS_FILE).write_text(
        json.dumps({"records": [good, {"schema": 0}]})
    )
    (tmp_path / "one.json").write_text(json.dumps({"records": [good]}))
    records, files = read_local_measurements([tmp_path / "report", tmp_path / "one.json"])
    assert records == [good, good]  # the malformed one skipped, as from S3
    assert files == [str(tmp_path / "report" / tuning.TUNE_RECORDS_FILE), str(tmp_path / "one.json")]
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="list.json: not a records file"):
        read_local_measurements([tmp_path / "list.json"])
    with pytest.raises(OSError, match="missing.json: cannot read"):
        read_local_measurements([tmp_path / "missing.json"])


@pytest.fixture
def project(tmp_path, monkeypatch):
    shutil.copy(ROOT / "cdk.json", tmp_path / "cdk.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv), stdin=io.StringIO(""))
    out, err = capsys.readouterr()
    return status, out, err


def test_the_cli_plan_uses_a_local_record_only_where_the_workflows_rules_say_it_stands(project, capsys):
    architecture = read_local_init_from(model_folder(project / "llama"))[0]
    (project / "run.json").write_text(json.dumps(REQUEST))
    records = {"records": [record_for(REQUEST, architecture),
                           record_for({**REQUEST, "batch_size": 2}, architecture, tps=99.0),
                           record_for(REQUEST, architecture, gpu="cpu", tag="other", tps=5.0)]}  # fmt: skip
    (project / "measurements.json").write_text(json.dumps(records))
    base = ["plan", "run.json", "--init-from", "llama", "--measurements", "measurements.json"]

    status, out, err = run(capsys, *base, "--image", f"123.dkr.ecr.us-west-2.amazonaws.com/train:{TAG}")
    assert status == 0, err
    assert "~12,345 tokens/s per GPU (measured)" in out and "measured by tuning job tune-job-1" in out
    assert f"tuning records: 3 read from measurements.json; one stands for this request (image {TAG})" in out
    planned = json.loads(run(capsys, *base, "--image", TAG, "--json")[1])
    assert planned["throughput_basis"] == "measured" and planned["tokens_per_sec_per_gpu"] == 12345
    assert planned["records"] == {"files": ["measurements.json"], "read": 3, "image_tag": TAG}

    status, out, _ = run(capsys, *base)  # no image: no record can stand for it
    assert status == 0 and "(measured)" not in out
    assert "no image given (--image): a record stands only for the image the request would run" in out
    status, out, _ = run(capsys, *base, "--image", "other")  # the CPU record's image: never a GPU's figure
    assert "(measured)" not in out and "none stands for this request on image other" in out
    status, out, _ = run(capsys, *base, "--image", TAG, "--set", "batch_size=4")  # other settings
    assert "(measured)" not in out and "none stands for this request" in out


def test_the_cli_plan_names_a_bad_local_input(project, capsys):
    (project / "run.json").write_text(json.dumps(REQUEST))
    status, _, err = run(capsys, "plan", "run.json")
    assert status == 2 and "init_from: the plan needs the model folder's config.json from S3" in err
    status, _, err = run(capsys, "plan", "run.json", "--init-from", "llama", "--measurements", "nowhere")
    assert status == 2 and "--measurements: nowhere/" not in err and "nowhere: cannot read" in err


def test_a_seq_length_above_the_models_max_position_embeddings_is_noted_by_validate_and_plan(project, capsys):
    """Not refused (the trainer can run it), but said: the model was not trained on those positions, and its export
    keeps the folder's max_position_embeddings; at or below it, nothing is said."""
    model_folder(project / "llama", {**CONFIG, "max_position_embeddings": 2048})
    note = (
        "note: seq_length: 4096 is above the init_from model's max_position_embeddings 2048 (its config.json): the "
        "model was not trained on positions past 2048"
    )
    for seq_length, noted in ((4096, True), (2048, False)):
        (project / "run.json").write_text(json.dumps({**REQUEST, "seq_length": seq_length}))
        for command in ("validate", "plan"):
            status, out, err = run(capsys, command, "run.json", "--init-from", "llama")
            assert status == 0, err
            assert (note in " ".join(out.split())) is noted, out
        checked = json.loads(run(capsys, "validate", "run.json", "--init-from", "llama", "--json")[1])
        planned = json.loads(run(capsys, "plan", "run.json", "--init-from", "llama", "--json")[1])
        assert checked["notes"] == planned["notes"] and len(planned["notes"]) == int(noted)
    model_folder(project / "unsaid", CONFIG)  # a config.json without max_position_embeddings: nothing to note
    (project / "run.json").write_text(json.dumps({**REQUEST, "seq_length": 65536}))
    assert (
        json.loads(run(capsys, "validate", "run.json", "--init-from", "unsaid", "--json")[1])["notes"] == []
    )
