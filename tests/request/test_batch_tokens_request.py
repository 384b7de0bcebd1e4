"""What a step holds, said before launch, and the batch given in tokens through the request check: the plan's
``step`` (windows, tokens, and on prepared conversations the examples and trained tokens their metadata.json
gives per window), ``batch_tokens`` in ``hyperparameters`` converted for the job's GPUs while the workflow's default
``batch_size`` gives way to it, and both at once refused by name (training.request.value, training.plan.step_batch).
"""

from __future__ import annotations

import json

from tests.request.test_fine_tuning_request import MODEL, REQUEST, RULES, folders  # noqa: F401 - the fixture
from training.contract import settings_parse
from training.contract import tuning as contract_tuning
from training.contract.settings_table import HYPERPARAMETERS_BY_NAME
from training.plan import estimate, report
from training.request.decision import decide_request
from training.request.reads import Reads
from training.request.rules import RequestRules
from training.trainer.data import packing

BASE = {key: value for key, value in REQUEST.items() if key != "batch_size"}


def decide(folders, raw: dict, rules: RequestRules = RULES):  # noqa: F811 - the fixture's value
    return decide_request(
        raw, rules, reads=Reads(local_init_from=folders["model"], local_train_data=folders["data"])
    )


def test_the_plan_says_the_examples_and_trained_tokens_a_packed_step_holds_from_the_metadata(folders):  # noqa: F811
    decision = decide(folders, {**BASE, "batch_size": 2})
    assert decision.problems == []
    step = decision.plan["step"]
    meta = json.loads((folders["data"] / "metadata.json").read_text())["splits"]["train"]
    windows = len(packing.Conversations(folders["data"], "train", token_dtype="uint16", seq_length=256, batch_size=1,
                                        seed=0, rank=0, world_size=1).windows)  # fmt: skip
    assert (step["windows"], step["tokens"]) == (16, 16 * 256)  # batch_size 2 x 8 GPUs
    assert (
        step["examples"] == round(16 * meta["examples"] / windows, 1) > 16
    )  # packed: more than one a window
    assert step["trained_tokens"] == round(16 * meta["trained_tokens"] / windows) < step["tokens"]
    assert step["summary"].startswith(
        "16 windows of 256 tokens (batch_size 2 x grad_accum_steps 1 x 8 GPUs) = 4,096 tokens; holding about "
        f"{step['examples']:,.1f} examples and {step['trained_tokens']:,} trained tokens (packed: "
    )
    assert "where one per window the same batch_size would hold 16" in step["summary"]
    assert f"the train split's metadata.json: {meta['examples']} examples and" in step["summary"]
    unpacked = decide(
        folders, {**BASE, "batch_size": 2, "hyperparameters": {"max_steps": "100", "packing": "false"}}
    )
    assert (
        unpacked.plan["step"]["examples"] == 16.0 and "(one per window;" in unpacked.plan["step"]["summary"]
    )
    assert f"step: {step['summary']}" in report.format_plan(decision.estimate)


def test_batch_tokens_in_the_hyperparameters_replaces_the_default_batch_size_and_reaches_the_job(folders):  # noqa: F811
    decision = decide(folders, {**BASE, "hyperparameters": {"max_steps": "100", "batch_tokens": "4100"}})
    assert decision.problems == []
    assert decision.hyperparameters["batch_tokens"] == "4100" and "batch_size" not in decision.hyperparameters
    assert decision.estimate.setup.batch_size == 2  # 4,100 / (256 x 8 GPUs) = 2.002
    assert decision.plan["step"]["batch_tokens"] == 4100
    assert "batch_tokens 4,100 / (seq_length 256 x 8 GPUs x grad_accum_steps 1) = batch_size 2 (rounded down " \
           "from 2.002" in decision.plan["step"]["summary"]  # fmt: skip


def test_a_batch_given_twice_is_refused_but_a_default_gives_way_to_the_inputs_own(folders):  # noqa: F811
    twice = decide(
        folders, {**BASE, "batch_size": 2, "hyperparameters": {"max_steps": "100", "batch_tokens": "4096"}}
    )
    assert twice.problems == [
        "hyperparameters.batch_tokens: give the batch once: batch_size (windows of seq_length per GPU per "
        "micro-batch) or batch_tokens (tokens per optimizer step over every GPU), not both; got batch_size 2 and "
        "batch_tokens 4096"
    ]
    too_small = decide(folders, {**BASE, "hyperparameters": {"max_steps": "100", "batch_tokens": "100"}})
    assert too_small.problems == [
        "hyperparameters.batch_tokens: must be at least 2,048 (seq_length 256 x 8 GPUs x grad_accum_steps 1: one "
        "window per GPU); got 100"
    ]
    in_tokens = RequestRules(
        bucket_name="b", defaults={"batch_size": 4, "hyperparameters": {"batch_tokens": "4096"}}
    )
    by_default = decide(folders, BASE, in_tokens)
    assert by_default.problems == [] and by_default.estimate.setup.batch_size == 2
    own = decide(folders, {**BASE, "batch_size": 1}, in_tokens)
    assert (
        own.problems == []
        and "batch_tokens" not in own.hyperparameters
        and own.estimate.setup.batch_size == 1
    )


def test_a_plain_plan_says_the_step_and_that_every_token_trains():
    planned = estimate.make_plan({"seq_length": 1024, "instance_count": 2,
                                  "hyperparameters": {"model_preset": "1b", "batch_tokens": 100_000}})  # fmt: skip
    step = planned.to_dict()["step"]
    assert (step["windows"], step["tokens"], step["trained_tokens"], step["examples"]) == (
        96,
        98_304,
        98_304,
        None,
    )
    assert step["summary"] == (
        "96 windows of 1,024 tokens (batch_size 6 x grad_accum_steps 1 x 16 GPUs) = 98,304 tokens; batch_tokens "
        "100,000 / (seq_length 1,024 x 16 GPUs x grad_accum_steps 1) = batch_size 6 (rounded down from 6.104: whole "
        "windows per GPU, never more tokens than asked); on plain token data every token trains"
    )


def test_a_tuning_runs_base_gets_the_batch_size_batch_tokens_made_so_that_its_trials_set_their_own():
    raw = {"instance_type": "ml.p6-b200.48xlarge", "precision": "bf16", "seq_length": 8192,
           "hyperparameters": {"max_steps": 1000, "batch_tokens": 64 * 8192 * 8}, "tune": {"max_trials": 3}}  # fmt: skip
    decision = decide_request(raw, RequestRules())
    assert decision.problems == [] and decision.tune is not None
    base = decision.hyperparameters
    assert base["batch_size"] == "64" and "batch_tokens" not in base
    for trial in contract_tuning.parse_trials(base[contract_tuning.TUNE_TRIALS]):
        settings = {k: v for k, v in {**base, **trial}.items() if k in HYPERPARAMETERS_BY_NAME}
        values = settings_parse.parse_hyperparameters(
            settings, world_size=8
        )  # as the trainer parses a trial's
        assert values["batch_size"] * values["grad_accum_steps"] == 64  # the base's tokens per step kept


def test_too_few_windows_for_the_batch_batch_tokens_made_names_batch_tokens(folders):  # noqa: F811
    decision = decide(folders, {**BASE, "hyperparameters": {"max_steps": "100", "batch_tokens": "8192"}})
    assert decision.problems == [
        "hyperparameters.batch_tokens: the validation split of s3://b/data/chats/ makes 16 windows of seq_length 256 "
        "(20 examples, packed); one global batch (batch_size 4 x 8 GPUs, from batch_tokens 8,192) needs 32: lower "
        "batch_tokens or seq_length, or add data; got 8192"
    ]
