"""What decides a request (``training.request.decision``, which the Lambda's ``constructs_lib.workflow.request_check``
runs), without aws_cdk or AWS."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import botocore.session
import pytest

from constructs_lib.workflow.request_check import decide
from training.contract import container, settings_parse, settings_table, shapes, tuning
from training.request import hf_config
from training.request.decision import prepare_request, validate_request
from training.request.fields import DEFAULT_INPUT, INPUT_FIELDS
from training.request.reads import newest_complete_checkpoint, read_init_from, resume_problems
from training.request.rules import (
    CHECKPOINT_MARKER,
    PLATFORM_HYPERPARAMETERS,
    RequestRules,
    parse_data_sources,
    sagemaker_limits,
)

REGION = "us-west-2"
PLAN = f"arn:aws:sagemaker:{REGION}:123456789012:training-plan/b200-week"


@pytest.fixture(scope="module")
def rules() -> RequestRules:
    return RequestRules(
        region=REGION, bucket_name="my-bucket", workflow_segment="Test-Workflow"
    ).with_limits()


def one(raw, rules) -> str:
    problems = validate_request(raw, rules)
    assert len(problems) == 1, problems
    return problems[0]


def test_module_loads_without_aws_cdk():
    code = "import sys, constructs_lib.workflow.request_check; print('aws_cdk' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )


def test_empty_input_is_the_defaults(rules):
    prepared = prepare_request({}, rules)
    assert prepared.problems == []
    assert prepared.config == {**DEFAULT_INPUT, "hyperparameters": {}}
    assert prepared.hyperparameters == {
        "precision": "bf16",
        "batch_size": "1",
        "seq_length": "8192",
        "activation_checkpointing": "none",
        **PLATFORM_HYPERPARAMETERS,
    }


@pytest.mark.parametrize("raw", [[], "text", 3, None, True])
def test_input_must_be_an_object(raw, rules):
    assert one(raw, rules).startswith("input: must be a JSON object of input fields; got ")


def test_unknown_field_suggests_the_closest(rules):
    assert one({"instance_typ": "x"}, rules).startswith(
        "instance_typ: unknown input field (did you mean instance_type?)"
    )


def test_issue_examples_are_each_named(rules):
    problems = validate_request(
        {
            "hyperparameters": {
                "max_step": "5",
                "max_steps": "-5",
                "model_preset": "2b",
                "learning_rate": "fast",
            }
        },
        rules,
    )
    assert problems[0].startswith(
        "hyperparameters: unknown trainer setting max_step (did you mean max_steps?)"
    )
    assert "hyperparameters.max_steps: must be an integer in [1, 100000000]; got '-5'" in problems
    assert any(p.startswith("hyperparameters.model_preset: must be one of 1b, 8b") for p in problems)
    assert "hyperparameters.learning_rate: must be a number in [0, 10]; got 'fast'" in problems


@pytest.mark.parametrize("spec", settings_table.HYPERPARAMETERS, ids=lambda s: s.name)
def test_every_contract_setting_is_checked_with_the_trainers_parser(spec, rules):
    """Generated from the contract's table: each setting's bad value is refused, named, with what is allowed."""
    if spec.name in PLATFORM_HYPERPARAMETERS:
        assert "cannot be set from an execution" in one({"hyperparameters": {spec.name: "/tmp/x"}}, rules)
        return
    bad = {"int": "1.5", "float": "fast", "bool": "maybe", "choice": "nope", "str": None}[spec.kind]
    if bad is None:
        pytest.skip("free-form string setting")
    if spec.name in ("precision", "num_layers", "batch_size", "seq_length", "activation_checkpointing"):
        assert f"is the top-level input field {spec.name}" in one(
            {"hyperparameters": {spec.name: bad}}, rules
        )
        return
    problem = one({"hyperparameters": {spec.name: bad}}, rules)
    assert problem == f"hyperparameters.{spec.name}: must be {spec.allowed()}; got {bad!r}"


def test_a_new_contract_setting_is_checked_with_no_other_edit(monkeypatch, rules):
    spec = settings_table.Hyperparameter("val_interval", "int", 0, "Validation loss every N steps.", 0, 1000)
    monkeypatch.setitem(settings_table.HYPERPARAMETERS_BY_NAME, spec.name, spec)
    assert validate_request({"hyperparameters": {"val_interval": "50"}}, rules) == []
    assert one({"hyperparameters": {"val-interval": "5000"}}, rules) == (
        "hyperparameters.val_interval: must be an integer in [0, 1000]; got '5000'"
    )


@pytest.mark.parametrize(
    ("settings", "field", "words"),
    [
        ({"num_heads": "7"}, "num_heads", "must divide hidden_size (2048)"),
        ({"quantized_model_init": "true"}, "quantized_model_init", "works only with precision fp8 or mxfp8"),
        ({"num_heads": "512"}, "num_heads", "hidden_size / num_heads must be a multiple of 8"),
        ({"model_preset": "custom"}, "num_layers", "must be set when model_preset=custom"),
        ({"grad_accum_steps": 0}, "grad_accum_steps", "an integer in [1, 65536]"),
        (
            {"activation_checkpointing_interval": 17},
            "activation_checkpointing_interval",
            "at most num_layers",
        ),
        ({"compile": "always"}, "compile", "one of auto, true, false"),
    ],
)
def test_the_trainers_cross_setting_rules(settings, field, words, rules):
    problem = one({"hyperparameters": settings}, rules)
    assert problem.startswith(f"hyperparameters.{field}: ") and words in problem


def test_lever_refusals_that_need_the_top_level_precision(rules):
    problem = one({"precision": "fp8", "instance_type": "ml.p5.48xlarge", "hyperparameters": {"compile": "true"}},
                  rules)  # fmt: skip
    assert problem.startswith("hyperparameters.compile: true cannot compile precision=fp8")
    selective = one({"precision": "mxfp8", "activation_checkpointing": "selective"}, rules)
    assert "activation_checkpointing: selective cannot run with precision=mxfp8" in selective
    masters = one({"precision": "mxfp8", "hyperparameters": {"quantized_model_init": True, "master_weights": False}},
                  rules)  # fmt: skip
    assert masters.startswith("hyperparameters.master_weights: must be true with quantized_model_init")


def test_fp8_dims_are_checked_for_the_recipe_the_instance_types_gpu_runs(rules):
    """fp8's auto recipe is MXFP8 on Blackwell (blocks of 32 values), current scaling on Hopper (multiples of 16)."""
    fp8 = {"precision": "fp8", "seq_length": 4112, "batch_size": 1}
    problem = one(fp8, rules)  # ml.p6-b200.48xlarge, the default
    assert problem.startswith("hyperparameters.seq_length: must be a multiple of 32 for precision=fp8 with ")
    assert "fp8_recipe=auto (MXFP8BlockScaling on SM 10.0" in problem
    assert validate_request({**fp8, "instance_type": "ml.p5.48xlarge"}, rules) == []


@pytest.mark.parametrize("value", [True, False, "none", "full", "selective"])
def test_activation_checkpointing_takes_true_false_and_its_modes(value, rules):
    prepared = prepare_request({"activation_checkpointing": value, "batch_size": 1}, rules)
    expected = {True: "full", False: "none"}.get(value, value)
    assert (
        settings_parse.parse_hyperparameters(prepared.hyperparameters)["activation_checkpointing"] == expected
    )


def test_an_unknown_activation_checkpointing_mode_is_refused_naming_the_field(rules):
    problem = one({"activation_checkpointing": "partial"}, rules)
    assert problem.startswith("activation_checkpointing: must be true, false or one of none, full, selective")


def test_channel_dataset_needs_training_data_and_data_switches_it(rules):
    assert "channel needs train_data_uri" in one({"hyperparameters": {"dataset": "channel"}}, rules)
    uri = "s3://my-bucket/data/corpus/"
    assert "synthetic would ignore train_data_uri" in one(
        {"train_data_uri": uri, "hyperparameters": {"dataset": "synthetic"}}, rules
    )
    assert prepare_request({"train_data_uri": uri}, rules).hyperparameters["dataset"] == "channel"


@pytest.mark.parametrize(
    "uri",
    [
        "s3://other-bucket/data/x/",  # not an allowed source
        "s3://my-bucket/checkpoints/x/",  # another prefix of the same bucket
        "s3://my-bucket/data/x",  # no trailing slash: a prefix would also match data/x2/
        "https://my-bucket/data/x/",
        "s3://my-bucket/data//x/",
        "s3://my-bucket/data/../checkpoints/",
        "s3://my-bucket/data/" + "x" * 1020 + "/",  # longer than SageMaker's S3Uri
        5,
    ],
)
def test_train_data_uri_must_be_under_an_allowed_source(uri, rules):
    assert one({"train_data_uri": uri}, rules).startswith(
        "train_data_uri: must be an s3:// prefix ending in '/' under one of s3://my-bucket/data/, or null; got "
    )


def test_data_sources_can_name_other_buckets(rules):
    wide = replace(rules, data_sources=("data/", "s3://corpora/tokens/"))
    assert validate_request({"train_data_uri": "s3://corpora/tokens/web/"}, wide) == []
    assert parse_data_sources(None) == ("data/",)
    assert parse_data_sources(["s3://corpora/tokens/", "data/"]) == ("s3://corpora/tokens/", "data/")
    for bad in (["s3://corpora/tokens"], "data/", ["/data/"], [3]):
        with pytest.raises(ValueError, match="context dataSources: must be a list of S3 prefixes"):
            parse_data_sources(bad)


def test_job_name_limits_come_from_botocore(rules):
    shape = (
        botocore.session.get_session()
        .get_service_model("sagemaker")
        .operation_model("CreateTrainingJob")
        .input_shape.members["TrainingJobName"]
    )
    assert sagemaker_limits()["TrainingJobName"]["max"] == shape.metadata["max"] == 63
    longest = shape.metadata["max"] - 37  # "-<UUID>"
    assert validate_request({"job_name_prefix": "a" * longest}, rules) == []
    assert one({"job_name_prefix": "a" * (longest + 1)}, rules).startswith(
        f"job_name_prefix: must be 1 to {longest} characters"
    )
    # A smaller limit in the rules (another botocore) moves the bound: nothing is typed from memory.
    tighter = replace(
        rules, limits={**rules.limits, "TrainingJobName": {**rules.limits["TrainingJobName"], "max": 50}}
    )
    assert one({"job_name_prefix": "a" * 14}, tighter).startswith(
        "job_name_prefix: must be 1 to 13 characters"
    )


@pytest.mark.parametrize("prefix", ["-a", "a_b", "", "é", "a.b", 7])
def test_job_name_prefix_pattern(prefix, rules):
    assert one({"job_name_prefix": prefix}, rules).startswith("job_name_prefix: ")


@pytest.mark.parametrize("prefix", ["a", "a-", "a--b-", "Run-2026"])
def test_job_name_prefix_allowed_by_sagemakers_pattern(prefix, rules):
    assert validate_request({"job_name_prefix": prefix}, rules) == []


def test_hyperparameter_value_size_and_count_come_from_botocore(rules):
    limits = dict(rules.limits)
    limits["HyperParameterValue"] = {"max": 3}
    problems = validate_request(
        {"hyperparameters": {"learning_rate": "0.0003"}}, replace(rules, limits=limits)
    )
    assert "hyperparameters.learning_rate: value of 6 characters; SageMaker allows at most 3" in problems
    limits = {**rules.limits, "HyperParameters": {"max": 6}}
    assert one({"hyperparameters": {"seed": "1"}}, replace(rules, limits=limits)) == (
        "hyperparameters: SageMaker allows at most 6 in all; the request would have 7"
    )


@pytest.mark.parametrize(
    ("raw", "start"),
    [
        ({"batch_size": 0}, "batch_size: must be an integer in [1, 4096]; got 0"),
        ({"batch_size": 2.0}, "batch_size: must be an integer"),
        ({"batch_size": True}, "batch_size: must be an integer"),
        ({"batch_size": None}, "batch_size: must be an integer in [1, 4096]; got null"),
        ({"instance_count": 5}, "instance_count: must be an integer in [1, 4]"),
        ({"precision": "fp7"}, "precision: must be one of fp32, fp16"),
        ({"instance_type": "ml.m5.large"}, "instance_type: must be one of ml.p6-b200.48xlarge"),
        ({"use_spot": "yes"}, "use_spot: must be true or false"),
        (
            {"training_plan_arn": PLAN.replace(REGION, "us-east-1")},
            "training_plan_arn: must be a training plan",
        ),
        ({"training_plan_arn": "arn:aws:sagemaker:us-west-2:1234:training-plan/x"}, "training_plan_arn:"),
        ({"max_runtime_seconds": 28 * 86400 + 1}, "max_runtime_seconds: must be an integer in [1, 2419200]"),
        ({"hyperparameters": ["a"]}, "hyperparameters: must be a JSON object of trainer settings"),
        ({"hyperparameters": {"seed": None}}, "hyperparameters: must be a JSON object"),
        ({"train_data_input_mode": "Pipe"}, "train_data_input_mode: must be one of FastFile, File"),
        ({"resume_from": "a/b"}, "resume_from: must be the name of an earlier execution"),
        (
            {"resume_from": "x" * 81},
            "resume_from: must be the name of an earlier execution of this workflow, or this execution's own to "
            "continue its run in its folder (1 to 80",
        ),
        (
            {"precision": "mxfp8", "instance_type": "ml.p5.48xlarge"},
            "precision: mxfp8 cannot run on the GPUs",
        ),
        ({"use_spot": True, "training_plan_arn": PLAN}, "use_spot: managed spot cannot be combined"),
        ({"max_wait_seconds": 100}, "max_wait_seconds: only allowed with use_spot true"),
        (
            {"use_spot": True, "max_wait_seconds": 100},
            "max_wait_seconds: must be >= max_runtime_seconds (86400)",
        ),
    ],
)
def test_field_problems(raw, start, rules):
    assert one(raw, rules).startswith(start)


def test_every_problem_is_reported_at_once(rules):
    problems = validate_request({"batch_size": 0, "precision": "x", "nope": 1}, rules)
    assert [p.split(":")[0] for p in problems] == ["nope", "precision", "batch_size"]


def test_trainer_settings_are_checked_even_when_other_fields_fail(rules):
    """One round of fixes, not two: a bad top-level field does not hide the bad trainer settings."""
    raw = {
        "precision": "x",
        "hyperparameters": {"max_step": "5", "learning_rate": "fast", "checkpoint_dir": "/x"},
    }
    problems = validate_request(raw, rules)
    assert [p.split(":")[0] for p in problems] == [
        "precision",
        "hyperparameters",
        "hyperparameters.learning_rate",
        "hyperparameters.checkpoint_dir",
    ]
    assert "did you mean max_steps?" in problems[1]


def test_spot_wait_defaults_to_the_runtime_and_numbers_become_strings(rules):
    prepared = prepare_request(
        {"use_spot": True, "num_layers": 4, "hyperparameters": {"learning-rate": 0.001, "seed": 7}}, rules
    )
    assert prepared.problems == []
    assert prepared.config["max_wait_seconds"] == prepared.config["max_runtime_seconds"]
    assert prepared.hyperparameters["learning_rate"] == "0.001"
    assert prepared.hyperparameters["seed"] == "7"
    assert prepared.hyperparameters["num_layers"] == "4"


def test_workflow_defaults_and_input_hyperparameters_merge(rules):
    with_defaults = replace(rules, defaults={"hyperparameters": {"seed": "5", "max_steps": "50"}})
    hps = prepare_request({"hyperparameters": {"seed": "6"}}, with_defaults).hyperparameters
    assert (hps["seed"], hps["max_steps"]) == ("6", "50")


def test_rules_round_trip_and_from_cdk_context(rules):
    assert RequestRules.from_json(rules.to_json()) == rules
    assert RequestRules.from_json(json.loads(rules.to_json())) == rules
    with open("cdk.json") as handle:
        context = json.load(handle)["context"]
    from_context = RequestRules.from_cdk_context(context)
    assert from_context.max_instance_count == context["maxInstanceCount"]
    assert from_context.max_runtime_seconds == context["workflowTimeoutHours"] * 3600
    assert from_context.defaults["instance_type"] == context["defaultInstanceType"]
    assert from_context.data_sources == ("data/",)
    assert "job_name_prefix" not in from_context.defaults
    assert (
        RequestRules.from_cdk_context({"defaultJobNamePrefix": "team-a"}).defaults["job_name_prefix"]
        == "team-a"
    )
    with pytest.raises(ValueError, match="context maxInstanceCount: must be an integer in \\[1, 64\\]"):
        RequestRules.from_cdk_context({"maxInstanceCount": 0})
    with pytest.raises(ValueError, match="RequestRules.defaults: unknown fields \\['typo'\\]"):
        RequestRules(defaults={"typo": 1})


def test_every_input_field_has_a_default_and_a_check(rules):
    assert set(INPUT_FIELDS) == set(DEFAULT_INPUT)
    for name in INPUT_FIELDS:
        assert validate_request({name: DEFAULT_INPUT[name]}, rules) == []


# ---- resume_from ------------------------------------------------------------------------------------------------


def _marker(files: dict[str, int], step: int) -> bytes:
    return json.dumps({"world_size": 8, "step": step, "files": files}).encode()


def test_newest_complete_checkpoint_follows_the_trainers_rule():
    run = "checkpoints/W/run-1/"
    markers = {
        f"{run}step_00000100/{CHECKPOINT_MARKER}": _marker({".metadata": 10, "__0_0.distcp": 100}, 100),
        f"{run}step_00000300/{CHECKPOINT_MARKER}": _marker({".metadata": 10, "__0_0.distcp": 100}, 300),
        f"{run}step_00000400.tmp/{CHECKPOINT_MARKER}": _marker({}, 400),
        f"{run}step_00000500/{CHECKPOINT_MARKER}": b"{not json",
    }
    objects = {key: len(body) for key, body in markers.items()}
    objects |= {f"{run}step_00000100/.metadata": 10, f"{run}step_00000100/__0_0.distcp": 100}
    objects |= {f"{run}step_00000300/.metadata": 10, f"{run}step_00000300/__0_0.distcp": 99}  # truncated
    assert newest_complete_checkpoint(objects, markers.__getitem__, run) == (100, f"{run}step_00000100/")
    assert newest_complete_checkpoint({}, markers.__getitem__, run) is None


def test_a_later_save_of_a_step_under_a_free_name_is_the_newest():
    """The trainer never writes into an existing folder: reaching step 100 again while an unsealed step_00000100/
    is there, it saves step_00000100-2/. Set-aside folders never count."""
    run = "checkpoints/W/run-1/"
    files = {".metadata": 10, "__0_0.distcp": 100}
    markers = {
        f"{run}step_00000100-2/{CHECKPOINT_MARKER}": _marker(files, 100),
        f"{run}step_00000090/{CHECKPOINT_MARKER}": _marker(files, 90),
        f"{run}step_00000200.unusable/{CHECKPOINT_MARKER}": _marker(files, 200),
    }
    objects = {key: len(body) for key, body in markers.items()}
    for folder in ("step_00000100-2", "step_00000090", "step_00000200.unusable"):
        objects |= {f"{run}{folder}/{name}": size for name, size in files.items()}
    objects[f"{run}step_00000100/.metadata"] = 10  # unsealed
    assert newest_complete_checkpoint(objects, markers.__getitem__, run) == (100, f"{run}step_00000100-2/")
    objects[f"{run}step_00000100-2{container.SET_ASIDE_SUFFIX}"] = (
        80  # the trainer set it aside: its record beside it
    )
    assert newest_complete_checkpoint(objects, markers.__getitem__, run) == (90, f"{run}step_00000090/")


def test_resume_needs_a_checkpoint_and_more_steps():
    assert resume_problems("run-1", 200, None, "s3://b/checkpoints/W/run-1/") == [
        'resume_from: execution run-1 has no complete checkpoint under s3://b/checkpoints/W/run-1/; got "run-1"'
    ]
    assert resume_problems("run-1", 200, (100, "k/"), "uri") == []
    assert resume_problems("run-1", 100, (100, "k/"), "uri") == [
        "hyperparameters.max_steps: must be greater than the step of the checkpoint resumed from (100, execution "
        "run-1) to train further; got 100"
    ]


# ---- warm pools, infra check, tags, remote debugging, environment (issue 24) --------------------------------------


def _problems(raw: dict, **rules) -> list[str]:
    from training.request.decision import validate_request
    from training.request.rules import RequestRules

    return validate_request(raw, RequestRules(**rules))


def test_tags_follow_botocores_unicode_pattern_and_lengths():
    assert _problems({"tags": {"équipe": "données 2026", "a.b:c/d=e+f-g@h_i": ""}}) == []
    assert _problems({"tags": {"team": "a#b"}})[0].startswith("tags.team: value must be at most 256 letters")
    assert _problems({"tags": {"k" * 129: "v"}})[0].startswith("tags.kkk")
    assert _problems({"tags": {"": "v"}})[0].startswith("tags.: key must be 1 to 128")
    assert _problems({"tags": {"AWS:team": "x"}})[0].startswith("tags.AWS:team: reserved")
    assert _problems({"tags": {f"k{i}": "v" for i in range(47)}}, tags={"owner": "ml"}) == []
    assert _problems({"tags": {f"k{i}": "v" for i in range(48)}}, tags={"owner": "ml"}) == [
        "tags: at most 47 (SageMaker's 50 less the workflow's 3); got 48"
    ]


def test_environment_allows_the_listed_prefixes_only():
    assert (
        _problems(
            {"environment": {p + "X": "1" for p in ("NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "NVTE_", "FI_")}}
        )
        == []
    )
    assert _problems({"environment": {"LD_PRELOAD": "/x.so", "CUDA_VISIBLE_DEVICES": "0"}}) == [
        "environment.LD_PRELOAD: name must start with one of NCCL_, TORCH_, PYTORCH_, CUDA_, NVTE_, FI_ (letters, "
        'digits and _, at most 512 characters); got "LD_PRELOAD"',
        "environment.CUDA_VISIBLE_DEVICES: set by the platform (train.sh starts one process per visible GPU; "
        "hiding GPUs breaks that count)",
    ]
    assert _problems({"environment": {"NCCL_A-B": "1"}})[0].startswith(
        "environment.NCCL_A-B: name must start"
    )
    assert len(_problems({"environment": {f"NCCL_{i}": "1" for i in range(101)}})) == 1


def test_keep_alive_and_remote_debug_follow_the_deployment():
    assert _problems({"keep_alive_seconds": 3600}) == []
    assert _problems({"keep_alive_seconds": 1}, max_keep_alive_seconds=0) == [
        "keep_alive_seconds: must be 0 (this workflow is deployed without warm pools: maxKeepAliveSeconds is 0); got 1"
    ]
    assert _problems({"keep_alive_seconds": 60, "use_spot": True})[0].startswith(
        "keep_alive_seconds: warm pools cannot be used with managed spot"
    )
    assert _problems({"remote_debug": True}, remote_debug=True) == []
    assert _problems({"remote_debug": True}, remote_debug=True, network_isolation=True) == [
        "remote_debug: must be false (the jobs run with network isolation, and remote debugging needs the "
        "network); got true"
    ]


def test_a_volume_key_refuses_instance_types_with_nvme_storage():
    (problem,) = _problems({}, volume_kms_key=True)
    assert problem.startswith("instance_type: ml.p6-b200.48xlarge has NVMe instance storage")


def test_limits_and_rules_of_an_earlier_deployment_still_check_the_new_fields():
    from training.request.decision import validate_request
    from training.request.rules import LIMIT_NAMES, RequestRules, sagemaker_limits

    assert set(sagemaker_limits()) == LIMIT_NAMES
    current = RequestRules().with_limits()
    earlier = dict(current.limits or {})
    for name in ("Tags", "TagKey", "TagValue", "Environment", "EnvironmentKey", "EnvironmentValue"):
        del earlier[name]
    rules = RequestRules.from_json({**json.loads(current.to_json()), "limits": earlier})
    assert validate_request({"tags": {"aws:x": "1"}}, rules)[0].startswith("tags.aws:x: reserved")


# ---- the memory plan (training.plan) ------------------------------------------------------------------------------

EIGHT_B_NO_AC = {"hyperparameters": {"model_preset": "8b"}, "seq_length": 8192, "batch_size": 8}


def test_a_request_that_cannot_fit_is_refused_in_one_line_with_its_parts_limit_and_fixes(rules):
    line = one(EIGHT_B_NO_AC, rules)
    assert line.startswith("memory: estimated peak ") and "GiB per GPU (saved activations " in line
    assert "exceeds 159.3 GiB (95% of ml.p6-b200.48xlarge's 167.6 GiB)" in line
    assert "fits with: activation_checkpointing true" in line and "batch_size 2" in line
    assert line.endswith("or set ignore_memory_estimate true to launch anyway")
    sixty_four = one({"hyperparameters": {"model_preset": "64b"}, "instance_type": "ml.p5.48xlarge"}, rules)
    assert "instance_count 3 with activation_checkpointing true" in sixty_four  # within max_instance_count 4


def test_ignore_memory_estimate_launches_anyway_and_says_so_in_the_plan(rules):
    prepared = prepare_request({**EIGHT_B_NO_AC, "ignore_memory_estimate": True}, rules)
    assert prepared.problems == [] and prepared.hyperparameters["batch_size"] == "8"
    assert prepared.plan is not None and prepared.plan["ignored"] is True and not prepared.plan["fits"]
    assert "ignore_memory_estimate" not in prepared.hyperparameters  # a workflow field, not a trainer setting
    assert one({"ignore_memory_estimate": 1}, rules).startswith(
        "ignore_memory_estimate: must be true or false"
    )


def test_the_seed_headline_configuration_is_accepted_with_its_plan(rules):
    prepared = prepare_request(
        {"precision": "mxfp8", "batch_size": 16, "activation_checkpointing": True}, rules
    )
    assert prepared.problems == []
    assert prepared.plan is not None and prepared.plan["fits"] and prepared.plan["ignored"] is False
    assert prepared.plan["world_size"] == 8 and prepared.plan["cost_usd"] > 0


# ---- init_from: a Hugging Face model folder under the data sources -----------------------------------------------

LLAMA_CONFIG = hf_config.to_config(settings_parse.parse_hyperparameters({"model_preset": "llama3.1-8b"}))
"""A config.json of Llama 3.1 8B's architecture, as the export writes it."""
FOLDER = "s3://my-bucket/data/llama-3.1-8b/"


@pytest.fixture
def s3():
    from moto import mock_aws

    with mock_aws():
        import boto3

        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket="my-bucket", CreateBucketConfiguration={"LocationConstraint": REGION})
        yield client


def put_folder(s3, key: str, config: dict | None, weights: bool = True) -> str:
    if config is not None:
        s3.put_object(Bucket="my-bucket", Key=f"{key}config.json", Body=json.dumps(config).encode())
    if weights:
        s3.put_object(Bucket="my-bucket", Key=f"{key}model-00001-of-00002.safetensors", Body=b"w")
    s3.put_object(Bucket="my-bucket", Key=f"{key}tokenizer.json", Body=b"{}")
    return f"s3://my-bucket/{key}"


def test_init_from_is_a_read_only_weights_channel_and_the_trainers_setting_points_at_it(rules):
    prepared = prepare_request({"init_from": FOLDER}, rules)  # offline: the folder's shape is not known yet
    assert prepared.problems == [] and prepared.plan is None
    assert prepared.hyperparameters["init_from"] == container.WEIGHTS_CHANNEL_DIR
    (weights,) = prepared.channels
    assert weights["ChannelName"] == container.WEIGHTS_CHANNEL == "weights" and weights["InputMode"] == "File"
    assert weights["DataSource"]["S3DataSource"]["S3Uri"] == FOLDER
    assert one({"hyperparameters": {"init_from": "/opt/x"}}, rules).startswith(
        "hyperparameters.init_from: set by the platform from the input field init_from"
    )
    assert one({"init_from": "s3://elsewhere/models/llama/"}, rules).startswith(
        "init_from: must be an s3:// prefix ending in '/' under one of s3://my-bucket/data/"
    )


def test_the_folders_shape_makes_the_plan_and_refuses_a_contradicting_request(rules):
    architecture = hf_config.architecture(LLAMA_CONFIG)
    prepared = prepare_request({"init_from": FOLDER, "activation_checkpointing": True}, rules, architecture)
    assert prepared.problems == []
    assert prepared.plan["parameters"] == shapes.MODEL_PRESETS["llama3.1-8b"].parameter_count()
    refused = prepare_request(
        {"init_from": FOLDER, "hyperparameters": {"num_kv_heads": "32"}}, rules, architecture
    )
    assert refused.problems == [
        "hyperparameters.num_kv_heads: must be 8 or left out: the init_from model's config.json has num_kv_heads=8; "
        "got 32"
    ]
    too_big = prepare_request({"init_from": FOLDER, "batch_size": 8}, rules, architecture)
    assert too_big.problems[0].startswith("memory: estimated peak")  # the 8B's memory, not the default 1b's


def test_read_init_from_reads_the_config_and_refuses_what_cannot_be_started_from(s3):
    good = put_folder(s3, "data/good/", LLAMA_CONFIG)
    architecture, problems = read_init_from(s3, good)
    assert problems == [] and architecture["num_kv_heads"] == 8 and architecture["rope_scaling_factor"] == 8.0
    cases = {
        "s3://my-bucket/data/nothing/": "init_from: must be a Hugging Face model folder, but no object is under it",
        put_folder(s3, "data/no-config/", None): "init_from: holds no config.json",
        put_folder(
            s3, "data/no-weights/", LLAMA_CONFIG, weights=False
        ): "init_from: holds no safetensors weights",
        put_folder(s3, "data/phi3/", {**LLAMA_CONFIG, "model_type": "phi3"}): (
            "init_from: s3://my-bucket/data/phi3/: config.json: model_type 'phi3' is not supported; supported: llama"
        ),
    }
    for uri, start in cases.items():
        architecture, problems = read_init_from(s3, uri)
        assert architecture is None and len(problems) == 1 and problems[0].startswith(start), problems


def test_decide_reads_the_folder_before_anything_else_and_plans_its_shape(s3, rules):
    uri = put_folder(s3, "data/llama/", LLAMA_CONFIG)
    decided = decide({"input": {"init_from": uri}, "rules": rules.to_json(), "execution": "e"}, s3=s3)
    assert decided["valid"], decided["cause"]
    assert decided["plan"]["parameters"] == shapes.MODEL_PRESETS["llama3.1-8b"].parameter_count()
    assert [c["ChannelName"] for c in decided["channels"]] == ["weights"]
    mismatch = decide({"input": {"init_from": uri, "num_layers": 4}, "rules": rules.to_json()}, s3=s3)
    assert mismatch["cause"] == (
        "hyperparameters.num_layers: must be 32 or left out: the init_from model's config.json has num_layers=32; "
        "got 4"
    )


# ---- evaluate ----------------------------------------------------------------------------------------------------

EVALUATE = {"train_data_uri": "s3://b/data/corpus/", "evaluate": {"task_data_uri": "s3://b/data/tasks/"}}


def test_an_evaluate_block_with_its_defaults_is_valid_offline():
    prepared = prepare_request(EVALUATE, RequestRules())
    assert prepared.problems == [] and prepared.config["evaluate"] == EVALUATE["evaluate"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"environment": {f"NCCL_{i}": "x" for i in range(100)}},
            "environment: at most 99 variables with evaluate",
        ),
        ({"tags": {f"k{i}": "x" for i in range(48)}}, "tags: at most 47 with evaluate"),
        ({"evaluate": "yes"}, "evaluate: must be an object of evaluation fields (tasks, task_data_uri"),
        (
            {"evaluate": {"task_data_uri": "s3://b/data/t/", "tasks": ["a b"]}},
            "evaluate.tasks: must be a list",
        ),
        (
            {"evaluate": {"task_data_uri": "s3://b/data/t/", "instance_type": "ml.g5.xlarge"}},
            "evaluate.instance_type",
        ),
        (
            {"evaluate": {"task_data_uri": "s3://b/data/t/", "max_runtime_seconds": 0}},
            "evaluate.max_runtime_seconds",
        ),
        (
            {"evaluate": {"task_data_uri": "s3://b/data/t/", "training_job": "bad name!"}},
            "evaluate.training_job",
        ),
    ],
)
def test_evaluate_problems_name_the_field(change, problem):
    problems = validate_request({**EVALUATE, **change}, RequestRules())
    assert any(p.startswith(problem) for p in problems), problems


def test_a_training_job_the_check_may_not_describe_is_named_as_not_this_workflows():
    """The deployed check may describe only jobs with the workflow's tag (RequestValidator's aws:ResourceTag
    condition), so AccessDenied means another workflow's job (or none: IAM cannot tell); a missing job that may be
    described is SageMaker's ValidationException. A real botocore client, its responses stubbed."""
    from botocore.stub import Stubber

    from training.request import evaluate_block

    client = botocore.session.get_session().create_client(
        "sagemaker", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    rules = RequestRules(region=REGION, bucket_name="b", workflow_path="Stack/Workflow")
    with Stubber(client) as stub:
        stub.add_client_error(
            "describe_training_job",
            service_error_code="AccessDeniedException",
            service_message="User is not authorized to perform: sagemaker:DescribeTrainingJob",
            expected_params={"TrainingJobName": "their-job"},
        )
        stub.add_client_error(
            "describe_training_job",
            service_error_code="ValidationException",
            service_message="Requested resource not found.",
            expected_params={"TrainingJobName": "gone"},
        )
        _, denied = evaluate_block.training_job_facts(client, "their-job", rules)
        _, missing = evaluate_block.training_job_facts(client, "gone", rules)
    assert denied == [
        "evaluate.training_job: their-job is not a training job of this workflow, or there is none of that name "
        "(the check may describe only jobs tagged training-workflow=Stack/Workflow)"
    ]
    assert missing == ["evaluate.training_job: no training job gone in this account and region"]


def test_a_tuning_runs_job_is_refused_as_an_evaluation_source_saying_what_to_evaluate_instead():
    """A tuning job completes with a model archive of no model (its trials are short and export nothing): refused
    before an evaluation job is provisioned, however it ended."""
    from training.request import evaluate_block

    rules = RequestRules(region=REGION, bucket_name="b", workflow_segment="W")

    class SageMaker:
        def describe_training_job(self, TrainingJobName):  # noqa: N803 - boto3's name
            return {
                "TrainingJobName": TrainingJobName,
                "TrainingJobStatus": "Completed",
                "CheckpointConfig": {"S3Uri": "s3://b/checkpoints/W/tune-1/"},
                "ModelArtifacts": {"S3ModelArtifacts": "s3://b/output/tune-job/output/model.tar.gz"},
                "HyperParameters": {tuning.TUNE_TRIALS: "batch_size=1;batch_size=2", "dataset": "channel"},
            }

    facts, problems = evaluate_block.training_job_facts(SageMaker(), "tune-job", rules)
    assert facts == {} and problems == [
        "evaluate.training_job: tune-job is a tuning run's job: it measured short trials and exported no model; "
        "write the tuning run's winning request (blackwell-training tune-apply RUN OUT.json), train it "
        "(blackwell-training submit OUT.json), and evaluate that run"
    ]


# ---- evaluate a run started from init_from: the export's tokenizer is the folder's (export_hf.write_tokenizer) ----

SMALL_LLAMA = hf_config.to_config(settings_parse.parse_hyperparameters({"model_preset": "llama3.2-1b"}))


def _evaluation_world(s3) -> None:
    """A task folder, byte-level data, data with its tokenizer.json, and init_from folders with and without one."""
    s3.put_object(Bucket="my-bucket", Key="data/tasks/piqa.yaml", Body=b"task: piqa\ndataset_path: json\n")
    for folder, kind in (("bytes", "byte-level UTF-8"), ("words", "tokenizers")):
        meta = {"tokenizer": {"kind": kind, "file": "tokenizer.json"}}
        s3.put_object(Bucket="my-bucket", Key=f"data/{folder}/metadata.json", Body=json.dumps(meta).encode())
        s3.put_object(Bucket="my-bucket", Key=f"data/{folder}/train.bin", Body=b"tokens")
    s3.put_object(Bucket="my-bucket", Key="data/words/tokenizer.json", Body=b"{}")
    put_folder(s3, "data/llama/", SMALL_LLAMA)  # with tokenizer.json
    for name, extra in (("bare", None), ("half", "tokenizer_config.json"), ("spm", "tokenizer.model")):
        key = f"data/llama-{name}/"
        s3.put_object(Bucket="my-bucket", Key=f"{key}config.json", Body=json.dumps(SMALL_LLAMA).encode())
        s3.put_object(Bucket="my-bucket", Key=f"{key}model.safetensors", Body=b"w")
        s3.put_object(
            Bucket="my-bucket", Key=f"{key}nested/tokenizer.json", Body=b"{}"
        )  # not the folder's own
        if extra:
            s3.put_object(Bucket="my-bucket", Key=f"{key}{extra}", Body=b"{}")


@pytest.mark.parametrize(
    ("init_from", "data", "refusal"),
    [
        ("llama", None, None),  # synthetic tokens: the folder's tokenizer.json is the export's
        ("llama", "bytes", None),  # byte-level data's metadata is not what the export takes: the folder's is
        ("llama-spm", None, None),  # a SentencePiece tokenizer.model travels too
        ("llama-bare", "words", None),  # no tokenizer file in the folder: the data's tokenizer.json
        (
            "llama-bare",
            None,
            "which has no tokenizer file (tokenizer.json or tokenizer.model), and trains on",
        ),
        ("llama-bare", "bytes", "was trained on byte-level tokens"),
        (
            "llama-half",
            "words",
            "whose tokenizer_config.json become its export's tokenizer files, but it has no",
        ),
        (None, "bytes", "was trained on byte-level tokens"),
    ],
)
def test_evaluating_a_run_from_init_from_looks_for_the_folders_tokenizer(s3, rules, init_from, data, refusal):
    _evaluation_world(s3)
    raw = {"evaluate": {"task_data_uri": "s3://my-bucket/data/tasks/", "tasks": ["piqa"]}}
    if init_from:
        raw["init_from"] = f"s3://my-bucket/data/{init_from}/"
    if data:
        raw["train_data_uri"] = f"s3://my-bucket/data/{data}/"
    decided = decide({"input": raw, "rules": rules.to_json(), "execution": "run-1"}, s3=s3)
    if refusal is None:
        assert decided["valid"], decided["cause"]
        assert decided["evaluation"]["evaluated"] == {"run": "run-1", "training_job": None}
    else:
        assert not decided["valid"] and refusal in decided["cause"], decided["cause"]
        assert decided["cause"].startswith("evaluate: this run ")


# ---- the evaluation job's instance type: one GPU when the weights fit, the plan's with a training plan ----------


class _PlanOfTwoB200s:
    """SageMaker describing :data:`PLAN` (moto has no training plans): 2 x ml.p6-b200.48xlarge, active."""

    def describe_training_plan(self, TrainingPlanName: str) -> dict:  # noqa: N803 - boto3's name
        assert TrainingPlanName == PLAN
        capacity = {"InstanceType": "ml.p6-b200.48xlarge", "TotalInstanceCount": 2, "Status": "Active"}
        return {"TrainingPlanName": "b200-week", "Status": "Active", "TargetResources": ["training-job"],
                "ReservedCapacitySummaries": [capacity]}  # fmt: skip


def _decide_evaluation(s3, rules, **fields) -> dict:
    _evaluation_world(s3)
    block = {"task_data_uri": "s3://my-bucket/data/tasks/", "tasks": ["piqa"], **fields.pop("evaluate", {})}
    raw = {"train_data_uri": "s3://my-bucket/data/words/", "evaluate": block, **fields}
    return decide(
        {"input": raw, "rules": rules.to_json(), "execution": "run-1"}, s3=s3, sagemaker=_PlanOfTwoB200s()
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "ml.p5.4xlarge"),  # 1b in bf16: 1.9 GB on one H100 rather than 8 B200s
        ({"hyperparameters": {"model_preset": "14b"}, "ignore_memory_estimate": True}, "ml.p5.4xlarge"),
        (
            {"precision": "fp32", "hyperparameters": {"model_preset": "8b"}, "ignore_memory_estimate": True},
            "ml.p5.4xlarge",
        ),  # fmt: skip
        # 32b's bf16 export (68.4 GB) is more than 80% of one H100: the training's instance type, all its GPUs
        ({"hyperparameters": {"model_preset": "32b"}, "ignore_memory_estimate": True}, "ml.p6-b200.48xlarge"),
        ({"training_plan_arn": PLAN}, "ml.p6-b200.48xlarge"),  # the plan's capacity, its instance type
        ({"evaluate": {"instance_type": "ml.p5.48xlarge"}}, "ml.p5.48xlarge"),  # asked for: kept
    ],
)
def test_the_evaluation_instance_type_defaults_to_one_gpu_when_the_weights_fit(s3, rules, fields, expected):
    decided = _decide_evaluation(s3, rules, **fields)
    assert decided["valid"], decided["cause"]
    assert decided["evaluation"]["config"]["instance_type"] == expected
    assert decided["evaluation"]["config"]["training_plan_arn"] == fields.get("training_plan_arn")


def test_a_workflow_that_does_not_allow_the_single_gpu_type_evaluates_on_the_trainings(s3):
    rules = RequestRules(
        region=REGION,
        bucket_name="my-bucket",
        workflow_segment="Test-Workflow",
        allowed_instance_types=("ml.p6-b200.48xlarge", "ml.p5.48xlarge"),
    ).with_limits()
    decided = _decide_evaluation(s3, rules, instance_type="ml.p5.48xlarge")
    assert decided["valid"], decided["cause"]
    assert decided["evaluation"]["config"]["instance_type"] == "ml.p5.48xlarge"


def test_an_instance_type_that_cannot_hold_the_weights_is_refused_naming_those_that_can(s3, rules):
    decided = _decide_evaluation(
        s3,
        rules,
        hyperparameters={"model_preset": "llama3.1-70b"},
        ignore_memory_estimate=True,
        evaluate={"instance_type": "ml.p5.4xlarge"},
    )
    assert not decided["valid"]
    assert decided["cause"] == (
        "evaluate.instance_type: ml.p5.4xlarge's 1 x 80 GB of GPU memory cannot hold the model's exported weights "
        "(141.1 GB: more than 80% of it); must be one of ml.p6-b200.48xlarge, ml.p6-b300.48xlarge, "
        "ml.p6e-gb200.36xlarge, ml.p5.48xlarge, ml.p5e.48xlarge, ml.p5en.48xlarge, ml.p4d.24xlarge, ml.p4de.24xlarge, "
        "or null"
    )


def test_with_a_training_plan_another_evaluation_instance_type_is_refused_offline():
    """SageMaker runs a job on a plan only on the plan's instance type (the training's here): refused before
    anything, naming both fields and the allowed values; the same type, or none, is accepted."""
    rules = RequestRules(region=REGION)
    raw = {
        **EVALUATE,
        "training_plan_arn": PLAN,
        "evaluate": {**EVALUATE["evaluate"], "instance_type": "ml.p5.4xlarge"},
    }
    assert validate_request(raw, rules) == [
        "evaluate.instance_type: with training_plan_arn the evaluation job runs on the plan's reserved capacity, and "
        "SageMaker runs a job on a plan only on the plan's instance type (the training's instance_type, "
        'ml.p6-b200.48xlarge); must be ml.p6-b200.48xlarge or null; got "ml.p5.4xlarge" (to evaluate on another '
        "type, leave evaluate out and evaluate the finished run later without training_plan_arn)"
    ]
    same = {**raw, "evaluate": {**raw["evaluate"], "instance_type": "ml.p6-b200.48xlarge"}}
    assert validate_request(same, rules) == []
    assert validate_request({**EVALUATE, "training_plan_arn": PLAN}, rules) == []


def test_the_evaluate_check_reads_the_setting_as_parsed_once(rules):
    """The request is read once: the evaluate block's check reads ``position_encoding`` as its parser read it, so
    either spelling of a NoPE run is refused (the raw text under one spelling only was read before), and a value the
    setting's own parser refuses is named once, by that parser."""
    base = {
        "train_data_uri": "s3://my-bucket/data/x/",
        "evaluate": {"task_data_uri": "s3://my-bucket/data/t/"},
    }
    nope = (
        "evaluate: the run trains with position_encoding=none, and such a model has no Hugging Face export "
        "(every supported Hugging Face class applies rotary embeddings), so there is nothing to evaluate"
    )
    for spelling in ({"position-encoding": "none"}, {"position_encoding": " NONE"}):
        assert validate_request({**base, "hyperparameters": spelling}, rules) == [nope]
    assert validate_request({**base, "hyperparameters": {"position_encoding": "xyz"}}, rules) == [
        "hyperparameters.position_encoding: must be one of rope, none; got 'xyz'"
    ]


def test_task_files_are_read_only_in_the_named_folder_and_only_its_tasks_are_named(s3, rules):
    """Another team's task files in a folder below the named one (or beside it) are neither read nor named; the
    data prefix itself is no task folder."""
    _evaluation_world(s3)
    s3.put_object(Bucket="my-bucket", Key="data/tasks/team-b/secret.yaml", Body=b"task: team_b_secret\n")
    s3.put_object(Bucket="my-bucket", Key="data/team-c-tasks/c.yaml", Body=b"task: team_c\n")
    reads: list[str] = []
    original = s3.get_object

    def get_object(**kwargs):
        reads.append(kwargs["Key"])
        return original(**kwargs)

    s3.get_object = get_object
    raw = {"train_data_uri": "s3://my-bucket/data/words/",
           "evaluate": {"task_data_uri": "s3://my-bucket/data/tasks/", "tasks": ["piqa", "team_b_secret"]}}  # fmt: skip
    decided = decide({"input": raw, "rules": rules.to_json(), "execution": "run-1"}, s3=s3)
    assert decided["cause"] == (
        "evaluate.tasks: team_b_secret not defined in the task folder s3://my-bucket/data/tasks/ (it defines: "
        "piqa); write it with python -m training.evaluate.prepare_tasks, or name one of those"
    )
    assert [key for key in reads if key.endswith(".yaml")] == ["data/tasks/piqa.yaml"]
    root = {**raw, "evaluate": {"task_data_uri": "s3://my-bucket/data/", "tasks": ["piqa"]}}
    assert validate_request(root, rules) == [
        "evaluate.task_data_uri: must be a task folder below the data prefix s3://my-bucket/data/, not the data "
        "prefix itself (the evaluation job would mount all of it); e.g. s3://my-bucket/data/evaluation-tasks/ "
        '(python -m training.evaluate.prepare_tasks writes one); got "s3://my-bucket/data/"'
    ]


# ---- a run's name is its checkpoint folder: reused only to continue that run ------------------------------------


def _seal(s3, key: str, step: int) -> None:
    folder = f"{key}step_{step:08d}/"
    s3.put_object(Bucket="my-bucket", Key=f"{folder}shard-0.pt", Body=b"x" * 10)
    s3.put_object(
        Bucket="my-bucket",
        Key=f"{folder}{CHECKPOINT_MARKER}",
        Body=json.dumps({"files": {"shard-0.pt": 10}}).encode(),
    )


def _decide(s3, rules, raw, execution):
    return decide({"input": raw, "rules": rules.to_json(), "execution": execution}, s3=s3)


def test_a_reused_run_name_is_refused_unless_the_input_continues_that_run_in_its_folder(s3, rules):
    _seal(s3, "checkpoints/Test-Workflow/old-run/", 100)
    refused = _decide(s3, rules, {"hyperparameters": {"max_steps": "300"}}, "old-run")
    assert refused["cause"] == (
        "execution name: s3://my-bucket/checkpoints/Test-Workflow/old-run/ already holds the checkpoints of an earlier "
        "run named old-run, which a new run would resume from and write over; start this one under another name, or "
        'set resume_from to "old-run" to continue that run in its folder'
    )
    continued = _decide(
        s3, rules, {"resume_from": "old-run", "hyperparameters": {"max_steps": "300"}}, "old-run"
    )
    assert continued["valid"], continued["cause"]
    assert continued["resume"] == {"step": 100, "uri": "s3://my-bucket/checkpoints/Test-Workflow/old-run/step_00000100/",
                                   "execution": "old-run", "in_place": True}  # fmt: skip
    assert (
        continued["channels"] == []
    )  # SageMaker's checkpoint sync brings the folder back: no resume channel
    elsewhere = _decide(
        s3, rules, {"resume_from": "old-run", "hyperparameters": {"max_steps": "300"}}, "new-run"
    )
    assert elsewhere["valid"] and elsewhere["resume"]["in_place"] is False
    assert [c["ChannelName"] for c in elsewhere["channels"]] == [container.RESUME_CHANNEL]
    nothing = _decide(s3, rules, {"resume_from": "fresh"}, "fresh")
    assert nothing["cause"] == (
        "resume_from: execution fresh has no complete checkpoint under s3://my-bucket/checkpoints/Test-Workflow/fresh/; "
        'got "fresh"'
    )
    assert _decide(s3, rules, {}, "fresh")["valid"]


def test_a_tuning_run_may_not_reuse_a_name_nor_write_over_stored_measurements(s3):
    rules = RequestRules(region=REGION, bucket_name="my-bucket", workflow_segment="Test-Workflow",
                         image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/r:tag1").with_limits()  # fmt: skip
    tune = {"batch_size": 8, "tune": {"search_space": {"batch_size": [4, 8]}, "max_trials": 1}}
    _seal(s3, "checkpoints/Test-Workflow/tuned/", 5)
    assert _decide(s3, rules, tune, "tuned")["cause"].endswith(
        "write over; start this one under another name"
    )
    s3.put_object(Bucket="my-bucket", Key="tuning/measurements/tag1/Test-Workflow/measured.json", Body=b"{}")
    assert _decide(s3, rules, tune, "measured")["cause"] == (
        "execution name: s3://my-bucket/tuning/measurements/tag1/Test-Workflow/measured.json already holds the "
        "measurements of an earlier tuning run named measured; start this one under another name"
    )
    assert _decide(s3, rules, tune, "new-tuning")["valid"]


def test_an_evaluation_only_run_writes_no_checkpoints_so_its_name_may_have_a_folder(s3, rules):
    _seal(s3, "checkpoints/Test-Workflow/evaluated/", 5)
    raw = {"evaluate": {"task_data_uri": "s3://my-bucket/data/tasks/", "training_job": "done-job"}}
    cause = _decide(s3, rules, raw, "evaluated")["cause"]
    assert "execution name" not in cause and "evaluate.training_job: no training job done-job" in cause


@pytest.mark.parametrize("name", [".", "..", "a/b", "run.1", "../other-run", "run 1"])
def test_path_like_execution_names_are_refused(rules, name):
    from training.request.decision import decide_request

    assert decide_request({}, rules, execution=name).problems == [
        "execution name: must be 1 to 80 characters of a-z, A-Z, 0-9, _ and - (it names the run's checkpoint "
        f"folder, and resume_from names runs by it); got {json.dumps(name)}"
    ]
