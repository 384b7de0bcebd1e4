"""What a prepared data folder's ``metadata.json`` records that the trainer's settings must agree with: the dtype its
``.bin`` token files were written in. The trainer refuses a ``token_dtype`` that contradicts it at its start
(``training.trainer.preflight``), and the request check decides the same before launch (``training.request.value``)
in the same words, from :func:`token_dtype_refusal`.

Part of the contract between the infrastructure (``constructs_lib``) and the trainer: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.contract.settings_table import HYPERPARAMETERS_BY_NAME, ContractError

TOKEN_DTYPES: tuple[str, ...] = tuple(HYPERPARAMETERS_BY_NAME["token_dtype"].choices)
"""The integer types the trainer reads ``.bin`` token files in (the ``token_dtype`` setting's choices)."""


def raw_token_files(meta: Mapping[str, Any]) -> bool:
    """Whether ``metadata.json``'s train split lists a ``.bin`` file (raw values of the recorded ``token_dtype``;
    a ``.npy`` file carries its own dtype)."""
    splits = meta.get("splits")
    entry = splits.get("train") if isinstance(splits, Mapping) else None
    files = entry.get("files") if isinstance(entry, Mapping) else None
    return isinstance(files, list) and any(isinstance(name, str) and name.endswith(".bin") for name in files)


def token_dtype_refusal(recorded: str, given: str, where: str) -> ContractError | None:
    """The refusal of a run whose ``token_dtype`` (``given``) is not the dtype ``recorded`` in the data's
    ``metadata.json`` (``where``), or None when they agree."""
    if given == recorded:
        return None
    return ContractError(
        "token_dtype", f"must be {recorded}, the dtype the data was written in ({where}); got {given}"
    )
