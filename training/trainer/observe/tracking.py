"""Rank 0's metrics, as printed in the step, validation and summary lines, also sent to TensorBoard and MLflow.

Names, the same in both: ``train/<field>`` for each step-line field (metric_lines.STEP_METRICS), ``validation/val_loss``
(and each other validation field) and ``final/<field>`` for each summary field (metric_lines.SUMMARY_METRICS), logged at the run's last step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from training.trainer.observe import tensorboard
from training.trainer.observe.mlflow_log import MlflowLog


def tag(kind: str, field: str) -> str:
    """``train/loss``, ``validation/val_loss``, ``final/tokens_per_sec``."""
    return f"{kind}/{field}"


class Tracking:
    """TensorBoard and/or MLflow, or nothing: every method is a no-op where neither is configured (other ranks)."""

    def __init__(self, board: tensorboard.TensorBoardLog | None, mlflow: MlflowLog | None):
        self.board, self.mlflow = board, mlflow
        self.stopped = False  # set by the loop when SIGTERM ended the run early (MLflow status KILLED)

    @classmethod
    def open(
        cls,
        tensorboard_dir: str | None,
        settings: Mapping[str, Any],
        is_main: bool,
        say: Callable[[str], None],
    ) -> Tracking:
        """Rank 0: TensorBoard where ``tensorboard.log_dir`` says, MLflow when its environment says; others: none."""
        if not is_main:
            return cls(None, None)
        directory = tensorboard.log_dir(tensorboard_dir)
        board = tensorboard.TensorBoardLog(directory) if directory else None
        if board is not None:
            board.text("config", " ".join(f"{k}={settings[k]}" for k in sorted(settings)))
            say(f"TensorBoard event files in {directory}")
        mlflow = MlflowLog.from_environment(say)
        if mlflow is not None:
            mlflow.start(settings)
            if mlflow.active:
                say(
                    f"MLflow: logging to experiment {mlflow.experiment}, run {mlflow.run_name or mlflow.run_id}"
                )
        return cls(board, mlflow)

    def _send(self, step: int, values: Mapping[str, float]) -> None:
        if self.board is not None:
            self.board.scalars(step, values)
        if self.mlflow is not None:
            self.mlflow.metrics(step, values)

    def step(self, step: int, fields: Mapping[str, float]) -> None:
        self._send(step, {tag("train", k): v for k, v in fields.items()})

    def validation(
        self, step: int, val_loss: float, val_accuracy: float | None = None, **fields: float
    ) -> None:
        """``fields``: a preference tuning run's other validation metrics (``val_reward_accuracy``, ...)."""
        values = {tag("validation", "val_loss"): val_loss}
        if val_accuracy is not None:
            values[tag("validation", "val_accuracy")] = val_accuracy
        values.update({tag("validation", name): value for name, value in fields.items()})
        self._send(step, values)

    def summary(self, step: int, summary: Mapping[str, float]) -> None:
        self._send(step, {tag("final", k): v for k, v in summary.items() if k != "steps" and v is not None})

    def close(self, failed: bool = False) -> None:
        """Flush and close the event file; end the MLflow run as FAILED, KILLED (stopped) or FINISHED."""
        if self.board is not None:
            self.board.close()
        if self.mlflow is not None:
            self.mlflow.close("FAILED" if failed else "KILLED" if self.stopped else "FINISHED")
