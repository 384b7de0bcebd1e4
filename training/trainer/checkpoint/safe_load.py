"""Reading pickled files without running what they carry: ``model.pt`` (the exports), a checkpoint's ``rank_*.pt``
trainer state, and DCP's own pickles (its ``.metadata`` and the non-tensor values it stores as bytes).

A pickle can name any importable function and call it while it is read, so a file changed in the bucket (or a
``model.pt`` from elsewhere) would run its code in the job or on the user's machine. Everything here is read with
``torch.load(weights_only=True)`` (torch's restricted unpickler: tensors, storages, dtypes, containers and plain
values) or, for DCP's ``.metadata`` (a plain ``pickle.dump`` of its ``Metadata``), by an unpickler that resolves
only the classes DCP's metadata is made of. What this trainer writes needs nothing more: its trainer state holds
tensors (the RNG state), numbers, strings and containers; ``model.pt`` tensors (Transformer Engine's quantized
weights written as their values: ``model_file.save_model``), numbers, strings, bytes and containers; DCP's byte
values are the optimizer's hyperparameters. So nothing is added to torch's allow-list
(``torch.serialization.add_safe_globals``). A file that holds more is refused with one line naming it
(``UnsafeFileError``), and nothing in it runs.

torch 2.9 (the image) and 2.13 (the tests) have the same ``FileSystemReader.read_metadata`` and
``DefaultLoadPlanner.load_bytes`` (read in both), which ``Reader`` and ``Planner`` replace.
"""

from __future__ import annotations

import collections
import io
import pathlib
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata


class UnsafeFileError(pickle.UnpicklingError):
    """A file holds more than tensors and plain values; the message names it and what was refused."""

    def __init__(self, path: str | Path, refused: str):
        super().__init__(
            f"{path} was not loaded: it holds more than tensors and plain values ({refused}): changed, or not "
            "written by this trainer; nothing in it was run"
        )
        self.path, self.refused = path, refused  # a path, or an S3 URI (which Path would turn into s3:/)

    def __reduce__(self) -> tuple:  # DCP gathers a rank's exception to every rank (pickled)
        return (type(self), (self.path, self.refused))


def load(path: str | Path | io.BytesIO, name: str | Path | None = None, **kwargs: Any) -> Any:
    """``torch.load(path, weights_only=True, **kwargs)``; a file torch's restricted unpickler refuses raises
    ``UnsafeFileError`` naming ``name`` (default ``path``)."""
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as err:
        raise UnsafeFileError(name if name is not None else path, _refused(str(err))) from None


def plain(value: Any) -> Any:
    """A value of a state dict as ``model.pt`` holds it: a tensor subclass with ``dequantize`` (Transformer
    Engine's quantized primary weights, ``quantized_model_init``) as its value, a plain tensor of its nominal
    dtype, as the export reads it (a weights-only load refuses the subclass); anything else as it is. (Read at TE
    v2.11: the state dict's offload to the CPU already goes through ``QuantizedTensor.__torch_dispatch__``, which
    dequantizes for ``_to_copy``; this keeps ``model.pt`` plain whatever gave the values.)"""
    if (
        isinstance(value, torch.Tensor)
        and type(value) not in (torch.Tensor, torch.nn.Parameter)
        and callable(getattr(value, "dequantize", None))
    ):
        return value.dequantize()
    return value


def _refused(message: str) -> str:
    """What torch's weights-only unpickler refused, from its (long, several-line) message."""
    found = re.search(r"GLOBAL (\S+)", message)
    if found:
        return f"it names GLOBAL {found.group(1)}"
    lines = [
        line.strip()
        for line in message.splitlines()
        if line.strip() and not line.startswith(("Weights only load failed", "Check the documentation"))
    ]
    return (lines[-1] if lines else message.strip())[:200]


def _metadata_classes() -> dict[tuple[str, str], Any]:
    """What DCP's ``.metadata`` pickle may resolve: the classes (dataclasses and an enum) DCP's metadata module
    defines, its storage record (``_StorageInfo``), ``torch.Size``, torch's dtypes, torch's layout lookup by name,
    and the path a save records as its checkpoint id. Each builds a value from its arguments and does nothing
    else."""
    allowed: dict[tuple[str, str], Any] = {
        (dcp_metadata.__name__, name): value
        for name, value in vars(dcp_metadata).items()
        if isinstance(value, type) and value.__module__ == dcp_metadata.__name__
    }
    allowed[(dcp_filesystem.__name__, "_StorageInfo")] = dcp_filesystem._StorageInfo
    allowed.update(
        {("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
    )
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    allowed.update({("pathlib", name): getattr(pathlib, name) for name in ("PosixPath", "PurePosixPath")})
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    allowed = _metadata_classes()

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name} is not part of DCP's metadata")
        return found


class SafeMetadata:
    """A mixin for a subclass of DCP's ``FileSystemReader`` (the folder's ``Reader`` here, the S3 connector's
    ``S3StorageReader`` in ``s3_dcp``, which inherits DCP's ``read_metadata``): its ``.metadata`` unpickled by
    ``_MetadataUnpickler`` (DCP's own reader calls ``pickle.load``)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            try:
                metadata = _MetadataUnpickler(stream).load()
            except pickle.UnpicklingError as err:
                raise UnsafeFileError(path, _refused(str(err))) from None
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise UnsafeFileError(path, f"a {type(metadata).__name__}, not DCP's Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class Reader(SafeMetadata, FileSystemReader):
    """DCP's folder reader, its ``.metadata`` read by ``SafeMetadata``."""


class Planner(DefaultLoadPlanner):
    """DCP's default load planner for the checkpoint ``folder`` (a path, or an S3 prefix's URI), its byte values
    (what is not a tensor) read weights-only (DCP's own planner reads them with ``weights_only=False``); a refusal
    names the file the value was stored in."""

    def __init__(self, folder: str | Path, **kwargs: Any):
        super().__init__(**kwargs)
        self.folder = folder

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        stored = self.metadata.storage_data.get(read_item.storage_index) if self.metadata else None
        where = (
            f"{str(self.folder).rstrip('/')}/{stored.relative_path}" if stored is not None else self.folder
        )
        loaded = load(value, name=f"{where} (its value {fqn})")
        if self.flatten_state_dict:
            # as DCP's planner does (the same function in 2.9 and 2.13)
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
