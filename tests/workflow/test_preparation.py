"""The data preparation's synthesized state machine in moto's ASL engine: defaults, refusals by field, the
Processing job (its script run as its instances against moto's S3), the manifest check, a bad record, a rerun."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest

from constructs_lib.cli import preparation
from constructs_lib.image.repository import TrainingImageRepository
from constructs_lib.preparation.construct import DataPreparation
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket
from tests.cdk_helpers import DEFAULT_ENV
from tests.training.chat_models import tokenizer_json
from tests.training.input_formats import write_corpus
from tests.workflow import processing
from tests.workflow.harness import definition_of
from training.prepare import job


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The state machine in moto, with a corpus and a tokenizer folder in the bucket."""
    app = cdk.App()
    stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
    bucket = CheckpointBucket(stack, "Checkpoints")
    images = TrainingImageRepository(stack, "Images")
    DataPreparation(stack, "Prepare", image_uri=images.image_uri("v1"), checkpoint_bucket=bucket,
                    image_repository=images, max_instance_count=4)  # fmt: skip
    template = app.synth().get_stack_by_name("Test").template
    name = f"fake-{stack.resolve(bucket.bucket.node.default_child.logical_id).lower()}"
    corpus = tmp_path_factory.mktemp("corpus")
    write_corpus(corpus)
    with processing.moto_preparation(definition_of(template)) as workflow:
        workflow.s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        for path in sorted(p for p in corpus.rglob("*") if p.is_file()):
            workflow.s3.upload_file(str(path), name, f"data/raw/{path.relative_to(corpus).as_posix()}")
        workflow.s3.put_object(Bucket=name, Key="data/tok/tokenizer.json", Body=tokenizer_json(["</s>"]))
        yield workflow, name


def given(bucket: str, **fields):
    return {"name": "corpus", "input_uri": f"s3://{bucket}/data/raw/", "model_uri": f"s3://{bucket}/data/tok/",
            **fields}  # fmt: skip


def test_a_preparation_runs_on_its_instances_and_ends_with_its_manifest(prepared):
    workflow, bucket = prepared
    done = workflow.run(given(bucket, instance_count=3, validation_fraction=0.2), timeout=300)
    assert done["status"] == "SUCCEEDED", done
    output = json.loads(done["output"])
    assert output["output_uri"] == f"s3://{bucket}/data/prepared/corpus/"
    request = processing.REQUESTS[-1]
    assert request["ProcessingResources"]["ClusterConfig"] == {"InstanceCount": 3, "InstanceType": "ml.c5.18xlarge",
                                                               "VolumeSizeInGB": 500}  # fmt: skip
    assert [i["S3Input"]["S3DataDistributionType"] for i in request["ProcessingInputs"]] == ["ShardedByS3Key",
                                                                                           "FullyReplicated"]  # fmt: skip
    args = request["AppSpecification"]["ContainerArguments"]
    assert args[args.index("--validation-fraction") + 1] == "0.2" and args[args.index("--kind") + 1] == "text"
    assert float(args[args.index("--template-seconds") + 1]) == 10  # the default, as local prepare's
    meta = json.loads(
        workflow.s3.get_object(Bucket=bucket, Key="data/prepared/corpus/metadata.json")["Body"].read()
    )
    assert len(meta["shards"]) == 7 and meta["tokenizer"]["kind"] == "tokenizers"
    # the same name again: every shard complete, nothing rewritten, still succeeds
    again = workflow.run(given(bucket, instance_count=2, validation_fraction=0.2), timeout=300)
    assert again["status"] == "SUCCEEDED", again


@pytest.mark.parametrize(
    ("fields", "cause"),
    [
        ({"instance_count": 5}, "instance_count: must be a whole number from 1 to 4"),
        ({"instance_count": 2.5}, "instance_count: must be a whole number from 1 to 4"),
        ({"instance_count": "2"}, "instance_count: must be a whole number from 1 to 4"),
        ({"input_uri": "s3://elsewhere/data/raw/"}, "input_uri: must be a folder s3://{bucket}/<prefix>/"),
        ({"input_uri": "-"}, "input_uri: must be a folder s3://{bucket}/<prefix>/ (ending in /)"),
        (
            {"input_uri": "s3://BUCKET/data/raw"},
            "input_uri: must be a folder s3://{bucket}/<prefix>/ (ending in /)",
        ),
        ({"model_uri": "-"}, "model_uri: must be a folder (ending in /)"),
        ({"name": ""}, "name: must be given, a non-empty string without '/'"),
        ({"name": "a/b"}, "name: must be given, a non-empty string without '/'"),
        ({"name": ".."}, "name: must be given, a non-empty string without '/'"),
        ({"kind": "dpo"}, "kind: must be one of text, chat, pairs"),
        ({"too_long": "cut"}, "too_long: must be one of drop, truncate"),
        ({"instance_type": "ml.p5.48xlarge"}, "instance_type: must be one of"),
    ],
)
def test_what_is_not_allowed_is_refused_by_field_before_any_job(prepared, fields, cause):
    workflow, bucket = prepared
    before = len(processing.REQUESTS)
    fields = {k: v.replace("BUCKET", bucket) if isinstance(v, str) else v for k, v in fields.items()}
    done = workflow.run(given(bucket, **fields))
    assert done["status"] == "FAILED" and done["error"] == "InvalidInput"
    assert done["cause"].startswith(cause)
    assert len(processing.REQUESTS) == before


def test_a_bad_record_fails_the_execution_and_writes_no_manifest(prepared):
    workflow, bucket = prepared
    workflow.s3.put_object(Bucket=bucket, Key="data/bad/x.jsonl", Body=b'{"text": "fine"}\n{"text": 7}\n')
    done = workflow.run(given(bucket, name="bad", input_uri=f"s3://{bucket}/data/bad/"), timeout=300)
    assert done["status"] == "FAILED" and done["error"] == "PreparationFailed", done
    request = processing.REQUESTS[-1]
    args = request["AppSpecification"]["ContainerArguments"]
    # where SageMaker reads ExitMessage from
    assert args[args.index("--exit-message") + 1] == job.EXIT_MESSAGE
    described = workflow.sagemaker.describe_processing_job(ProcessingJobName=request["ProcessingJobName"])
    # the object by its key below input_uri
    assert described["ExitMessage"] == "error: x.jsonl:2: field 'text' is not a string"
    assert "x.jsonl" not in described["FailureReason"]  # SageMaker's own: the line reaches ExitMessage only
    state = preparation.progress(workflow.s3, workflow.sfn, done["executionArn"], f"s3://{bucket}/data/bad/",
                                 f"s3://{bucket}/data/prepared/bad/")  # fmt: skip
    assert state.line().endswith(
        "; the job said: error: x.jsonl:2: field 'text' is not a string"
    )  # prepare-status
    listed = workflow.s3.list_objects_v2(Bucket=bucket, Prefix="data/prepared/bad/").get("Contents", [])
    assert "data/prepared/bad/metadata.json" not in {o["Key"] for o in listed}


def test_preference_pairs_are_prepared_by_the_state_machine_as_kind_pairs(prepared, tmp_path):
    """Issue 55 item 2 for preference pairs through the workflow: ``kind`` pairs with a chat model's folder as
    ``model_uri``, two instances, ends with a ``kind: preference`` manifest and the model's template files."""
    from tests.prepare.test_local_sharded import write_pairs
    from tests.training.chat_models import model_folder

    workflow, bucket = prepared
    model = model_folder(tmp_path / "model", "qwen2.5")
    for path in sorted(p for p in model.iterdir() if p.is_file()):
        workflow.s3.upload_file(str(path), bucket, f"data/qwen/{path.name}")
    for path in write_pairs(tmp_path / "pairs"):
        workflow.s3.upload_file(str(path), bucket, f"data/pairs/{path.name}")
    fields = {"name": "pairs", "input_uri": f"s3://{bucket}/data/pairs/", "model_uri": f"s3://{bucket}/data/qwen/",
              "kind": "pairs", "instance_count": 2, "validation_fraction": 0.2}  # fmt: skip
    done = workflow.run(given(bucket, **fields), timeout=300)
    assert done["status"] == "SUCCEEDED", done
    args = processing.REQUESTS[-1]["AppSpecification"]["ContainerArguments"]
    assert args[args.index("--kind") + 1] == "pairs"
    listed = workflow.s3.list_objects_v2(Bucket=bucket, Prefix="data/prepared/pairs/")["Contents"]
    assert "data/prepared/pairs/tokenizer_config.json" in {o["Key"] for o in listed}
    meta = json.loads(
        workflow.s3.get_object(Bucket=bucket, Key="data/prepared/pairs/metadata.json")["Body"].read()
    )
    assert meta["kind"] == "preference" and len(meta["shards"]) == 3 and meta["pairs"] == 24
    assert all(entry["sequences"] == 2 * entry["examples"] for entry in meta["splits"].values())
