"""``python -m training.measure.gpu_report``: the command line, and the run from the first phase to the printed path.

    python -m training.measure.gpu_report --dry-run                 # expected time on H100 and H200, from the plan
    python -m training.measure.gpu_report --out gpu-report          # on one H100 or H200 (the carried wheels in .gpu-wheels)
    python -m training.measure.gpu_report --smoke --out /tmp/smoke  # on a CPU: tiny model, the same code path and files

Exit 0 once the report folder is written (whatever a phase measured or not), 2 for a refusal before anything runs
(bad arguments, no known GPU outside ``--smoke``, a dry run over the budget).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training.measure.gpu_report import charts, estimate, report, titan, trials, unmeasurable, workers
from training.measure.gpu_report.budget import Clock
from training.measure.gpu_report.context import Context, say
from training.measure.gpu_report.modes import GPUS, MODES, Gpu, Mode
from training.measure.gpu_report.sweep import Calibration, ordered
from training.tune import runner

DEFAULT_WHEELS = ".gpu-wheels"
INSTALL_SECONDS = 60.0
"""The longest the carried wheels' install may take (the setup's own share is a few seconds; a slow disk must not
make a timeout that loses every trial, which all need tensorboardX)."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.gpu_report", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", help="the report folder (a new one beside it when it holds files already)")
    parser.add_argument(
        "--smoke", action="store_true", help="CPU mode: a tiny model, the same code path and files"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the expected time per phase and exit")
    parser.add_argument(
        "--gpu", choices=sorted(GPUS), action="append", help="--dry-run: this GPU (default: all)"
    )
    parser.add_argument(
        "--budget-seconds", type=float, help="the whole run's wall-clock budget (default: the mode's)"
    )
    parser.add_argument(
        "--wheels", help=f"carried wheels to install first (default: {DEFAULT_WHEELS} on a GPU)"
    )
    parser.add_argument("--max-trials", type=int, help="at most this many trials in the sweep")
    args = parser.parse_args(argv)
    if not args.dry_run and not args.out:
        parser.error("--out is required (or --dry-run)")
    if args.budget_seconds is not None and not 30 <= args.budget_seconds <= 86_400:
        parser.error("--budget-seconds: must be between 30 and 86400")
    if args.max_trials is not None and args.max_trials < 1:
        parser.error("--max-trials: must be at least 1")
    return args


def dry_run(mode: Mode, gpus: Sequence[str], budget: float) -> int:
    fits = True
    for name in gpus:
        text, ok = estimate.render(mode, GPUS[name], budget)
        print(
            text + ("" if ok else "\nREFUSED: over the budget, or a phase cannot hold its first step") + "\n"
        )
        fits = fits and ok
    return 0 if fits else 2


def find_gpu() -> tuple[Gpu | None, dict[str, Any]]:
    """The GPU (``nvidia-smi``: name, memory, driver), or None without one."""
    if shutil.which("nvidia-smi") is None:
        return None, {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    except (subprocess.SubprocessError, OSError):
        return None, {}
    first = out.strip().splitlines()[0] if out.strip() else ""
    name, memory, driver = ([p.strip() for p in first.split(",")] + ["", "", ""])[:3]
    known = next((g for key, g in GPUS.items() if key in name.upper()), None)
    return known, {"gpu": name, "gpu_memory": memory, "driver": driver, "gpus": len(out.strip().splitlines())}


def report_folder(wanted: Path) -> Path:
    """``wanted``, or ``wanted-2``, ``wanted-3``... when it holds files: an earlier report is never written over."""
    for number in range(1, 1000):
        folder = wanted if number == 1 else wanted.with_name(f"{wanted.name}-{number}")
        if not folder.exists() or not any(folder.iterdir()):
            folder.mkdir(parents=True, exist_ok=True)
            return folder
    raise SystemExit(f"{wanted}: 999 reports already; choose another --out")


def missing_wheels(wheels: Path | None) -> str | None:
    """Why the run cannot start without carried wheels (None: they are there, or this Python has what they hold):
    every trial of our trainer writes TensorBoard events (tensorboardX), which the GPU machine lacks."""
    if wheels is not None and (wheels / "requirements.txt").is_file():
        return None
    if importlib.util.find_spec("tensorboardX") is not None:
        return None
    return (
        f"no carried wheels in {wheels} and no tensorboardX here: every trial would fail. Run `make gpu-wheels` "
        f"on a machine with PyPI and carry {DEFAULT_WHEELS} (docs/measurements.md, Running it on a GPU machine)"
    )


def install_wheels(ctx: Context, wheels: Path | None) -> str:
    """The carried wheels into a folder of their own (no network, no dependencies resolved: the list is complete,
    ``make gpu-wheels`` proves it), put on every child's path."""
    listed = wheels / "requirements.txt" if wheels else None
    found = sorted(wheels.glob("*.whl")) if wheels and wheels.is_dir() else []
    if not found or listed is None or not listed.is_file():
        return f"no carried wheels in {wheels}" if wheels else "no carried wheels asked for"
    site = ctx.scratch / "site"
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--find-links", str(wheels), "--target", str(site), "-r", str(listed)]  # fmt: skip
    started = time.monotonic()
    try:  # past the setup's few seconds if need be: every trial needs them (tensorboardX), the sweep's time pays
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=max(INSTALL_SECONDS, ctx.clock.phase_left()))  # fmt: skip
    except (subprocess.TimeoutExpired, OSError) as error:
        return f"installing {len(found)} wheels failed: {type(error).__name__}: {error}"
    if done.returncode != 0:
        return f"installing {len(found)} wheels failed: {done.stderr.strip()[-300:]}"
    ctx.site = site
    return f"{len(found)} carried wheels installed in {time.monotonic() - started:.1f} s"


def setup(ctx: Context, wheels: Path | None, found: dict[str, Any]) -> None:
    ctx.clock.begin("setup")
    versions = {name: _version(name) for name in ("torch", "triton", "transformers", "numpy", "matplotlib")}
    ctx.records["where"] = {**found, "gpu": found.get("gpu") if ctx.gpu else None, "torch": versions["torch"],
                            "versions": versions, "host": socket.gethostname(), "python": sys.version.split()[0],
                            "date": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
    note = install_wheels(ctx, wheels)
    ctx.prepare_environment()
    say(note)
    estimate_text, _ = estimate.render(ctx.mode, ctx.plan_gpu, ctx.clock.budget)
    ctx.records["plan"] = {"dry_run": estimate_text.splitlines(), "order": [c.describe() + f" [{c.role}]"
                           for c in ordered(ctx.mode, ctx.plan_gpu)]}  # fmt: skip
    ctx.records["unmeasurable"] = unmeasurable.items()
    ctx.write()
    ctx.clock.end(note=note)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def phase(ctx: Context, name: str, body) -> None:
    """Run one phase; an error in it is reported and the next phase runs (the run is never lost whole)."""
    ctx.clock.begin(name)
    say(f"phase {name}: until {ctx.clock.current.allowed_end:.0f} s (now {ctx.clock.now():.0f} s)")  # type: ignore[union-attr]
    try:
        body()
        ctx.clock.end()
    except Exception as error:  # noqa: BLE001 - one phase's failure must not cost the others' measurements
        say(f"phase {name} failed: {type(error).__name__}: {error}")
        ctx.clock.end(note=f"error: {type(error).__name__}: {error}")
    ctx.write()


def run(ctx: Context, wheels: Path | None, found: dict[str, Any]) -> None:
    setup(ctx, wheels, found)
    phase(ctx, "sweep", lambda: trials.run(ctx))

    def chosen() -> dict[str, Any]:
        best = trials.fastest(ctx.records.get("sweep", []))
        order = ordered(ctx.mode, ctx.plan_gpu)
        return dict(best["settings"]) if best else dict(order[0].settings) if order else {}

    phase(ctx, "profile", lambda: workers.profile(ctx, chosen()))

    def side_by_side() -> None:
        order = ordered(ctx.mode, ctx.plan_gpu)
        if order:
            titan.run(ctx, order[0].settings)
            ctx.records["ratios"] = titan.ratios(
                ctx.records.get("sweep", []), ctx.records.get("torchtitan", [])
            )

    phase(ctx, "torchtitan", side_by_side)
    phase(ctx, "numerics", lambda: workers.numerics(ctx))
    ctx.clock.begin("report")
    problems = charts.draw(ctx)
    ctx.records["calibration"] = {"starts_s": ctx.calibration.starts, "compiles_s": ctx.calibration.compiles,
                                  "measured_over_plan_step": ctx.calibration.ratios}  # fmt: skip
    ctx.clock.end(note="; ".join(problems) or None)
    ctx.write()


def on_sigterm(ctx: Context):
    """Stopped from outside: kill what runs (the current trial's tree), write what there is, exit."""

    def handle(signum: int, frame: Any) -> None:
        for pid in runner.descendants(os.getpid()):
            runner.kill_tree(pid)
        if ctx.clock.current is not None:
            ctx.clock.end(cut=True, note="stopped by SIGTERM")
        ctx.write()
        say(f"stopped by SIGTERM; the report so far is in {ctx.out}")
        raise SystemExit(143)

    return handle


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    mode = MODES["smoke" if args.smoke else "gpu"]
    budget = args.budget_seconds or mode.budget
    if args.dry_run:
        return dry_run(mode, args.gpu or sorted(GPUS), budget)
    gpu, found = find_gpu()
    if gpu is None and not args.smoke:
        what = found.get("gpu") or "no NVIDIA GPU (nvidia-smi found none)"
        print(f"error: gpu-report measures one H100 or H200; this machine has {what}. Use --smoke on a CPU, or "
              "--dry-run", file=sys.stderr)  # fmt: skip
        return 2
    wheels = Path(args.wheels) if args.wheels else (None if args.smoke else Path(DEFAULT_WHEELS))
    problem = None if args.smoke else missing_wheels(wheels)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    clock = Clock(budget, mode.phase_shares(budget))
    out = report_folder(Path(args.out))
    scratch = Path(tempfile.mkdtemp(prefix="gpu-report-"))
    ctx = Context(mode, None if args.smoke else gpu, clock, out, scratch, Calibration(mode.start_up),
                  max_trials=args.max_trials, writer=report.write)  # fmt: skip
    runner.become_subreaper()
    signal.signal(signal.SIGTERM, on_sigterm(ctx))
    say(f"mode {mode.name}, {gpu.name if ctx.gpu else 'CPU'}, budget {budget:.0f} s; report in {out}")
    try:
        run(ctx, wheels, found)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    say(f"done in {clock.now():.0f} s of {budget:.0f} s")
    print(out.resolve())
    return 0
