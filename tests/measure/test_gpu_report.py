"""The GPU report (``training.measure.gpu_report``): its budget and phases, the plan's sweep order and the dry run's
estimates, the torchtitan side's config and log parsing, the profile's reduction, the carried wheel list, and the
whole run in ``--smoke`` mode on this CPU (the same code path and the same files as on a GPU)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.training.runner import PYTHON, ROOT, env
from training.measure.gpu_report import (
    budget,
    cli,
    context,
    estimate,
    modes,
    profile_trial,
    sweep,
    titan,
    trials,
    wheels,
)

H100, H200 = modes.GPUS["H100"], modes.GPUS["H200"]


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_phase_runs_to_the_deadline_less_the_later_phases_shares_and_an_overrun_is_cut(monkeypatch):
    clock_time = FakeTime()
    monkeypatch.setattr(budget.time, "monotonic", clock_time)
    shares = [budget.Share("a", 100, ""), budget.Share("b", 200, ""), budget.Share("c", 100, "")]
    clock = budget.Clock(400, shares, age=10.0)  # the process started 10 s ago: its start counts
    assert clock.now() == 10.0
    first = clock.begin("a")
    assert first.allowed_end == 100.0  # 400 less b's and c's shares
    clock_time.now += 40
    assert clock.end().cut is False
    second = clock.begin("b")
    assert second.allowed_end == 300.0 and clock.phase_left() == 250.0  # a's unused 50 s flow on to b
    clock_time.now += 260
    assert clock.end().cut is True  # ended at 310 s, past its 300 s


def test_the_sweep_is_the_base_then_one_lever_at_a_time_then_a_probe_past_the_memory_edge():
    order = sweep.ordered(modes.GPU_MODE, H100)
    base = order[0]
    assert base.role == "base" and base.settings == {
        "batch_size": 2, "activation_checkpointing": "none", "compile": "true", "attention_backend": "cudnn"}  # fmt: skip
    levers = [c for c in order if c.role.startswith("lever")]
    assert {c.role for c in levers} == {"lever compile", "lever attention_backend", "lever activation_checkpointing",
                                        "lever batch_size"}  # fmt: skip
    for candidate in levers:  # each differs from the base in exactly one setting
        assert sum(candidate.settings[k] != base.settings[k] for k in sweep.LEVERS) == 1
    probes = [c for c in order if c.role.startswith("probe")]
    assert len(probes) == 1 and not probes[0].fits
    assert all(c.fits for c in order if not c.role.startswith("probe"))
    assert len({c.key() for c in order}) == len(order)
    # the H200's memory fits larger micro-batches: its base is larger, and still within the margin
    h200 = sweep.ordered(modes.GPU_MODE, H200)[0]
    assert h200.settings["batch_size"] > base.settings["batch_size"]
    assert h200.peak_gib <= sweep.BASE_MARGIN * h200.limit_gib


def test_calibration_replaces_the_assumed_start_up_and_scales_the_plans_step_time():
    candidate = sweep.ordered(modes.GPU_MODE, H100)[0]
    calibration = sweep.Calibration(modes.GPU_START_UP)
    assumed = calibration.seconds(candidate, 10)
    assert assumed == pytest.approx(
        modes.GPU_START_UP.trial + modes.GPU_START_UP.compile + 10 * candidate.step_seconds
    )
    eager = sweep.Candidate({**candidate.settings, "compile": "false"}, 1, 1, 2, candidate.step_seconds, 1.0)
    calibration.learn(eager, first_step=12.0, step_median=candidate.step_seconds / 4)
    calibration.learn(candidate, first_step=42.0, step_median=candidate.step_seconds / 4)
    assert calibration.seconds(candidate, 10) == pytest.approx(12.0 + 30.0 + 10 * candidate.step_seconds / 4)


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_the_dry_run_fits_eight_minutes_on_each_gpu_and_says_so(gpu, capsys):
    assert cli.main(["--dry-run", "--gpu", gpu]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"{gpu} (") and "total" in printed and "REFUSED" not in printed
    rows = estimate.phases(modes.GPU_MODE, modes.GPUS[gpu], modes.BUDGET_SECONDS)
    assert sum(r.expected for r in rows) <= modes.BUDGET_SECONDS and all(r.fits for r in rows)
    assert any("[base]" in c for c in rows[1].chosen)


def test_a_dry_run_over_its_budget_is_refused(capsys):
    assert cli.main(["--dry-run", "--gpu", "H100", "--budget-seconds", "120"]) == 2
    assert "REFUSED" in capsys.readouterr().out


def test_bad_arguments_and_a_machine_without_a_known_gpu_are_refused(capsys, monkeypatch):
    with pytest.raises(SystemExit):
        cli.parse_args([])  # neither --out nor --dry-run
    monkeypatch.setattr(cli, "find_gpu", lambda: (None, {"gpu": "NVIDIA A10G"}))
    assert cli.main(["--out", "x"]) == 2
    assert "NVIDIA A10G" in capsys.readouterr().err
    # an H100 without the carried wheels: refused before anything runs (every trial needs tensorboardX)
    monkeypatch.setattr(cli, "find_gpu", lambda: (H100, {"gpu": "NVIDIA H100 80GB HBM3"}))
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None)
    assert cli.main(["--out", "x", "--wheels", "/nonexistent"]) == 2
    assert "make gpu-wheels" in capsys.readouterr().err


def test_the_shares_cover_the_budget_once():
    assert sum(f for _, f, _ in modes.SHARES) == pytest.approx(1.0)
    assert [name for name, _, _ in modes.SHARES][-1] == "reserve"


def test_torchtitans_step_lines_are_parsed_and_its_config_is_toml():
    lines = [
        "[rank0]:[titan] 2026-11-27 12:00:00,000 - root - INFO - Model gpukit_llama3 run size: 1,498,482,688 total "
        "parameters",
        "[rank0]:[titan] ... - INFO - step:  1  loss: 12.01234  grad_norm:  3.2100  memory: 30.12GiB(38.05%)  "
        "tps: 4,321  tflops: 46.51  mfu: 4.70%",
        "[rank0]:[titan] ... - INFO - step:  2  loss: 11.50000  grad_norm:  2.0000  memory: 31.50GiB(39.82%)  "
        "tps: 35,000  tflops: 376.60  mfu: 38.08%",
    ]
    parsed = titan.parse_log(lines)
    assert parsed["parameters"] == 1_498_482_688
    assert [s["tps"] for s in parsed["steps"]] == [4321.0, 35000.0]
    assert parsed["steps"][1]["reserved_gib"] == 31.5 and parsed["steps"][1]["mfu_pct"] == 38.08
    text = titan.toml(titan.config(modes.GPU_MODE, {"batch_size": 2, "activation_checkpointing": "full"}, True,
                                   Path("/x")))  # fmt: skip
    assert '[compile]\nenable = true\ncomponents = ["model", "loss"]\n' in text
    assert 'custom_import = "training.measure.gpu_report.titan_spec"' in text and "seq_len = 8192" in text
    shape = json.loads(titan.shape_json(modes.GPU_MODE))
    assert (shape["hidden_size"], shape["num_kv_heads"], shape["ffn_hidden_size"]) == (2048, 8, 8192)


def test_the_profile_counts_overlapping_kernels_once_and_names_the_idle_share():
    from torch.autograd import DeviceType

    def event(name, start, end, device=DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                               self_cpu_time_total=0.0)  # fmt: skip

    events = [event("ProfilerStep*", 0, 100, DeviceType.CPU), event("sm90_xmma_gemm_bf16", 10, 50),
              event("cudnn_flash_fwd", 40, 60), event("ncclDevKernel_AllGather", 70, 80)]  # fmt: skip
    table = profile_trial.reduce(events, on_gpu=True)
    assert table["window_ms"] == pytest.approx(0.1)
    assert table["shares"] == pytest.approx(
        {"compute": 0.5, "communication": 0.1, "memory copy": 0.0, "idle": 0.4}
    )
    assert table["top"][0]["name"] == "sm90_xmma_gemm_bf16" and table["attention_kernels"] == [
        "cudnn_flash_fwd"
    ]


def test_the_carried_wheels_are_pinned_once_each_and_kept_out_of_git():
    names = [w.name.lower() for w in wheels.WHEELS]
    assert len(names) == len(set(names)) and "torchtitan" in names and "tensorboardx" in names
    assert all(w.version.count(".") >= 1 and w.why for w in wheels.WHEELS)
    assert "/.gpu-wheels/" in (ROOT / ".gitignore").read_text().splitlines()


EXPECTED_FILES = {
    "report.md",
    "rows.csv",
    "records.json",
    "logs.txt",
    "throughput.png",
    "memory.png",
    "numerics.png",
}


@pytest.mark.slow
def test_the_smoke_run_writes_every_file_of_the_report_through_the_same_path(tmp_path):
    """``--smoke``: one trial through the tuning driver, the profile, torchtitan's config (not run: CUDA only),
    the kernel checks and the convergence runs, then every file. A budget no loaded machine reaches, so the verdict
    never depends on its speed (the cut of a phase is tested above, on a fake clock)."""
    out = tmp_path / "report"
    done = subprocess.run([PYTHON, "-m", "training.measure.gpu_report", "--smoke", "--out", str(out),
                           "--max-trials", "1", "--budget-seconds", "3000"],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str(out.resolve())
    files = {p.name: p for p in out.iterdir()}
    assert set(files) == EXPECTED_FILES and all(p.stat().st_size < 16 * 2**20 for p in files.values())
    assert all(
        files[n].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in EXPECTED_FILES if n.endswith(".png")
    )
    records = json.loads(files["records.json"].read_text())
    [trial] = records["sweep"]
    assert trial["status"] == "ok" and trial["tokens_per_sec"] > 0 and trial["role"] == "base"
    assert trial["attention"] == "flash" and trial["step"]["steps"] == modes.SMOKE_MODE.measured_steps
    assert (
        records["profile"]["top"]
        and records["profile"]["steps_recorded"] == modes.SMOKE_MODE.profile_steps[1]
    )
    assert {r["backend"]: r["ran"] for r in records["kernel_checks"]["sdpa"]}["math"] is True
    assert records["convergence"]["comparison"]["passed"] is True
    [peer] = records["torchtitan"]
    assert peer["status"] == "not-run" and "CUDA" in peer["error"] and "torchtitan.train" in peer["command"]
    assert [p["phase"] for p in records["phases"]] == [
        "setup",
        "sweep",
        "profile",
        "torchtitan",
        "numerics",
        "report",
    ]
    assert not any(p["cut"] for p in records["phases"])
    text = files["report.md"].read_text()
    for heading in ("## Our trainer, tuned", "## torchtitan side by side", "## Where the time goes",
                    "## Numerics on this device", "## What one GPU cannot measure"):  # fmt: skip
        assert heading in text
    assert files["rows.csv"].read_text().splitlines()[0].startswith("source,trial,role,configuration,status")


def _context(tmp_path, gpu=H100):
    clock = budget.Clock(480, modes.GPU_MODE.phase_shares(480), age=0.0)
    return context.Context(
        modes.GPU_MODE, gpu, clock, tmp_path, tmp_path, sweep.Calibration(modes.GPU_START_UP)
    )


def test_a_gpu_trials_row_has_mfu_against_the_bf16_peak_and_the_plans_errors(tmp_path):
    from training.contract import shapes
    from training.tune.outcome import TrialResult
    from training.tune.stability import Spread

    candidate = sweep.ordered(modes.GPU_MODE, H100)[0]
    log = tmp_path / "trial.log"
    log.write_text(
        "levers activation_checkpointing=none compile=true attention=cudnn attention_priority=cudnn,flash\n"
    )
    result = TrialResult(1, dict(candidate.settings), status="ok", spread=Spread.of([0.5, 0.5, 0.52, 0.48]),
                         summary={"max_allocated_gb": 40.0, "max_reserved_gb": 50.0}, first_step_seconds=60.0,
                         log=str(log))  # fmt: skip
    row = trials.row_of(_context(tmp_path), candidate, result)
    tokens = 2 * 8192
    assert row["tokens_per_sec"] == pytest.approx(tokens / 0.5)
    flops = shapes.flops_per_token(shapes.MODEL_PRESETS["llama3.2-1b"], 8192)
    assert row["mfu"] == pytest.approx(tokens / 0.5 * flops / 989e12)
    assert row["peak_error_pct"] == pytest.approx(100 * (row["predicted_peak_gb"] - 50.0) / 50.0)
    assert row["tensors_error_pct"] == pytest.approx(100 * (row["predicted_tensors_gb"] - 40.0) / 40.0)
    assert (row["attention"], row["compile"]) == ("cudnn", "true")
    rows = [row, {**row, "compile": "false", "first_step_s": 20.0}]
    trials.compile_warmups(rows)
    assert rows[0]["compile_warmup_s"] == pytest.approx(40.0)


def test_a_torchtitan_run_is_measured_from_its_own_step_lines_and_set_against_ours(tmp_path):
    from training.tune.runner import Finished

    step = "[titan] - INFO - step: {n:2}  loss: 11.0  grad_norm: 1.0  memory: 40.00GiB(50.00%)  tps: {tps}  " \
           "tflops: 1.0  mfu: {mfu}%"  # fmt: skip
    lines = [step.format(n=n, tps=tps, mfu=mfu) for n, tps, mfu in
             ((1, "1,000", "1.00"), (2, "5,000", "30.00"), (3, "30,000", "30.00"), (4, "32,000", "32.00"),
              (5, "31,000", "31.00"), (6, "30,500", "30.50"), (7, "31,500", "31.50"), (8, "31,000", "31.00"))]  # fmt: skip
    settings = {"batch_size": 2, "activation_checkpointing": "none"}
    out = titan.measure(_context(tmp_path), settings, titan.parse_log(lines), Finished(0, False, lines, 50.0))
    assert out["status"] == "ok" and out["tokens_per_sec"] == 31_000  # the median after the 2 warm-up steps
    assert out["titan_mfu"] == pytest.approx(0.31) and out["max_reserved_gb"] == pytest.approx(
        40 * 2**30 / 1e9
    )
    assert out["step"]["steps"] == 6 and out["mfu"] > 0
    theirs = [{"configuration": "t", "settings": {**settings, "compile": "true"}, **out}]
    ours = [{"status": "ok", "tokens_per_sec": 34_100.0, "configuration": "o", "mfu": 0.3,
             "settings": {**settings, "compile": "true", "attention_backend": "cudnn"}}]  # fmt: skip
    [ratio] = titan.ratios(ours, theirs)
    assert ratio["ratio"] == pytest.approx(1.1) and ratio["ours"] == "o"
    failed = titan.measure(
        _context(tmp_path), settings, titan.parse_log([]), Finished(1, False, ["OSError: x"], 3.0)
    )
    assert failed["status"] == "failed" and "OSError" in failed["error"]


def test_an_sdpa_backend_with_a_nan_anywhere_fails_its_check(monkeypatch):
    """A NaN gradient after a finite output: ``max`` over the errors would skip it (every comparison with NaN is
    false) and pass the backend."""
    from training.measure.gpu_report import kernel_checks

    errors = iter([1e-3, float("nan"), 1e-3, 1e-3] * 8)  # out, dq, dk, dv of each backend that runs
    monkeypatch.setattr(kernel_checks, "relative", lambda x, ref: next(errors))
    rows = kernel_checks.sdpa_check("cpu", batch=1, heads=2, kv_heads=1, seq=16, head_dim=8)
    ran = [r for r in rows if r["ran"]]
    assert {r["backend"] for r in ran} >= {"math"}
    assert not any(r["passed"] for r in ran)


def test_a_report_file_that_cannot_be_rendered_says_why_and_the_others_are_still_written(tmp_path):
    """The report is rewritten after every step: a record this code did not foresee must not raise out of the
    phase (whose own end writes again) and end the run."""
    from training.measure.gpu_report import report

    ctx = _context(tmp_path)
    ctx.records["sweep"] = [{"source": "ours", "trial": 1, "role": "base", "configuration": "c", "status": "ok",
                             "settings": {"batch_size": 1}}]  # fmt: skip  # no predicted_peak_gb
    report.write(ctx)
    assert "report.md could not be rendered: KeyError" in (tmp_path / report.REPORT).read_text()
    assert json.loads((tmp_path / report.RECORDS).read_text())["sweep"][0]["configuration"] == "c"
    assert (tmp_path / report.ROWS).read_text().splitlines()[1].startswith("ours,1,base,c,ok")


def test_a_wheel_install_that_fails_to_finish_is_a_note_not_the_end_of_the_run(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "requirements.txt").write_text("tensorboardX==2.6.5\n")
    (wheels / "tensorboardx-2.6.5-py3-none-any.whl").write_bytes(b"")

    def slow(command, **kwargs):
        assert kwargs["timeout"] >= cli.INSTALL_SECONDS  # not the setup share's few seconds
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(cli.subprocess, "run", slow)
    ctx = _context(tmp_path)
    ctx.clock.begin("setup")
    note = cli.install_wheels(ctx, wheels)
    assert note.startswith("installing 1 wheels failed: TimeoutExpired") and ctx.site is None
