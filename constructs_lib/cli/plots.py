"""Pictures of runs' curves: a PNG (matplotlib), a plot in the terminal (plotext) and a one-line sparkline.

matplotlib and plotext are imported inside the functions that draw, so that the CLI's start-up does not load them;
they are the ``charts`` extra (not installed by ``make synth``): without them ``curves`` says how to install them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from constructs_lib.cli.curves import X_AXES, RunCurve
from constructs_lib.cli.errors import OperatorError

SPARK_BARS = "▁▂▃▄▅▆▇█"
CHARTS_EXTRA = "pip install -e '.[charts]' in the repository (make local or make test install it)"


def charts_module(name: str) -> ModuleType:
    """``matplotlib`` or ``plotext``, or one line saying how to install the ``charts`` extra."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise OperatorError(f"curves needs {name}, which is not installed: {CHARTS_EXTRA}") from None


def sparkline(values: Sequence[float], width: int = 24) -> str:
    """``values`` as ``width`` block characters at most (each the mean of its share of the values), lowest to
    highest; empty when there is nothing to draw."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    if len(finite) > width:
        size = len(finite) / width
        finite = [
            sum(chunk) / len(chunk)
            for i in range(width)
            if (chunk := finite[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)])
        ]
    low, high = min(finite), max(finite)
    span = high - low
    top = len(SPARK_BARS) - 1
    return "".join(SPARK_BARS[round((v - low) / span * top) if span else top // 2] for v in finite)


def png(curves: Sequence[RunCurve], axis: str, path: Path) -> Any:
    """Draw loss and ``val_loss`` (top) and tokens/s (bottom) of every run against ``axis`` into ``path``; one colour
    per run, the training loss solid, ``val_loss`` dashed with dots. Returns the matplotlib figure (closed)."""
    matplotlib = charts_module("matplotlib")
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    figure, (losses, speed) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=(2, 1))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, curve in enumerate(curves):
        colour = colours[index % len(colours)]
        x, y = curve.series("loss", axis)
        losses.plot(x, y, color=colour, linewidth=1.6, label=f"{curve.name} loss")
        x, y = curve.series("val_loss", axis)
        if x:
            losses.plot(
                x, y, color=colour, linestyle="--", marker="o", markersize=4, label=f"{curve.name} val_loss"
            )
        x, y = curve.series("tokens_per_sec", axis)
        if x:
            speed.plot(x, y, color=colour, linewidth=1.2, label=curve.name)
    losses.set_ylabel("loss")
    losses.set_title("Training curves: " + ", ".join(curve.name for curve in curves))
    losses.legend(loc="upper right", fontsize="small")
    losses.grid(alpha=0.3)
    speed.set_ylabel("tokens/s")
    speed.set_xlabel(X_AXES[axis])
    speed.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return figure


def terminal(curves: Sequence[RunCurve], axis: str, width: int, height: int = 20) -> str:
    """Loss and ``val_loss`` of every run against ``axis`` as a plot in text (ANSI colours)."""
    plotext = charts_module("plotext")
    plotext.clear_figure()
    plotext.plot_size(max(40, width), height)
    plotext.theme("clear")
    for curve in curves:
        x, y = curve.series("loss", axis)
        if x:
            plotext.plot(x, y, label=f"{curve.name} loss", marker="braille")
        x, y = curve.series("val_loss", axis)
        if x:
            plotext.scatter(x, y, label=f"{curve.name} val_loss", marker="dot")
    plotext.xlabel(X_AXES[axis])
    plotext.ylabel("loss")
    return str(plotext.build())
