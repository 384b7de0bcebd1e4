"""The workflow's dashboard (its body reads only the contract's metric names, in the two namespaces, scoped to the
workflow's job names), TensorBoard output and MLflow in the synthesized template."""

from __future__ import annotations

import json
import re

import aws_cdk as cdk
import pytest
from aws_cdk import assertions

from constructs_lib.workflow.dashboard import search_terms
from constructs_lib.workflow.permissions import MLFLOW_ACTIONS
from tests.cdk_helpers import synth_with_nag
from tests.workflow.harness import definition_of, resolve
from tests.workflow.stacks import build_workflow
from training.contract import container, evaluation, metric_lines
from training.request import evaluate_block
from training.request.decision import validate_request
from training.request.job import job_fields
from training.request.rules import RequestRules
from training.request.value import read_request

MLFLOW = "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/team"
SEARCH = re.compile(r"""^SEARCH\('\{"([^"]+)",(\w+)\} MetricName="([^"]+)" (.+)', '(\w+)', 60\)$""")


def _template(**props) -> dict:
    app = cdk.App()
    build_workflow(app, **props)
    return assertions.Template.from_stack(app.node.find_child("Test")).to_json()


@pytest.fixture(scope="module")
def template() -> dict:
    return _template()


def _body(template: dict) -> dict:
    (dashboard,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    return json.loads(resolve(dashboard["Properties"]["DashboardBody"], template["Resources"]))


def _metrics(body: dict) -> list[list]:
    return [m for w in body["widgets"] if w["type"] == "metric" for m in w["properties"]["metrics"]]


def test_the_dashboard_reads_only_contract_metrics_in_the_two_namespaces_scoped_to_the_workflows_jobs(
    template,
):
    body = _body(template)
    searched, plain = [], []
    for metric in _metrics(body):
        options = metric[-1]
        if "expression" in options:
            match = SEARCH.match(options["expression"])
            assert match, options["expression"]
            namespace, dimension, name, terms, _statistic = match.groups()
            assert namespace == metric_lines.TRAINING_METRICS_NAMESPACE
            assert terms == search_terms(dimension, "blackwell-training")
            assert terms == f"{dimension}=blackwell-training"  # tokens next to each other, in order
            searched.append((dimension, name))
        else:
            namespace, name = metric[0], metric[1]
            assert namespace == "AWS/States"
            plain.append(name)
    defined = {definition.name for definition in metric_lines.metric_definitions()}
    job_metrics = {name for dimension, name in searched if dimension == metric_lines.TRAINING_JOB_DIMENSION}
    host_metrics = {name for dimension, name in searched if dimension == metric_lines.HOST_DIMENSION}
    scores = {
        d.name
        for d in evaluation.evaluation_metric_definitions(evaluation.DEFAULT_EVALUATION_TASKS)
        if "stderr" not in d.name
    }
    assert job_metrics <= defined | scores
    assert (
        job_metrics
        == {
            "train:loss",
            "val_loss",
            "val_accuracy",
            "train:tokens_per_sec",
            "train:mfu",
            "train:peak_mem_gb",
            "train:rewards_chosen",
            "train:rewards_rejected",
            "train:reward_margin",
            "train:reward_accuracy",
            "val_reward_accuracy",
            "train:logps_chosen",
            "train:logps_rejected",
        }
        | scores
    )
    assert len(scores) == 8  # acc and acc_norm of the four standard tasks
    assert host_metrics == set(metric_lines.HOST_GPU_METRICS)
    assert set(plain) == {
        "ExecutionsStarted",
        "ExecutionsSucceeded",
        "ExecutionsFailed",
        "ExecutionsTimedOut",
    }


@pytest.mark.parametrize(
    ("prefix", "term"),
    [("blackwell-training", "blackwell-training"), ("llama-1b--", "llama-1b"), ("Nightly2", "Nightly2")],
)
def test_the_search_term_is_the_prefix_whole_so_its_tokens_match_in_a_row(prefix, term):
    assert search_terms("TrainingJobName", prefix) == f"TrainingJobName={term}"


@pytest.mark.parametrize("prefix", ["", "-x", "a_b", "a b", "a'b"])
def test_a_prefix_the_dashboard_cannot_search_by_is_refused(prefix):
    with pytest.raises(ValueError, match="the dashboard searches by it"):
        search_terms("TrainingJobName", prefix)


def test_the_dashboard_searches_by_the_workflows_own_default_prefix():
    from constructs_lib.workflow.defaults import WorkflowDefaults

    body = _body(_template(defaults=WorkflowDefaults(job_name_prefix="team-a")))
    expressions = [m[-1]["expression"] for m in _metrics(body) if "expression" in m[-1]]
    assert expressions and all(SEARCH.match(e).group(4).endswith("=team-a") for e in expressions)


def test_executions_with_their_own_prefixes_are_searched_when_named():
    body = _body(_template(dashboard_job_name_prefixes=["nightly", "llama-1b-mxfp8"]))
    expressions = [m[-1]["expression"] for m in _metrics(body) if "expression" in m[-1]]
    for expression in expressions:
        dimension = SEARCH.match(expression).group(2)
        assert SEARCH.match(expression).group(4) == (
            f"({dimension}=blackwell-training OR {dimension}=nightly OR {dimension}=llama-1b-mxfp8)"
        )
    assert search_terms("Host", "a", "a-", "b") == "(Host=a OR Host=b)"
    with pytest.raises(ValueError, match="1 to 10 job name prefixes; got 11"):
        search_terms("Host", *[f"p{i}" for i in range(11)])


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"dashboard_job_name_prefixes": "nightly"}, "must be a list of strings"),
        ({"dashboard_job_name_prefixes": ["nightly"], "dashboard": False}, "needs dashboard=True"),
        ({"dashboard_job_name_prefixes": ["night_ly"]}, "'night_ly': the dashboard searches by it"),
    ],
)
def test_impossible_dashboard_prefixes_are_refused_at_synth(props, message):
    with pytest.raises(ValueError, match=message):
        build_workflow(cdk.App(), **props)


def test_a_renamed_contract_metric_fails_the_synth(monkeypatch):
    monkeypatch.setattr(
        metric_lines, "STEP_METRICS", tuple(m for m in metric_lines.STEP_METRICS if m != "mfu")
    )
    with pytest.raises(ValueError, match="no metric definition for train field 'mfu'"):
        build_workflow(cdk.App())


def test_the_evaluation_scores_are_bars_of_the_latest_value_between_0_and_1(template):
    widgets = [
        w for w in _body(template)["widgets"] if w["properties"].get("title", "").startswith("Evaluation")
    ]
    assert [w["properties"]["title"] for w in widgets] == [
        "Evaluation acc (standard tasks, per job)", "Evaluation acc_norm (standard tasks, per job)"
    ]  # fmt: skip
    for widget in widgets:
        props = widget["properties"]
        assert props["view"] == "bar" and props["setPeriodToTimeRange"] is True
        assert props["yAxis"]["left"]["min"] == 0 and props["yAxis"]["left"]["max"] == 1
        assert [m[-1]["label"] for m in props["metrics"]] == [
            f"{task} ${{PROP('Dim.TrainingJobName')}}" for task in evaluation.DEFAULT_EVALUATION_TASKS
        ]  # each bar says its task and (CloudWatch's dynamic label) its job


def test_the_dashboard_can_be_turned_off():
    app = cdk.App()
    workflow = build_workflow(app, dashboard=False)
    assertions.Template.from_stack(app.node.find_child("Test")).resource_count_is(
        "AWS::CloudWatch::Dashboard", 0
    )
    assert workflow.dashboard is None and workflow.dashboard_url is None


def _launches(template: dict, kind: str = "training") -> list[dict]:
    """The ``Parameters`` of the launch states of ``kind``: evaluation (the states named ``Run evaluation job...``)
    or training (every other: training and tuning, with CheckpointConfig or S3-direct checkpoints)."""
    states = definition_of(template)["States"]
    found = []

    def walk(node):
        if isinstance(node, dict):
            for name, value in node.items():
                launch = isinstance(value, dict) and str(value.get("Resource", "")).startswith(
                    "arn:aws:states:::sagemaker:createTrainingJob"
                )
                if launch and name.startswith("Run evaluation job") == (kind == "evaluation"):
                    found.append(value["Parameters"])
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(states)
    return found


def test_every_launch_writes_tensorboard_files_under_the_output_prefix_per_execution(template):
    launches = _launches(template)
    assert launches
    for params in launches:
        config = params["TensorBoardOutputConfig"]
        assert config["LocalPath"] == container.TENSORBOARD_LOCAL_PATH
        assert re.fullmatch(
            r"States\.Format\('s3://[^/]+/output/tensorboard/Test-Workflow/\{\}/', \$\$\.Execution\.Name\)",
            config["S3OutputPath.$"],
        )
        assert "MlflowConfig" not in params and "Environment" not in params
    assert all("TensorBoardOutputConfig" not in p for p in _launches(_template(tensorboard=False)))


def test_mlflow_config_environment_and_a_grant_on_that_server_only_nag_clean():
    result = synth_with_nag(lambda app: build_workflow(app, mlflow_tracking_server_arn=MLFLOW))
    assert result.violations == ()
    template = result.templates["Test.template.json"]
    for params in _launches(template):
        assert params["MlflowConfig"] == {
            "MlflowResourceArn": MLFLOW,
            "MlflowExperimentName": "Test-Workflow",
            "MlflowRunName.$": "$$.Execution.Name",
        }
    # the evaluation jobs stay network-isolated with a tracking server too: no MlflowConfig, no MLflow variables
    evaluations = _launches(template, "evaluation")
    assert len(evaluations) == 2
    assert all("MlflowConfig" not in e and e["EnableNetworkIsolation"] is True for e in evaluations)
    # the decided request's Environment carries the trainer's MLflow variables (and the execution's own)
    rules = RequestRules.from_state_machine_definition(definition_of(template))
    assert rules.mlflow_tracking_server_arn == MLFLOW
    read = read_request(
        {"environment": {"NCCL_DEBUG": "INFO"}, "evaluate": {"task_data_uri": "s3://b/data/tasks/"}}, rules
    )
    config = read.fields
    environment = job_fields(config, rules, "run-7")["Environment"]
    assert environment == {
        "NCCL_DEBUG": "INFO",
        container.MLFLOW_TRACKING_URI_ENV: MLFLOW,
        container.MLFLOW_EXPERIMENT_ENV: "Test-Workflow",
        container.MLFLOW_RUN_NAME_ENV: "run-7",
    }
    room = rules.sagemaker()["Environment"]["max"] - 3  # the three MLflow variables must still fit
    too_many = {f"NCCL_X{i}": "1" for i in range(room + 1)}
    assert f"environment: at most {room} variables; got {room + 1}" in validate_request(
        {"environment": too_many}, rules
    )
    decided = evaluate_block.decided(
        config, read.evaluate, rules, "run-7", None, instance_type="ml.p5.4xlarge"
    )
    assert decided["request"]["Environment"] == {"NCCL_DEBUG": "INFO", "SAGEMAKER_PROGRAM": "evaluate.sh"}
    plain = RequestRules.from_state_machine_definition(definition_of(_template()))
    assert plain.mlflow_tracking_server_arn is None
    assert job_fields(config, plain, "run-7")["Environment"] == {"NCCL_DEBUG": "INFO"}
    statements = [
        s
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy"
        for s in r["Properties"]["PolicyDocument"]["Statement"]
        if any(
            str(a).startswith("sagemaker-mlflow:")
            for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
        )
    ]
    (statement,) = statements
    assert statement["Resource"] == MLFLOW and sorted(statement["Action"]) == sorted(MLFLOW_ACTIONS)
    assert not any(a.endswith("*") for a in statement["Action"])
    assert {a.split(":")[1] for a in statement["Action"]} == {
        "GetExperimentByName",
        "CreateExperiment",
        "SearchRuns",
        "CreateRun",
        "GetRun",
        "UpdateRun",
        "LogBatch",
    }


@pytest.mark.parametrize(
    ("props", "message"),
    [
        (
            {"mlflow_tracking_server_arn": "arn:aws:s3:::bucket"},
            "mlflow_tracking_server_arn must be a SageMaker MLflow",
        ),
        ({"mlflow_tracking_server_arn": MLFLOW, "network_isolation": True}, "network_isolation=True removes"),
    ],
)
def test_impossible_mlflow_settings_are_refused_at_synth(props, message):
    with pytest.raises(ValueError, match=message):
        build_workflow(cdk.App(), **props)
