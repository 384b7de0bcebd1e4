"""Nothing this trainer reads is unpickled without ``weights_only`` (issue 53 item 8): ``model.pt`` (the exports),
a checkpoint's ``rank_*.pt`` trainer state, DCP's ``.metadata`` and the non-tensor values DCP stores as bytes. A
file that carries code is refused in one line naming it, and its code never runs (each tampered file here would
create a file when unpickled). One process, no torchrun."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from tests.training import checkpoint_places
from training.trainer.checkpoint import export_hf, model_file, safe_load
from training.trainer.checkpoint import folder as folder_storage
from training.trainer.checkpoint import manager as checkpoint_manager
from training.trainer.checkpoint.names import MARKER


class Payload:
    """What an attacker puts in a pickle: unpickling it runs ``os.system``, which here only creates ``ran``."""

    def __init__(self, ran: Path):
        self.ran = ran

    def __reduce__(self):
        return (os.system, (f"touch {self.ran}",))


def test_a_model_file_carrying_code_is_refused_in_one_line_and_its_code_never_runs(tmp_path):
    ran = tmp_path / "ran"
    model = tmp_path / "model.pt"
    torch.save({"config": {}, "step": 1, "state_dict": {"w": torch.zeros(2)}, "data": Payload(ran)}, model)
    with pytest.raises(export_hf.ExportError) as info:
        export_hf.load_model_file(model)
    message = str(info.value)
    assert message.startswith(
        f"model_dir: {model} was not loaded: it holds more than tensors and plain values"
    )
    assert "GLOBAL posix.system" in message and "\n" not in message, message
    assert not ran.exists()


def test_a_model_file_of_quantized_weights_is_saved_as_plain_tensors_and_loads_weights_only(
    tmp_path, monkeypatch
):
    """Transformer Engine's quantized primary weights (``quantized_model_init``) are tensor subclasses that a
    weights-only load refuses: ``save_model`` writes their values (``dequantize()``), as the export reads them."""

    class Quantized(torch.Tensor):
        def dequantize(self):
            return torch.Tensor(self).as_subclass(torch.Tensor) * 2

    weight = torch.ones(2, 3).as_subclass(Quantized)
    monkeypatch.setattr(
        model_file, "get_model_state_dict", lambda *_a, **_k: {"w": weight, "b": torch.ones(3)}
    )
    saved = model_file.save_model(None, str(tmp_path), 3, {"precision": "fp8"}, rank=0)
    loaded = export_hf.load_model_file(saved)
    assert type(loaded["state_dict"]["w"]) is torch.Tensor and torch.equal(
        loaded["state_dict"]["w"], weight * 2
    )
    assert torch.equal(loaded["state_dict"]["b"], torch.ones(3))


@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group and the ``DistEnv`` fields ``CheckpointManager`` reads."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield SimpleNamespace(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), cpu_group=None)
    finally:
        dist.destroy_process_group()


def saved_checkpoint(where: str, env) -> tuple[str, torch.nn.Module, torch.optim.Optimizer]:
    """One checkpoint at step 4 in ``where`` (a folder or an S3 prefix); its name, the model and optimizer."""
    net = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(net.parameters())
    manager = checkpoint_manager.CheckpointManager(where, 3, env)
    manager.save(4, net, optimizer, {"step": 4, "data": {"position": 4}})
    return "step_00000004", net, optimizer


def test_a_checkpoints_trainer_state_loads_weights_only(one_rank, place):
    _, net, optimizer = saved_checkpoint(place.setting, one_rank)
    state = checkpoint_manager.CheckpointManager(place.setting, 3, one_rank).load_latest(net, optimizer)
    assert state is not None and state["step"] == 4 and state["data"] == {"position": 4}
    assert optimizer.param_groups[0]["lr"] == 0.001  # DCP's non-tensor values (bytes), loaded weights-only


def tamper_rank_file(place, name: str, ran: Path, scratch: Path) -> str:
    state = torch.load(io.BytesIO(place.read(f"{name}/rank_00000.pt")), weights_only=True)
    buffer = io.BytesIO()
    torch.save({**state, "data": Payload(ran)}, buffer)
    place.write(f"{name}/rank_00000.pt", buffer.getvalue())
    return "rank_00000.pt"


def tamper_metadata(place, name: str, ran: Path, scratch: Path) -> str:
    place.write(f"{name}/.metadata", pickle.dumps(Payload(ran)))
    return ".metadata"


def tamper_stored_value(place, name: str, ran: Path, scratch: Path) -> str:
    """Rewrite the checkpoint's DCP files with DCP itself, its optimizer's learning rate (a value DCP stores as
    bytes) replaced by the payload."""
    net = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(net.parameters())
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(net, optimizer)
    optim_sd["param_groups"][0]["lr"] = Payload(ran)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(scratch))
    for key in [k for k in place.contents() if k.startswith(f"{name}/") and k.endswith(".distcp")]:
        place.delete(key)
    for path in scratch.iterdir():
        place.write(f"{name}/{path.name}", path.read_bytes())
    return "__0_0.distcp"


@pytest.mark.parametrize("tamper", [tamper_rank_file, tamper_metadata, tamper_stored_value])
def test_a_checkpoint_file_carrying_code_is_set_aside_naming_it_and_its_code_never_runs(
    one_rank, tmp_path, place, tamper
):
    """In a folder and under a run's S3 prefix alike (``checkpoint_backend``)."""
    name, net, optimizer = saved_checkpoint(place.setting, one_rank)
    ran = tmp_path / "ran"
    file = tamper(place, name, ran, tmp_path / "scratch")
    checkpoint_places.reseal(place, name)
    manager = checkpoint_manager.CheckpointManager(place.setting, 3, one_rank)
    assert manager.load_latest(net, optimizer) is None
    assert not ran.exists()
    ((skipped, reason),) = manager.set_aside
    assert skipped == name and "\n" not in reason
    assert (
        f"{place.where(name)}/{file}" in reason
        and "was not loaded: it holds more than tensors and plain values" in reason
    ), reason
    assert f"{name}.unusable" in place.names()


def test_an_unsealed_saves_metadata_carrying_code_is_not_run_when_the_next_start_looks_at_it(
    one_rank, tmp_path
):
    name, _, _ = saved_checkpoint(str(tmp_path / "ckpt"), one_rank)
    folder, ran = tmp_path / "ckpt" / name, tmp_path / "ran"
    (folder / MARKER).unlink()
    tmp = folder.rename(folder.with_name(folder.name + ".tmp"))
    (tmp / ".metadata").write_bytes(pickle.dumps(Payload(ran)))
    view = folder_storage.node_view(tmp, folder)
    assert view["listed"] is None and not ran.exists()


def test_the_metadata_reader_allows_what_dcp_writes_and_nothing_else(tmp_path):
    dcp.save({"w": torch.zeros(2, 3, dtype=torch.bfloat16), "n": 3}, checkpoint_id=str(tmp_path))
    metadata = safe_load.Reader(str(tmp_path)).read_metadata()
    assert set(metadata.state_dict_metadata) == {"w", "n"}
    loaded = {"w": torch.ones(2, 3, dtype=torch.bfloat16), "n": 0}
    dcp.load(loaded, storage_reader=safe_load.Reader(str(tmp_path)), planner=safe_load.Planner(tmp_path))
    assert loaded["n"] == 3 and not loaded["w"].any()
