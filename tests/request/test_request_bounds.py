"""What the request check returns stays well under Step Functions' 256 KiB for any input (``training.request.bounds``):
a realistic tuning block, the largest search spaces the tune block allows, inputs with tens of thousands of
problems, and inputs whose decision would be too large, each through the workflow's Lambda (S3 in moto) and the
CLI offline."""

from __future__ import annotations

import json
import math
import re

import pytest

from constructs_lib.cli.tuning import tune_plan
from constructs_lib.workflow.request_check import decide
from training.contract import tuning as contract_tuning
from training.request import bounds, tuning
from training.request.decision import decide_request, validate_request
from training.request.rules import RequestRules

REGION = "us-west-2"
STEP_FUNCTIONS_LIMIT = 256 * 1024
LARGEST: dict[str, int] = {}
"""The largest decision measured by each test (printed by the last test; the issue's bound)."""

ISSUE_BLOCK = {
    "batch_size": 32,
    "tune": {
        "search_space": {
            "batch_size": [1, 2, 4, 8, 16, 32],
            "activation_checkpointing": ["none", "full", "selective"],
            "precision": ["bf16", "fp8", "mxfp8", "nvfp4"],
            "loss_chunk_tokens": [0, 1024, 2048, 4096],
            "compile": ["auto", "true", "false"],
            "attention_backend": ["auto", "flash"],
        }
    },
}


@pytest.fixture(scope="module")
def rules() -> RequestRules:
    return RequestRules(
        region=REGION,
        bucket_name="bounds-bucket",
        workflow_segment="W" * 40,
        image_uri=f"123456789012.dkr.ecr.{REGION}.amazonaws.com/blackwell-training:{'t' * 64}",
        tags={f"team-tag-{i}": "v" * 64 for i in range(3)},
    ).with_limits()


@pytest.fixture(scope="module")
def s3():
    from moto import mock_aws

    with mock_aws():
        import boto3

        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket="bounds-bucket", CreateBucketConfiguration={"LocationConstraint": REGION})
        client.put_object(Bucket="bounds-bucket", Key="data/tokens/train.bin", Body=b"t")
        yield client


def lambda_state(raw, rules, s3, test: str) -> dict:
    """The workflow's Lambda's result for ``raw`` (the longest execution name), its size checked and recorded."""
    state = decide({"input": raw, "rules": rules.to_json(), "execution": "x" * 80}, s3=s3)
    size = len(json.dumps(state))
    assert size <= bounds.STATE_LIMIT_BYTES < STEP_FUNCTIONS_LIMIT / 3, (test, size)
    LARGEST[test] = max(LARGEST.get(test, 0), size)
    return state


def test_the_issues_tuning_block_is_decided_in_a_few_kib_and_the_cli_lists_every_refusal(rules, s3):
    state = lambda_state(ISSUE_BLOCK, rules, s3, "issue block")
    assert state["valid"], state["cause"]
    planned = state["tune"]["plan"]
    assert planned["considered"] == 1728 and planned["refused_by_the_trainer_count"] == 1008
    assert len(planned["refused_by_the_trainer"]) == tuning.LISTED_REFUSALS
    assert len(json.dumps(state)) < 16 * 1024  # was 333 KB, every refused combination listed
    assert len(tune_plan(ISSUE_BLOCK, rules)["refused_by_the_trainer"]) == 1008


def _largest_spaces() -> list[tuple[str, dict]]:
    """Search spaces of exactly ``MAX_COMBINATIONS`` combinations, the most the tune block allows: every tunable
    setting varied with its longest values, every combination refused by the trainer's rules, every combination
    planned, and one setting with 2,048 values."""
    every = {
        "batch_size": [1, 2],
        "activation_checkpointing": ["full", "selective"],
        "precision": ["bf16"],
        "seq_length": [8192],
        "loss_chunk_tokens": [1048576, 1048575],
        "fp8_recipe": ["delayed", "current"],
        "quantized_model_init": [False],
        "activation_checkpointing_interval": [1, 2],
        "compile": ["false", "auto"],
        "attention_backend": ["efficient", "cudnn"],
        "adamw_impl": ["foreach", "fused"],
        "master_weights": [True, False],
        "nvfp4_bf16_blocks": [1],
        "gc_interval": [999999, 999998],
        "async_checkpoint": [True],
        "expandable_segments": [True],
        "data_parallel_replicate": ["auto", 1],
    }
    refused = {
        **every,
        "precision": ["fp8"],
        "compile": ["true", "true"],
        "attention_backend": ["flash", "math"],
    }
    refused["expandable_segments"] = [True, False]
    refused["gc_interval"] = [999999]
    values = {"batch_size": list(range(1, tuning.MAX_COMBINATIONS + 1))}
    spaces = [("every setting", every), ("every combination refused", refused), ("2048 values", values)]
    for _, space in spaces:
        assert math.prod(len(set(map(str, v))) for v in space.values()) <= tuning.MAX_COMBINATIONS
    assert set(every) == set(
        contract_tuning.TUNABLE_SETTINGS
    )  # a setting made tunable later is varied here too
    return spaces


BASES = {
    "one instance": {},
    "4 instances, LoRA": {
        "instance_count": 4,
        "hyperparameters": {
            "lora_rank": "512",
            "lora_targets": "q,k,v,o,gate,up,down",
            "lora_dropout": "0.05",
        },
    },
}
"""The request a search space tunes: one instance, and the most instances the rules allow (the layouts a dimension
of the space) with LoRA's settings (each trial's line carries the base's settings)."""


@pytest.mark.parametrize(("label", "space"), _largest_spaces(), ids=[label for label, _ in _largest_spaces()])
@pytest.mark.parametrize("max_trials", [1, 6, tuning.MAX_TRIALS_LIMIT])
@pytest.mark.parametrize("base", list(BASES))
def test_the_largest_search_spaces_the_schema_allows_give_bounded_decisions(
    rules, s3, label, space, max_trials, base
):
    raw = {
        **BASES[base],
        "batch_size": 4096 if label == "2048 values" else 32,
        "tune": {"search_space": space, "max_trials": max_trials, "convergence": {"precisions": ["mxfp8"]}},
    }
    state = lambda_state(raw, rules, s3, f"search space: {label}, {base}")
    if state["valid"]:
        assert state["tune"]["plan"]["refused_by_the_trainer_count"] >= len(
            state["tune"]["plan"]["refused_by_the_trainer"]
        )
    else:
        assert len(state["cause"]) <= bounds.CAUSE_LIMIT_CHARS


def test_a_search_space_above_the_limit_is_refused_naming_its_size(rules):
    space = {"batch_size": list(range(1, 1025)), "activation_checkpointing": ["none", "full", "selective"]}
    (problem,) = validate_request({"tune": {"search_space": space}}, rules)
    assert problem.startswith(
        f"tune.search_space: at most {tuning.MAX_COMBINATIONS} combinations (each is planned before launch); "
        "got 3072 (1024 batch_size x 3 activation_checkpointing): list fewer values"
    )


def test_tens_of_thousands_of_problems_are_counted_not_listed(rules, s3):
    raw = {f"u{i}": 0 for i in range(30_000)}  # about 256 KiB of input: Step Functions' largest
    raw["hyperparameters"] = {f"s{i}": "1" for i in range(3000)}
    raw["tags"] = {f"t{i}": "x" * 300 for i in range(200)}
    state = lambda_state(raw, rules, s3, "30,000 problems")
    problems = decide_request(raw, rules).problems
    assert len(problems) > 30_000  # every one, for the CLI
    assert not state["valid"] and len(state["cause"]) <= bounds.CAUSE_LIMIT_CHARS
    more = int(re.search(r"; and (\d+) more problems \(", state["cause"]).group(1))
    kept = [p if len(p) <= bounds.PROBLEM_LIMIT_CHARS else p[: bounds.PROBLEM_LIMIT_CHARS - 3] + "..."
            for p in problems[: len(problems) - more]]  # fmt: skip
    assert state["cause"] == "; ".join(kept) + (
        f"; and {more} more problems (the request check's log and blackwell-training validate --deployed on this "
        "input list every one)"
    )
    one_long_line = lambda_state(
        {"hyperparameters": raw["hyperparameters"]}, rules, s3, "3,000 unknown settings"
    )
    assert len(one_long_line["cause"]) == bounds.PROBLEM_LIMIT_CHARS and one_long_line["cause"].endswith(
        "..."
    )


def test_a_valid_request_whose_decision_would_be_too_large_is_refused_alike_offline_and_in_the_workflow(
    rules, s3
):
    long_number = "0." + "0" * 2400 + "3"  # a learning rate the trainer parses: 2,403 characters
    raw = {
        "hyperparameters": {"learning_rate": long_number, "weight_decay": long_number},
        "environment": {f"NCCL_X{i}": "v" * 500 for i in range(90)},
        "tags": {f"k{i}": "v" * 256 for i in range(40)},
    }
    state = lambda_state(raw, rules, s3, "too large")
    offline = validate_request(raw, rules)
    (problem,) = offline
    assert not state["valid"] and state["cause"] == problem
    assert problem.startswith("input: its decision would take about ")
    assert "its largest fields: environment " in problem and problem.endswith("; shorten them")


def test_the_reference_says_fields_within_their_own_limits_can_be_refused_together_for_the_size():
    """Issue 53 item 4: each field of the request above is within its own limit (the reference's table), yet
    the request is refused for the decision's size; docs/reference.md says so, with the limits."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "reference.md").read_text(encoding="utf-8")
    intro = page.split("## Execution input fields", 1)[1].split("| field |", 1)[0]
    assert "fields each within their own limits can still be refused together" in intro
    assert f"more than {bounds.STATE_LIMIT_BYTES // bounds.KIB} KiB of the workflow's state" in intro
    assert "Step Functions passes at most 256 KiB between states" in intro


def test_a_large_but_reasonable_request_stays_valid(rules, s3):
    raw = {
        "train_data_uri": "s3://bounds-bucket/data/tokens/",
        "environment": {f"NCCL_X{i}": "v" * 100 for i in range(20)},
        "tags": {f"k{i}": "v" * 100 for i in range(30)},
        "hyperparameters": {"learning_rate": "0.000300000000000", "max_steps": "1000"},
    }
    state = lambda_state(raw, rules, s3, "large but reasonable")
    assert state["valid"], state["cause"]


def test_the_largest_decisions_measured(rules):
    """Prints the largest decision each test above measured (run with -s to see them). It takes the module's
    fixture so that ``make test`` hands it to the same worker as the tests above, after them (tests/schedule.py)."""
    assert LARGEST, "run with the tests above"
    for test, size in sorted(LARGEST.items(), key=lambda item: -item[1]):
        print(f"{size / 1024:7.1f} KiB  {test}")
    assert max(LARGEST.values()) <= bounds.STATE_LIMIT_BYTES
