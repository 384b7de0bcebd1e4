"""The trained model as a Hugging Face ``LlamaForCausalLM`` folder: ``python -m training.trainer.export_hf MODEL_DIR OUT_DIR``.

Reads ``model.pt`` (``checkpoint.save_model``: ``{"config", "step", "state_dict", "data"}``) and writes into
``OUT_DIR`` (which must not exist, or be empty; nothing is overwritten):

* ``config.json``: a ``LlamaForCausalLM`` config (sizes, heads, ``num_key_value_heads`` = heads, since the model
  has no grouped-query attention, ``intermediate_size``, ``rms_norm_eps``, ``rope_theta``, vocabulary, untied
  embeddings, no biases, dtype);
* ``model.safetensors``, or above ``--max-shard-size`` shards ``model-0000i-of-0000n.safetensors`` and
  ``model.safetensors.index.json`` (``{"metadata": {"total_size"}, "weight_map"}``, Hugging Face's layout);
* ``generation_config.json`` (end-of-text id when the data had one);
* ``tokenizer.json`` and ``tokenizer_config.json`` when the data was prepared with a ``tokenizer.json``
  (``training.trainer.prepare``; the trainer stores it in ``model.pt``);
* ``README.md``: what the model is, how it was trained, how to load it, and its tokenizer (byte-level: say so).

Weight mapping. The torch block's fused ``qkv`` is ``[q; k; v]`` (rows ``0:h``, ``h:2h``, ``2h:3h``), ``gate_up``
is ``[gate; up]`` (``silu(gate) * up``). Transformer Engine 2.11's ``TransformerLayer`` (``fuse_qkv_params=True``,
``qkv_weight_interleaved=True``, RMSNorm, SwiGLU, no bias) names them
``self_attention.layernorm_qkv.{layer_norm_weight,weight}``, ``self_attention.proj.weight``,
``layernorm_mlp.{layer_norm_weight,fc1_weight,fc2_weight}`` (``module/layernorm_linear.py``: ``weight_names =
["weight"]`` without ``parameters_split``; ``module/layernorm_mlp.py``: ``fc1_weight`` is ``[2 * ffn, hidden]`` for
swiglu, ``fc2_weight`` ``[hidden, ffn]``), plus ``_extra_state`` entries (FP8 metadata, skipped). Its fused QKV
rows are interleaved per query group: ``[groups, heads/groups + 2, head_dim, hidden]`` with each group's query
heads, then its key, then its value (``attention/multi_head_attention.py``, forward: ``[sq, b, ng * (np/ng + 2)
* hn] --> [sq, b, ng, (np/ng + 2), hn]``, split ``(np/ng, 1, 1)`` along dim -2). SwiGLU gates the FIRST half of
``fc1``'s output (``ops/basic/activation.py``, ``SwiGLU``: "Transformer Engine applies the gating function to the
first half"), so ``fc1 = [gate; up]``. Rotary embeddings are rotate-half in both blocks and in Llama
(``training.trainer.rotary``), so query and key projections map over unpermuted.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from training.request import contract
from training.trainer.model import INIT_STD, NORM_EPS

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9
"""Hugging Face's own default shard limit for ``save_pretrained`` (5 GB)."""
HF_DIR = contract.HF_EXPORT_DIR
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
    """``model.pt``'s dict (tensors memory-mapped, not read into memory at once)."""
    try:
        saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError:
        # Transformer Engine's quantized primary weights (quantized_model_init) are tensor subclasses that only
        # full unpickling restores; the file is this trainer's own output.
        saved = _load_unrestricted(path)
    except Exception as err:  # torch raises several types for a file it cannot read
        raise ExportError(f"model_dir: cannot read {path}: {type(err).__name__}: {err}") from None
    if not isinstance(saved, dict) or not {"config", "state_dict"} <= saved.keys():
        raise ExportError(
            f"model_dir: {path} is not a model saved by this trainer (no config and state_dict)"
        )
    return saved


def _load_unrestricted(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception as err:
        raise ExportError(f"model_dir: cannot read {path}: {type(err).__name__}: {err}") from None


def check_exportable(config: dict[str, Any], path: Path) -> None:
    """Refuse a model Llama's architecture cannot represent: one trained without rotary embeddings."""
    encoding = config.get("position_encoding", "none")  # saved before the setting existed: NoPE
    if encoding != "rope":
        raise ExportError(
            f"position_encoding: {path} was trained with position_encoding={encoding} (no position encoding); "
            "LlamaForCausalLM always applies rotary embeddings, so these weights would load there and give wrong "
            "outputs. Only models trained with position_encoding=rope can be exported."
        )


def shape_of(config: dict[str, Any]) -> contract.ModelShape:
    return contract.ModelShape(**{name: int(config[name]) for name in contract.MODEL_DIM_NAMES})


# ---------------------------------------------------------------------------------------------------------------
# The weight mapping
# ---------------------------------------------------------------------------------------------------------------


def _take(state: dict[str, torch.Tensor], used: set[str], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if name not in state:
        raise ExportError(f"state_dict: {name} is missing")
    tensor = state[name]
    dequantize = getattr(tensor, "dequantize", None)  # TE's quantized primary weights (quantized_model_init)
    if callable(dequantize) and type(tensor) is not torch.Tensor:
        tensor = dequantize()
    if tuple(tensor.shape) != shape:
        raise ExportError(f"state_dict: {name} has shape {tuple(tensor.shape)}; expected {shape}")
    used.add(name)
    return tensor


def _torch_layer(state, used, prefix: str, shape: contract.ModelShape) -> dict[str, torch.Tensor]:
    h, f = shape.hidden_size, shape.ffn_hidden_size
    q, k, v = _take(state, used, f"{prefix}qkv.weight", (3 * h, h)).split(h, dim=0)
    gate, up = _take(state, used, f"{prefix}gate_up.weight", (2 * f, h)).split(f, dim=0)
    return {
        "input_layernorm.weight": _take(state, used, f"{prefix}attention_norm.weight", (h,)),
        "self_attn.q_proj.weight": q,
        "self_attn.k_proj.weight": k,
        "self_attn.v_proj.weight": v,
        "self_attn.o_proj.weight": _take(state, used, f"{prefix}out_proj.weight", (h, h)),
        "post_attention_layernorm.weight": _take(state, used, f"{prefix}ffn_norm.weight", (h,)),
        "mlp.gate_proj.weight": gate,
        "mlp.up_proj.weight": up,
        "mlp.down_proj.weight": _take(state, used, f"{prefix}down.weight", (h, f)),
    }


def split_te_qkv(
    weight: torch.Tensor, num_heads: int, num_groups: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TE's interleaved fused QKV weight ``[groups * (heads/groups + 2) * head_dim, hidden]`` -> q, k, v weights
    ``[heads * head_dim, hidden]``, ``[groups * head_dim, hidden]`` twice (see the module doc)."""
    per_group = num_heads // num_groups
    grouped = weight.view(num_groups, per_group + 2, head_dim, weight.shape[-1])
    q, k, v = grouped.split((per_group, 1, 1), dim=1)
    return tuple(t.reshape(-1, weight.shape[-1]) for t in (q, k, v))  # type: ignore[return-value]


def _te_layer(state, used, prefix: str, shape: contract.ModelShape) -> dict[str, torch.Tensor]:
    h, f, n = shape.hidden_size, shape.ffn_hidden_size, shape.num_heads
    qkv = _take(state, used, f"{prefix}self_attention.layernorm_qkv.weight", (3 * h, h))
    q, k, v = split_te_qkv(qkv, n, n, h // n)
    gate, up = _take(state, used, f"{prefix}layernorm_mlp.fc1_weight", (2 * f, h)).split(f, dim=0)
    return {
        "input_layernorm.weight": _take(
            state, used, f"{prefix}self_attention.layernorm_qkv.layer_norm_weight", (h,)
        ),
        "self_attn.q_proj.weight": q,
        "self_attn.k_proj.weight": k,
        "self_attn.v_proj.weight": v,
        "self_attn.o_proj.weight": _take(state, used, f"{prefix}self_attention.proj.weight", (h, h)),
        "post_attention_layernorm.weight": _take(
            state, used, f"{prefix}layernorm_mlp.layer_norm_weight", (h,)
        ),
        "mlp.gate_proj.weight": gate,
        "mlp.up_proj.weight": up,
        "mlp.down_proj.weight": _take(state, used, f"{prefix}layernorm_mlp.fc2_weight", (h, f)),
    }


def to_hf_state_dict(state: dict[str, torch.Tensor], shape: contract.ModelShape) -> dict[str, torch.Tensor]:
    """The trainer's state dict (torch or Transformer Engine blocks) under ``LlamaForCausalLM``'s names.

    Every entry must be used (TE's ``_extra_state`` excepted): an unknown name is an error, not a silent drop."""
    used: set[str] = set()
    h, vocab = shape.hidden_size, shape.vocab_size
    out = {
        "model.embed_tokens.weight": _take(state, used, "embed.weight", (vocab, h)),
        "model.norm.weight": _take(state, used, "norm.weight", (h,)),
        "lm_head.weight": _take(state, used, "head.weight", (vocab, h)),
    }
    for index in range(shape.num_layers):
        prefix = f"layers.{index}."
        layer = _te_layer if f"{prefix}self_attention.layernorm_qkv.weight" in state else _torch_layer
        for name, tensor in layer(state, used, prefix, shape).items():
            out[f"model.layers.{index}.{name}"] = tensor
    unused = sorted(name for name in state if name not in used and not name.endswith("_extra_state"))
    if unused:
        shown = ", ".join(unused[:5]) + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
        raise ExportError(f"state_dict: entries with no Llama counterpart: {shown}")
    return out


# ---------------------------------------------------------------------------------------------------------------
# The folder's files
# ---------------------------------------------------------------------------------------------------------------


def hf_config(config: dict[str, Any], dtype: str, eos_id: int | None) -> dict[str, Any]:
    """``config.json`` of ``LlamaForCausalLM`` for the trainer's settings ``config``."""
    shape = shape_of(config)
    theta = float(config["rope_theta"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.ffn_hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_heads,
        "head_dim": shape.hidden_size // shape.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": int(config["seq_length"]),
        "rms_norm_eps": NORM_EPS,
        # rope_theta at the top level for readers before transformers 5, rope_parameters for 5.x.
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
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


def write_tokenizer(data: dict[str, Any] | None, out: Path, max_length: int) -> str:
    """Tokenizer files when the data had a ``tokenizer.json``; returns the README's tokenizer paragraph."""
    if data is None:
        return "Unknown: this model file was saved before the trainer recorded how its data was tokenized."
    if data.get("dataset") == "synthetic":
        return (
            "None: trained on synthetic tokens (`dataset=synthetic`), so the model has learnt no language. Use it "
            "to check the pipeline, not to generate text."
        )
    info = data.get("tokenizer") or {}
    if not info:
        return "Unknown: the token files had no `metadata.json` (not made by `training.trainer.prepare`)."
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


def readme(config: dict[str, Any], step: int, dtype: str, files: list[str], tokenizer_text: str) -> str:
    shape = shape_of(config)
    return f"""# Llama-architecture model exported by `training.trainer.export_hf`

Trained by this project's FSDP2 trainer for {step} steps (precision `{config.get("precision")}`,
`seq_length={config.get("seq_length")}`, rotary embeddings with `rope_theta={float(config["rope_theta"]):g}`),
{shape.parameter_count():,} parameters: {shape.num_layers} layers, hidden size {shape.hidden_size},
{shape.num_heads} heads (no grouped-query attention), MLP {shape.ffn_hidden_size}, vocabulary {shape.vocab_size},
untied input and output embeddings. Weights in `{dtype}`: {", ".join(f"`{f}`" for f in files)}.

## Tokenizer

{tokenizer_text}

## Load it

```python
import torch
from transformers import LlamaForCausalLM

model = LlamaForCausalLM.from_pretrained("PATH/TO/THIS/FOLDER", dtype=torch.{dtype})
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


def export(
    model_dir: str | Path,
    out_dir: str | Path,
    dtype: str = "bfloat16",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_SIZE,
) -> list[str]:
    """Write the Hugging Face folder for the model in ``model_dir`` into ``out_dir``; returns its file names.

    Everything is checked before anything is written; the folder appears whole (renamed from ``.partial``)."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype: must be one of {', '.join(DTYPES)}; got {dtype!r}")
    if max_shard_bytes < 1:
        raise ExportError(f"max_shard_size: must be at least 1 byte; got {max_shard_bytes}")
    path = find_model_file(model_dir)
    saved = load_model_file(path)
    config = saved["config"]
    check_exportable(config, path)
    tensors = to_hf_state_dict(saved["state_dict"], shape_of(config))
    out = Path(out_dir)
    tmp = _fresh_folder(out)
    data = saved.get("data")
    eos_id = ((data or {}).get("tokenizer") or {}).get("eos_id")
    files = write_weights(tensors, tmp, max_shard_bytes, DTYPES[dtype])
    (tmp / "config.json").write_text(json.dumps(hf_config(config, dtype, eos_id), indent=2) + "\n")
    generation = {"bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": None}
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer_text = write_tokenizer(data, tmp, int(config["seq_length"]))
    (tmp / "README.md").write_text(readme(config, int(saved.get("step", 0)), dtype, files, tokenizer_text))
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
    """What ``model.pt`` records about the run's data for the export: the dataset kind, the tokenizer description
    from ``metadata.json`` and, for a Hugging Face tokenizer, the text of its ``tokenizer.json`` (looked for in
    the data folder, where ``prepare`` copies it, then at the path ``prepare`` read it from)."""
    info: dict[str, Any] = {"dataset": cfg.dataset}
    if cfg.dataset != "channel":
        return info
    from training.trainer import data  # numpy; only a training run gets here

    directory = Path(data.channel_dir(cfg))
    meta = data.read_metadata(directory)
    tokenizer = (meta or {}).get("tokenizer") or {}
    info["tokenizer"] = tokenizer
    if tokenizer.get("kind") == "tokenizers":
        candidates = [directory / tokenizer["file"]] if tokenizer.get("file") else []
        candidates += [Path(tokenizer["path"])] if tokenizer.get("path") else []
        found = next((p for p in candidates if p.is_file()), None)
        info["tokenizer_json"] = found.read_text() if found else None
    return info


def export_after_training(model_file: Path, cfg) -> str:
    """Export a finished run's ``model_file`` into ``hf/`` next to it (``hf_step_XXXXXXXX/`` when ``hf/`` is
    taken); returns the line to print. fp32 runs export float32 weights, the others bfloat16."""
    if cfg.position_encoding != "rope":
        return (
            f"Hugging Face export skipped: position_encoding={cfg.position_encoding} (only models trained with "
            "rotary embeddings map onto LlamaForCausalLM)"
        )
    out = model_file.parent / HF_DIR
    if out.exists():
        out = model_file.parent / f"{HF_DIR}_{model_file.stem.removeprefix('model_')}"
    dtype = "float32" if cfg.precision == "fp32" else "bfloat16"
    try:
        files = export(model_file, out, dtype)
    except ExportError as err:
        return f"error: Hugging Face export failed (the model file is kept): {err}"
    return f"Hugging Face model ({dtype}) exported to {out}: {', '.join(files)}"


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
        prog="python -m training.trainer.export_hf", description=__doc__.splitlines()[0]
    )
    parser.add_argument("model_dir", help="A folder holding model.pt (a job's model artifact), or the file.")
    parser.add_argument("out_dir", help="A new (or empty) folder for the Hugging Face files.")
    parser.add_argument(
        "--dtype", default="bfloat16", help=f"Weights' dtype: {', '.join(DTYPES)} (default bfloat16)."
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
