"""What ``blackwell-training evaluate --compare`` prints: the runs' scores per task, in columns that fit the
terminal (cells on lines of their own, or the tasks split over tables, where they would not)."""

from __future__ import annotations

from typing import Any

from constructs_lib.cli.render import say, score_text


def print_compare(out: Any, rows: list[dict[str, Any]]) -> None:
    """Runs side by side: precision, max_steps, final and validation loss, then each task's acc / acc_norm. Every
    cell on one line when that fits the terminal; else each cell on lines of its own and the tasks over as many
    tables as the width needs; a run name is never cut (where even one task would not fit beside the names, the
    runs are numbered and named whole above the table)."""
    tasks = sorted({task for row in rows for task in row["scores"]})
    losses = [k for k in ("final_loss", "val_loss") if any(row[k] is not None for row in rows)]
    wide = _compare_columns(rows, tasks, losses, narrow=False)
    if _table_width(wide) <= out.width:
        _print_columns(out, "Runs compared (acc / acc_norm ± standard error; chance in the header)", wide)
        return
    numbered = _table_width(_compare_columns(rows, tasks[:1], losses, narrow=True)) > out.width
    if numbered:
        for number, row in enumerate(rows, start=1):
            say(out, f"run {number}: {_run_text(row, ' ')}")
    groups, rest = [], tasks  # as many tasks to a table as fit beside the runs, at least one
    while rest:
        count = 1
        while count < len(rest):
            if _table_width(_compare_columns(rows, rest[: count + 1], losses, True, numbered)) > out.width:
                break
            count += 1
        groups.append(rest[:count])
        rest = rest[count:]
    for index, group in enumerate(groups or [[]]):
        title = "Runs compared (acc over acc_norm, ± standard error)"
        _print_columns(out, title if index == 0 else "Runs compared (continued)",
                       _compare_columns(rows, group, losses, True, numbered))  # fmt: skip


def _run_text(row: dict[str, Any], sep: str) -> str:
    return row["run"] + (f"{sep}(of {row['trained_run']})" if row["trained_run"] != row["run"] else "")


def _compare_columns(
    rows: list[dict[str, Any]], tasks: list[str], losses: list[str], narrow: bool, numbered: bool = False
) -> list[tuple[str, list[str]]]:
    """``compare``'s columns (heading, one cell per run): ``narrow`` puts each heading's and cell's parts on lines
    of their own; ``numbered`` shows the runs' numbers instead of their names."""
    from constructs_lib.cli.evaluation import chance

    sep = "\n" if narrow else " "
    names = [str(n) for n in range(1, len(rows) + 1)] if numbered else [_run_text(r, sep) for r in rows]
    columns = [("run", names), ("precision", [str(r["precision"] or "-") for r in rows]),
               (f"max{sep}steps" if narrow else "max_steps", [str(r["max_steps"] or "-") for r in rows])]  # fmt: skip
    for k in losses:
        columns.append((k.replace("_", sep), [f"{r[k]:.4f}" if r[k] is not None else "-" for r in rows]))
    for task in tasks:
        level = chance(task)
        cells = []
        for row in rows:
            values = row["scores"].get(task, {})
            texts = [score_text(values, f) or "-" for f in ("acc", "acc_norm")]
            cells.append(("\n" if narrow else " / ").join(texts) if values else "-")
        columns.append((task + (f"{sep}(chance {level:.2f})" if level else ""), cells))
    return columns


def _table_width(columns: list[tuple[str, list[str]]]) -> int:
    """The width of a rich table of these columns, none wrapped: the longest line of each, its padding (one
    space each side) and the borders."""
    lines = [
        max(len(line) for text in (heading, *cells) for line in text.split("\n"))
        for heading, cells in columns
    ]
    return sum(lines) + 3 * len(columns) + 1


def _print_columns(out: Any, title: str, columns: list[tuple[str, list[str]]]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    for heading, _ in columns:
        table.add_column(heading, justify="left" if heading == "run" else "right", no_wrap=True)
    for cells in zip(*(cells for _, cells in columns), strict=True):
        table.add_row(*(Text(cell) for cell in cells))
    out.print(table)
