"""The SageMaker job the trainer may run in: whether it runs in one, the job's name, and how the reason a run
stops (a refusal, a failure) reaches the job's ``FailureReason`` (the ``failure`` file in SageMaker's output folder).

SageMaker returns the first 1024 characters of ``/opt/ml/output/failure`` as the job's ``FailureReason``, which the
workflow reports as its error cause and ``blackwell-training result`` shows. The sagemaker-training toolkit writes
that file only when it does not exist yet (its own text for a failed entry point is just the exit code), so the
trainer's reason, written first, is the one the job reports. Outside SageMaker there is no such file
(``training.trainer.refusal`` prints the line).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from training.contract import container

RESOURCE_CONFIG = Path("/opt/ml/input/config/resourceconfig.json")
"""Written by SageMaker into every training container."""


def in_sagemaker() -> bool:
    """Whether this process runs in a SageMaker training job (the toolkit sets SM_MODEL_DIR; the platform writes
    resourceconfig.json)."""
    return "SM_MODEL_DIR" in os.environ or RESOURCE_CONFIG.is_file()


def job_name() -> str | None:
    """The training job's name (SageMaker sets ``TRAINING_JOB_NAME``; a relaunch after a spot interruption keeps
    it), or None outside SageMaker."""
    return os.environ.get("TRAINING_JOB_NAME") or None


def failure_file() -> Path | None:
    """Where SageMaker reads the failure reason: ``$SM_OUTPUT_DIR/failure`` (the toolkit's output folder,
    ``/opt/ml/output`` in a job); None outside SageMaker."""
    if not in_sagemaker():
        return None
    return Path(os.environ.get("SM_OUTPUT_DIR") or container.OUTPUT_DIR) / container.FAILURE_FILE


def write_failure(message: str) -> Path | None:
    """Write ``message`` as the job's failure reason when running under SageMaker; return the file written, or
    None (outside SageMaker, or a reason was already written: the first one stays, as the toolkit does)."""
    path = failure_file()
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(message.strip() + "\n")
    except FileExistsError:
        return None
    except OSError as err:  # the reason is still on stderr; say why it could not become the job's
        print(f"note: could not write the failure reason to {path}: {err.strerror or err}", file=sys.stderr)
        return None
    return path
