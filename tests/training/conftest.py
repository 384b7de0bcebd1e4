"""Fixtures shared by the trainer's end-to-end test modules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from tests.training.checkpoint_places import FolderPlace, S3Place
from tests.training.runner import reference_settings, run_trainer
from tests.training.s3_server import s3_bucket, s3_server  # noqa: F401 (fixtures of the trainer's tests)
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
    ``model_file.save_model`` and the benchmark's loops run on; destroyed afterwards."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(parallel._free_port()))
    environment = parallel.init_distributed()
    yield environment
    dist.destroy_process_group()


@pytest.fixture(params=["folder", "s3"])
def place(request, tmp_path):
    """Where the test's run keeps its checkpoints, once per backend: a folder (``tmp_path/ckpt``), or a run's prefix
    in a fresh bucket on the session's S3 server (its endpoint and test credentials in this process's environment,
    which the trainer's child processes inherit)."""
    if request.param == "folder":
        return FolderPlace(tmp_path / "ckpt")
    server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
    return S3Place(server.client(), bucket)
