"""Every table of figures in README.md and docs/*.md is produced by a named command, and what is cheap to recompute
is recomputed here, so that a changed default or formula cannot leave a table stale.

A figure is marked by the line right before its table (or its block of output): ``<!-- figure: python -m MODULE
ARGS -->``. Every table in docs/measurements.md must have one, and so must any table elsewhere whose header shows
GiB, GB or tokens/s. The command must parse with the module's own ``parse_args``. For the commands in
:data:`RECOMPUTED`, the columns that come from the memory plan's closed form (``training/plan/``, no torch)
and the configurations themselves are recomputed; a difference fails with the command to run again.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import shlex
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from tests.docs.pages import Page, Table

MEASUREMENTS = "docs/measurements.md"
FIGURE_HEADERS = ("GiB", "(GB)", "tokens/s")


def _rerun(command: str, table: Table) -> str:
    return f"{table.where()}: stale: run `{command}` and paste its output there"


def check_agreement(module: ModuleType, argv: list[str], table: Table) -> list[str]:
    """The plan-agreement table: its configurations (``ROWS``, labelled with the contract's defaults) and the
    closed-form column."""
    rows = module.selected(module.parse_args(argv))
    expected = [
        (row.label(), f"{round(module.closed_form_gib(row), 3):.2f}") for row in rows
    ]  # as evaluate/format_table
    shown = [(row[0], row[1]) for row in table.rows]
    if shown == expected:
        return []
    first = next((i for i, pair in enumerate(expected) if i >= len(shown) or shown[i] != pair), len(expected))
    detail = (
        f"the table has {len(shown)} rows, ROWS {len(expected)}"
        if first >= len(expected) or first >= len(shown)
        else f"row {first + 1} shows {shown[first]}, the closed form gives {expected[first]}"
    )
    command = " ".join(["python -m", module.__name__, *map(shlex.quote, argv)])
    return [f"{_rerun(command, table)} ({detail})"]


def check_loss_table(module: ModuleType, argv: list[str], table: Table) -> list[str]:
    """The chunked-loss table: its header (the chunks, the contract's default when not given), its cells' order and
    the closed-form columns."""
    args = module.parse_args(argv)
    chunks = [int(c) for c in args.chunks.split(",")]
    command = " ".join(["python -m", module.__name__, *map(shlex.quote, argv)])
    header = [c.strip() for c in module.header(args, chunks)[0].strip("|").split("|")]
    if table.header != header:
        return [f"{_rerun(command, table)} (header {table.header}, the command prints {header})"]
    cells = [(v, b) for v in args.vocabs.split(",") for b in args.batches.split(",")]
    if [(row[0], row[1]) for row in table.rows] != cells:
        return [
            f"{_rerun(command, table)} (rows {[(r[0], r[1]) for r in table.rows]}, the command prints {cells})"
        ]
    for row in table.rows:
        for index, chunk in enumerate(chunks):
            closed = f"{module.closed_form_gib(args, int(row[0]), int(row[1]), chunk):.2f}"
            if row[3 + 2 * index] != closed:
                return [f"{_rerun(command, table)} (vocabulary {row[0]}, micro-batch {row[1]}, chunk {chunk}: "
                        f"closed form {row[3 + 2 * index]} shown, {closed} now)"]  # fmt: skip
    return []


def check_seed(module: ModuleType, argv: list[str], table: Table) -> list[str]:
    """The seed comparison is closed form only: the whole table."""
    printed = Page.parse(module.table() + "\n", Path("printed.md"), "printed").tables[0]
    if (table.header, table.rows) != (printed.header, printed.rows):
        return [_rerun(f"python -m {module.__name__}", table)]
    return []


def check_preset_plans(module: ModuleType, argv: list[str], table: Table) -> list[str]:
    """The presets' plans are closed form only: the whole table."""
    printed = Page.parse(module.table(module.parse_args(argv)) + "\n", Path("printed.md"), "printed").tables[
        0
    ]
    if (table.header, table.rows) != (printed.header, printed.rows):
        return [_rerun(" ".join(["python -m", module.__name__, *map(shlex.quote, argv)]), table)]
    return []


def check_layouts(module: ModuleType, argv: list[str], table: Table) -> list[str]:
    """The layouts' plans (memory, time, cost, network) are closed form only: the whole table."""
    printed = Page.parse(module.table(module.parse_args(argv)) + "\n", Path("printed.md"), "printed").tables[
        0
    ]
    if (table.header, table.rows) != (printed.header, printed.rows):
        return [_rerun(" ".join(["python -m", module.__name__, *map(shlex.quote, argv)]), table)]
    return []


def check_preparation_costs(module: ModuleType, argv: list[str], table: Table) -> list[str]:
    """The preparation's cost table (docs/data.md) is closed form from the measured rate and the prices: the whole
    table."""
    args = module.parse_args(argv)
    printed = Page.parse("\n".join(module.table(object_bytes=args.object_mb * 1e6)) + "\n", Path("printed.md"),
                         "printed").tables[0]  # fmt: skip
    if (table.header, table.rows) != (printed.header, printed.rows):
        return [_rerun(" ".join(["python -m", module.__name__, *map(shlex.quote, argv)]), table)]
    return []


RECOMPUTED: dict[str, Callable[[ModuleType, list[str], Table], list[str]]] = {
    "training.measure.plan_agreement": check_agreement,
    "training.measure.loss_memory_table": check_loss_table,
    "training.measure.seed_comparison": check_seed,
    "training.measure.preset_plans": check_preset_plans,
    "training.plan.layouts": check_layouts,
    "training.prepare.plan": check_preparation_costs,
    "training.plan.checkpoint_time": check_layouts,  # closed form only too: the whole table
}
"""Commands whose tables are (partly) closed form, and their checks. Others (timed, traced) are only parsed."""


def command_problem(command: str, where: str) -> tuple[ModuleType | None, list[str], str | None]:
    """The figure command's module and arguments, or what is wrong with it."""
    words = shlex.split(command)
    if words[:2] != ["python", "-m"] or len(words) < 3:
        return None, [], f"{where}: a figure command is `python -m MODULE ARGS`; got `{command}`"
    try:
        module = importlib.import_module(words[2])
    except ImportError as error:
        return None, [], f"{where}: `{command}`: no module {words[2]} ({error})"
    if not hasattr(module, "parse_args"):
        return (
            None,
            [],
            f"{where}: `{command}`: {words[2]} has no parse_args(argv) to check its arguments with",
        )
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            module.parse_args(words[3:])
    except SystemExit:
        return None, [], f"{where}: `{command}`: {errors.getvalue().strip().splitlines()[-1]}"
    return module, words[3:], None


def figure_problems(pages: list[Page]) -> list[str]:
    problems = []
    for page in pages:
        marked = [t for t in page.tables if t.figure] + [b for b in page.blocks if b.figure]
        if len(marked) != len(page.markers):
            lines = sorted({line for _, line in page.markers} - {item.line - 1 for item in marked})
            problems.append(
                f"{page.name}: figure markers at lines {lines} are not right before a table or block"
            )
        for table in page.tables:
            needs = page.name == MEASUREMENTS or any(
                mark in cell for cell in table.header for mark in FIGURE_HEADERS
            )
            if needs and not table.figure:
                problems.append(
                    f"{table.where()}: a table of figures needs the command that produces it on the line before: "
                    "<!-- figure: python -m MODULE ARGS -->"
                )
        for item in marked:
            module, argv, problem = command_problem(item.figure or "", item.where())
            if problem:
                problems.append(problem)
            elif isinstance(item, Table) and module is not None and module.__name__ in RECOMPUTED:
                problems += RECOMPUTED[module.__name__](module, argv, item)
    return problems


def test_every_figure_is_produced_by_a_named_command_and_its_closed_form_is_current(pages):
    problems = figure_problems(pages)
    assert not problems, "figures in the docs:\n" + "\n".join(problems)


def test_the_recomputed_tables_are_there(pages):
    """The three closed-form tables are found and checked (so that a reading that finds none cannot pass)."""
    checked = [t.figure for p in pages for t in p.tables if t.figure and t.figure.split()[2] in RECOMPUTED]
    assert {f.split()[2] for f in checked} == set(RECOMPUTED), checked


def _measurements(pages: list[Page]) -> Page:
    (page,) = [p for p in pages if p.name == MEASUREMENTS]
    return page


def test_a_stale_closed_form_or_a_missing_command_is_found(pages, monkeypatch, tmp_path):
    page = _measurements(pages)
    text = page.path.read_text()
    planted = [
        text.replace("| 13.01 | 13.01 |", "| 13.38 | 13.01 |", 1),  # the README's old agreement row
        text.replace("loss chunk 2048 | 13.01", "loss chunk 4096 | 13.01", 1),  # an old default in a label
        text.replace("| 15.4 (12.3 + 3.1) |", "| 15.8 (12.6 + 3.2) |", 1),  # the old seed-comparison row
        text.replace("| 32000 | 4 | 15.64 | 15.64 |", "| 32000 | 4 | 15.64 | 15.70 |", 1),
        text.replace("<!-- figure: python -m training.measure.seed_comparison -->\n", "", 1),
        text.replace(
            "training.measure.plan_agreement -->", "training.measure.plan_agreement --rowz 1 -->", 1
        ),
    ]
    for index, planted_text in enumerate(planted):
        assert planted_text != text, index
        broken = Page.parse(planted_text, page.path, MEASUREMENTS)
        assert len(figure_problems([broken])) == 1, (index, figure_problems([broken]))


def test_a_changed_default_makes_the_tables_stale(pages, monkeypatch):
    """A new default loss chunk (the README's old agreement table was labelled 4096 while the default was 2048)."""
    from training.contract import settings_table

    page = _measurements(pages)
    spec = settings_table.HYPERPARAMETERS_BY_NAME["loss_chunk_tokens"]
    monkeypatch.setattr(settings_table, "LOSS_CHUNK_TOKENS_DEFAULT", 1024)
    object.__setattr__(spec, "default", 1024)  # a frozen dataclass: the contract's own row
    try:
        problems = figure_problems([page])
    finally:
        object.__setattr__(spec, "default", 2048)
    for command in ("plan_agreement", "seed_comparison", "loss_memory_table`"):
        assert any(command in p for p in problems), (command, problems)


def test_a_stale_preparation_cost_table_is_found(pages, monkeypatch):
    """docs/data.md's cost table: a changed cell, and a changed price in the plan's table, each fail with the
    command to rerun."""
    from training.prepare import plan

    (page,) = [p for p in pages if p.name == "docs/data.md"]
    assert figure_problems([page]) == []
    text = page.path.read_text()
    planted = text.replace("| 1.61 | 14.81 |", "| 1.61 | 14.80 |", 1)
    assert planted != text
    problems = figure_problems([Page.parse(planted, page.path, "docs/data.md")])
    assert len(problems) == 1 and "python -m training.prepare.plan`" in problems[0], problems
    cheaper = plan.ProcessingInstance(72, 2.0, "test")
    monkeypatch.setitem(plan.PROCESSING_INSTANCE_TYPES, plan.DEFAULT_INSTANCE_TYPE, cheaper)
    assert len(figure_problems([page])) == 1
