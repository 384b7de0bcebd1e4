"""Fixtures shared by the trainer's end-to-end test modules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from tests.training.runner import reference_settings, run_trainer
from training.trainer.distributed import parallel


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> tuple[Path, str]:
    """One uninterrupted 12-step 2-process run (checkpoints at steps 6 and 12 in ckpt_ref/, the model in
    model_ref/) and its output, shared by the modules that compare with it."""
    tmp = tmp_path_factory.mktemp("reference")
    return tmp, run_trainer(reference_settings(tmp, "ref"))


@pytest.fixture
def process_group(monkeypatch):
    """This process as a world of one (gloo, a free port): the ``parallel.DistEnv`` that ``loop.build``,
    ``checkpoint.save_model`` and the benchmark's loops run on; destroyed afterwards."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(parallel._free_port()))
    environment = parallel.init_distributed()
    yield environment
    dist.destroy_process_group()
