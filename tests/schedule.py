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

``SECONDS`` is what the longest tests took (``pytest --durations=0``, docs/measurements.md): only their order
comes from it, never a verdict. A test missing from it counts ``SLOW_SECONDS`` when marked ``slow``, else
``FAST_SECONDS``; a stale entry only changes the order.
"""

from __future__ import annotations

import pytest

SECONDS = {
    # from a whole-suite run's --durations=60 (setup and call) at load 9 to 20 on the shared 2-core machine
    # (main at 241f808); a test split since counts its parts' measured shares of it; those marked "earlier" failed
    # in that run and keep an earlier run's figure
    "tests/docs/test_runs.py::test_every_command_of_the_first_run": 323,  # 127 of 194 s at load 4
    "tests/docs/test_runs.py::test_an_opening_run_apart_runs_as_printed": 170,  # 67 of 194 s
    "tests/docs/test_open_weights_first_runs.py::test_each_familys_first_run": 56,  # 5 of 280 s, one unit
    "tests/training/distributed/test_compile_cache.py::test_a_half_written_precompiled_header": 176,
    "tests/training/test_fine_tuning.py::test_trained_locally_as_the_page_shows": 152,
    "tests/training/test_fine_tuning.py::test_through_train_sh_under_the_sagemaker_toolkit": 72,  # load 6.5, 100 steps
    "tests/tune/test_tune_toolkit.py::test_a_tuning_job_under_the_toolkit_ranks_its_trials": 183,  # load 5, its own timeout
    "tests/training/test_stops.py::test_a_bad_token_id_in_packed_conversations": 113,  # 122 x 42.5/45.7 CPU s
    "tests/training/test_stops.py::test_a_bad_token_id_past_the_checks_sample": 107,  # 113 x 31.7/33.4 CPU s
    "tests/training/test_stops.py::test_a_run_that_diverges": 109,
    "tests/training/test_stops.py::test_a_lora_run_that_diverges": 101,
    "tests/evaluate/test_evaluate_run.py::test_a_memorized_task_scores_1": 98,
    "tests/cli/test_commands.py::test_submit_wait_follows_the_run_to_success": 87,
    "tests/cli/test_commands.py::test_submit_wait_reports_the_failure_reason": 73,
    "tests/training/test_multinode.py::test_a_checkpoint_resumes_from_four_processes": 86,  # earlier
    "tests/training/model/test_lora.py::test_compiled_lora_blocks_train_like_eager_ones": 56,  # 68 x 70.2/84.6 CPU s
    "tests/training/test_hybrid_fine_tuning.py::test_lora_on_packed_conversations_trains_alike": 66,
    "tests/measure/test_gpu_report.py::test_the_smoke_run_writes_every_file": 65,
    "tests/training/distributed/test_levers.py::test_accumulation_resumed_mid_run": 61,
    "tests/training/distributed/test_levers.py::test_compiled_blocks_and_loss_chunks": 52,
    "tests/training/distributed/test_levers.py::test_sigterm_during_async_saves": 48,
    "tests/training/distributed/test_levers.py::test_compiled_blocks_run_the_pinned_attention_kernel": 48,
    "tests/test_package.py::test_reuse_example_synthesizes_from_a_fresh_install": 47,
    "tests/training/checkpoint/test_export_peft.py::test_adapter_config_is_the_same_bytes_in_every_process": 43,
    "tests/training/observe/test_tracking.py::test_a_two_process_run_and_its_resume": 42,
    "tests/training/test_distributed.py::test_sigterm_saves_a_complete_checkpoint": 42,
    "tests/training/distributed/test_compile_cache.py::test_a_0_byte_library_of_the_backward_graph": 42,
    "tests/training/model/test_lora.py::test_a_lora_checkpoint_holds_only_adapters": 39,
    "tests/training/test_train_sh.py::test_on_unusable_checkpoints_fail_with_2_processes": 37,  # earlier
    "tests/training/model/test_lora.py::test_peft_and_the_merged_folder_give_the_trainers_logits": 35,
    "tests/test_request_corpus.py::test_every_recorded_input_is_decided_as_recorded": 34,
    "tests/docs/test_runs.py::test_a_broken_command_a_wrong_output_and_a_wrong_exit_are_found": 33,
    "tests/workflow/test_requests.py::test_state_machine_and_python_function_agree": 32,
    "tests/training/test_distributed.py::test_activation_checkpointing_gives_the_same_losses": 31,
    "tests/training/test_distributed.py::test_an_earlier_runs_checkpoint_in_the_resume_channel": 31,
    "tests/training/test_sagemaker_toolkit.py::test_toolkit_runs_train_sh": 31,  # earlier
    "tests/training/test_distributed.py::test_resume_continues_bit_for_bit": 30,
    "tests/training/preference/test_trl_agreement.py::test_log_probabilities_and_five_losses_agree": 30,
    "tests/training/preference/test_trl_agreement.py::test_lora_with_the_adapter_switched_off": 30,
    "tests/training/model/test_lora.py::test_a_peft_adapter_export_interrupted": 30,
    "tests/training/test_resume.py::test_an_end_of_run_export_interrupted_by_sigkill": 29,
    "tests/test_request_corpus.py::test_validate_and_the_workflow_agree_on_every_input": 29,
    "tests/training/test_loss.py::test_chunked_loss_under_fsdp2_with_two_processes": 28,  # earlier
    "tests/training/test_resume.py::test_a_nope_checkpoint_from_before_rope": 28,
    "tests/training/test_stops.py::test_an_init_from_model_with_a_nan": 27,
    "tests/training/test_distributed.py::test_chunked_loss_gives_the_same_training": 27,
    "tests/training/checkpoint/test_weights.py::test_the_gathered_initial_model_is_bit_identical": 27,
    "tests/evaluate/test_evaluate_tasks.py::test_without_a_network_the_hub_failure_is_one_line": 26,
    "tests/training/distributed/test_levers.py::test_a_compile_error_in_the_backward_pass": 25,
    "tests/training/test_multinode.py::test_two_agents_with_hybrid_sharding": 88,  # earlier
    "tests/training/checkpoint/test_families_hf.py::test_a_gemma3_model_trains_and_exports": 25,
    "tests/training/preference/test_trl_agreement.py::test_the_ipo_and_length_normalised_losses": 25,
    "tests/cli/test_evaluation.py::test_compare_prints_scores_beside_the_final_losses": 23,
    "tests/training/model/test_lora.py::test_every_ranks_slice_of_every_adapter": 23,
    "tests/training/test_resume.py::test_when_no_checkpoint_loads_one_line_says_why": 22,
}
"""Test node id (or its start): seconds, from the suite's ``--durations=0`` on the shared 2-core machine."""
SLOW_SECONDS = 20
FAST_SECONDS = 1

SPLIT: tuple[str, ...] = ()
"""Modules whose module-scoped fixture is cheaper than keeping its tests on one worker (each worker makes it)."""


def seconds(item: pytest.Item) -> float:
    for start, value in SECONDS.items():
        if item.nodeid.startswith(start):
            return value
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
