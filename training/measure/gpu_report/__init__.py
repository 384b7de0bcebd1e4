"""The GPU report: one prepared command that measures, on one H100 or H200 and within a wall-clock budget of eight
minutes (every process start counted), what a GPU can tell about this product: our trainer tuned through the real
tuning driver, torchtitan side by side, numerics on CUDA, where the time goes, and what one GPU cannot measure.

``python -m training.measure.gpu_report`` (:mod:`.cli`); ``make gpu-report`` runs it, ``make gpu-wheels`` makes
the wheels it carries. ``--smoke`` runs the same code path on a CPU with a tiny model; ``--dry-run`` prints the
expected time on H100 and H200 from the plan. docs/measurements.md says how to run it on a GPU machine.
"""

from training.measure.gpu_report.cli import main, parse_args

__all__ = ["main", "parse_args"]
