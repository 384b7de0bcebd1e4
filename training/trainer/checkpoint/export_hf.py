"""The trained model as a Hugging Face folder of its family's class (``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``, ``MistralForCausalLM``, ``Gemma3ForCausalLM``):
``python -m training.trainer.checkpoint.export_hf MODEL_DIR OUT_DIR``.

Reads ``model.pt`` (``model_file.save_model``: ``{"config", "step", "state_dict", "data"}``) and writes into
``OUT_DIR`` (which must not exist, or be empty; nothing is overwritten):

* ``config.json``: the family's config (``training.models.<family>``: sizes, heads, ``num_key_value_heads``,
  ``head_dim``, ``intermediate_size``, ``rms_norm_eps``, ``rope_theta`` with the RoPE scaling in both spellings,
  ``rope_scaling`` and ``rope_parameters``, vocabulary, ``tie_word_embeddings``, the family's own keys, dtype). A run that started from a Hugging
  Face model (``init_from``) writes that model's own config.json back, with only the dtype changed, so import ->
  train -> export keeps every field (its ``max_position_embeddings``, token ids, ...);
* ``model.safetensors``, or above ``--max-shard-size`` shards ``model-0000i-of-0000n.safetensors`` and
  ``model.safetensors.index.json`` (``{"metadata": {"total_size"}, "weight_map"}``, Hugging Face's layout); a tied
  model has no ``lm_head.weight`` (as ``save_pretrained`` writes it);
* ``generation_config.json`` (end-of-text id when the data had one; the ``init_from`` model's own when it had one);
* the tokenizer: the ``init_from`` model's tokenizer files (``TRAVELLING_FILES``), or ``tokenizer.json`` and
  ``tokenizer_config.json`` when the data was prepared with a ``tokenizer.json`` (``training.prepare``; the
  trainer stores them in ``model.pt``);
* ``README.md``: what the model is, how it was trained, how to load it, and its tokenizer (byte-level: say so).

Weight mapping: ``training.trainer.model.layout`` (the family's tensor names; torch blocks and Transformer Engine 2.11
blocks, grouped-query attention, tying), the same table the import (``training.trainer.checkpoint.weights``) reads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from training.contract import container, settings_table
from training.models import registry
from training.models import settings as model_settings
from training.models.config import ModelConfig
from training.models.family import Family
from training.request import hf_config
from training.trainer import files
from training.trainer.checkpoint import chat_export, safe_load
from training.trainer.checkpoint.weights import INIT_STD
from training.trainer.model import layout, lora

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9
"""Hugging Face's own default shard limit for ``save_pretrained`` (5 GB)."""
HF_DIR = container.HF_EXPORT_DIR
"""The folder a finished training job writes next to ``model.pt`` in its model artifact."""


class ExportError(ValueError):
    """The model cannot be exported; the message names what and why."""


# ---------------------------------------------------------------------------------------------------------------
# Reading model.pt
# ---------------------------------------------------------------------------------------------------------------


def find_model_file(model_dir: str | Path) -> Path:
    """``model_dir`` itself when it is a file, else the one ``model*.pt`` in it."""
    path = Path(model_dir)
    if path.is_file():
        return path
    if not path.is_dir():
        raise ExportError(f"model_dir: {path} is neither a model file nor a folder")
    found = sorted(path.glob("model*.pt"))
    if not found:
        raise ExportError(f"model_dir: {path} holds no model.pt")
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ExportError(f"model_dir: {path} holds several models ({names}); pass the file to export")
    return found[0]


def load_model_file(path: Path) -> dict[str, Any]:
    """``model.pt``'s dict (tensors memory-mapped, not read into memory at once), read weights-only
    (``safe_load``: a file carrying more than tensors and plain values is refused, nothing in it run)."""
    try:
        saved = safe_load.load(path, map_location="cpu", mmap=True)
    except safe_load.UnsafeFileError as err:
        raise ExportError(f"model_dir: {err}") from None
    except Exception as err:  # torch raises several types for a file it cannot read
        raise ExportError(f"model_dir: cannot read {path}: {type(err).__name__}: {err}") from None
    if not isinstance(saved, dict) or not {"config", "state_dict"} <= saved.keys():
        raise ExportError(
            f"model_dir: {path} is not a model saved by this trainer (no config and state_dict)"
        )
    return saved


def check_exportable(config: dict[str, Any], path: Path) -> None:
    """Refuse a model no supported Hugging Face class can represent: one trained without rotary embeddings."""
    encoding = config.get("position_encoding", "none")  # saved before the setting existed: NoPE
    if encoding != "rope":
        raise ExportError(
            f"position_encoding: {path} was trained with position_encoding={encoding} (no position encoding); "
            "every supported Hugging Face class applies rotary embeddings, so these weights would load there and give wrong "
            "outputs. Only models trained with position_encoding=rope can be exported."
        )


def shape_of(config: dict[str, Any]) -> ModelConfig:
    """The model of a saved run's settings (``model.pt``'s ``config``): its ``ModelConfig``."""
    return model_settings.model_config(config)


# ---------------------------------------------------------------------------------------------------------------
# The weight mapping
# ---------------------------------------------------------------------------------------------------------------


def _value(tensor: torch.Tensor) -> torch.Tensor:
    dequantize = getattr(tensor, "dequantize", None)  # TE's quantized primary weights (quantized_model_init)
    if callable(dequantize) and type(tensor) is not torch.Tensor:
        return dequantize()
    return tensor


def to_hf_state_dict(state: dict[str, torch.Tensor], shape: ModelConfig) -> dict[str, torch.Tensor]:
    """The trainer's state dict (torch or Transformer Engine blocks) under its Hugging Face class's names
    (``layout``: the family's).

    Every entry must be used (TE's ``_extra_state`` excepted) and every Hugging Face tensor made: an unknown name
    is an error, not a silent drop."""
    out: dict[str, torch.Tensor] = {}
    unused = []
    for name, tensor in state.items():
        parts = layout.parts(name, shape)
        if parts is None:
            if not name.endswith("_extra_state"):
                unused.append(name)
            continue
        value = _value(tensor)
        dims = [layout.dims_of(n, shape) for n in parts.names]
        expected = (sum(d[0] for d in dims), *dims[0][1:])
        if tuple(value.shape) != expected:
            raise ExportError(f"state_dict: {name} has shape {tuple(value.shape)}; expected {expected}")
        out.update(layout.split(parts, value, shape))
    if unused:
        shown = ", ".join(sorted(unused)[:5]) + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
        raise ExportError(f"state_dict: entries with no {_family(shape).title} counterpart: {shown}")
    names = layout.hf_tensors(shape)
    missing = [name for name in names if name not in out]
    if missing:
        raise ExportError(f"state_dict: no entry holds {missing[0]}")
    return {name: out[name] for name in names}


def _family(shape: ModelConfig) -> Family:
    """The family of the model of ``shape``."""
    return registry.family(shape.family)


# ---------------------------------------------------------------------------------------------------------------
# The folder's files
# ---------------------------------------------------------------------------------------------------------------


def hf_config_json(
    config: dict[str, Any], dtype: str, eos_id: int | None, source: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``config.json`` of the model's Hugging Face class for the trainer's settings ``config``
    (``hf_config.to_config``: the family's keys); the ``init_from`` model's own config.json (``source``) when the run
    started from one, with the dtype changed."""
    if source is not None:  # its own dtype key(s): transformers 5 writes dtype, 4 torch_dtype
        keys = [key for key in ("dtype", "torch_dtype") if key in source] or ["dtype", "torch_dtype"]
        return {**source, **dict.fromkeys(keys, dtype)}
    settings = {"rope_theta": 10000.0, **config}  # a model.pt saved before rope_theta was recorded
    return {
        **hf_config.to_config(settings),
        "max_position_embeddings": int(config["seq_length"]),
        "attention_dropout": 0.0,
        "initializer_range": INIT_STD,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }


def shard(tensors: dict[str, torch.Tensor], max_bytes: int, itemsize: int) -> list[list[str]]:
    """The names of ``tensors`` (in order) grouped into shards of at most ``max_bytes`` each once converted to
    ``itemsize`` bytes per element (a tensor larger than that gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * itemsize
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def write_weights(
    tensors: dict[str, torch.Tensor], out: Path, max_bytes: int, dtype: torch.dtype
) -> list[str]:
    """``model.safetensors``, or shards and ``model.safetensors.index.json``, in ``dtype``; returns the file
    names. One shard at a time is converted (memory: one shard, not the model)."""
    from safetensors.torch import save_file

    itemsize = torch.empty(0, dtype=dtype).element_size()
    parts = shard(tensors, max_bytes, itemsize)
    names = (
        ["model.safetensors"]
        if len(parts) == 1
        else [f"model-{number:05d}-of-{len(parts):05d}.safetensors" for number in range(1, len(parts) + 1)]
    )
    for name, part in zip(names, parts, strict=True):
        converted = {key: tensors[key].detach().to(dtype).contiguous().clone() for key in part}
        save_file(converted, str(out / name), metadata={"format": "pt"})
    if len(parts) == 1:
        return names
    weight_map = {key: name for name, part in zip(names, parts, strict=True) for key in part}
    total = sum(t.numel() * itemsize for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return [*names, "model.safetensors.index.json"]


TRAVELLING_FILES = container.INIT_FROM_TRAVELLING_FILES
"""Files of an ``init_from`` model folder that travel to the export (its tokenizer and generation settings; the
contract's, since the request check reads the same names to decide whether the export will have a tokenizer)."""


def base_name(saved: dict[str, Any]) -> str | None:
    """What names the model a saved run started from (``model.pt``'s dict): its ``init_from_source`` (a Hub model
    id; a job's ``init_from`` S3 URI), else ``init_from`` as an absolute path (a model file from before they were
    recorded: ``init_from`` as typed); None without ``init_from``."""
    source = (saved.get("data") or {}).get("init_from") or {}
    return source.get("source") or source.get("path") or saved["config"].get("init_from")


def source_info(folder: str) -> dict[str, Any]:
    """What ``model.pt`` keeps of the ``init_from`` folder for the export: its path, its config.json and the bytes
    of its ``TRAVELLING_FILES`` that exist. A folder gone unreadable since the start (checked then) gives none of
    them, and the export writes its own config.json: the model file is still saved (rank 0 alone runs this,
    between collectives, so it must not raise)."""
    path = Path(folder)
    try:
        files = {name: (path / name).read_bytes() for name in TRAVELLING_FILES if (path / name).is_file()}
        return {"path": folder, "config": hf_config.read_local(path), "files": files}
    except (OSError, settings_table.ContractError) as err:
        return {"path": folder, "config": None, "files": {}, "unreadable": str(err)}


def write_source_files(data: dict[str, Any] | None, out: Path) -> list[str]:
    """The ``init_from`` model's travelling files, written into ``out``; returns their names."""
    files = ((data or {}).get("init_from") or {}).get("files") or {}
    for name, content in files.items():
        (out / name).write_bytes(content)
    return sorted(files)


def write_tokenizer(data: dict[str, Any] | None, out: Path, max_length: int) -> str:
    """Tokenizer files when the data had a ``tokenizer.json`` (unless the ``init_from`` model's own tokenizer
    files travelled, ``write_source_files``); returns the README's tokenizer paragraph."""
    source = (data or {}).get("init_from") or {}
    if source:
        return _imported_tokenizer(source, (data or {}).get("dataset") == "synthetic")
    if data is None:
        return "Unknown: this model file was saved before the trainer recorded how its data was tokenized."
    if data.get("dataset") == "synthetic":
        return (
            "None: trained on synthetic tokens (`dataset=synthetic`), so the model has learnt no language. Use it "
            "to check the pipeline, not to generate text."
        )
    info = data.get("tokenizer") or {}
    if not info:
        return "Unknown: the token files had no `metadata.json` (not made by `training.prepare`)."
    if info.get("kind") == "byte-level UTF-8":
        return (
            "Byte-level: token ids 0-255 are the bytes of UTF-8 text, 256 ends a document (`eos_token_id`). There "
            "are no tokenizer files; encode with `list(text.encode('utf-8'))` and decode with "
            "`bytes(i for i in ids if i < 256).decode('utf-8', errors='replace')`."
        )
    text = data.get("tokenizer_json")
    name = info.get("name", "tokenizer.json")
    if not text:
        return (
            f"`{name}` (a Hugging Face tokenizer), which the trainer did not find next to the data, so no tokenizer "
            "files are here: copy that `tokenizer.json` into this folder."
        )
    (out / "tokenizer.json").write_text(text)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "eos_token": _token_name(text, info.get("eos_id")),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return (
        f"The data's Hugging Face tokenizer `{name}`: `tokenizer.json` and `tokenizer_config.json` are here."
    )


def _imported_tokenizer(source: dict[str, Any], synthetic: bool) -> str:
    """The tokenizer paragraph of a run that started from the ``init_from`` model ``source`` (``source_info``):
    its tokenizer files, when they travelled; with ``synthetic`` data, what this run's tokens were (the model
    learnt its language before this run)."""
    travelled = [name for name in source.get("files") or {} if name != "generation_config.json"]
    origin = f"`init_from` {source.get('source') or source['path']}"
    if travelled:
        names = ", ".join(f"`{name}`" for name in sorted(travelled))
        text = f"The tokenizer of the model this run started from ({origin}): {names} are here."
    else:
        text = (
            f"None here: the folder of the model this run started from ({origin}) had no tokenizer files; use "
            "the tokenizer of the model it started from."
        )
    if synthetic:
        text += (
            " This run trained it on synthetic tokens (`dataset=synthetic`: a fixed pattern over token ids, not "
            "text), so its language comes from that model and these steps may have made it worse, not better."
        )
    return text


def _token_name(tokenizer_json: str, token_id: int | None) -> str | None:
    if token_id is None:
        return None
    spec = json.loads(tokenizer_json)
    for added in spec.get("added_tokens", []):
        if added.get("id") == token_id:
            return added.get("content")
    vocab = (spec.get("model") or {}).get("vocab") or {}
    return (
        next((token for token, i in vocab.items() if i == token_id), None)
        if isinstance(vocab, dict)
        else None
    )


def readme(
    config: dict[str, Any],
    step: int,
    dtype: str,
    files: list[str],
    tokenizer_text: str,
    base: str | None = None,
) -> str:
    """The model card; ``base``: what names the model the run started from (``base_name``)."""
    shape = shape_of(config)
    attention = (
        f"{shape.kv_heads} key/value heads (grouped-query attention)"
        if shape.kv_heads != shape.num_heads
        else "no grouped-query attention"
    )
    scaling = config.get("rope_scaling", "none")
    rope = f"rope_theta={float(config['rope_theta']):g}" + (
        f", {scaling} scaling" if scaling != "none" else ""
    )
    embeddings = "tied" if shape.tie_embeddings else "untied"
    base = base or config.get("init_from")
    origin = f", starting from `{base}`" if base else ""
    adapters = lora.LoraSettings.of(config)
    if adapters is not None:
        origin += (
            f", as LoRA adapters (rank {adapters.rank}, alpha {adapters.alpha:g}, on {', '.join(adapters.targets)}) "
            f"merged into the frozen base weights (W + alpha / rank x B A; the adapter alone is the peft folder "
            f"`{container.PEFT_EXPORT_DIR}/` beside this one)"
        )
    family = _family(shape)
    return f"""# {family.title} model ({family.architecture}) exported by `training.trainer.checkpoint.export_hf`

Trained by this project's FSDP2 trainer for {step} steps{origin} (precision `{config.get("precision")}`,
`seq_length={config.get("seq_length")}`, rotary embeddings with `{rope}`),
{shape.parameter_count():,} parameters: {shape.num_layers} layers, hidden size {shape.hidden_size},
{shape.num_heads} heads of {shape.head_dim} ({attention}), MLP {shape.ffn_hidden_size}, vocabulary {shape.vocab_size},
{embeddings} input and output embeddings. Weights in `{dtype}`: {", ".join(f"`{f}`" for f in files)}.

## Tokenizer

{tokenizer_text}

## Load it

```python
import torch
from transformers import {family.architecture}

model = {family.architecture}.from_pretrained("PATH/TO/THIS/FOLDER", dtype=torch.{dtype})
```
"""


# ---------------------------------------------------------------------------------------------------------------
# The export
# ---------------------------------------------------------------------------------------------------------------


def _fresh_folder(out: Path) -> Path:
    """A temporary sibling of ``out`` to write into (``out`` must be new or empty)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"out_dir: {out} already exists and is not empty; choose a new folder")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # our own leftover from an interrupted export
    tmp.mkdir(parents=True)
    return tmp


def run_dtype(precision: str | None) -> str:
    """The weights' dtype that keeps a run's precision: float32 for ``fp32``, float16 for ``fp16``, bfloat16 for
    ``bf16`` and the Transformer Engine precisions (whose higher precision it is)."""
    return {"fp32": "float32", "fp16": "float16"}.get(str(precision), "bfloat16")


def export(
    model_dir: str | Path,
    out_dir: str | Path,
    dtype: str | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_SIZE,
) -> list[str]:
    """Write the Hugging Face folder for the model in ``model_dir`` into ``out_dir``; returns its file names.
    ``dtype`` None keeps the run's precision (:func:`run_dtype`).

    Everything is checked before anything is written; the folder appears whole (renamed from ``.partial``)."""
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"dtype: must be one of {', '.join(DTYPES)}; got {dtype!r}")
    if max_shard_bytes < 1:
        raise ExportError(f"max_shard_size: must be at least 1 byte; got {max_shard_bytes}")
    path = find_model_file(model_dir)
    saved = load_model_file(path)
    config = saved["config"]
    dtype = dtype or run_dtype(config.get("precision"))
    check_exportable(config, path)
    state = saved["state_dict"]
    adapters = lora.LoraSettings.of(config)
    if adapters is not None:  # a LoRA run: the merged model (the peft adapter is export_peft's)
        state = lora.merged_state(state, adapters, shape_of(config))
    tensors = to_hf_state_dict(state, shape_of(config))
    out = Path(out_dir)
    tmp = _fresh_folder(out)
    data = saved.get("data")
    eos_id = ((data or {}).get("tokenizer") or {}).get("eos_id")
    files = write_weights(tensors, tmp, max_shard_bytes, DTYPES[dtype])
    source = ((data or {}).get("init_from") or {}).get("config")
    (tmp / "config.json").write_text(
        json.dumps(hf_config_json(config, dtype, eos_id, source), indent=2) + "\n"
    )
    if "generation_config.json" not in write_source_files(data, tmp):
        generation = {"bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": None}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer_text = write_tokenizer(data, tmp, int(config["seq_length"]))
    chat_text = chat_export.write(data, tmp)  # a run on conversations: its template and end-of-turn stop
    if chat_text:
        tokenizer_text += "\n\n" + chat_text
    card = readme(config, int(saved.get("step", 0)), dtype, files, tokenizer_text, base_name(saved))
    (tmp / "README.md").write_text(card)
    mode = (
        tmp / "README.md"
    ).stat().st_mode & 0o777  # safetensors creates its files 0600: the umask's mode instead
    for name in files:
        os.chmod(tmp / name, mode)
    if out.exists():
        out.rmdir()  # checked empty above
    os.replace(tmp, out)
    return sorted(p.name for p in out.iterdir())


def data_info(cfg) -> dict[str, Any]:
    """What ``model.pt`` records about the run's data for the export: the ``init_from`` model's config.json and
    travelling files (``source_info``), the dataset kind, the tokenizer description from ``metadata.json`` and, for a Hugging Face tokenizer, the text of its ``tokenizer.json`` (looked for in
    the data folder, where ``prepare`` copies it, then at the path ``prepare`` read it from)."""
    info: dict[str, Any] = {"dataset": cfg.dataset}
    if getattr(cfg, "init_from", None):
        named = getattr(cfg, "init_from_source", None) or str(Path(cfg.init_from).resolve())
        info["init_from"] = {**source_info(cfg.init_from), "source": named}
    if cfg.dataset != "channel":
        return info
    from training.trainer.data import token_files as data  # numpy; only a training run gets here

    directory = Path(data.channel_dir(cfg))
    meta = data.read_metadata(directory)
    tokenizer = (meta or {}).get("tokenizer") or {}
    info["tokenizer"] = tokenizer
    info["chat"] = chat_export.chat_info(directory, meta or {})
    if tokenizer.get("kind") == "tokenizers":
        candidates = [_tokenizer_file(directory, tokenizer["file"])] if tokenizer.get("file") else []
        # where prepare read it (data prepared before it copied the tokenizer): a tokenizer.json only
        path = Path(str(tokenizer.get("path") or ""))
        candidates += [path] if path.name == "tokenizer.json" else []
        found = next((p for p in candidates if p.is_file()), None)
        info["tokenizer_json"] = found.read_text() if found else None
    return info


def _tokenizer_file(directory: Path, name: str) -> Path:
    """The tokenizer file ``metadata.json`` names, confined to the data folder (``training.trainer.files``)."""
    try:
        return files.inside(
            directory, name, f"{directory / container.DATA_METADATA_FILE}", "as the tokenizer file"
        )
    except files.OutsideFolderError as err:
        raise settings_table.ContractError("dataset", str(err)) from None


def export_after_training(model_file: Path, cfg) -> str:
    """Export a finished run's ``model_file`` into its folder next to it (``export_folder``: ``hf/`` for
    ``model.pt``, ``hf_step_XXXXXXXX/`` for ``model_step_XXXXXXXX.pt``); returns the line to print. The weights
    keep the run's precision (:func:`run_dtype`)."""
    if cfg.position_encoding != "rope":
        return (
            f"Hugging Face export skipped: position_encoding={cfg.position_encoding} (only models trained with "
            "rotary embeddings map onto a Hugging Face class)"
        )
    out = export_folder(model_file)
    if out.exists():  # hf/ of another model beside a new model.pt
        out = model_file.parent / f"{HF_DIR}_{model_file.stem}"
    dtype = run_dtype(cfg.precision)
    try:
        files = export(model_file, out, dtype)
    except ExportError as err:
        return f"error: Hugging Face export failed (the model file is kept): {err}"
    return f"Hugging Face model ({dtype}) exported to {out}: {', '.join(files)}"


def export_folder(model_file: Path, prefix: str = HF_DIR) -> Path:
    """Where ``model_file``'s export goes: ``hf/`` beside ``model.pt``, ``hf_step_XXXXXXXX/`` beside
    ``model_step_XXXXXXXX.pt`` (the model file of a run that continued a finished one: ``model_file.save_model``).
    ``prefix``: the export's kind (``export_peft.PEFT_DIR``: a LoRA run's adapter folder)."""
    return model_file.parent / (prefix + model_file.stem.removeprefix("model"))


def pending_exports(model_dir: str | Path, cfg, prefix: str = HF_DIR) -> list[tuple[Path, str]]:
    """The model files whose export an earlier run of ``cfg`` did not finish, oldest first, and how each was left:
    its export folder (``export_folder``) still being written (``hf.partial``, ``hf_step_N.partial``: the job was
    killed while it exported), or none at all (killed before it began; after a raised ``max_steps``,
    ``model_step_N.pt`` beside an older ``model.pt`` and its ``hf/``). Empty when there is nothing to do, or the
    model has no export (``position_encoding=none``). ``prefix``: the export folder's name
    (``export_peft.PEFT_DIR``: a LoRA run's adapter folder)."""
    folder = Path(model_dir)
    models = sorted(folder.glob("model*.pt")) if folder.is_dir() else []
    if cfg.position_encoding != "rope":
        return []
    pending = []
    for model in models:
        out = export_folder(model, prefix)
        if out.is_dir():
            continue
        partial = out.with_name(out.name + ".partial")
        pending.append(
            (model, f"one was interrupted: {partial.name}" if partial.is_dir() else "none was made")
        )
    return pending


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``10KB``, ``123`` (bytes) -> bytes (decimal units, as Hugging Face's)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(GB|MB|KB|B)?\s*", text.upper())
    size = int(float(match.group(1)) * _UNITS[match.group(2) or "B"]) if match else 0
    if size < 1:
        raise ExportError(
            f"max_shard_size: must be a size of at least 1 byte such as 5GB, 500MB or 1000; got {text!r}"
        )
    return size


_UNITS = {"GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.trainer.checkpoint.export_hf", description=__doc__.splitlines()[0]
    )
    parser.add_argument("model_dir", help="A folder holding model.pt (a job's model artifact), or the file.")
    parser.add_argument("out_dir", help="A new (or empty) folder for the Hugging Face files.")
    parser.add_argument(
        "--dtype",
        help=f"The weights' dtype, one of {', '.join(DTYPES)} (default: the run's precision, as every finished run's own export: float32 for "
        "an fp32 run, float16 for fp16, bfloat16 for bf16, fp8, mxfp8 and nvfp4).",
    )
    parser.add_argument("--max-shard-size", default="5GB", help="Largest safetensors file (default 5GB).")
    args = parser.parse_args(argv)
    try:
        files = export(args.model_dir, args.out_dir, args.dtype, parse_size(args.max_shard_size))
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported to {args.out_dir}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
