"""A local preparation's output folder, all or nothing: made (with its missing parents) when the preparation starts
writing, and when it is refused or interrupted, the files it was writing (its own names, which the caller checked
were free, and their ``.partial`` copies) removed again with every folder it made. A folder that was there before
stays, with whatever else it holds."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

PARTIAL = ".partial"


@contextmanager
def output_folder(out: Path, names: Sequence[str], error: type[Exception]) -> Iterator[Path]:
    """Make ``out`` for the block's files ``names`` (none of which exists: the caller refused the folder
    otherwise); when the block raises, remove those files and the folders made here, then re-raise. A folder
    that cannot be made is ``error("output: ...")``."""
    made = []
    folder = out
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise error(f"output: cannot make the folder {out}: {err.strerror or err}") from None
        yield out
    except BaseException:
        for name in names:
            for path in (out / name, out / (name + PARTIAL)):
                path.unlink(missing_ok=True)
        for path in made:  # deepest first; one that now holds something else stays
            try:
                path.rmdir()
            except OSError:
                break
        raise
