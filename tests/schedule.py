"""The order ``make test`` hands tests to its two pytest-xdist workers: longest first, so that the last test to
start is a short one and neither worker idles at the end while the other still runs a long one (the wall time of
``-n 2`` is bounded below by its longest test, and by the sum of all over two).

It applies with ``--dist loadgroup --no-loadscope-reorder`` only (the Makefile's ``test`` target): each test is a
unit of its own, handed to whichever worker is free next, but the tests of a module that share a module-scoped
fixture (a synthesized stack, a multi-process run several tests read) form one unit, so that the fixture is made
once, on one worker. Any other way of running the suite keeps pytest's own order.

The order is made where the tests are collected: in each pytest-xdist worker (the controller collects nothing and
hands out the units in the order its workers collected them). A worker does not see ``--dist loadgroup`` as
``dist``: pytest-xdist sets its ``dist`` to ``"no"`` and its ``loadgroup`` to true before it collects
(``xdist.remote.setup_config``), so ``loadgroup`` is what ``in_effect`` reads. A group reaches the controller as a
suffix of its tests' node ids (``<node id>@<group>``) that pytest-xdist's own hook writes after ``longest_first``;
``carry_groups`` makes that write take under pytest 9.2.

``SECONDS`` is what the longest tests took in a whole run of the suite (``tests/cpu_seconds.py``'s figures): only
their order comes from it, never a verdict. A test missing from it counts ``SLOW_SECONDS`` when marked ``slow``,
else ``FAST_SECONDS``; a stale entry only changes the order.
"""

from __future__ import annotations

import pytest

SECONDS = {
    # Each test's wall seconds (set-up, call and tear-down) in the whole-suite run 6 of main at 272f532, 2026-11-29:
    # `make test` with `-p tests.cpu_seconds` on the 2-core machine with nothing else running (load 2.5 to 3.7 from the
    # suite's own processes), 2,399 tests in 16 min 25 s; every test over 8 s (46), rounded. Node ids as collected
    # (tests/cpu_seconds.py writes them so: without the "@<module>" pytest-xdist adds to a grouped test's id).
    "tests/training/distributed/test_compile_cache.py::test_a_half_written_precompiled_header_in_the_machine_wide_cache_fails_no_compile_test_and_the_trainer_names_it": 96,
    "tests/training/preference/test_toy_task.py::test_the_pages_commands_teach_the_preferred_style_and_answers_still_stop": 93,
    "tests/tune/test_tune_toolkit.py::test_a_tuning_job_under_the_toolkit_ranks_its_trials_through_an_oom_and_a_timeout": 88,
    "tests/training/test_fine_tuning.py::test_trained_locally_as_the_page_shows_the_export_answers_held_out_prompts_and_stops": 80,
    "tests/training/model/test_lora.py::test_compiled_lora_blocks_train_like_eager_ones_with_every_graph_compiled_in_the_warm_up": 63,
    "tests/docs/test_runs.py::test_every_command_of_the_first_run_and_of_each_opening_runs_as_printed": 49,
    "tests/training/distributed/test_levers.py::test_compiled_blocks_run_the_pinned_attention_kernel_whatever_was_compiled_before": 40,
    "tests/measure/test_gpu_report.py::test_the_smoke_run_writes_every_file_of_the_report_through_the_same_path": 35,
    "tests/docs/test_runs.py::test_an_opening_run_apart_runs_as_printed_in_a_copy_of_its_own[docs/evaluation.md]": 33,
    "tests/training/test_fine_tuning.py::test_through_train_sh_under_the_sagemaker_toolkit_with_the_data_and_model_channels": 27,
    "tests/test_package.py::test_reuse_example_synthesizes_from_a_fresh_install": 27,
    "tests/training/distributed/test_levers.py::test_compiled_blocks_and_loss_chunks_train_like_eager_ones_with_every_graph_compiled_in_the_warm_up": 26,
    "tests/training/distributed/test_compile_cache.py::test_a_0_byte_library_of_the_backward_graph_in_the_cache_runs_eagerly_naming_it": 25,
    "tests/test_request_corpus.py::test_every_recorded_input_is_decided_as_recorded": 22,
    "tests/training/test_multinode.py::test_two_agents_with_hybrid_sharding_train_the_losses_of_one_agent_sharding_over_four": 22,
    "tests/test_request_corpus.py::test_validate_and_the_workflow_agree_on_every_input_that_needs_no_s3": 21,
    "tests/training/preference/test_trl_agreement.py::test_lora_with_the_adapter_switched_off_as_reference_agrees_with_trl_and_peft": 21,
    "tests/workflow/test_requests.py::test_state_machine_and_python_function_agree_on_a_generated_corpus": 20,
    "tests/training/test_stops.py::test_a_bad_token_id_in_packed_conversations_past_the_checks_sample_stops_in_one_line_and_keeps_the_save": 19,
    "tests/training/test_hybrid_fine_tuning.py::test_lora_on_packed_conversations_trains_alike_under_replicate_2_x_shard_2_and_shard_4": 18,
    "tests/evaluate/test_evaluate_run.py::test_a_memorized_task_scores_1_and_shuffled_answers_score_chance": 17,
    "tests/prepare/test_processing.py::test_preference_pairs_on_one_instance_and_three_are_the_same_bytes": 17,
    "tests/training/checkpoint/test_s3_backend.py::test_a_background_save_is_sealed_with_every_objects_size_and_checksum": 16,
    "tests/measure/test_benchmark.py::test_under_torchrun_every_rank_checkpoints_into_one_folder_rank_0_made": 16,
    "tests/docs/test_open_weights_first_runs.py::test_each_familys_first_run_works_offline_as_printed[gemma3_text]": 15,
    "tests/tune/test_tune_preference.py::test_a_lora_dpo_tuning_job_runs_its_trial_as_a_dpo_run_and_records_a_dpo_step": 15,
    "tests/training/checkpoint/test_export_peft.py::test_adapter_config_is_the_same_bytes_in_every_process_with_target_modules_in_block_order": 15,
    "tests/training/test_multinode.py::test_a_checkpoint_resumes_from_four_processes_on_two_and_back": 14,
    "tests/workflow/test_requests.py::test_bad_input_ends_in_invalid_input_before_sagemaker[execution_input0-input: must be a JSON object of input fields; got [1, 2]]": 14,
    "tests/training/model/test_lora.py::test_a_lora_checkpoint_holds_only_adapters_and_a_sigterm_then_resume_is_bit_identical": 12,
    "tests/tune/test_tune_driver.py::test_the_overhead_benchmark_prints_each_phase": 12,
    "tests/training/test_loss.py::test_chunked_loss_under_fsdp2_with_two_processes": 12,
    "tests/training/observe/test_tracking.py::test_a_two_process_run_and_its_resume_write_one_tensorboard_log_and_one_mlflow_run": 11,
    "tests/workflow/test_executions.py::test_on_demand_defaults_create_the_expected_request": 11,
    "tests/test_app.py::test_checkov_finds_nothing_outside_its_explicit_skip_list": 11,
    "tests/training/distributed/test_levers.py::test_sigterm_during_async_saves_ends_sealed_and_the_resume_continues_bit_for_bit": 11,
    "tests/training/test_distributed.py::test_a_run_killed_with_sigkill_resumes_from_its_newest_sealed_s3_checkpoint": 10,
    "tests/training/test_resume.py::test_each_damage_to_the_newest_checkpoint_is_set_aside_with_its_reason_and_the_previous_one_resumes[s3]": 10,
    "tests/training/distributed/test_levers.py::test_accumulation_resumed_mid_run_and_async_saves_after_sigterm_match_the_reference": 10,
    "tests/request/test_read_limits.py::test_the_checks_peak_on_the_largest_files_it_accepts_fits_the_lambda": 10,
    "tests/prepare/test_processing.py::test_one_instance_and_four_and_a_local_run_write_the_same_bytes": 10,
    "tests/training/preference/test_trl_agreement.py::test_the_ipo_and_length_normalised_losses_agree_with_trl_for_five_steps[ipo]": 8,
    "tests/training/test_stops.py::test_a_bad_token_id_past_the_checks_sample_stops_every_rank_in_one_line_and_reruns_resume_there": 8,
    "tests/training/test_fine_tuning.py::test_lora_on_packed_conversations_trains_and_exports_an_adapter_peft_loads": 8,
    "tests/training/test_stops.py::test_a_run_that_diverges_stops_before_saving_anything_non_finite_and_keeps_every_good_checkpoint": 8,
    "tests/training/preference/test_trl_agreement.py::test_the_ipo_and_length_normalised_losses_agree_with_trl_for_five_steps[sigmoid_norm]": 8,
}
"""Test node id: seconds (above). Only the order comes from them, never a verdict; a stale entry only changes it."""
SLOW_SECONDS = 8
"""A ``slow`` test missing from ``SECONDS``: it took under 8 s in that run, or is newer than it."""
FAST_SECONDS = 1

SPLIT: tuple[str, ...] = ()
"""Modules whose module-scoped fixture is cheaper than keeping its tests on one worker (each worker makes it)."""


def seconds(item: pytest.Item) -> float:
    if item.nodeid in SECONDS:
        return SECONDS[item.nodeid]
    return SLOW_SECONDS if item.get_closest_marker("slow") else FAST_SECONDS


def shared_module_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture made once per module (or class, or package)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None or item.nodeid.startswith(SPLIT):
        return False
    return any(
        definitions[-1].scope in ("module", "class", "package")
        for definitions in info.name2fixturedefs.values()
        if definitions
    )


def in_effect(config: pytest.Config) -> bool:
    """Whether ``config`` is a pytest-xdist worker's of a ``--dist loadgroup --no-loadscope-reorder`` run."""
    return bool(config.getoption("loadgroup", False)) and not config.getoption("loadscopereorder", True)


def longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker of ``--dist loadgroup --no-loadscope-reorder``: mark the tests sharing a module-scoped fixture as
    one group per module, and order the units (a group, or a test) by their summed ``seconds``, longest first
    (pytest's order kept among equals and within a unit)."""
    if not in_effect(config):
        return
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        if shared_module_fixture(item):
            group = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(group))
        else:
            group = item.nodeid
        units.setdefault(group, []).append(item)
    ordered = sorted(units.values(), key=lambda unit: -sum(seconds(item) for item in unit))
    items[:] = [item for unit in ordered for item in unit]


def carry_groups(items: list[pytest.Item]) -> None:
    """After pytest-xdist's own ``pytest_collection_modifyitems``: put the group it wrote for a grouped test into the
    test's node id, where its write did not take. pytest-xdist 3.8.0 writes ``item._nodeid`` (``xdist.remote``);
    pytest 9.2 keeps the node id in ``item._id`` and never reads ``_nodeid``, so without this the controller sees
    no group and hands a module's tests to both workers, each making the module's fixture (pytest-xdist issue
    1386, open). A no-op where the write took (an earlier pytest) or where pytest-xdist writes no ``_nodeid``."""
    for item in items:
        written = vars(item).get("_nodeid")
        if written is not None and written != item.nodeid:
            item._id = type(item._id).parse(written)
