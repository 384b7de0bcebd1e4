"""The tuning report from trial results: predicted next to measured, ranking, winner, costs only on the target
GPUs, the table's four forms, the records the planner reads back, the winning request and where it is written."""

from __future__ import annotations

import csv
import io
import json
import threading

import pytest

from training.contract import hardware, settings_parse, shapes
from training.plan import estimate, inputs, measured
from training.tune import charts, report, session
from training.tune.hosts import Hosts
from training.tune.outcome import TrialResult
from training.tune.stability import Spread

B200 = "ml.p6-b200.48xlarge"
BASE = {"precision": "bf16", "seq_length": "8192", "batch_size": "1", "max_steps": "1000",
        "checkpoint_dir": "/opt/ml/checkpoints", "model_dir": "/opt/ml/model"}  # fmt: skip


def where(device: str = "cuda", gpu: str | None = "B200") -> report.Where:
    return report.Where(
        B200, 1, device, gpu, 8, "abc123", "2.9.0", "2.11.0", "job-1", "2026-11-20T10:00:00+00:00", "algo-1"
    )


def result(
    index: int, settings: dict, status: str = "ok", median: float | None = 1.0, **summary
) -> TrialResult:
    out = TrialResult(index, settings, status=status)
    if median is not None:
        out.step_times = [median] * 10
        out.spread = Spread.of(out.step_times)
    out.summary = (
        {"max_allocated_gb": 40.0, "max_reserved_gb": 44.0, **summary} if status in ("ok", "near-oom") else {}
    )
    out.config = {"world_size": "8"}
    if status not in ("ok", "near-oom"):
        out.error = f"{status} happened"
    return out


def rows(place: report.Where) -> list[report.Row]:
    results = [
        result(1, {"batch_size": 16, "activation_checkpointing": "none"}, "oom", None),
        result(2, {"batch_size": 4, "activation_checkpointing": "full"}, median=0.5),
        result(3, {"batch_size": 8, "activation_checkpointing": "full"}, median=0.8),
        result(4, {"batch_size": 2, "activation_checkpointing": "none"}, "near-oom", median=0.1),
    ]
    return report.rank([report.make_row(r, BASE, place) for r in results])


def test_rows_rank_ok_by_measured_throughput_then_near_oom_then_failures():
    ranked = rows(where())
    assert [(r.trial, r.status) for r in ranked] == [(3, "ok"), (2, "ok"), (4, "near-oom"), (1, "oom")]
    best = report.winner(ranked)
    assert best.trial == 3 and best.measured_tokens_per_sec == pytest.approx(8 * 8192 / 0.8)
    assert best.mfu == pytest.approx(
        best.measured_tokens_per_sec * shapes.flops_per_token(shapes.MODEL_PRESETS["1b"], 8192) / 2250e12
    )
    per_second = hardware.ON_DEMAND_USD_PER_HOUR[B200] / 3600
    assert best.usd_per_billion_tokens == pytest.approx(per_second * 1e9 / (best.measured_tokens_per_sec * 8))
    # the full run is the base request's tokens (1 x 8192 per GPU per step, 1000 steps) at the measured speed
    assert best.full_run_seconds == pytest.approx(1000 * 8192 / best.measured_tokens_per_sec)
    assert best.full_run_usd == pytest.approx(best.full_run_seconds * per_second)
    planned = estimate.make_plan({"instance_type": B200, "hyperparameters": {**BASE, "batch_size": "8",
                                                                         "activation_checkpointing": "full"}})  # fmt: skip
    assert best.predicted_tokens_per_sec == pytest.approx(planned.timing.tokens_per_sec_per_gpu)
    assert best.memory_error_pct == pytest.approx(100 * (planned.memory.tensors_gib * 2**30 / 1e9 - 40) / 40)


def test_measured_on_another_device_no_cost_and_no_memory_error_is_shown():
    best = report.winner(rows(where("cpu", None)))
    assert best.usd_per_billion_tokens is None and best.full_run_usd is None and best.mfu is None
    assert best.memory_error_pct is None and best.full_run_seconds is not None


def test_the_table_in_markdown_csv_text_and_json():
    ranked = rows(where())
    markdown = report.markdown(ranked, "# Tuning")
    assert markdown.splitlines()[2].startswith("| # | configuration | status | predicted tok/s/GPU |")
    assert "- #4 batch_size=16 activation_checkpointing=none: oom: oom happened" in markdown
    parsed = list(csv.DictReader(io.StringIO(report.csv_text(ranked))))
    assert [r["status"] for r in parsed] == ["ok", "ok", "near-oom", "oom"] and parsed[0][
        "step_median_s"
    ] == "0.8"
    assert report.plain(ranked).splitlines()[0].split()[:3] == ["#", "configuration", "status"]
    data = json.loads(report.report_json(ranked, where(), {"notes": []}))
    assert data["winner"] == {"trial": 3, "settings": {"batch_size": 8, "activation_checkpointing": "full"}}
    assert data["measured_on_target"] is True


def test_the_records_of_a_run_are_what_the_planner_matches():
    place = where()
    records = report.records(rows(place), BASE, place)
    assert {r["measured"]["status"] for r in records} == {"ok", "near-oom", "oom"}
    request = {"instance_type": B200, "precision": "bf16", "seq_length": 8192, "batch_size": 8,
               "activation_checkpointing": "full"}  # fmt: skip
    planned = estimate.make_plan(request, measurements=records, image_tag="abc123")
    assert planned.timing.basis == "measured"
    assert planned.timing.tokens_per_sec_per_gpu == pytest.approx(8 * 8192 / 0.8)
    assert estimate.make_plan(request, measurements=records, image_tag="other").timing.basis == "estimate"
    values = settings_parse.parse_hyperparameters(inputs.trainer_settings(request))
    assert measured.find(records, values, instance_type=B200, instance_count=1, image_tag="abc123",
                         versions={"torch": "2.9.0", "transformer_engine": "2.11.0"}) is not None  # fmt: skip


def test_the_winning_request_is_an_execution_input_of_the_winners_settings():
    request = session.winning_request({**BASE, "dataset": "channel"}, {"batch_size": 8, "activation_checkpointing": "full"},
                                      where())  # fmt: skip
    assert request == {
        "instance_type": B200, "instance_count": 1, "precision": "bf16", "seq_length": 8192, "batch_size": 8,
        "activation_checkpointing": "full", "hyperparameters": {"max_steps": "1000"},
    }  # fmt: skip


def test_a_local_report_folder_is_never_written_over_and_a_jobs_is_the_one_the_workflow_reads(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("SM_MODEL_DIR", raising=False)
    first = session.report_folder(str(tmp_path))
    (first / "report.json").write_text("{}")
    assert first.name == "tune" and session.report_folder(str(tmp_path)).name == "tune-2"
    monkeypatch.setenv(
        "SM_MODEL_DIR", "/opt/ml/model"
    )  # in a job: an earlier attempt's report is moved aside
    (first / "winning_request.json").write_text('{"batch_size": 8}')
    assert session.report_folder(str(tmp_path)) == first and not any(first.iterdir())
    aside = tmp_path / "tune-attempt-1"
    assert sorted(p.name for p in aside.iterdir()) == ["report.json", "winning_request.json"]
    (first / "report.json").write_text("{}")
    assert (
        session.report_folder(str(tmp_path)) == first
        and (tmp_path / "tune-attempt-2" / "report.json").is_file()
    )
    assert (aside / "winning_request.json").read_text() == '{"batch_size": 8}'  # never written over


def test_the_leader_hands_the_winner_to_every_other_host():
    leader = Hosts(("localhost", "algo-2", "algo-3"), "localhost")
    follower = Hosts(("localhost", "algo-2", "algo-3"), "algo-2")
    received: list[object] = []
    threads = [
        threading.Thread(target=lambda: received.append(follower.share(None, 47_613, timeout=20)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    assert leader.share({"batch_size": 8}, 47_613, timeout=20) == {"batch_size": 8}
    for thread in threads:
        thread.join(20)
    assert received == [{"batch_size": 8}, {"batch_size": 8}]
    assert (
        Hosts.from_environment({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}).leader
        is False
    )
    assert Hosts.from_environment({}).names == ("localhost",)


def test_chart_labels_name_the_activation_checkpointing_mode():
    labels = [charts._label(r) for r in rows(where())]
    assert labels == ["#1 bs8 AC full", "#2 bs4 AC full", "#3 bs2 AC none", "#4 bs16 AC none"]


def test_a_trial_with_one_timed_step_shows_no_spread_and_its_json_is_standard():
    one = report.make_row(result(1, {"batch_size": 8}, "timeout", median=None), BASE, where())
    one.step_seconds = Spread.of([13.25]).as_dict()
    assert json.loads(json.dumps(one.step_seconds, allow_nan=False))["cv"] is None
    assert report.cells(one)["step"] == "13.25 [13.25-13.25], - (1 steps)"


def test_tokens_per_optimizer_step_are_checked_on_every_trial_not_asserted():
    base = {**BASE, "batch_size": "8"}
    kept = [result(1, {"batch_size": 4, "grad_accum_steps": 2}), result(2, {"batch_size": 8})]
    kept_rows = [report.make_row(r, base, where()) for r in kept]
    assert [r.tokens_per_step for r in kept_rows] == [8 * 8192, 8 * 8192] and not any(
        r.notes for r in kept_rows
    )
    (note,) = report.tokens_per_step_notes(kept_rows, base)
    assert note.startswith("every trial trains the base request's 65,536 tokens per optimizer step per GPU")
    other = report.make_row(result(3, {"batch_size": 2}), base, where())  # no accumulation: 4x fewer tokens
    (warning,) = report.tokens_per_step_notes([*kept_rows, other], base)
    assert warning.startswith("WARNING: 1 of 3 trials train other tokens per optimizer step per GPU than the base "
                              "request's 65,536 (trial 3 16,384)")  # fmt: skip
    assert other.notes == ["16384 tokens per optimizer step per GPU, not the base request's 65536"]
    assert "- WARNING: 1 of 3 trials" in report.markdown([*kept_rows, other], "# Tuning", [warning])


def test_mfu_has_one_denominator_the_gpus_bf16_peak_in_the_report_and_the_plan():
    """A low-precision trial's MFU against the bf16 peak (bf16-equivalent), as the plan shows the same measurement."""
    place = where()
    trial = report.make_row(result(1, {"batch_size": 1, "precision": "mxfp8"}, median=0.25), BASE, place)
    bf16_peak = hardware.PEAK_TFLOPS["B200"]["bf16"] * 1e12
    flops = shapes.flops_per_token(shapes.MODEL_PRESETS["1b"], 8192)
    assert trial.mfu == pytest.approx(trial.measured_tokens_per_sec * flops / bf16_peak)
    records = report.records([trial], BASE, place)
    request = {"instance_type": B200, "precision": "mxfp8", "seq_length": 8192, "batch_size": 1}
    planned = estimate.make_plan(request, measurements=records, image_tag="abc123")
    assert planned.timing.basis == "measured" and planned.timing.mfu_bf16 == pytest.approx(trial.mfu)


def spread_rows(place: report.Where) -> list[report.Row]:
    """Two trials that ran, one stable (a narrow spread) and one that never was (a wide one), and an OOM."""
    steady, shaky = result(1, {"batch_size": 8}, median=None), result(2, {"batch_size": 4}, median=None)
    steady.step_times, shaky.step_times = [0.80, 0.81, 0.79, 0.80, 0.82, 0.80], [0.5, 0.9, 0.4, 0.7, 0.5, 0.6]
    for trial in (steady, shaky):
        trial.spread = Spread.of(trial.step_times)
    steady.stopped_early = True
    results = [steady, shaky, result(3, {"batch_size": 16}, "oom", None)]
    return report.rank([report.make_row(r, BASE, place, None, 0.05) for r in results])


def test_each_trial_shows_its_spread_and_a_trial_never_stable_is_flagged():
    ranked = spread_rows(where())
    steady, shaky = ranked[0], ranked[1]
    assert (steady.stable, shaky.stable, ranked[2].stable) == (True, False, None)
    low, high = shaky.tokens_per_sec_range()
    assert low == pytest.approx(4 * 8192 / shaky.step_seconds["p90"]) and high == pytest.approx(
        4 * 8192 / shaky.step_seconds["p10"]
    )
    assert low < shaky.measured_tokens_per_sec < high
    text = report.cells(shaky)
    assert text["status"] == "ok, never stable" and text["measured_tokens_per_sec"].endswith(
        f" [{low:,.0f}-{high:,.0f}]"
    )
    assert report.cells(steady)["status"] == "ok"
    (note,) = report.stability_notes(ranked, 0.05, 6)
    assert note.startswith("1 of 3 trials never met the stability target") and ": #2;" in note
    assert report.stability_notes([steady, ranked[2]], 0.05, 6) == []
    # no target (0): no trial is called unstable
    assert report.make_row(result(4, {"batch_size": 2}), BASE, where(), None, 0.0).stable is None


def test_a_cpu_table_leaves_out_what_carries_nothing_there():
    """Measured on a CPU: no GPU prediction, memory, MFU or dollars; columns with no value are left out too."""
    gpu_headings = [h for _, h in report.shown_columns(spread_rows(where()), where())]
    assert "predicted tok/s/GPU" in gpu_headings and "measured allocated GB" in gpu_headings
    cpu = spread_rows(where("cpu", None))
    headings = [h for _, h in report.shown_columns(cpu, where("cpu", None))]
    assert headings == ["#", "configuration", "status", "measured tok/s/process [p90-p10 step]",
                        "step s (median [p10-p90], cv)", "full run (time, $)"]  # fmt: skip
    assert (
        report.markdown(cpu, "# T", where=where("cpu", None)).splitlines()[2]
        == "| " + " | ".join(headings) + " |"
    )
    assert report.plain(cpu, where("cpu", None)).splitlines()[0].split()[:4] == [
        "#",
        "configuration",
        "status",
        "measured",
    ]
    # every field stays in the CSV (and the JSON)
    assert "measured_allocated_gb" in report.csv_text(cpu).splitlines()[0]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_throughput_chart_draws_the_spread_and_the_memory_only_on_a_gpu(tmp_path, device):
    from PIL import Image

    place = where(device, "B200" if device == "cuda" else None)
    path = charts.throughput_and_memory(spread_rows(place), place, tmp_path / "t.png", 179.0)
    image = Image.open(path).convert("RGB")
    colours = {colour for _, colour in image.getcolors(maxcolors=1_000_000)}
    grey_memory_bars = (0x95, 0xA5, 0xA6)
    assert (grey_memory_bars in colours) == (device == "cuda")
    assert (0x2A, 0x7A, 0xB0) in colours  # the ok bars
