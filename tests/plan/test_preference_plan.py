"""The plan of a DPO run (``training.plan.preference``): the rows docs/preference-tuning.md shows, Llama 3.1 8B full
DPO and 70B LoRA DPO on one ml.p6-b200.48xlarge: the same memory as a next-token step of the same windows (no
second model held; what one would take is shown), the adapter-off reference's extra forward in the step time, and
the precomputed reference's pass in the run's time once the data's windows are known."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.contract import shapes
from training.measure import dpo_plans
from training.plan import estimate, preference, report
from training.plan.memory_terms import GIB

ROWS = {
    "llama3.1-8b full": {"model_preset": "llama3.1-8b", "seq_length": "4096", "batch_size": "1", "max_steps": "1000"},
    "llama3.1-70b LoRA": {"model_preset": "llama3.1-70b", "seq_length": "4096", "batch_size": "1", "max_steps": "1000",
                          "lora_rank": "16", "activation_checkpointing": "full"},
}  # fmt: skip


def plans(settings: dict[str, str]) -> tuple[estimate.Plan, estimate.Plan]:
    """(the next-token plan, the DPO plan) of the same settings on one ml.p6-b200.48xlarge."""
    return (
        estimate.make_plan({"hyperparameters": settings}),
        estimate.make_plan({"hyperparameters": {**settings, "objective": "dpo"}}),
    )


@pytest.mark.parametrize("row", list(ROWS))
def test_the_docs_rows_fit_one_instance_with_the_memory_of_next_token_training_and_no_second_model(row):
    next_token, dpo = plans(ROWS[row])
    d, part = dpo.to_dict(), dpo.to_dict()["preference"]
    lora = "lora_rank" in ROWS[row]
    print(f"{row}: peak {d['peak_gib']} GiB of {d['limit_gib']}, reference {part['reference']}, step "
          f"{d['step_seconds']} s (x{part['step_factor']} next-token's {next_token.timing.step_seconds:.4f} s), "
          f"{d['tokens_per_sec_per_gpu']} tokens/s per GPU, 1000 steps {d['run_seconds']} s ${d['cost_usd']}, "
          f"kept copy avoided {part['kept_copy_avoided_gib']} GiB per GPU")  # fmt: skip
    assert d["fits"] and dpo.memory == next_token.memory
    assert part["reference"] == ("adapter_off" if lora else "precomputed")
    params = shapes.MODEL_PRESETS[ROWS[row]["model_preset"]].parameter_count()
    assert part["kept_copy_avoided_gib"] == pytest.approx(
        params * 2 / 8 / GIB, rel=1e-3
    )  # bf16, sharded over 8
    factor = dpo.timing.step_seconds / next_token.timing.step_seconds
    if lora:  # the frozen weights' forward and input gradient, plus the adapters' forward once more
        assert factor == pytest.approx(part["step_factor"], rel=1e-3) and 1.45 < factor < 1.5
    else:
        assert (
            factor == 1.0 and part["reference_pass_seconds"] is None
        )  # the data's windows are not known here
    assert dpo.timing.cost_usd == pytest.approx(next_token.timing.cost_usd * factor, rel=0.02)
    assert f"preference tuning (dpo): reference {part['reference']}" in report.format_plan(dpo)


def test_the_reference_pass_is_the_forward_share_of_a_steps_time_per_window():
    next_token, _ = plans(ROWS["llama3.1-8b full"])
    s, values = next_token.setup, {"objective": "dpo", "dpo_reference": "auto", "lora_rank": 0}
    with_data = estimate.with_preference(next_token, values, windows=80_000, answers=160_000)
    part = with_data.preference
    share = preference.forward_flops_per_token(s) / (
        shapes.flops_per_token(s.shape, s.seq_length)
    )  # a third: forward of forward + backward
    assert share == pytest.approx(1 / 3)
    assert part["reference_pass_seconds"] == pytest.approx(
        80_000 * next_token.timing.step_seconds / 8 / 3, rel=1e-3
    )
    assert with_data.timing.run_seconds == pytest.approx(
        next_token.timing.run_seconds + part["reference_pass_seconds"], rel=1e-4
    )
    assert part["stored_reference_bytes"] == 640_000


def test_the_docs_table_is_what_the_command_prints_now():
    """docs/preference-tuning.md's plan table, under its ``<!-- figure: python -m training.measure.dpo_plans -->``
    marker, is the command's output: a changed default or formula makes it stale."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "preference-tuning.md").read_text()
    marker = "<!-- figure: python -m training.measure.dpo_plans -->\n"
    shown = page.split(marker, 1)[1].split("\n\n", 1)[0].strip()
    assert shown == dpo_plans.table(dpo_plans.parse_args([])), (
        "run python -m training.measure.dpo_plans and paste it"
    )
