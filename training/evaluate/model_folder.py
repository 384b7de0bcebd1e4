"""The model an evaluation reads: a Hugging Face folder (``config.json`` and weights), found as it is or taken out
of a training job's ``model.tar.gz`` (the ``model`` channel), and checked to have tokenizer files.

A finished run writes its export as ``hf/`` into the model folder (``training.trainer.checkpoint.export_hf``), so into the job's
``model.tar.gz`` beside ``model.pt``. Only the members under ``hf/`` are extracted (the training state is not
needed), with tarfile's ``data`` filter (no links out of the folder, no absolute paths, no devices). The folder is
then read by ``transformers``' own loading (config, weights, tokenizer), so whatever the export writes (grouped-query
attention, tied embeddings, RoPE scaling, a copied tokenizer) is read as transformers reads it.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from training.contract import container

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""Any of these makes a folder loadable by ``AutoTokenizer`` (fast tokenizer, SentencePiece, BPE vocabulary)."""
ARCHIVE = "model.tar.gz"


class ModelFolderError(ValueError):
    """No usable model: the message says what was looked for and why it cannot be evaluated."""


def _is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def extract_export(archive: Path, into: Path, folder: str = container.HF_EXPORT_DIR) -> Path:
    """The ``folder/`` members of ``archive`` extracted under ``into``; returns the extracted folder."""
    prefix = folder.strip("/") + "/"
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = [m for m in tar if m.name.lstrip("./").startswith(prefix) and (m.isfile() or m.isdir())]
            if not members:
                raise ModelFolderError(
                    f"model: {archive} holds no {prefix} folder: the run wrote no Hugging Face export (trained "
                    "with position_encoding=none, or its export failed: see the training job's log)"
                )
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, OSError) as err:
        raise ModelFolderError(f"model: cannot read {archive}: {err}") from None
    return into / prefix.rstrip("/")


def locate(model_dir: str | Path, work_dir: str | Path) -> Path:
    """The Hugging Face folder to evaluate: ``model_dir`` itself, its ``hf/`` folder, or the ``hf/`` folder of the
    ``model.tar.gz`` in it (extracted under ``work_dir``)."""
    path = Path(model_dir)
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        return extract_export(path, Path(work_dir))
    if not path.is_dir():
        raise ModelFolderError(f"model_dir: {path} is neither a folder nor a model.tar.gz")
    for candidate in (path, path / container.HF_EXPORT_DIR):
        if _is_model_folder(candidate):
            return candidate
    archives = sorted(path.glob("*.tar.gz"))
    if len(archives) == 1:
        return extract_export(archives[0], Path(work_dir))
    raise ModelFolderError(
        f"model_dir: {path} holds no Hugging Face folder (config.json), no {container.HF_EXPORT_DIR}/ folder and "
        f"{'no' if not archives else 'more than one'} {ARCHIVE}"
    )


def check_tokenizer(folder: Path) -> None:
    """Refuse a folder without tokenizer files: a byte-level model (``training.prepare``'s default) has
    none, and lm-eval needs a Hugging Face tokenizer to turn the tasks' text into the model's tokens."""
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        return
    readme = folder / "README.md"
    byte_level = readme.is_file() and "Byte-level" in readme.read_text(errors="replace")
    why = (
        "it was trained on byte-level tokens (training.prepare without --tokenizer), which no Hugging Face "
        "tokenizer describes"
        if byte_level
        else "the data it was trained on had no tokenizer.json"
    )
    raise ModelFolderError(
        f"model: {folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)}): {why}. Evaluation needs the "
        "model's own tokenizer: prepare the training data with --tokenizer tokenizer.json and train again "
        "(python -m training.prepare.tokenizer writes one from your text, offline: docs/evaluation.md)."
    )
