"""The final model file of a run: ``model.pt`` (the full model state gathered on rank 0, the run's settings and
what the Hugging Face export needs to know about its data), never written over (``model_step_XXXXXXXX.pt`` then)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from training.trainer.checkpoint import safe_load


def model_files(model_dir: str) -> list[Path]:
    """The model files ``save_model`` wrote into ``model_dir`` (``model.pt``, ``model_step_*.pt``)."""
    directory = Path(model_dir)
    return sorted(directory.glob("model*.pt")) if directory.is_dir() else []


def save_model(
    model, model_dir: str, step: int, config: dict[str, Any], rank: int, data: dict[str, Any] | None = None
) -> Path | None:
    """Gather the full model state dict on rank 0 (CPU) and write ``model.pt`` (torch.save of
    ``{"config", "step", "state_dict", "data"}``; ``data``: what ``export_hf`` needs to know about the run's data
    and tokenizer) via a temporary name. An existing ``model.pt`` is never overwritten: the new one is then named
    ``model_step_XXXXXXXX.pt``. Returns the path on rank 0, None elsewhere."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return None
    state = {name: safe_load.plain(value) for name, value in state.items()}
    directory = Path(model_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "model.pt"
    if target.exists():
        target = directory / f"model_step_{step:08d}.pt"
    tmp = target.with_name(target.name + ".tmp")
    torch.save({"config": config, "step": step, "state_dict": state, "data": data}, tmp)
    if target.exists():
        raise FileExistsError(f"model_dir: {target} already exists; not overwriting it")
    os.replace(tmp, target)
    return target
