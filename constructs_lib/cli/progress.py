"""The trainer's progress (step N of M, loss, tokens/s, MFU, ETA), read from its log lines.

The lines are the contract's (``training/contract/``: ``config ...``, ``step=N ...``, ``summary ...``), parsed
with the contract's own parsers, so the CLI and the trainer cannot disagree on a format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training.contract.metric_lines import parse_config_line, parse_step_line, parse_summary_line
from training.contract.settings_parse import parse_hyperparameters
from training.contract.settings_table import HYPERPARAMETERS_BY_NAME, ContractError


@dataclass
class Progress:
    """What the trainer has said so far. ``max_steps`` comes from its ``config`` line, or, before that line, from
    the job's hyperparameters (:meth:`expect`)."""

    step: int | None = None
    max_steps: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    summary: dict[str, float] | None = None
    lines: int = 0

    def expect(self, hyperparameters: Mapping[str, str]) -> None:
        """Take ``max_steps`` from the job's ``HyperParameters`` (with the contract's default) unless the trainer
        already said it."""
        if self.max_steps is not None:
            return
        try:
            self.max_steps = int(parse_hyperparameters(hyperparameters)["max_steps"])
        except (ContractError, KeyError, TypeError, ValueError):
            raw = hyperparameters.get("max_steps", HYPERPARAMETERS_BY_NAME["max_steps"].default)
            self.max_steps = int(raw) if str(raw).isdigit() else None

    def feed(self, message: str) -> bool:
        """Read one log line; True when it changed the progress."""
        self.lines += 1
        step = parse_step_line(message)
        if step is not None:
            self.step, self.metrics = step[0], {**self.metrics, **step[1]}
            return True
        summary = parse_summary_line(message)
        if summary is not None:
            self.summary = summary
            if "steps" in summary:
                self.step = int(summary["steps"])
            return True
        config = parse_config_line(message)
        if config is not None and str(config.get("max_steps", "")).isdigit():
            self.max_steps = int(config["max_steps"])
            return True
        return False

    @property
    def fraction(self) -> float | None:
        if self.step is None or not self.max_steps:
            return None
        return min(1.0, self.step / self.max_steps)

    @property
    def eta_seconds(self) -> float | None:
        """Steps left times the last step time (None until both are known)."""
        step_time = self.metrics.get("step_time")
        if self.step is None or self.max_steps is None or step_time is None:
            return None
        return max(0, self.max_steps - self.step) * step_time

    def describe(self) -> str:
        """One line: ``step 50/100 loss 2.31 tokens/s 51,200 MFU 41.0% ETA 0:00:25``."""
        if self.step is None:
            return "waiting for the trainer's first step line"
        parts = [f"step {self.step}/{self.max_steps if self.max_steps is not None else '?'}"]
        if "loss" in self.metrics:
            parts.append(f"loss {self.metrics['loss']:.4g}")
        if "tokens_per_sec" in self.metrics:
            parts.append(f"tokens/s {self.metrics['tokens_per_sec']:,.0f}")
        if "mfu" in self.metrics:
            parts.append(f"MFU {100 * self.metrics['mfu']:.1f}%")
        if "mfu_bf16" in self.metrics:  # a low-precision run: its MFU against the bf16 peak too
            parts.append(f"(bf16-equivalent {100 * self.metrics['mfu_bf16']:.1f}%)")
        if self.eta_seconds is not None:
            parts.append(f"ETA {format_duration(self.eta_seconds)}")
        return " ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "max_steps": self.max_steps,
            "metrics": dict(self.metrics),
            "eta_seconds": self.eta_seconds,
            "summary": self.summary,
        }


def format_duration(seconds: float | None) -> str:
    """``1:02:03`` (hours unbounded), ``-`` for None."""
    if seconds is None:
        return "-"
    total = int(round(seconds))
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"
