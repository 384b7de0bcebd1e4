"""Every parameter's value, from one place: each parameter (torch or Transformer Engine) gets its FULL value, from an
imported Hugging Face model (``init_from``) or from a generator seeded by (seed, tensor name), and then this rank
keeps its shard. Loading weights and initializing them are the same operation, so the initial model is the same
whatever the world size, on the torch path and the TE path, and a torch model and a TE model of one seed hold the
same Hugging Face tensors.

Values are made per Hugging Face tensor (``layout``, the family's names: ``model.layers.3.self_attn.k_proj.weight``
and so on) and fused into our layout (the torch block's ``[q; k; v]`` rows, TE's per-group interleaving), so both
paths share them. Generated values: ones for the RMSNorm weights (zeros for Gemma's ``x * (1 + w)`` norms: the same
identity), zeros for biases, N(0, 0.02) for the others, the output projections of each block
(``o_proj``, ``down_proj``) scaled by 1/sqrt(2 * num_layers) (GPT-2's), each drawn in fp32 on the parameter's
device from its own ``torch.Generator`` seeded by a hash of (seed, name). Imported values: read one tensor at a
time from the folder's safetensors files (``safetensors.safe_open``: the file's header says where the tensor is;
only that tensor is read), converted to fp32 on the CPU, then this rank's rows copied to its device. Memory per
rank: its shard plus one parameter's full value (for a fused one: its parts and the fused value); a 70B load
therefore needs no more GPU memory than the sharded model (the full tensors stay in host memory: at most the
embedding, 128256 x 8192 fp32 = 4.2 GB, per rank at a time).

Transformer Engine. Read at v2.11, ``module/base.py`` ``TransformerEngineBaseModule.reset_parameters``: for every
parameter it takes the DTensor's LOCAL tensor (this rank's shard; ``torch.empty_like(..., device="cuda")`` when it
is still on meta), calls ``param_init_meta[name].init_fn(local)`` under the default RNG (or an RNG tracker's fork),
quantizes the local tensor when primary weights are FP8 (``quantized_model_init``; with ``Float8CurrentScaling`` the
amax is reduced over the mesh's group), and wraps it back into a DTensor of the same global shape and placements.
So with TE's own ``init_method`` every rank drew its shard from the same RNG state: each rank's rows of a weight
were the same numbers, and the model changed with the world size. Here TE still materializes and quantizes, but
each ``init_fn`` is replaced by one that copies this rank's shard of the value this module gives.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from training.models import registry
from training.request import hf_config
from training.trainer import files
from training.trainer.distributed import master_weights
from training.trainer.model import layout
from training.trainer.refusal import Refusal

INIT_STD = 0.02
INDEX_FILE = "model.safetensors.index.json"
IGNORED_TENSORS = ("rotary_emb.inv_freq",)
"""Tensors older Llama checkpoints carry that hold no weights (RoPE's frequencies, recomputed here)."""
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
"""safetensors dtypes of weights this trainer loads (integer or FP8 tensors are quantized checkpoints)."""


# ---------------------------------------------------------------------------------------------------------------
# Where values come from
# ---------------------------------------------------------------------------------------------------------------


class Generated:
    """Initial values: a full fp32 tensor per Hugging Face tensor name, the same on every rank and for every world
    size. ``unit_offset_norms``: the model's norms compute ``x * (1 + w)`` (Gemma), so their weights start at 0
    (the identity, as transformers' ``Gemma3RMSNorm``), not 1."""

    def __init__(self, seed: int, num_layers: int, unit_offset_norms: bool = False):
        self.seed, self.num_layers, self.unit_offset_norms = seed, num_layers, unit_offset_norms

    def tensor(self, name: str, dims: tuple[int, ...], device: torch.device) -> torch.Tensor:
        if name.endswith("norm.weight"):
            fill = torch.zeros if self.unit_offset_norms else torch.ones
            return fill(dims, device=device, dtype=torch.float32)
        if name.endswith(".bias"):  # Qwen 2's query/key/value bias, an attention_bias: zeros, as transformers
            return torch.zeros(dims, device=device, dtype=torch.float32)
        std = INIT_STD
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            std /= math.sqrt(2 * self.num_layers)
        generator = torch.Generator(device=device).manual_seed(seed_of(self.seed, name))
        return torch.empty(dims, device=device, dtype=torch.float32).normal_(0.0, std, generator=generator)

    def work_device(self, device: torch.device) -> torch.device:
        """Where full values are made: on the parameter's device (random numbers are fastest on the GPU)."""
        return device


def seed_of(seed: int, name: str) -> int:
    """The generator seed of tensor ``name``: 63 bits of SHA-256 of ``seed:name`` (stable across runs and
    versions, unlike Python's ``hash``)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class DamagedFileError(ValueError):
    """One weights file of an ``init_from`` folder cannot be read; ``path`` names it."""

    def __init__(self, path: Path, err: BaseException):
        if isinstance(err, FileNotFoundError):
            super().__init__(f"{INDEX_FILE} names {path.name}, which is not in the folder")
        else:
            super().__init__(f"cannot read {path.name}: {_one_line(err)}")
        self.path = path


class HuggingFaceFolder:
    """A Hugging Face model folder's safetensors files, read one tensor at a time (``model.safetensors``, or the
    shards ``model.safetensors.index.json`` lists, or else every ``*.safetensors`` file in it)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._handles: dict[Path, Any] = {}
        self.files = self._weight_map()
        self.nonfinite: list[str] = []  # what ``note_nonfinite`` found in the values this rank loaded

    def _weight_map(self) -> dict[str, Path]:
        index = self.folder / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            return {
                name: files.inside(self.folder, file, INDEX_FILE, f"for {name}")
                for name, file in weight_map.items()
            }
        found: dict[str, Path] = {}
        for path in sorted(self.folder.glob("*.safetensors")):
            files.found_inside(self.folder, path)
            handle = self._open(path)
            found |= dict.fromkeys(handle.keys(), path)
        return found

    def _open(self, path: Path) -> Any:
        if path not in self._handles:
            from safetensors import safe_open

            try:
                self._handles[path] = safe_open(str(path), framework="pt", device="cpu")
            except Exception as err:  # OSError, safetensors' SafetensorError (a header cut short or damaged)
                raise DamagedFileError(path, err) from None
        return self._handles[path]

    def headers(self) -> Iterator[tuple[str, Path, tuple[int, ...], str]]:
        """(name, file, shape, safetensors dtype) of every tensor, read from the headers only."""
        for name, path in self.files.items():
            piece = self._open(path).get_slice(name)
            yield name, path, tuple(piece.get_shape()), piece.get_dtype()

    def tensor(self, name: str, dims: tuple[int, ...], device: torch.device) -> torch.Tensor:
        value = self._open(self.files[name]).get_tensor(name)
        if tuple(value.shape) != dims:  # checked before training (check_init_from); a file changed since
            raise ValueError(f"init_from: {name} has shape {tuple(value.shape)}; the model needs {dims}")
        return value.to(dtype=torch.float32)

    def work_device(self, device: torch.device) -> torch.device:
        """Where full values are made: host memory (only this rank's rows go to the GPU)."""
        return torch.device("cpu")

    def note_nonfinite(self, rows: torch.Tensor, names: list[str], tensors: list[torch.Tensor]) -> None:
        """When ``rows`` (this rank's share of a parameter made of the Hugging Face tensors ``names``, ``tensors``) holds
        a NaN or an infinity, note which tensor of which file (checked on the host, before the copy to the
        device; every rank checks its own rows, so the ranks together check every value once)."""
        if bool(torch.isfinite(rows).all()):
            return
        for name, tensor in zip(names, tensors, strict=True):
            bad = ~torch.isfinite(tensor)
            if bool(bad.any()):
                first = tensor[bad][0].item()
                self.nonfinite.append(
                    f"{name} in {self.files[name].name} holds {int(bad.sum())} non-finite value(s) ({first})"
                )
                return


def source_for(init_from: str | None, seed: int, shape: Any) -> Generated | HuggingFaceFolder:
    """Where the values of the model of ``shape`` (its ``ModelConfig``) come from."""
    if init_from is not None:
        return HuggingFaceFolder(init_from)
    return Generated(seed, shape.num_layers, getattr(shape, "norm", "rmsnorm") == "rmsnorm_unit_offset")


# ---------------------------------------------------------------------------------------------------------------
# Filling the model
# ---------------------------------------------------------------------------------------------------------------


def initialize(
    model: nn.Module,
    *,
    seed: int,
    init_from: str | None = None,
    keep_master_values: bool = False,
    skip: Callable[[str], bool] | None = None,
) -> list[str]:
    """Give every parameter of the sharded ``model`` (``parallel.shard_model``'s) its value: from the Hugging Face
    folder ``init_from``, or generated from ``seed``. Transformer Engine modules are materialized by their own
    ``reset_parameters`` with each ``init_fn`` replaced (see the module doc); the rest are copied into.

    ``reset_parameters`` runs with grad mode ON: at v2.11 it quantizes a primary FP8/MXFP8 weight with
    ``quantizer.set_usage(rowwise=True, columnwise=torch.is_grad_enabled())``, and a weight made without its
    column-wise data cannot be used by the backward pass (FSDP2's backward all-gather sends ``_columnwise_data``,
    ``tensor/mxfp8_tensor.py`` ``fsdp_pre_all_gather``). The copies themselves run under ``no_grad``.

    ``keep_master_values`` (``quantized_model_init``'s fp32 masters): each parameter stored in less than fp32
    keeps its fp32 value from before quantization, where ``master_weights.MasterWeightAdamW`` starts its master.
    ``skip``: parameters with no Hugging Face counterpart that another module fills (``lora.is_adapter``).

    Returns what this rank found non-finite in ``init_from``'s values (``HuggingFaceFolder.note_nonfinite``: one
    line per tensor); the caller agrees with the other ranks and refuses (``refuse_nonfinite``)."""
    shape = model.shape
    source = source_for(init_from, seed, shape)
    te_owned: set[str] = set()
    for module_name, module in model.named_modules():
        if hasattr(module, "param_init_meta"):
            values: dict[str, torch.Tensor] = {}
            for param_name, meta in module.param_init_meta.items():
                full_name = f"{module_name}.{param_name}" if module_name else param_name
                te_owned.add(full_name)
                kept = values if keep_master_values else None
                meta.init_fn = _copy_into(
                    full_name, param_name, getattr(module, param_name), shape, source, kept
                )
                meta.get_rng_state_tracker = None
            with torch.enable_grad():
                module.reset_parameters()
            for param_name, value in values.items():
                master_weights.keep_initial_value(getattr(module, param_name), value)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name not in te_owned and not (skip is not None and skip(name)):
                value = shard_value(name, param, shape, source)
                _local(param).copy_(value)
                if keep_master_values:
                    master_weights.keep_initial_value(param, value)
    return source.nonfinite if isinstance(source, HuggingFaceFolder) else []


def _copy_into(
    name: str, key: str, param: torch.Tensor, shape, source, kept: dict[str, torch.Tensor] | None
) -> Callable[[torch.Tensor], None]:
    """A TE ``init_fn``: copies this rank's shard of ``name``'s value into the local tensor TE passes (and, with
    ``kept``, keeps the fp32 value there under ``key``)."""

    def init_fn(local: torch.Tensor) -> None:
        with torch.no_grad():
            value = shard_value(name, param, shape, source, device=local.device)
            local.copy_(value)
        if kept is not None:
            kept[key] = value

    return init_fn


def shard_value(
    name: str, param: torch.Tensor, shape, source, device: torch.device | None = None
) -> torch.Tensor:
    """This rank's shard of parameter ``name``'s full value (made on the source's work device)."""
    parts = layout.parts(name, shape)
    if parts is None:
        raise ValueError(
            f"{name}: no Hugging Face tensor holds this parameter, so it has no value to load or draw"
        )
    device = device or _local(param).device
    where = source.work_device(device)
    tensors = [source.tensor(n, layout.dims_of(n, shape), where) for n in parts.names]
    full = layout.fuse(parts, tensors, shape)
    if tuple(full.shape) != tuple(param.shape):
        raise ValueError(
            f"{name}: the Hugging Face tensors give shape {tuple(full.shape)}; the parameter is {tuple(param.shape)}"
        )
    rows = local_rows(full, param)
    if isinstance(source, HuggingFaceFolder):
        source.note_nonfinite(rows, list(parts.names), tensors)
    return rows.to(device)


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def local_rows(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The part of ``full`` that ``param`` (a DTensor sharded on dim 0, as FSDP2 shards: over a 1-D mesh, or over
    the second dimension of hybrid sharding's (replicate, shard) mesh; or a replicated or plain tensor) keeps on
    this rank: ``torch.chunk``'s piece of this rank's coordinate on the sharded dimension, empty past the last."""
    if not isinstance(param, DTensor):
        return full
    mesh, placements = param.device_mesh, param.placements
    rows = full
    for dim, placement in enumerate(placements):
        if isinstance(placement, Replicate):
            continue
        if not isinstance(placement, Shard) or placement.dim != 0:
            raise NotImplementedError(f"placements {placements} on a {mesh.ndim}-D mesh")
        chunks = torch.chunk(rows, mesh.size(dim), dim=0)
        rank = mesh.get_local_rank(dim)
        rows = chunks[rank] if rank < len(chunks) else rows[:0]
    if rows.shape != param.to_local().shape:
        raise RuntimeError(
            f"this rank's rows {tuple(rows.shape)} are not its shard {tuple(param.to_local().shape)}"
        )
    return rows


class NonFiniteWeightsError(Refusal, ValueError):
    """The ``init_from`` model holds a NaN or an infinity (raised on every rank together, before step 1: a refusal,
    exit status 2)."""


def refuse_nonfinite(found: list[str], init_from: str | None, group: Any) -> None:
    """Every rank's ``initialize`` findings gathered over ``group``; raise ``NonFiniteWeightsError`` on every rank
    when any rank found a non-finite value (naming the tensor and its file). A collective."""
    if init_from is None:
        return
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, found, group=group)
    lines = sorted({line for part in gathered for line in part})
    if lines:
        more = f" (and {len(lines) - 1} more tensors)" if len(lines) > 1 else ""
        raise NonFiniteWeightsError(
            f"init_from: {init_from}: {lines[0]}{more}; a model cannot be trained from non-finite weights: use "
            "another folder, or repair that tensor"
        )


# ---------------------------------------------------------------------------------------------------------------
# Before step 1
# ---------------------------------------------------------------------------------------------------------------


def check_init_from(cfg) -> None:
    """Refuse, before any process group, an ``init_from`` folder whose safetensors do not hold the model its
    config.json describes (``cfg.shape``, derived from it): no weights files, an index naming a missing file, a
    tensor missing, of another shape or not a float type, a tensor the model's class has no place for. Reads the files'
    headers only. Each refusal is one ``settings_table.ContractError`` on ``init_from``."""
    if cfg.init_from is None:
        return
    where = cfg.init_from
    try:
        folder = HuggingFaceFolder(where)
        found = {name: (path, dims, dtype) for name, path, dims, dtype in folder.headers()}
    except (DamagedFileError, files.OutsideFolderError) as err:  # the file, not only the folder
        raise hf_config.refuse(where, str(err)) from None
    except Exception as err:  # OSError, a bad index (ValueError, KeyError), safetensors' own SafetensorError
        raise hf_config.refuse(where, f"cannot read its safetensors: {_one_line(err)}") from None
    if not found:
        raise hf_config.refuse(
            where, f"holds no weights: no model.safetensors, no {INDEX_FILE} and no other *.safetensors file"
        )
    expected = layout.hf_tensors(cfg.shape)
    missing = [name for name in expected if name not in found]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise hf_config.refuse(
            where, f"has no tensor {missing[0]}{more}, which its config.json's model needs"
        )
    for name, dims in expected.items():
        path, actual, dtype = found[name]
        if actual != dims:
            raise hf_config.refuse(
                where, f"{name} in {path.name} has shape {actual}; its config.json's model needs {dims}"
            )
        if dtype not in FLOAT_DTYPES:
            raise hf_config.refuse(
                where, f"{name} in {path.name} is {dtype}; loadable: {', '.join(sorted(FLOAT_DTYPES))}"
            )
    tied_head = "lm_head.weight" if cfg.shape.tie_embeddings else None
    extra = [n for n in found if n not in expected and n != tied_head and not n.endswith(IGNORED_TENSORS)]
    if extra:
        architecture = registry.family(cfg.shape.family).architecture
        raise hf_config.refuse(
            where, f"holds tensors {architecture} has no place for: {', '.join(extra[:3])}"
        )


def _one_line(err: BaseException) -> str:
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text[:300]}"
