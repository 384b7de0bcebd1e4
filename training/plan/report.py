"""Know before paying: one request's per-GPU peak memory by part, its time and its cost, in closed form.

The plan in words: the throughput line, the plain text of a whole plan, and the command line
that prints it (``python -m training.plan RUN.json [--json]``; the first line above is its description).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from training.contract import metric_lines
from training.plan import checkpoint_time
from training.plan.estimate import Plan, make_plan


def throughput_line(d: Mapping[str, Any]) -> str:
    """The plan's throughput, step, run and cost (of :meth:`Plan.to_dict`), with an estimate's low-high spread
    after each figure and its assumptions after its source."""
    band = d.get("throughput_spread")

    def between(key: str, text: Any) -> str:
        return "" if band is None or band[key] is None else f" ({text(band[key][0])}-{text(band[key][1])})"

    cost = (
        "unknown (no price)"
        if d["cost_usd"] is None
        else f"${d['cost_usd']:,.2f}{between('cost_usd', lambda v: f'${v:,.2f}')}{instances_text(d)} (prices of "
        f"{d['price_source']})"
    )
    source = d["throughput_source"] + (f"; {band['assumptions']}" if band else "")
    return (
        f"throughput ~{d['tokens_per_sec_per_gpu']:,}{between('tokens_per_sec_per_gpu', lambda v: f'{v:,}')} "
        f"tokens/s per GPU ({d['throughput_basis']}: {source}), step {d['step_seconds']:.3f} s"
        f"{between('step_seconds', lambda v: f'{v:.3f}')}, run {metric_lines.format_duration(d['run_seconds'])}"
        f"{between('run_seconds', metric_lines.format_duration)}, cost {cost}"
    )


def instances_text(d: Mapping[str, Any]) -> str:
    """`` for 2 x ml.p6-b200.48xlarge``: what the time and cost are of (every instance of the job)."""
    return f" for {d['instance_count']} x {d['instance_type']}" if d.get("instance_type") else ""


def network_line(d: Mapping[str, Any]) -> str | None:
    """The plan's network line (of :meth:`Plan.to_dict`): the step's bytes and time on this layout, or why there
    is no estimate (``network_note``); None for one GPU."""
    n = d.get("network")
    if n:
        return (
            f"network per step ({n['layout']}): {n['efa_gb_per_instance']:.1f} GB per instance over EFA, "
            f"{n['nvlink_gb_per_gpu']:.1f} GB per GPU over NVLink; busy {n['busy_seconds']:.3f} s, exposed "
            f"{n['exposed_seconds']:.3f} s ({100 * n['share']:.1f}% of the step; links: {n['source']})"
        )
    return f"network per step: {d['network_note']}" if d.get("network_note") else None


def format_plan(plan: Plan) -> str:
    """The plan as plain text (the operator CLI draws its own rich table from :meth:`Plan.to_dict`)."""
    d = plan.to_dict()
    lines = [
        f"peak {d['peak_gib']:.2f} GiB per GPU (at {d['moment']}), limit {d['limit_gib']:.2f} GiB: "
        + ("fits" if d["fits"] else "DOES NOT FIT")
    ]
    for name, gib in sorted(d["parts_gib"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:<40} {gib:9.3f} GiB")
    lines.append(
        f"  {'allowance (context, workspaces, NCCL, fragmentation)':<40} {d['allowance_gib']:9.3f} GiB"
    )
    lines.append(throughput_line(d))
    net = network_line(d)
    if net:
        lines.append(net)
    if d.get("step"):
        lines.append(f"step: {d['step']['summary']}")
    if d.get("data"):
        lines.append(f"data: {d['data']['summary']}")
    if d.get("preference"):
        lines.append(f"preference tuning (dpo): {d['preference']['summary']}")
    if d.get("checkpoint"):
        lines.append(checkpoint_time.line(d["checkpoint"]))
    if d["warning"]:
        lines.append(f"warning: {d['warning']}")
    if d["advice"]:
        lines.append("fits with: " + "; ".join(d["advice"]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="the execution input (JSON file; - for standard input)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        request = json.loads(text)
        if not isinstance(request, dict):
            raise ValueError("the execution input must be a JSON object")
        plan = make_plan(request)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
