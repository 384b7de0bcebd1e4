"""A tuning run decided before launch (training/request/tuning.py): the tune block's checks (each refusal names its
field), the candidates the plan picks and ranks, the probe past the memory edge, the cost and its bound, and the
tuning job's hyperparameters (which the driver in the image parses back)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from training.contract import hardware, settings_table
from training.contract import tuning as contract_tuning
from training.plan import inputs, memory
from training.request import tuning, tuning_plan

B200 = "ml.p6-b200.48xlarge"
BASE = {
    "instance_type": B200,
    "precision": "bf16",
    "seq_length": 8192,
    "batch_size": 64,
    "hyperparameters": {"max_steps": 1000},
}
"""64 sequences per optimizer step: each candidate's micro-batch, with its grad_accum_steps making up the rest."""


def settings(**block) -> tuning.TuneSettings:
    parsed, problems = tuning.parse_tune(block, B200)
    assert not problems, problems
    return parsed


def test_the_default_space_is_micro_batch_ac_and_the_precisions_the_gpu_runs():
    assert settings().search_space == {
        "batch_size": (1, 2, 4, 8, 16, 32),
        "activation_checkpointing": ("none", "full", "selective"),
        "precision": ("bf16", "fp8", "mxfp8", "nvfp4"),
    }
    assert tuning.default_space("ml.p5.48xlarge")["precision"] == ("bf16", "fp8")  # Hopper: no MXFP8, NVFP4


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ({"search_space": {}}, "tune.search_space: must name at least one setting to vary"),
        (
            {"search_space": {"learning_rate": [1e-4]}},
            "tune.search_space.learning_rate: unknown setting; allowed: ",
        ),
        ({"search_space": {"batch_size": []}}, "tune.search_space.batch_size: must be a non-empty list"),
        (
            {"search_space": {"batch_size": [0]}},
            "tune.search_space.batch_size: each value must be an integer in [1, 4096]",
        ),
        (
            {"search_space": {"precision": ["mxfp8"]}},
            "tune.search_space.precision: mxfp8 cannot run on the GPUs",
        ),
        ({"max_trials": 0}, "tune.max_trials: must be an integer in [1, 32]; got 0"),
        ({"max_trials": 33}, "tune.max_trials: must be an integer in [1, 32]; got 33"),
        ({"cv_target": -1}, "tune.cv_target: must be a number in [0, 0.5]"),
        ({"max_cost_usd": 0}, "tune.max_cost_usd: must be a number in [0.01, 10000000], or null"),
        (
            {"window_steps": 20, "max_measured_steps": 10},
            "tune.window_steps: must be at most max_measured_steps",
        ),
        ({"convergence": {"precisions": ["bf16"]}}, "tune.convergence.precisions: must be a non-empty list"),
        ({"colour": 1}, "tune.colour: unknown field; allowed: search_space, max_trials"),
        ([], "tune: must be an object of search_space"),
    ],
)
def test_each_refusal_names_its_field(block, problem):
    instance = "ml.p5.48xlarge" if "mxfp8" in str(block) else B200
    parsed, problems = tuning.parse_tune(block, instance)
    assert parsed is None and any(p.startswith(problem) for p in problems), problems


def test_candidates_are_ranked_by_predicted_throughput_with_the_non_fits_dropped_and_one_probe():
    space = {"batch_size": (1, 4, 16, 64), "activation_checkpointing": ("none", "full")}
    found = tuning.candidates(*inputs.parse_request(BASE), space)
    assert found.considered == 8
    speeds = [c.tokens_per_sec for c in found.ranked]
    assert speeds == sorted(speeds, reverse=True) and all(c.plan.memory.fits for c in found.ranked)
    # every candidate trains the request's 64 sequences per optimizer step
    assert all(c.overrides["batch_size"] * c.overrides["grad_accum_steps"] == 64 for c in found.ranked)
    assert {tuple(c.overrides.values()) for c in found.not_fitting} == {(16, "none", 4), (64, "none", 1)}
    assert found.edge is not None and found.edge.probe
    assert found.edge.overrides == {
        "batch_size": 16,
        "activation_checkpointing": "none",
        "grad_accum_steps": 4,
    }
    tuned = tuning_plan.plan_tuning(*inputs.parse_request(BASE), settings(search_space={k: list(v) for k, v in space.items()}, max_trials=3),
                               max_runtime_seconds=86_400)  # fmt: skip
    assert [c.probe for c in tuned.trials] == [False, False, False, True]
    assert tuned.trials[-1].trial()[contract_tuning.TRIAL_PROBE] is True


def test_a_space_with_no_candidate_that_fits_is_refused_naming_the_nearest():
    tuned = tuning_plan.plan_tuning(*inputs.parse_request({**BASE, "batch_size": 128, "hyperparameters": {"model_preset": "64b"}}),
                               settings(search_space={"batch_size": [64, 128]}), max_runtime_seconds=86_400)  # fmt: skip
    (problem,) = tuned.problems
    assert problem.startswith("tune.search_space: no candidate of the 2 combinations is predicted to fit")
    assert "nearest: batch_size=64" in problem
    assert problem.endswith("it would fit with: batch_size values below 64; activation_checkpointing full")


def test_when_nothing_fits_the_advice_names_what_would_help_not_what_the_space_tried():
    """The space tried micro-batch 1 and every activation checkpointing mode: the advice is more instances (the
    fewest under which the nearest candidate fits) or a larger type the workflow allows, never those again."""
    request = {**BASE, "batch_size": 8, "hyperparameters": {"model_preset": "64b"}}
    space = {"batch_size": [1, 2, 4, 8], "activation_checkpointing": ["none", "full", "selective"]}
    tuned = tuning_plan.plan_tuning(*inputs.parse_request(request), settings(search_space=space), max_runtime_seconds=86_400,
                               max_instance_count=4, instance_types=tuple(hardware.GPU_INSTANCE_TYPES))  # fmt: skip
    (problem,) = tuned.problems
    advice = problem.split("; it would fit with: ")[1]
    assert (
        advice.startswith("instance_count 3 (the nearest candidate then plans ") and "instance_type" in advice
    )
    assert "batch_size" not in advice and "activation_checkpointing" not in advice
    nearest = tuned.found.not_fitting[0].plan.setup
    assert memory.estimate_memory(replace(nearest, instance_count=3)).fits
    assert not memory.estimate_memory(replace(nearest, instance_count=2)).fits
    # a workflow allowing one instance and no larger type: nothing it allows would help, and it says so
    alone = tuning_plan.plan_tuning(*inputs.parse_request(request), settings(search_space=space), max_runtime_seconds=86_400,
                               max_instance_count=1)  # fmt: skip
    assert alone.problems[0].endswith(
        "no instance count up to 1, allowed instance type, micro-batch or activation checkpointing fits it: tune a "
        "smaller model (model_preset) or seq_length"
    )


def test_a_space_whose_micro_batches_all_exceed_the_requests_batch_advises_raising_it():
    tuned = tuning_plan.plan_tuning(*inputs.parse_request({**BASE, "batch_size": 1}), settings(search_space={"batch_size": [2, 4]}),
                               max_runtime_seconds=86_400)  # fmt: skip
    (problem,) = tuned.problems
    assert "2 are refused by the trainer's rules (first: batch_size=2: batch_size 2 x seq_length" in problem
    assert problem.endswith("raise the request's batch_size (or grad_accum_steps) to the global batch the "
                            "micro-batches should split, or list micro-batches that divide it")  # fmt: skip


def test_combinations_the_trainer_refuses_are_left_out_with_the_reason():
    found = tuning.candidates(
        *inputs.parse_request({**BASE, "seq_length": 8200, "batch_size": 1}), {"precision": ("bf16", "mxfp8")}
    )
    assert [c.overrides for c in found.ranked] == [{"precision": "bf16", "grad_accum_steps": 1}]
    assert found.refused == [
        "precision=mxfp8: seq_length: must be a multiple of 32 for precision=mxfp8; got 8200"
    ]
    split = tuning.candidates(*inputs.parse_request({**BASE, "batch_size": 8}), {"batch_size": (2, 16)})
    assert [c.overrides for c in split.ranked] == [{"batch_size": 2, "grad_accum_steps": 4}]
    assert split.refused == [
        "batch_size=16: batch_size 16 x seq_length 8192 does not divide the request's 65536 tokens per optimizer "
        "step per GPU (batch_size x grad_accum_steps x seq_length; give it the global batch to split)"
    ]


def test_the_cost_bound_keeps_the_best_trials_that_fit_and_bounds_the_jobs_run_time():
    free = tuning_plan.plan_tuning(*inputs.parse_request(BASE), settings(), max_runtime_seconds=86_400)
    price = hardware.ON_DEMAND_USD_PER_HOUR[B200]
    assert free.expected_cost_usd == pytest.approx(free.expected_seconds * price / 3600)
    one_trial = (
        (tuning_plan.JOB_START_SECONDS + tuning_plan.REPORT_SECONDS + free.trial_seconds[0]) * price / 3600
    )
    bounded = tuning_plan.plan_tuning(
        *inputs.parse_request(BASE),
        settings(max_cost_usd=round(one_trial * 2.5, 2)),
        max_runtime_seconds=86_400,
    )
    assert (
        not bounded.problems and 1 <= len(bounded.trials) < len(free.trials) and bounded.trimmed_by_cost > 0
    )
    assert bounded.trials == free.trials[: len(bounded.trials)]
    assert bounded.max_cost_usd <= one_trial * 2.5 + 0.01  # SageMaker stops the job at its max run time
    too_small = tuning_plan.plan_tuning(
        *inputs.parse_request(BASE),
        settings(max_cost_usd=round(one_trial * 0.9, 2)),
        max_runtime_seconds=86_400,
    )
    (problem,) = too_small.problems
    assert problem.startswith(f"tune.max_cost_usd: must cover at least one trial (${one_trial:,.2f}")


def test_a_cost_bound_needs_a_price():
    tuned = tuning_plan.plan_tuning(*inputs.parse_request({**BASE, "instance_type": "ml.p6-b300.48xlarge"}), settings(max_cost_usd=100),
                               max_runtime_seconds=86_400)  # fmt: skip
    assert tuned.problems == [
        "tune.max_cost_usd: ml.p6-b300.48xlarge has no on-demand price in this version "
        "(hardware.ON_DEMAND_USD_PER_HOUR), so the bound cannot be kept; leave max_cost_usd out"
    ]


def test_the_jobs_hyperparameters_carry_the_ordered_trials_the_driver_parses_back():
    tuned = tuning_plan.plan_tuning(*inputs.parse_request(BASE), settings(max_trials=4, convergence={"precisions": ["mxfp8"], "steps": 50}),
                               max_runtime_seconds=86_400)  # fmt: skip
    hyperparameters = tuning_plan.job_hyperparameters(tuned, instance_type=B200, image_uri="r/x:tag1")
    trials = contract_tuning.parse_trials(hyperparameters[contract_tuning.TUNE_TRIALS])
    assert trials == [c.trial() for c in tuned.trials]
    assert set(hyperparameters) <= set(contract_tuning.TUNE_HYPERPARAMETERS_BY_NAME)
    for name, text in hyperparameters.items():
        contract_tuning.TUNE_HYPERPARAMETERS_BY_NAME[name].parse(
            text
        )  # every value is what the driver accepts
    assert hyperparameters["tune_convergence_precisions"] == "mxfp8"
    assert int(hyperparameters["tune_deadline_seconds"]) == tuned.max_runtime_seconds - int(
        tuning_plan.REPORT_SECONDS
    )
    assert tuned.to_dict()["trials"][0]["throughput_basis"] == "estimate"


def test_trial_lists_refuse_settings_a_trial_may_not_change():
    with pytest.raises(settings_table.ContractError, match="tune_trials: trial 2: 'learning_rate=1' is not"):
        contract_tuning.parse_trials("batch_size=2;learning_rate=1")
    with pytest.raises(settings_table.ContractError, match="trial 1 is empty"):
        contract_tuning.parse_trials("")


def test_a_trial_may_carry_its_own_timeout_within_the_jobs_bounds():
    trials = contract_tuning.parse_trials("batch_size=2,timeout_seconds=30;batch_size=8")
    assert trials == [{"batch_size": 2, "timeout_seconds": 30}, {"batch_size": 8}]
    assert contract_tuning.trial_overrides(trials[0]) == {"batch_size": 2}
    assert contract_tuning.parse_trials(contract_tuning.format_trials(trials)) == trials
    for bad in ("2", "1.5", "forever", "100000"):
        with pytest.raises(
            settings_table.ContractError, match=r"tune_trials: trial 1: timeout_seconds must be .*5.*86400"
        ):
            contract_tuning.parse_trials(f"timeout_seconds={bad},batch_size=2")


def test_a_candidate_keeps_the_requests_tokens_per_optimizer_step_by_accumulation():
    base = {**BASE, "batch_size": 8, "hyperparameters": {"grad_accum_steps": 2}}  # 16 sequences per step
    found = tuning.candidates(*inputs.parse_request(base), {"batch_size": (1, 4, 16, 32)})
    everyone = [*found.ranked, *found.not_fitting]
    assert {c.overrides["batch_size"]: c.overrides[contract_tuning.GRAD_ACCUM_SETTING] for c in everyone} == {
        1: 16, 4: 4, 16: 1
    }  # fmt: skip
    assert [r.split(":")[0] for r in found.refused] == ["batch_size=32"]
    one = next(c for c in found.ranked if c.overrides["batch_size"] == 4)
    assert one.plan.setup.grad_accum_steps == 4
    # an optimizer step is its 4 micro-batches (the plan counts them)
    assert one.step_seconds() == pytest.approx(4 * 4 * 8192 / one.plan.timing.tokens_per_sec_per_gpu)
    assert contract_tuning.parse_trials(contract_tuning.format_trials([one.trial()])) == [one.trial()]
    assert contract_tuning.GRAD_ACCUM_SETTING in contract_tuning.measurement_key_settings()


def test_with_settings_puts_top_level_fields_on_top():
    request = tuning.with_settings(BASE, {"batch_size": 4, "loss_chunk_tokens": 0})
    assert request["batch_size"] == 4 and request["hyperparameters"] == {
        "max_steps": 1000,
        "loss_chunk_tokens": 0,
    }
    assert inputs.setup_from_request(request).loss_chunk_tokens == 0 and BASE["hyperparameters"] == {
        "max_steps": 1000
    }


def test_the_mxfp8_recipe_is_refused_in_a_space_for_a_gpu_that_cannot_run_it():
    from training.request.decision import decide_request, validate_request
    from training.request.rules import RequestRules

    hopper = {"precision": "fp8", "instance_type": "ml.p5.48xlarge", "batch_size": 8}
    assert validate_request(
        {**hopper, "tune": {"search_space": {"fp8_recipe": ["current", "mxfp8"]}}}, RequestRules()
    ) == [  # fmt: skip
        "tune.search_space.fp8_recipe: mxfp8 cannot run on the GPUs of ml.p5.48xlarge; it runs auto, current, delayed"
    ]
    # the request's own recipe mxfp8: the candidates that run fp8 are refused, bf16's are kept
    space = {"precision": ["bf16", "fp8"], "activation_checkpointing": ["full"]}
    decided = decide_request(
        {
            **hopper,
            "precision": "bf16",
            "hyperparameters": {"fp8_recipe": "mxfp8"},
            "tune": {"search_space": space},
        },
        RequestRules(),
    )
    assert decided.problems == [], decided.problems
    (refused,) = decided.tune_refused
    assert refused.startswith(
        "precision=fp8, activation_checkpointing=full: fp8_recipe: mxfp8 (TE MXFP8BlockScaling)"
    )
    assert [t["settings"]["precision"] for t in decided.tune["plan"]["trials"]] == ["bf16"]


def test_a_space_whose_layouts_all_fail_to_divide_the_gpus_names_the_ones_that_do():
    """Issue 53 item 4: every data_parallel_replicate value of the space failing to divide the GPUs was answered
    with memory advice ("it would fit with: activation_checkpointing full"), which nothing had planned."""
    request = {**BASE, "instance_count": 2, "batch_size": 8}
    parsed, problems = tuning.parse_tune({"search_space": {"data_parallel_replicate": [3, 5]}}, B200, 2)
    assert not problems
    tuned = tuning_plan.plan_tuning(*inputs.parse_request(request), parsed, max_runtime_seconds=86_400,
                                    max_instance_count=4)  # fmt: skip
    (problem,) = tuned.problems
    assert (
        "2 are refused by the trainer's rules (first: data_parallel_replicate=3: data_parallel_replicate: "
        in problem
    )
    assert "it would fit with" not in problem and "activation_checkpointing" not in problem.split("; ")[-1]
    assert problem.endswith(
        "list data_parallel_replicate values that divide the job's 16 GPUs (1, 2, 4, 8, 16), or leave it out of the "
        "search space (auto)"
    )


def test_a_space_every_combination_of_which_the_trainer_refuses_gives_no_memory_advice():
    request = {**BASE, "seq_length": 8200, "batch_size": 1}
    parsed, _ = tuning.parse_tune({"search_space": {"precision": ["mxfp8"]}}, B200)
    tuned = tuning_plan.plan_tuning(*inputs.parse_request(request), parsed, max_runtime_seconds=86_400)
    (problem,) = tuned.problems
    assert "it would fit with" not in problem
    assert problem.endswith(
        "every combination is refused by the trainer's rules, before any memory was planned: change the values "
        "the reasons name (blackwell-training tune --dry-run lists every one)"
    )
