"""``resume_from``'s checkpoint against the run that would continue it, before launch (issue 53 item 1): a LoRA run
resuming a full fine-tuning run's checkpoint, a full run resuming a LoRA run's, and a LoRA run whose rank, alpha or
targets differ from its checkpoint's are refused by the request check with the sentence the trainer says at its
start (``training.contract.checkpoint_identity``, one set of words for both). The checkpoint's ``COMPLETE`` marker
is the one the trainer writes (``identity.model_identity`` of the earlier run's decided settings), in an S3 bucket
(moto); the trainer's own start check (``preflight.check_checkpoint_shape``) reads a local copy of the same folder as
its resume channel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.contract.settings_table import ContractError
from training.request.decision import decide_request
from training.request.reads import Reads
from training.request.rules import RequestRules
from training.trainer import preflight
from training.trainer.checkpoint import identity, names
from training.trainer.config import config_from_mapping

REGION = "us-west-2"
RULES = RequestRules(region=REGION, bucket_name="resume-bucket", workflow_segment="W")
FILES = {".metadata": b"m" * 10, "__0_0.distcp": b"w" * 100}


@pytest.fixture(scope="module")
def s3():
    from moto import mock_aws

    with mock_aws():
        import boto3

        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(
            Bucket=RULES.bucket_name, CreateBucketConfiguration={"LocationConstraint": REGION}
        )
        yield client


def decide(s3, hyperparameters: dict[str, str], resume_from: str | None = None, execution: str = "later"):
    """The decision before launch of a run with ``hyperparameters`` (``num_layers``: the top-level field)."""
    top = {key: int(hyperparameters.pop(key)) for key in ["num_layers"] if key in hyperparameters}
    raw = {**top, "hyperparameters": {"max_steps": "200", **hyperparameters}}
    if resume_from is not None:
        raw["resume_from"] = resume_from
    return decide_request(raw, RULES, reads=Reads(s3, before_launch=True), execution=execution)


def trainer_config(decision, tmp: Path):
    """The trainer's settings of a decided request (what the job's hyperparameters give it)."""
    local = {"checkpoint_dir": str(tmp / "own-checkpoints"), "model_dir": str(tmp / "model")}
    return config_from_mapping({**decision.hyperparameters, **local})


def earlier_run(s3, name: str, hyperparameters: dict[str, str], tmp: Path) -> tuple[str, Path]:
    """A run ``name`` that trained with ``hyperparameters`` and left one complete checkpoint at step 100, its
    ``COMPLETE`` marker as the trainer writes it, in S3 and in a local copy; returns (S3 URI, local folder)."""
    decision = decide(s3, dict(hyperparameters), execution=name)
    assert decision.problems == [], decision.problems
    shape = identity.model_identity(trainer_config(decision, tmp / name))
    marker = {
        "world_size": 8,
        "step": 100,
        "model_shape": shape,
        "files": {n: len(b) for n, b in FILES.items()},
    }
    key = f"{RULES.checkpoint_prefix}W/{name}/step_00000100/"
    local = tmp / name / "step_00000100"
    local.mkdir(parents=True)
    for file, body in {**FILES, names.MARKER: json.dumps(marker).encode()}.items():
        s3.put_object(Bucket=RULES.bucket_name, Key=key + file, Body=body)
        (local / file).write_bytes(body)
    return f"s3://{RULES.bucket_name}/{key}", local


def trainer_says(decision, local: Path, tmp: Path, monkeypatch) -> str | None:
    """What the trainer of the decided request says at its start, resuming the local copy ``local``."""
    monkeypatch.setenv("SM_CHANNEL_RESUME", str(local))
    try:
        preflight.check_checkpoint_shape(trainer_config(decision, tmp / "later"))
    except ContractError as err:
        return str(err)
    return None


FULL: dict[str, str] = {}
LORA = {"lora_rank": "8"}  # alpha 16 (2 x rank), every linear layer


@pytest.mark.parametrize(
    ("case", "earlier", "later", "words"),
    [
        ("lora-on-full", FULL, LORA, "holds a full fine-tuning run (every weight), but this run trains LoRA"),
        ("full-on-lora", LORA, FULL, "holds LoRA adapters (lora_rank > 0), but this run is full fine-tuning"),
        ("rank", LORA, {"lora_rank": "16", "lora_alpha": "16"}, "lora_rank=8, lora_alpha=16.0"),
        (
            "alpha",
            LORA,
            {"lora_rank": "8", "lora_alpha": "32"},
            "but this run has lora_rank=8, lora_alpha=32.0",
        ),
        ("targets", LORA, {"lora_rank": "8", "lora_targets": "q,v"}, "lora_targets=q_proj,v_proj"),
    ],
)
def test_a_checkpoint_the_trainer_would_refuse_is_refused_before_launch_in_its_words(
    s3, tmp_path, monkeypatch, case, earlier, later, words
):
    uri, local = earlier_run(s3, f"earlier-{case}", earlier, tmp_path)
    decision = decide(s3, dict(later), resume_from=f"earlier-{case}")
    trainer = trainer_says(decision, local, tmp_path, monkeypatch)
    assert trainer is not None and words in trainer, trainer
    assert decision.problems == [trainer.replace(str(local), uri)]
    assert decision.problems[0].startswith(f"resume_from: {uri} holds ")
    assert decision.problems[0].endswith(identity.REMEDY["resume_from"])


def test_a_checkpoint_of_the_same_adapters_resumes(s3, tmp_path, monkeypatch):
    """The same LoRA settings, alpha given as its default, resume (and the trainer agrees); so does a full run."""
    uri, local = earlier_run(s3, "earlier-same", LORA, tmp_path)
    decision = decide(
        s3, {"lora_rank": "8", "lora_alpha": "16", "lora_targets": "all-linear"}, "earlier-same"
    )
    assert decision.problems == [], decision.problems
    assert decision.resume["uri"] == uri
    assert trainer_says(decision, local, tmp_path, monkeypatch) is None
    uri, local = earlier_run(s3, "earlier-full", FULL, tmp_path)
    decision = decide(s3, FULL, "earlier-full")
    assert decision.problems == [] and decision.resume["uri"] == uri
    assert trainer_says(decision, local, tmp_path, monkeypatch) is None


def test_a_checkpoint_of_another_shape_is_refused_before_launch(s3, tmp_path, monkeypatch):
    _, local = earlier_run(s3, "earlier-shape", {"num_layers": "4"}, tmp_path)
    decision = decide(s3, {"num_layers": "6"}, "earlier-shape")
    trainer = trainer_says(decision, local, tmp_path, monkeypatch)
    assert trainer is not None and "holds a model of shape (num_layers=4" in trainer
    assert len(decision.problems) == 1 and "holds a model of shape (num_layers=4" in decision.problems[0]
