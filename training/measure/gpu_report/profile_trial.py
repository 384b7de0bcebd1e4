"""Where the time goes: the trainer's own run (``training.trainer.loop.run``, the settings of the fastest trial) under
``torch.profiler``, a few steps skipped and the next ones recorded, reduced to a table.

    python -m training.measure.gpu_report.profile_trial --json OUT.json --skip 2 --active 3 -- --batch_size 2 ...

The reduction: on a GPU the device's kernels (on a CPU, the ``aten::`` operators) of the recorded steps, grouped by
name (total time, calls, share of the window); the window is the recorded steps' span, from the first step's start
to the last kernel's end; compute, communication (NCCL kernels, or ``c10d``/gloo operators on a CPU) and memory
copies each as the share of the window some kernel of theirs was running (the union of their intervals: what
overlaps counts once), and idle as the share where nothing ran. The attention kernels seen are named (a check of
the kernel the trainer's probe reported). Writes one JSON file; prints the trainer's lines as it goes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ATTENTION_MARKS = ("flash", "cudnn", "fmha", "attention", "sdpa", "efficient")
TOP = 15


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals (microseconds in, microseconds out)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def category(name: str, on_gpu: bool) -> str:
    lowered = name.lower()
    if "nccl" in lowered or "c10d::" in lowered or "gloo" in lowered:
        return "communication"
    if lowered.startswith(("memcpy", "memset")) or "memcpy" in lowered:
        return "memory copy"
    return "compute"


def reduce(events: Sequence[Any], on_gpu: bool) -> dict[str, Any]:
    """The table (module doc) of a profiler's events."""
    from torch.autograd import DeviceType

    steps = [e for e in events if e.name.startswith("ProfilerStep")]
    if on_gpu:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    else:
        kernels = [
            e for e in events if e.device_type == DeviceType.CPU and e.name.startswith(("aten::", "c10d::"))
        ]
    if not kernels:
        return {"error": "the profiler recorded no kernels"}
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    start = min([s.time_range.start for s in steps] or [min(a for a, _ in spans)])
    stop = max([s.time_range.end for s in steps] + [b for _, b in spans])
    window = max(stop - start, 1e-9)
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        own = event.self_cpu_time_total if not on_gpu else event.time_range.end - event.time_range.start
        entry = by_name.setdefault(event.name, [0.0, 0])
        entry[0] += own
        entry[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP]
    shares = {
        name: union_length(
            span for e, span in zip(kernels, spans, strict=True) if category(e.name, on_gpu) == name
        )
        / window
        for name in ("compute", "communication", "memory copy")
    }
    busy = union_length(spans) / window
    return {
        "window_ms": window / 1e3,
        "steps_recorded": len(steps),
        "kernels": len(kernels),
        "top": [{"name": n, "ms": t / 1e3, "calls": int(c), "share": t / window} for n, (t, c) in top],
        "shares": {**shares, "idle": max(0.0, 1.0 - busy)},
        "attention_kernels": sorted({e.name for e in kernels if any(m in e.name.lower() for m in ATTENTION_MARKS)})[:10],
        "unit": "device kernels" if on_gpu else "aten operators (CPU)",
    }  # fmt: skip


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m training.measure.gpu_report.profile_trial")
    parser.add_argument("--json", required=True, help="where to write the table")
    parser.add_argument("--skip", type=int, default=2, help="steps before recording (warm-up)")
    parser.add_argument("--active", type=int, default=3, help="steps recorded")
    args, rest = parser.parse_known_args(argv)
    return args, [a for a in rest if a != "--"]


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    from training.contract import metric_lines
    from training.trainer import config, loop
    from training.trainer.distributed import parallel

    args, rest = parse_args(list(sys.argv[1:] if argv is None else argv))
    steps = args.skip + 1 + args.active
    cfg, _ = config.parse_args([*rest, "--max_steps", str(steps + 1), "--throughput_warmup_steps", "1"])
    env = parallel.init_distributed()
    on_gpu = env.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    plan = schedule(wait=args.skip, warmup=1, active=args.active, repeat=1)
    with profile(activities=activities, schedule=plan) as prof:

        def emit(line: str) -> None:
            print(line, flush=True)
            if metric_lines.parse_step_line(line) is not None:
                prof.step()

        summary = loop.run(cfg, env, emit=emit, final_save=False)
    table = reduce(prof.events(), on_gpu)
    table.update(
        device=torch.cuda.get_device_name(env.device) if on_gpu else "cpu",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        tokens_per_sec=summary.get("tokens_per_sec"),
        profiled_steps=args.active,
    )
    Path(args.json).write_text(json.dumps(table, indent=1, default=str) + "\n")
    print(
        f"profile: {table.get('kernels', 0)} kernels over {table.get('window_ms', 0):.1f} ms written to {args.json}"
    )
    dist.barrier(group=env.cpu_group)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
