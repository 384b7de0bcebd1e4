"""The peer, side by side: torchtitan's own training loop (``python -m torchtitan.train`` under ``torchrun``, the
carried torchtitan 0.2.2) on the same architecture (:mod:`titan_spec`), sequence length, micro-batch, activation
checkpointing and data as the sweep's base, bf16, compile on and then off, on the same GPU in the same run.

Each run is a fresh process tree with a hard limit at what is left of the phase (``training.tune.runner.run``). Its
row: tokens/s per GPU (the median of torchtitan's own per-step ``tps`` after the warm-up steps), its step times
(tokens per step over ``tps``), MFU by our formula (the same FLOPs per token and peak as our rows) next to
torchtitan's own ``mfu``, its reserved peak (torchtitan logs ``memory``: the max reserved GiB of each step), its
parameter count, and the time to its first step; then the ratio ours / torchtitan's for the matching trial.

On one GPU torchtitan does not shard (its ``ParallelDims`` enables FSDP only for more than one shard) and trains in
bf16 through autocast over fp32 weights; ours runs FSDP2 on a one-rank mesh. torchtitan's Llama keeps its output
layer apart from the embedding (the tied Llama 3.2 1B has one matrix): more parameters and optimizer work, the same
FLOPs per token. The report says both.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.contract import settings_parse, shapes
from training.measure.gpu_report.context import Context, say
from training.measure.gpu_report.modes import Mode
from training.measure.gpu_report.trials import GB_PER_GIB, KILL_MARGIN_SECONDS
from training.tune import runner
from training.tune.stability import Spread

VERSION = "0.2.2"
"""Released 2026-02-20 against the torch 2.11 nightlies (its release process pins the nightly it was tested on);
0.3.0 follows torch 2.13's."""
STEP = re.compile(
    r"step:\s*(\d+)\s+loss:\s*([-\d.naif]+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+).*?mfu:\s*([\d.]+)%"
)
SIZE = re.compile(r"size:\s*([\d,]+) total parameters")


def parse_log(lines: list[str]) -> dict[str, Any]:
    """torchtitan's step lines (``step: N  loss: ...  memory: X GiB(Y%)  tps: T  tflops: ...  mfu: M%``) and its
    parameter count."""
    steps, params = [], None
    for line in lines:
        match = STEP.search(line)
        if match:
            steps.append({"step": int(match.group(1)), "loss": float(match.group(2)),
                          "reserved_gib": float(match.group(3)), "tps": float(match.group(4).replace(",", "")),
                          "mfu_pct": float(match.group(5))})  # fmt: skip
            continue
        size = SIZE.search(line)
        if size:
            params = int(size.group(1).replace(",", ""))
    return {"steps": steps, "parameters": params}


def toml(config: Mapping[str, Mapping[str, Any]]) -> str:
    """TOML of sections of plain values (torchtitan's config file format)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list | tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    return "".join(f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in body.items()) + "\n"
                   for name, body in config.items())  # fmt: skip


def config(
    mode: Mode, settings: Mapping[str, Any], compiled: bool, folder: Path
) -> dict[str, dict[str, Any]]:
    """torchtitan's job config of one run (``settings``: the micro-batch and activation checkpointing)."""
    warmup, measured = mode.titan_steps
    return {
        "job": {"dump_folder": str(folder), "description": "gpu-report side by side"},
        "model": {"name": "gpukit_llama3", "flavor": "run", "hf_assets_path": str(folder)},
        "training": {"local_batch_size": int(settings["batch_size"]), "seq_len": mode.seq_length,
                     "steps": warmup + measured, "max_norm": 1.0, "mixed_precision_param": "bfloat16"},
        "optimizer": {"name": "AdamW", "lr": 3e-4, "eps": 1e-8, "weight_decay": 0.1, "implementation": "fused"},
        "lr_scheduler": {"warmup_steps": 2},
        "activation_checkpoint": {"mode": settings["activation_checkpointing"], "selective_ac_option": "op"},
        "compile": {"enable": compiled, "components": ["model", "loss"]},
        "metrics": {"log_freq": 1, "disable_color_printing": True, "enable_tensorboard": False},
        "checkpoint": {"enable": False},
        "parallelism": {"data_parallel_shard_degree": -1},
        "experimental": {"custom_import": "training.measure.gpu_report.titan_spec"},
        "debug": {"seed": 1234},
    }  # fmt: skip


def shape_json(mode: Mode) -> str:
    """The model's shape for :mod:`titan_spec` (``GPU_REPORT_TITAN_SHAPE``)."""
    values = settings_parse.parse_hyperparameters({**mode.model, "seq_length": mode.seq_length})
    shape = settings_parse.model_shape(values)
    return json.dumps({
        "hidden_size": shape.hidden_size, "num_layers": shape.num_layers, "num_heads": shape.num_heads,
        "num_kv_heads": shape.kv_heads, "ffn_hidden_size": shape.ffn_hidden_size, "vocab_size": shape.vocab_size,
        "norm_eps": values.get("rms_norm_eps") or shapes.NORM_EPS, "rope_theta": values["rope_theta"],
        "rope_scaling_factor": values.get("rope_scaling_factor"),
    })  # fmt: skip


def missing(ctx: Context) -> str | None:
    """Why torchtitan cannot run here (None: it can be tried)."""
    if not ctx.on_gpu:
        return ("torchtitan trains on CUDA only (its device is cuda unless another accelerator is found); on this "
                "CPU its config and command are written but not run")  # fmt: skip
    if ctx.site is None or not (ctx.site / "torchtitan").is_dir():
        return f"torchtitan {VERSION} is not installed: make gpu-wheels here, then carry .gpu-wheels to the GPU machine"
    return None


def run_one(ctx: Context, settings: Mapping[str, Any], compiled: bool) -> dict[str, Any]:
    name = f"torchtitan compile={'on' if compiled else 'off'}"
    folder = ctx.scratch / f"titan-{'compile' if compiled else 'eager'}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(toml(config(ctx.mode, settings, compiled, folder)))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               "-m", "torchtitan.train", "--job.config_file", str(folder / "job.toml")]  # fmt: skip
    row: dict[str, Any] = {"source": "torchtitan", "configuration": _describe(settings, compiled),
                           "settings": {**settings, "compile": "true" if compiled else "false"},
                           "command": " ".join(command), "version": VERSION}  # fmt: skip
    why = missing(ctx)
    need = ctx.mode.start_up.titan + (ctx.mode.start_up.compile if compiled else 0.0)
    left = ctx.clock.phase_left() - KILL_MARGIN_SECONDS
    if why is None and left < need:
        ctx.clock.current.cut = True  # type: ignore[union-attr]
        why = f"not started: {left:.0f} s left in the phase, {need:.0f} s needed"
    if why is not None:
        return {**row, "status": "not-run", "error": why}
    say(f"{name}: started, at most {left:.0f} s")
    env = dict(os.environ, **{"GPU_REPORT_TITAN_SHAPE": shape_json(ctx.mode), "HF_HUB_OFFLINE": "1"})
    started, first = time.monotonic(), []

    def echo(line: str) -> None:
        if not first and STEP.search(line):
            first.append(time.monotonic() - started)

    finished = runner.run(command, env=env, log_path=folder / "log.txt", timeout=left, echo=echo)
    ctx.append_log(name, folder / "log.txt")
    return {
        **row,
        **measure(ctx, settings, parse_log(finished.lines), finished),
        "first_step_s": first[0] if first else None,
    }


def measure(
    ctx: Context, settings: Mapping[str, Any], parsed: dict[str, Any], finished: runner.Finished
) -> dict:
    warmup, _ = ctx.mode.titan_steps
    timed = [s for s in parsed["steps"] if s["step"] > warmup]
    out: dict[str, Any] = {"parameters": parsed["parameters"], "seconds": finished.seconds,
                           "steps_logged": len(parsed["steps"])}  # fmt: skip
    if parsed["steps"]:
        out["max_reserved_gb"] = max(s["reserved_gib"] for s in parsed["steps"]) * GB_PER_GIB
        out["losses"] = [(s["step"], s["loss"]) for s in parsed["steps"]]
    if finished.timed_out:
        return {
            **out,
            "status": "timeout",
            "error": f"killed at the phase's end after {finished.seconds:.0f} s",
        }
    if finished.exit_code != 0 or not timed:
        error = next((line.strip() for line in reversed(finished.lines) if "Error" in line), None)
        return {**out, "status": "failed", "error": error or " | ".join(finished.lines[-3:]) or "no output"}
    tokens = int(settings["batch_size"]) * ctx.mode.seq_length
    tps = statistics.median(s["tps"] for s in timed)
    spread = Spread.of([tokens / s["tps"] for s in timed if s["tps"] > 0])
    out.update(
        status="ok",
        error=None,
        tokens_per_sec=tps,
        titan_mfu=statistics.median(s["mfu_pct"] for s in timed) / 100,
    )
    if spread is not None:
        out["step"] = spread.as_dict()
    if ctx.gpu is not None:
        flops = shapes.flops_per_token(ctx.mode.shape(), ctx.mode.seq_length)
        out["mfu"] = tps * flops / (ctx.gpu.bf16_peak_tflops * 1e12)
    return out


def _describe(settings: Mapping[str, Any], compiled: bool) -> str:
    return (f"batch_size={settings['batch_size']} activation_checkpointing={settings['activation_checkpointing']} "
            f"compile={'true' if compiled else 'false'} (torchtitan {VERSION})")  # fmt: skip


def run(ctx: Context, settings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Compile on, then off; each row added as it comes; the ratio to our matching trial on each."""
    rows: list[dict[str, Any]] = []
    for compiled in (True, False):
        if compiled and "true" not in ctx.mode.compile_values:
            continue
        row = run_one(ctx, settings, compiled)
        rows.append(row)
        ctx.records["torchtitan"] = rows
        say(f"{row['configuration']}: {row['status']}" + (f" ({row['error']})" if row.get("error") else "")
            + (f", {row['tokens_per_sec']:,.0f} tokens/s" if row.get("tokens_per_sec") else ""))  # fmt: skip
        ctx.write()
    return rows


def ratios(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours / torchtitan's tokens/s for each torchtitan row with an ``ok`` trial of ours at the same micro-batch,
    activation checkpointing and compile (the fastest such trial: ours ran cuDNN and Flash)."""
    out = []
    for row in theirs:
        keys = ("batch_size", "activation_checkpointing", "compile")
        same = [r for r in ours if r["status"] == "ok" and r.get("tokens_per_sec")
                and all(str(r["settings"][k]) == str(row["settings"][k]) for k in keys)]  # fmt: skip
        best = max(same, key=lambda r: r["tokens_per_sec"]) if same else None
        ratio = best["tokens_per_sec"] / row["tokens_per_sec"] if best and row.get("tokens_per_sec") else None
        out.append({"torchtitan": row["configuration"], "ours": best["configuration"] if best else None,
                    "ratio": ratio, "ours_mfu": best.get("mfu") if best else None, "torchtitan_mfu": row.get("mfu")})  # fmt: skip
    return out
