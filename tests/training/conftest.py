"""Fixtures shared by the trainer's end-to-end test modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from .runner import reference_settings, run_trainer


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> tuple[Path, str]:
    """One uninterrupted 12-step 2-process run (checkpoints at steps 6 and 12 in ckpt_ref/, the model in
    model_ref/) and its output, shared by the modules that compare with it."""
    tmp = tmp_path_factory.mktemp("reference")
    return tmp, run_trainer(reference_settings(tmp, "ref"))
