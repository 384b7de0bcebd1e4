"""``blackwell-training curves`` and the sparkline of ``result``: the curve of a run across its launches (pure, from
records), and the command against the stack in moto with runs whose logs are in moto's CloudWatch Logs."""

from __future__ import annotations

import json
import sys
import time

import pytest
from PIL import Image

from constructs_lib.cli.curves import curve_of
from constructs_lib.cli.plots import SPARK_BARS, sparkline
from constructs_lib.cli.records import Job, LogEvent
from tests.cli.conftest import LOG_GROUP
from tests.workflow.harness import Outcome
from training.contract.metric_lines import (
    format_config_line,
    format_step_line,
    format_summary_line,
    format_validation_line,
)

B200_PER_HOUR = 113.93
MINUTE = 60_000
CONFIG = {"batch_size": 8, "seq_length": 1024, "world_size": 8, "max_steps": 50}
TOKENS_PER_STEP = 8 * 1024 * 8


def _step(step: int, loss: float, tokens_per_sec: float = 50_000.0) -> str:
    return format_step_line(step, {"loss": loss, "lr": 3e-4, "tokens_per_sec": tokens_per_sec}, 50)


def _events(job: str, start_ms: int, lines: list[str]) -> list[LogEvent]:
    return [LogEvent(f"{job}/algo-1-1763887200", start_ms + i * MINUTE, line) for i, line in enumerate(lines)]


FIRST = [
    format_config_line(CONFIG),
    _step(10, 4.0),
    _step(20, 3.0),
    format_validation_line(20, 50, 3.2),
    _step(30, 2.5),
    _step(40, 2.2),
]
SECOND = [
    format_config_line(CONFIG),
    _step(30, 2.6),
    _step(40, 2.3),
    _step(50, 2.0),
    format_validation_line(50, 50, 2.1),
]


def _two_launches(capacity: str = "on-demand"):
    jobs = [
        Job("j-1", instance_type="ml.p6-b200.48xlarge", capacity=capacity),
        Job("j-2", instance_type="ml.p6-b200.48xlarge", capacity=capacity),
    ]
    return [(jobs[0], _events("j-1", 0, FIRST)), (jobs[1], _events("j-2", 10 * 3_600_000, SECOND))]


def test_a_relaunch_continues_the_curve_and_replaces_the_steps_it_trained_again():
    curve = curve_of("run-a", _two_launches())
    assert curve.launches == 2
    assert [(p.step, p.launch, p.values["loss"]) for p in curve.train] == [
        (10, 1, 4.0), (20, 1, 3.0), (30, 2, 2.6), (40, 2, 2.3), (50, 2, 2.0),
    ]  # fmt: skip
    assert [(p.step, p.values["val_loss"]) for p in curve.validation] == [(20, 3.2), (50, 2.1)]
    assert [p.tokens for p in curve.train] == [s * TOKENS_PER_STEP for s in (10, 20, 30, 40, 50)]
    # hours: launch 1 took 5 minutes of log time (config line to step 40); launch 2 starts there, not 10 h later
    assert [round(p.hours * 60, 6) for p in curve.train] == [1, 2, 5 + 1, 5 + 2, 5 + 3]
    for point in curve.train:
        assert point.cost == pytest.approx(point.hours * B200_PER_HOUR)
    assert curve.series("loss", "tokens") == (
        [s * TOKENS_PER_STEP for s in (10, 20, 30, 40, 50)],
        [4.0, 3.0, 2.6, 2.3, 2.0],
    )
    assert not curve.missing("cost")


def test_a_training_plan_run_has_no_cost_axis_and_lines_of_other_hosts_are_left_out():
    launches = _two_launches(capacity="training plan")
    launches[0] = (launches[0][0], [*launches[0][1], LogEvent("j-1/algo-2-1", 99, "worker ready")])
    curve = curve_of("run-b", launches)
    assert curve.missing("cost") and not curve.missing("hours")
    assert curve.series("loss", "cost") == ([], [])
    assert len(curve.train) == 5


def test_without_a_config_line_tokens_come_from_the_hyperparameters_and_the_instance_type():
    job = Job(
        "j",
        instance_type="ml.p6-b200.48xlarge",
        instance_count=2,
        hyperparameters={"batch_size": "4", "seq_length": "2048"},
    )
    curve = curve_of("run-c", [(job, _events("j", 0, [_step(10, 3.0)]))])
    assert curve.train[0].tokens == 10 * 4 * 2048 * 16


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([4.0, 3.0, 2.0, 1.0], SPARK_BARS[-1] + "▆▃" + SPARK_BARS[0]),
        ([2.0, 2.0], SPARK_BARS[3] * 2),
        ([], ""),
        ([float("nan")], ""),
    ],
)
def test_sparkline(values, expected):
    assert sparkline(values) == expected


def test_a_long_sparkline_is_resampled_to_its_width():
    line = sparkline([float(v) for v in range(1000, 0, -1)], width=24)
    assert len(line) == 24 and line[0] == SPARK_BARS[-1] and line[-1] == SPARK_BARS[0]


# ---- against the stack in moto ------------------------------------------------------------------------------------


def _log(deployed, job: str, start_ms: int, lines: list[str]) -> None:
    stream = f"{job}/algo-1-1763887200"
    if stream not in deployed.streams:
        deployed.logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
        deployed.streams.add(stream)
    events = [{"timestamp": start_ms + i * MINUTE, "message": line} for i, line in enumerate(lines)]
    deployed.logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=events)


def _wait_for_new_job(deployed, prefix: str, known: set[str], timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while not (new := set(deployed.workflow.jobs(prefix)) - known):
        assert time.monotonic() < deadline, f"no new job {prefix}-*"
        time.sleep(0.05)
    (job,) = new
    return job


@pytest.fixture(scope="module")
def two_runs(deployed):
    """Run ``one``: one launch, loss 4.0 -> 1.0; run ``two``: a capacity failure after step 40, relaunched, resumed
    at step 30, loss 5.0 -> 2.0 (both with val_loss lines)."""
    start = int(time.time() * 1000) - 3 * 3_600_000
    names = []
    for index, loss0 in enumerate((4.0, 5.0)):
        prefix = deployed.prefix()
        name = f"curve-{prefix}"
        names.append(name)
        if index == 0:
            deployed.plan(prefix, Outcome("InProgress"))
        else:
            deployed.plan(prefix, Outcome("InProgress"), Outcome("InProgress"))
        deployed.workflow.sfn.start_execution(
            stateMachineArn=deployed.workflow.arn, name=name, input=json.dumps({"job_name_prefix": prefix})
        )
        first = deployed.wait_for_job(prefix)
        losses = {s: loss0 - 3.0 * s / 50 for s in range(5, 55, 5)}
        lines = [format_config_line(CONFIG)]
        for s in range(5, 55 if index == 0 else 45, 5):
            lines.append(_step(s, losses[s], 50_000.0 + 1000 * index))
            if s % 20 == 0:
                lines.append(format_validation_line(s, 50, losses[s] + 0.1))
        _log(deployed, first, start, lines)
        if index == 0:
            _log(
                deployed,
                first,
                start + len(lines) * MINUTE,
                [format_summary_line({"steps": 50, "final_loss": losses[50]})],
            )
            deployed.finish(first)
        else:
            deployed.finish(
                first, "Failed", reason="CapacityError: Unable to provision requested ML compute capacity"
            )
            second = _wait_for_new_job(deployed, prefix, {first})
            resumed = [format_config_line(CONFIG)] + [
                _step(s, losses[s] + 0.05, 51_000.0) for s in range(35, 55, 5)
            ]
            resumed += [
                format_validation_line(50, 50, losses[50] + 0.1),
                format_summary_line({"steps": 50, "final_loss": losses[50] + 0.05}),
            ]
            _log(deployed, second, start + 3_600_000, resumed)
            deployed.finish(second)
        deployed.wait_until_ended(name)
    return names


def test_curves_json_gives_every_point_of_every_launch(two_runs, cli):
    one, two = two_runs
    result = cli("curves", one, two, "--json", "--x", "tokens")
    assert result.status == 0, result.err
    data = json.loads(result.out)
    assert data["x"] == "tokens"
    first, second = data["runs"]
    assert (first["name"], first["launches"], second["name"], second["launches"]) == (one, 1, two, 2)
    assert [p["step"] for p in second["train"]] == list(range(5, 55, 5))
    assert [p["launch"] for p in second["train"]] == [1] * 6 + [2] * 4
    assert [p["step"] for p in second["validation"]] == [20, 50]
    assert second["train"][-1]["tokens"] == 50 * TOKENS_PER_STEP
    assert second["train"][-1]["loss"] == pytest.approx(2.05)


def test_curves_png_compares_two_runs(two_runs, cli, tmp_path):
    out = tmp_path / "compare.png"
    result = cli("curves", *two_runs, "--out", str(out), "--x", "hours")
    assert result.status == 0, result.err
    assert result.out.strip() == f"wrote {out}"
    image = Image.open(out).convert("RGB")
    assert image.size == (1000, 700)
    counts = {colour: n for n, colour in image.getcolors(maxcolors=1_000_000)}
    assert len(counts) > 50, "a blank or near-blank picture"
    # matplotlib's first two cycle colours, one per run: both drawn, in many pixels each
    for colour in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        assert counts.get(colour, 0) > 500, colour
    assert counts.get((0x2C, 0xA0, 0x2C), 0) == 0  # no third series

    again = cli("curves", *two_runs, "--out", str(out))
    assert again.status == 3 and "already exists" in again.err
    bad = cli("curves", two_runs[0], "--out", str(tmp_path / "x.svg"))
    assert bad.status == 3 and "--out: must name a .png file" in bad.err


def test_curves_in_the_terminal_and_the_sparkline_of_result(two_runs, cli):
    one, two = two_runs
    result = cli("curves", one, two)
    assert result.status == 0, result.err
    assert f"{one} loss" in result.out and f"{two} val_loss" in result.out
    assert any("\u2800" < ch <= "\u28ff" for ch in result.out)  # braille dots of the lines
    summary = cli("result", one).out
    row = next(line for line in summary.splitlines() if "trainer final_loss" in line)
    assert "1  " in row and SPARK_BARS[-1] in row and SPARK_BARS[0] in row


def test_curves_of_an_unknown_run_is_one_line(two_runs, cli):
    result = cli("curves", two_runs[0], "no-such-run")
    assert result.status == 3 and result.err.startswith("error: unknown run no-such-run")


def test_curves_without_the_charts_extra_says_how_to_install_it(two_runs, cli, tmp_path, monkeypatch):
    """`make synth` does not install matplotlib and plotext (the charts extra): curves says so in one line."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "plotext", None)
    for args in (["--out", str(tmp_path / "c.png")], []):
        result = cli("curves", two_runs[0], *args)
        assert result.status == 3, result.err
        (line,) = result.err.strip().splitlines()
        assert "not installed" in line and ".[charts]" in line and "make local" in line
    assert not (tmp_path / "c.png").exists()
