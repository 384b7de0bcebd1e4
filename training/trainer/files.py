"""File names read from files, confined to their folder: the token files, masks and document offsets a data folder's
``metadata.json`` lists, its tokenizer, and the shards a model's ``model.safetensors.index.json`` maps tensors to.

Such a name is data, not a path to follow: ``../x``, an absolute name, or a link that leads out of the folder would
read any file of the machine into training (or into an export). A name is accepted when the file it names, links
resolved, is inside the folder (links resolved too); one exception, Hugging Face's cache, whose
``snapshots/<revision>/`` folders hold links into the same repository's ``blobs/`` (``hf download`` without
``--local-dir``): that is one model, and its links are followed.
"""

from __future__ import annotations

import os
from pathlib import Path


class OutsideFolderError(ValueError):
    """A listed name leads out of its folder; the message names the listing, the name and the folder."""


def inside(folder: str | Path, name: str, listing: str, role: str) -> Path:
    """``folder / name`` when the file it names (links resolved) is inside ``folder``; else ``OutsideFolderError``:
    ``{listing} names '{name}' {role}, which is outside the folder {folder}: ...`` (``listing``: the file the name
    was read from; ``role``: what the name is there, e.g. ``as a file of the train split``)."""
    base = Path(folder)
    if not isinstance(name, str) or not name or os.path.isabs(name) or not _within(base, base / name):
        raise OutsideFolderError(
            f"{listing} names {name!r} {role}, which is outside the folder {base}: every file it lists must be "
            "inside it"
        )
    return base / name


def found_inside(folder: str | Path, path: Path) -> None:
    """A file found by searching ``folder`` (no listing): refused when it is a link that leads out of it."""
    if not _within(Path(folder), path):
        raise OutsideFolderError(
            f"{path} is a link to {path.resolve()}, outside the folder {folder}: copy the file into the folder"
        )


def _within(folder: Path, path: Path) -> bool:
    real_folder, real = folder.resolve(), path.resolve()
    if real.is_relative_to(real_folder):
        return True
    # Hugging Face's cache: <repo>/snapshots/<revision>/name -> ../../blobs/<hash>
    return real_folder.parent.name == "snapshots" and real.is_relative_to(real_folder.parent.parent / "blobs")
