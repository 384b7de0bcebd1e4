"""TensorBoard event files of the trainer's scalars (rank 0): where they go, and the writer.

Written with tensorboardX (pure Python on numpy and protobuf, which the training image already has; TensorBoard
itself, needed by ``torch.utils.tensorboard``, is not in the AWS PyTorch DLC). In a SageMaker job with a
``TensorBoardOutputConfig`` the files go to its ``LocalPath`` (SageMaker syncs it to S3 while the job runs);
elsewhere only where ``--tensorboard_dir`` asks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from training.contract import container


def log_dir(requested: str | None, config_file: str = container.TENSORBOARD_CONFIG_FILE) -> str | None:
    """The folder to write event files to: ``requested`` (``--tensorboard_dir``) when given, else the
    ``LocalPath`` of the job's TensorBoard output config when SageMaker wrote one, else None (no TensorBoard)."""
    if requested:
        return requested
    path = Path(config_file)
    if not path.is_file():
        return None
    try:
        local = json.loads(path.read_text()).get("LocalPath")
    except (OSError, ValueError, AttributeError):
        local = None
    return local or container.TENSORBOARD_LOCAL_PATH


class TensorBoardLog:
    """Scalars into one event file per process start under ``directory`` (a relaunch or resume adds a file next
    to the earlier ones, never overwriting them; TensorBoard draws them as one run, by step)."""

    def __init__(self, directory: str):
        from tensorboardX import SummaryWriter  # only where TensorBoard is asked for

        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        # flush_secs: SageMaker uploads what is on disk; a minute keeps the S3 copy close to the run
        self._writer = SummaryWriter(logdir=directory, flush_secs=60)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)

    def text(self, tag: str, body: str) -> None:
        self._writer.add_text(tag, body, global_step=0)

    def close(self) -> None:
        self._writer.close()
