"""A LoRA run's adapter as a peft folder: ``python -m training.trainer.checkpoint.export_peft MODEL_DIR OUT_DIR``.

Reads ``model.pt`` (``model_file.save_model``: every rank's shard of every tensor gathered, so every row of every
adapter) of a run with ``lora_rank`` > 0 and writes into ``OUT_DIR`` (new or empty; nothing is overwritten):

* ``adapter_config.json``: peft's own ``LoraConfig`` (``task_type`` CAUSAL_LM, ``r``, ``lora_alpha``,
  ``lora_dropout``, ``target_modules`` the projection names in block order (the same in every family: ``q_proj``
  ... ``down_proj``), ``bias`` none, no ``modules_to_save``, no DoRA or rsLoRA: what vLLM's ``PEFTHelper``
  accepts), whose ``base_model_name_or_path`` names the base: ``init_from_source`` when the run had one (a Hub
  model id; in a job, ``init_from``'s S3 URI), else ``init_from``'s absolute path, so
  ``peft.AutoPeftModelForCausalLM.from_pretrained(OUT_DIR)`` loads both;
* ``adapter_model.safetensors``: the adapter matrices in float32 under peft's names for the family's class
  (``base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight``, ``...lora_B.weight``, as
  ``peft.get_peft_model_state_dict`` writes them);
* ``README.md``: how to load it with peft and serve it with vLLM's ``--lora-modules``.

``peft.PeftModel.from_pretrained(base, OUT_DIR)`` on the ``init_from`` model gives the trainer's logits; the merged
model (``W + alpha / r x B A``) is the Hugging Face folder ``export_hf`` writes (``hf/``) next to this one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from training.contract import container, settings_table
from training.trainer.checkpoint import export_hf
from training.trainer.model import lora

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_DIR = container.PEFT_EXPORT_DIR


def adapter_settings(config: dict[str, Any], path: Path) -> lora.LoraSettings:
    """The LoRA settings of a saved run; refuses a run that trained every weight (there is no adapter)."""
    settings = lora.LoraSettings.of(config)
    if settings is None:
        raise export_hf.ExportError(
            f"lora_rank: {path} was trained with lora_rank=0 (every weight, no adapter); its model is the Hugging "
            "Face folder export_hf writes"
        )
    return settings


def check_adapters(tensors: dict[str, torch.Tensor], settings: lora.LoraSettings, shape) -> None:
    """Every targeted projection of every block has its two matrices at their full shapes (``rank x in`` and
    ``out x rank``): a file that holds one rank's slice of an adapter is refused, not written."""
    dims = shape.projection_shapes()
    for layer in range(shape.num_layers):
        for projection in settings.targets:
            out_rows, in_cols = dims[projection]
            for which, expected in (("A", (settings.rank, in_cols)), ("B", (out_rows, settings.rank))):
                key = f"{lora.peft_module(layer, projection)}.lora_{which}.weight"
                if key not in tensors:
                    raise export_hf.ExportError(f"state_dict: no adapter {key}")
                if tuple(tensors[key].shape) != expected:
                    raise export_hf.ExportError(
                        f"state_dict: {key} has shape {tuple(tensors[key].shape)}; the adapter is {expected}"
                    )
    extra = len(tensors) - 2 * shape.num_layers * len(settings.targets)
    if extra:
        raise export_hf.ExportError(
            f"state_dict: {extra} adapter tensors beyond lora_targets {settings.targets}"
        )


def lora_config(settings: lora.LoraSettings, base: str | None) -> Any:
    """peft's ``LoraConfig`` of the adapter (peft imported here: only the export needs it)."""
    from peft import LoraConfig

    return LoraConfig(
        task_type="CAUSAL_LM",
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.targets),
        bias="none",
        base_model_name_or_path=base,
        inference_mode=True,
    )


def write_config(settings: lora.LoraSettings, base: str | None, folder: Path) -> None:
    """``adapter_config.json``: peft's ``LoraConfig`` as peft writes it (``save_pretrained``: its fields, sorted
    keys), but ``target_modules`` in block order (``q_proj``, ..., ``down_proj``): peft keeps them in a set and
    writes the set's order, which differs between processes (Python's string hashing), so two identical runs
    wrote different files."""
    fields = lora_config(settings, base).to_dict()
    for key, value in fields.items():
        if isinstance(value, set):
            fields[key] = list(settings.targets) if key == "target_modules" else sorted(value, key=str)
    (folder / ADAPTER_CONFIG).write_text(json.dumps(fields, indent=2, sort_keys=True))


def _loading(base: str | None) -> str:
    """How to load the adapter, for the base it names."""
    if not base:
        return "Load the base model the run started from, then the adapter:"
    if base.startswith("s3://"):
        return (
            f"It names its base by the S3 URI the job read it from, `{base}`, which transformers does not read: "
            "download that folder (`aws s3 sync "
            + base
            + " base/`) and load the base from there as below (or "
            "give the run `init_from_source` = the base's Hugging Face Hub model id, which "
            '`AutoPeftModelForCausalLM.from_pretrained("PATH/TO/THIS/FOLDER")` then loads by itself).'
        )
    return (
        f"It names its base, `{base}` (`base_model_name_or_path` in `{ADAPTER_CONFIG}`), so peft loads both at once:"
        "\n\n```python\nfrom peft import AutoPeftModelForCausalLM\n\n"
        'model = AutoPeftModelForCausalLM.from_pretrained("PATH/TO/THIS/FOLDER")\n```\n\nOr the base by hand:'
    )


def readme(settings: lora.LoraSettings, step: int, base: str | None, rank_hint: int) -> str:
    where = f"`{base}`" if base else "the base model the run started from"
    return f"""# LoRA adapter exported by `training.trainer.checkpoint.export_peft`

Trained by this project's FSDP2 trainer for {step} steps on the frozen base model {where}: rank {settings.rank},
alpha {settings.alpha:g} (each adapter adds {settings.scale:g} x B A to its weight), dropout {settings.dropout:g},
on {", ".join(f"`{t}`" for t in settings.targets)} of every block. Weights in float32: `{ADAPTER_WEIGHTS}`, with
`{ADAPTER_CONFIG}` peft's own configuration.

## Load it with peft

{_loading(base)}

```python
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained("PATH/TO/THE/BASE/MODEL", dtype=torch.bfloat16)
model = PeftModel.from_pretrained(base, "PATH/TO/THIS/FOLDER")
```

## Serve it with vLLM

```bash
vllm serve PATH/TO/THE/BASE/MODEL --enable-lora --max-lora-rank {rank_hint} \\
    --lora-modules my-adapter=PATH/TO/THIS/FOLDER
```

Requests then name `"model": "my-adapter"`. The merged model (no adapter needed) is the `hf/` folder next to this one.
"""


def vllm_rank(rank: int) -> int:
    """The smallest of vLLM's ``--max-lora-rank`` values that holds ``rank``."""
    return next(r for r in (8, 16, 32, 64, 128, 256, 320, settings_table.LORA_MAX_RANK) if r >= rank)


def export(model_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Write the peft adapter folder of the LoRA run saved in ``model_dir`` into ``out_dir``; returns its file
    names. Everything is checked before anything is written; the folder appears whole (renamed from
    ``.partial``)."""
    from safetensors.torch import save_file

    path = export_hf.find_model_file(model_dir)
    saved = export_hf.load_model_file(path)
    config = saved["config"]
    settings = adapter_settings(config, path)
    shape = export_hf.shape_of(config)
    tensors = {
        k: v.detach().float().contiguous().clone() for k, v in lora.adapter_state(saved["state_dict"]).items()
    }
    check_adapters(tensors, settings, shape)
    base = export_hf.base_name(saved)
    out = Path(out_dir)
    tmp = export_hf._fresh_folder(out)
    try:
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        write_config(settings, base, tmp)
        step = int(saved.get("step", 0))
        (tmp / "README.md").write_text(readme(settings, step, base, vllm_rank(settings.rank)))
        os.chmod(tmp / ADAPTER_WEIGHTS, (tmp / "README.md").stat().st_mode & 0o777)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()  # checked empty above
    os.replace(tmp, out)
    return sorted(p.name for p in out.iterdir())


def export_after_training(model_file: Path, cfg) -> str:
    """Export a finished LoRA run's adapter into its folder next to ``model_file`` (``export_hf.export_folder``:
    ``adapter/`` for ``model.pt``, ``adapter_step_XXXXXXXX/`` for ``model_step_XXXXXXXX.pt``); returns the line to
    print."""
    out = export_hf.export_folder(model_file, PEFT_DIR)
    if out.exists():  # adapter/ of another model beside a new model.pt
        out = model_file.parent / f"{PEFT_DIR}_{model_file.stem}"
    try:
        files = export(model_file, out)
    except (export_hf.ExportError, ImportError) as err:
        return f"error: peft adapter export failed (the model file is kept): {err}"
    return f"peft LoRA adapter exported to {out}: {', '.join(files)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.trainer.checkpoint.export_peft", description=__doc__.splitlines()[0]
    )
    parser.add_argument("model_dir", help="A folder holding model.pt of a LoRA run, or the file.")
    parser.add_argument("out_dir", help="A new (or empty) folder for the adapter.")
    args = parser.parse_args(argv)
    try:
        files = export(args.model_dir, args.out_dir)
    except export_hf.ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported to {args.out_dir}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
