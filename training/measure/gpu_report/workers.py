"""The profile and numerics phases: each step a fresh process (``training.tune.runner.run``: its own session, a
hard timeout at what is left of the phase, its whole tree killed after it), its log kept in the report's log file.

* profile: :mod:`profile_trial` with the fastest trial's settings (the sweep's base when none ran);
* numerics: :mod:`kernel_checks` (chunked loss, SDPA backends), then the tuner's convergence runs
  (``training.tune.driver.run_trial`` with ``convergence``: fixed steps, the same seed, weights and data) in fp32
  and bf16 on a small model of the mode (``modes.Mode.numerics_model``), compared by the tuner's own rule
  (``training.tune.convergence.compare``, fp32 the reference).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from training.contract import settings_parse
from training.measure.gpu_report.context import Context, say, tail
from training.measure.gpu_report.trials import KILL_MARGIN_SECONDS, base_settings, job_for
from training.tune import convergence, driver, runner


def run_worker(
    ctx: Context, name: str, module: str, args: Sequence[str], need: float
) -> tuple[dict | None, str]:
    """Run ``python -m module args`` (its JSON result at ``--json``) within the phase; the result or None, and
    what happened, in words."""
    left = ctx.clock.phase_left() - KILL_MARGIN_SECONDS
    if left < need:
        ctx.clock.current.cut = True  # type: ignore[union-attr]
        return None, f"not started: {left:.0f} s left in the phase, {need:.0f} s needed"
    output = ctx.scratch / f"{name}.json"
    log = ctx.scratch / f"{name}.log"
    command = [sys.executable, "-m", module, "--json", str(output), *args]
    say(f"{name}: started, at most {left:.0f} s")
    finished = runner.run(command, env=dict(os.environ), log_path=log, timeout=left)
    ctx.append_log(name, log)
    if finished.timed_out:
        ctx.clock.current.cut = True  # type: ignore[union-attr]
        return (
            None,
            f"killed at the phase's end after {finished.seconds:.0f} s (last lines in {ctx.out.name}/logs.txt)",
        )
    if finished.exit_code != 0 or not output.is_file():
        return None, f"failed (exit {finished.exit_code}): " + " | ".join(tail(log, 3))
    return json.loads(output.read_text()), f"ran in {finished.seconds:.0f} s"


def profile(ctx: Context, settings: Mapping[str, Any]) -> None:
    """The profile phase: ``settings`` (a trial's) under torch.profiler."""
    skip, active = ctx.mode.profile_steps
    merged = {**base_settings(ctx), **settings, "log_interval": 1, "checkpoint_interval": 0,
              "checkpoint_dir": str(ctx.scratch / "profile-checkpoints"), "model_dir": str(ctx.scratch / "profile-model")}  # fmt: skip
    args = ["--skip", str(skip), "--active", str(active), "--"]
    for key, value in merged.items():
        args += [f"--{key}", settings_parse.format_setting(value)]
    need = ctx.mode.start_up.worker + (
        ctx.mode.start_up.compile / 3 if settings.get("compile") == "true" else 0
    )
    table, what = run_worker(ctx, "profile", "training.measure.gpu_report.profile_trial", args, need)
    ctx.records["profile"] = {"settings": dict(settings), "status": what, **(table or {})}
    say(f"profile: {what}")
    ctx.write()


def numerics(ctx: Context) -> None:
    """The numerics phase (the module's doc)."""
    checks = {**ctx.mode.loss_check, **ctx.mode.sdpa_check}
    args: list[str] = []
    for key, value in checks.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    result, what = run_worker(ctx, "kernel-checks", "training.measure.gpu_report.kernel_checks", args,
                              ctx.mode.start_up.worker)  # fmt: skip
    ctx.records["kernel_checks"] = {"status": what, **(result or {})}
    say(f"kernel checks: {what}")
    ctx.write()
    ctx.records["convergence"] = converge(ctx)
    ctx.write()


def converge(ctx: Context) -> dict[str, Any]:
    """fp32 then bf16 from the same seed, weights and data; the tuner's comparison of the two loss curves."""
    mode = ctx.mode
    job = job_for({**mode.base_settings, **mode.numerics_model}, warmup=2, measured=3)
    job.options["tune_convergence_steps"] = mode.numerics_steps
    runs: dict[str, Any] = {}
    for precision in ("fp32", "bf16"):
        left = ctx.clock.phase_left() - KILL_MARGIN_SECONDS
        if left < mode.start_up.trial:
            ctx.clock.current.cut = True  # type: ignore[union-attr]
            runs[precision] = {"status": "not-run", "error": f"{left:.0f} s left in the phase"}
            continue
        job.options["tune_convergence_timeout_seconds"] = max(5, int(left))
        say(f"convergence run {precision}: {mode.numerics_steps} steps, at most {left:.0f} s")
        result = driver.run_trial(job, 100 + len(runs), {"precision": precision}, ctx.scratch / "numerics",
                                  convergence=True)  # fmt: skip
        ctx.append_log(f"convergence {precision}", result.log)
        if result.status == "timeout":
            ctx.clock.current.cut = True  # type: ignore[union-attr]
        runs[precision] = {"status": result.status, "error": result.error, "losses": result.losses,
                           "seconds": result.seconds, "step": result.spread.as_dict() if result.spread else None}  # fmt: skip
    out: dict[str, Any] = {"model": dict(mode.numerics_model), "steps": mode.numerics_steps, "runs": runs,
                           "rule": "training.tune.convergence.compare (Megatron-Bridge's defaults), fp32 the reference"}  # fmt: skip
    fp32, bf16 = runs.get("fp32", {}), runs.get("bf16", {})
    if fp32.get("losses") and bf16.get("losses"):
        out["comparison"] = convergence.compare("bf16", bf16["losses"], "fp32", fp32["losses"]).as_dict()
    else:
        out["comparison"] = {"passed": False, "why": "not compared: "
                             + "; ".join(f"{p} {r.get('status')} ({r.get('error')})" for p, r in runs.items())}  # fmt: skip
    say(f"convergence bf16 against fp32: {out['comparison'].get('why')}")
    return out
