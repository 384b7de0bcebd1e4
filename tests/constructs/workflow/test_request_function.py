"""RequestValidator: a self-contained asset, least-privilege role, cdk-nag clean."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from constructs_lib.storage.checkpoint_bucket import CheckpointBucket
from constructs_lib.workflow.request_function import HANDLER, RequestValidator, asset_files, build_asset
from tests.cdk_helpers import DEFAULT_ENV, synth_with_nag
from tests.test_import_cycles import _graph
from tests.workflow.harness import definition_of
from tests.workflow.stacks import build_workflow
from training.request.job import job_fields
from training.request.rules import RequestRules
from training.request.value import Fields


def _validator(stack: cdk.Stack) -> RequestValidator:
    bucket = CheckpointBucket(stack, "Checkpoints")
    return RequestValidator(
        stack, "Validator", bucket=bucket.bucket, runs_prefix="checkpoints/Test-Workflow/"
    )


@pytest.fixture(scope="module")
def template() -> Template:
    stack = cdk.Stack(cdk.App(), "Test", env=DEFAULT_ENV)
    _validator(stack)
    return Template.from_stack(stack)


def _handler_imports() -> set[str]:
    """The project's modules the handler's module imports, directly or through others (the import graph of
    ``tests/test_import_cycles.py``: import statements anywhere and imports by literal name), itself included."""
    graph = _graph()
    seen: set[str] = set()
    todo = [HANDLER.rsplit(".", 1)[0]]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph[name]
    return seen


def test_asset_holds_only_what_the_handler_imports():
    """Every module the handler imports, found in the source at synth time (``asset_files``) and held here against
    the project's import graph, which also counts imports by literal name: a module a new import brings is in the
    asset with no edit. Nothing else; each package's ``__init__`` empty unless the handler imports the package."""
    folder = build_asset()
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert files >= set(asset_files())
    inits = {name for name in files if name.endswith("__init__.py")}
    packages = {name for name in inits if (folder / name).read_text()}
    modules = {name.removesuffix("/__init__.py").removesuffix(".py").replace("/", ".") for name in packages}
    modules |= {name[: -len(".py")].replace("/", ".") for name in files - inits}
    imported = _handler_imports()
    assert not imported - modules, f"the handler imports {sorted(imported - modules)}, not in the asset"
    assert not modules - imported, f"the handler never imports {sorted(modules - imported)}: leave it out"
    assert {
        "training.request.decision",
        "training.contract.settings_table",
        "training.models.registry",
    } < modules
    assert all(name.endswith(".py") for name in files)
    assert inits == {f"{name.rsplit('/', 1)[0]}/__init__.py" for name in files}  # a package: every folder
    for package in ("constructs_lib", "constructs_lib/workflow", "training", "training/request"):
        assert (folder / package / "__init__.py").read_text() == "", f"{package}/__init__.py is not empty"


EMPTY_S3 = (
    "import types; listed = []; "
    "s3 = types.SimpleNamespace(list_objects_v2=lambda **kw: listed.append(kw) or {'KeyCount': 0}); "
    "sys.modules['boto3'] = types.SimpleNamespace(client=lambda service, **kw: s3); "
)
"""The Lambda runtime's boto3, standing in for an empty bucket (the process has no site-packages): the only S3
calls a tuning request without data makes are the listings of the run's own folder and measurements before a
launch, kept in ``listed``."""


def _handler_from_the_asset(event: dict, cwd: Path, s3: str = "") -> dict:
    """The handler's result for ``event``, run from the asset alone: no site-packages at all (-S); ``s3``: code
    that stands in for boto3 first (``EMPTY_S3``)."""
    code = (
        f"import sys, json; {s3}sys.path.insert(0, {str(build_asset())!r}); "
        f"mod, fn = {HANDLER!r}.rsplit('.', 1); import importlib; "
        "handler = getattr(importlib.import_module(mod), fn); "
        f"state = handler({event!r}); print(json.dumps(state)); print(json.dumps(globals().get('listed')))"
    )
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    state, listed = proc.stdout.splitlines()
    return {**json.loads(state), "listed": json.loads(listed)} if s3 else json.loads(state)


def test_handler_runs_from_the_asset_alone(tmp_path):
    """No site-packages at all (-S): the handler needs neither aws_cdk nor botocore when the rules carry the limits."""
    rules = RequestRules(region="us-west-2", bucket_name="b").with_limits().to_json()
    result = _handler_from_the_asset(
        {"input": {"hyperparameters": {"max_step": "5"}}, "rules": rules}, tmp_path
    )
    assert result["valid"] is False and "did you mean max_steps?" in result["cause"]


def test_the_handler_logs_every_problem_which_the_state_only_counts(caplog):
    from constructs_lib.workflow.request_check import handler

    rules = RequestRules(region="us-west-2").with_limits().to_json()
    with caplog.at_level("INFO", logger="constructs_lib.workflow.request_check"):
        state = handler({"input": {f"u{i}": 0 for i in range(2000)}, "rules": rules, "execution": "run-1"})
    lines = [json.loads(record.getMessage()) for record in caplog.records]
    assert lines[0] == {"execution": "run-1", "valid": False, "problems": 2000}
    assert [line["problem"].split(":")[0] for line in lines[1:]] == [f"u{i}" for i in range(1000)]
    assert state["cause"].endswith("more problems (the request check's log and blackwell-training validate "
                                   "--deployed on this input list every one)")  # fmt: skip


def test_a_tuning_run_is_decided_from_the_asset_alone(tmp_path):
    """The tuning plan (candidates, cost, the job's hyperparameters) needs nothing beyond the asset either."""
    rules = RequestRules(region="us-west-2", bucket_name="b").with_limits().to_json()
    event = {
        "input": {"batch_size": 2, "tune": {"search_space": {"batch_size": [1, 2]}}},
        "rules": rules,
        "execution": "run-1",
    }
    result = _handler_from_the_asset(event, tmp_path, s3=EMPTY_S3)
    assert result["valid"] is True, result["cause"]
    listed = result["listed"]  # the run's own folder and measurements: no earlier run's of that name
    assert listed and all(kw["Bucket"] == "b" and "run-1" in kw["Prefix"] for kw in listed), listed
    assert result["hyperparameters"]["tune_trials"] == (
        "batch_size=2,grad_accum_steps=1;batch_size=1,grad_accum_steps=2"
    )
    assert result["tune"]["winner_key"] == "checkpoints/run-1/tune/winner.json"


def test_memory_estimate_runs_from_the_asset_alone(tmp_path):
    """The plan (training/plan/, standard library only) refuses what cannot fit, inside the asset, with -S."""
    rules = RequestRules(region="us-west-2", bucket_name="b").with_limits().to_json()
    requests = [
        {"hyperparameters": {"model_preset": "8b"}, "seq_length": 8192, "batch_size": 8},
        {"precision": "mxfp8", "batch_size": 16, "activation_checkpointing": True},
    ]
    code = (
        f"import sys, json; sys.path.insert(0, {str(build_asset())!r}); "
        f"mod, fn = {HANDLER!r}.rsplit('.', 1); import importlib; "
        "handler = getattr(importlib.import_module(mod), fn); "
        f"print(json.dumps([handler({{'input': r, 'rules': {rules!r}}}) for r in {requests!r}])); "
        "assert 'torch' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    refused, accepted = json.loads(proc.stdout)
    assert refused["valid"] is False and refused["cause"].startswith("memory: estimated peak")
    assert "fits with: activation_checkpointing true" in refused["cause"]
    assert accepted["valid"] is True and accepted["plan"]["fits"] and accepted["plan"]["ignored"] is False


def test_role_reads_only_the_markers_and_lists_only_the_runs(template):
    template.has_resource_properties(
        "AWS::IAM::Role",
        {"AssumeRolePolicyDocument": Match.object_like({}), "ManagedPolicyArns": Match.absent()},
    )
    (policy,) = [
        p
        for lid, p in template.find_resources("AWS::IAM::Policy").items()
        if lid.startswith("ValidatorRoleDefaultPolicy")
    ]
    by_sid = {s.get("Sid"): s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert by_sid["ReadCheckpointMarkers"]["Action"] == "s3:GetObject"
    assert json.dumps(by_sid["ReadCheckpointMarkers"]["Resource"]).endswith(
        '"/checkpoints/Test-Workflow/*/COMPLETE"]]}'
    )
    assert by_sid["ListWorkflowRuns"]["Action"] == "s3:ListBucket"
    assert by_sid["ListWorkflowRuns"]["Condition"] == {
        "StringLike": {"s3:prefix": ["checkpoints/Test-Workflow/*"]}
    }
    actions = {
        a for s in by_sid.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert actions <= {"s3:GetObject", "s3:ListBucket", "logs:CreateLogStream", "logs:PutLogEvents",
                       "sagemaker:DescribeTrainingPlan"}  # fmt: skip
    # no training_job_tag: it may describe no training job at all
    plans = by_sid["DescribeTrainingPlans"]
    assert plans["Action"] == "sagemaker:DescribeTrainingPlan" and "Condition" not in plans
    # the training plans of the stack's own account and region, any name (a request names its plan)
    assert plans["Resource"] == {
        "Fn::Join": [
            "",
            ["arn:", {"Ref": "AWS::Partition"}, ":sagemaker:us-west-2:123456789012:training-plan/*"],
        ]
    }


def test_role_describes_only_the_training_jobs_with_the_workflows_tag_nag_clean():
    """In a workflow: DescribeTrainingJob on training-job/* only where aws:ResourceTag/training-workflow is the tag
    value every job of that workflow gets (the request rules' workflow_path), and cdk-nag acknowledges exactly
    that resource."""
    result = synth_with_nag(lambda app: build_workflow(app))
    assert result.violations == ()
    template = result.templates["Test.template.json"]
    (policy,) = [
        p
        for lid, p in template["Resources"].items()
        if p["Type"] == "AWS::IAM::Policy" and lid.startswith("WorkflowRequestValidatorRoleDefaultPolicy")
    ]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (jobs,) = [s for s in statements if "sagemaker:DescribeTrainingJob" in json.dumps(s["Action"])]
    rules = RequestRules.from_state_machine_definition(definition_of(template))
    assert jobs["Action"] == "sagemaker:DescribeTrainingJob"
    assert jobs["Condition"] == {"StringEquals": {"aws:ResourceTag/training-workflow": rules.workflow_path}}
    assert rules.workflow_path == "Test/Workflow"
    assert json.dumps(jobs["Resource"]).endswith(':training-job/*"]]}')
    assert {"Key": "training-workflow", "Value": rules.workflow_path} in job_fields(
        Fields(**rules.full_defaults()), rules, "run-1"
    )["Tags"]


def test_role_lists_only_the_allowed_data_prefixes():
    stack = cdk.Stack(cdk.App(), "Test", env=DEFAULT_ENV)
    bucket = CheckpointBucket(stack, "Checkpoints")
    other = "arn:aws:s3:::shared-corpora"
    RequestValidator(
        stack,
        "Validator",
        bucket=bucket.bucket,
        runs_prefix="checkpoints/Test-Workflow/",
        data_prefixes=[(bucket.bucket.bucket_arn, "data/"), (other, "tokens/"), (other, "text/")],
    )
    (policy,) = Template.from_stack(stack).find_resources("AWS::IAM::Policy").values()
    by_sid = {s.get("Sid"): s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert by_sid["ListTrainingData0"]["Action"] == "s3:ListBucket"
    assert by_sid["ListTrainingData0"]["Condition"] == {"StringLike": {"s3:prefix": ["data/*"]}}
    # under the data prefixes it may read only task YAML files (evaluation's task names) by their ending
    reads = by_sid["ReadTaskFiles"]
    assert reads["Action"] == "s3:GetObject"
    rendered = json.dumps(reads["Resource"])
    for prefix in ("/data/*/*.yaml", "/data/*/*.yml"):  # in a folder below the prefix: never the prefix's own
        assert prefix in rendered
    assert [r for r in reads["Resource"] if isinstance(r, str)] == [
        f"{other}/{p}*/*{s}" for p in ("tokens/", "text/") for s in (".yaml", ".yml")
    ]
    # and prepared data's metadata.json by its exact name: in a data prefix or any folder below it, nothing else
    metadata = by_sid["ReadDataMetadata"]
    assert metadata["Action"] == "s3:GetObject"
    assert [r for r in metadata["Resource"] if isinstance(r, str)] == [
        f"{other}/{p}{s}" for p in ("tokens/", "text/") for s in ("metadata.json", "*/metadata.json")
    ]
    readable = [r for st in by_sid.values() if st["Action"] == "s3:GetObject" for r in st["Resource"]]
    readable = [r for r in readable if isinstance(r, str)]  # the other bucket's: plain ARNs

    def may_read(key: str) -> bool:  # IAM's '*' matches any characters, '/' included, as fnmatch's does
        return any(fnmatch.fnmatchcase(f"{other}/{key}", r) for r in readable)

    for key in ("tokens/metadata.json", "tokens/corpus/metadata.json", "tokens/a/b/metadata.json"):
        assert may_read(key), key
    for key in (
        "tokens/corpus/old-metadata.json",  # the loose pattern '*metadata.json' let these through
        "tokens/secret_metadata.json",
        "tokens/corpus/metadata.json.bak",
        "tokens/corpus/train.bin",
        "tokens/model/model.safetensors",
        "elsewhere/metadata.json",
    ):
        assert not may_read(key), key
    assert by_sid["ListTrainingData1"] == {
        "Sid": "ListTrainingData1",
        "Action": "s3:ListBucket",
        "Effect": "Allow",
        "Resource": other,
        "Condition": {"StringLike": {"s3:prefix": ["tokens/*", "text/*"]}},
    }
    # init_from: the config.json of a model folder under a data source (the source itself or below), nothing else
    configs = by_sid["ReadModelConfigs"]
    assert configs["Action"] == "s3:GetObject"
    rendered = [json.dumps(r) for r in configs["Resource"]]
    assert len(rendered) == 6 and all(
        r.endswith('config.json"]]}') or r.endswith('config.json"') for r in rendered
    )
    assert f"{other}/tokens/config.json" in configs["Resource"]
    assert f"{other}/tokens/*/config.json" in configs["Resource"]
    assert any('"/data/*/config.json"' in r for r in rendered) and any(
        '"/data/config.json"' in r for r in rendered
    )


def test_function_uses_its_own_log_group_and_the_handler(template):
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {"Handler": HANDLER, "Runtime": "python3.14", "LoggingConfig": {"LogGroup": Match.any_value()}},
    )


def test_no_unacknowledged_findings():
    result = synth_with_nag(lambda app: _validator(cdk.Stack(app, "Test", env=DEFAULT_ENV)))
    assert result.violations == ()


@pytest.mark.parametrize("prefix", ["checkpoints", "/checkpoints/", "check*/"])
def test_runs_prefix_must_be_a_key_prefix(prefix):
    stack = cdk.Stack(cdk.App(), "Test", env=DEFAULT_ENV)
    bucket = CheckpointBucket(stack, "Checkpoints")
    with pytest.raises(ValueError, match="RequestValidator: runs_prefix must be a key prefix ending in '/'"):
        RequestValidator(stack, "Validator", bucket=bucket.bucket, runs_prefix=prefix)


def test_asset_is_content_addressed():
    """The folder (and so the asset's hash) is named by the files' paths and bytes, in path order."""
    assert build_asset() == build_asset()
    assert Path(build_asset()).name.startswith("request-validator-")
    assert list(asset_files()) == sorted(asset_files())


def test_role_lists_and_reads_only_the_stored_tuning_measurements():
    stack = cdk.Stack(cdk.App(), "Test", env=DEFAULT_ENV)
    bucket = CheckpointBucket(stack, "Checkpoints")
    RequestValidator(stack, "Validator", bucket=bucket.bucket, runs_prefix="checkpoints/W/",
                     measurements_prefix="tuning/measurements/")  # fmt: skip
    template = Template.from_stack(stack)
    (policy,) = [
        p
        for lid, p in template.find_resources("AWS::IAM::Policy").items()
        if lid.startswith("ValidatorRoleDefaultPolicy")
    ]
    by_sid = {s.get("Sid"): s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert by_sid["ReadTuningMeasurements"]["Action"] == "s3:GetObject"
    assert json.dumps(by_sid["ReadTuningMeasurements"]["Resource"]).endswith('"/tuning/measurements/*"]]}')
    assert by_sid["ListTuningMeasurements"]["Condition"] == {
        "StringLike": {"s3:prefix": ["tuning/measurements/*"]}
    }
    with pytest.raises(ValueError, match="measurements_prefix must be a key prefix ending in '/'"):
        RequestValidator(
            stack, "Other", bucket=bucket.bucket, runs_prefix="checkpoints/W/", measurements_prefix="t"
        )
