"""What ``blackwell-training`` prints in an 80-column terminal (``COLUMNS=80``, rich's ``Console(width=80)``): the
``tune --dry-run`` table breaks no setting in two, ``compare`` cuts no run name, and ``plan`` says its time and
cost in lines that fit (a word longer than the line, a URL, on a line of its own, whole)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from constructs_lib.cli import render, render_compare
from constructs_lib.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 80
README_RUN = {"precision": "mxfp8", "batch_size": 16, "activation_checkpointing": True, "max_runtime_seconds": 14400,
              "job_name_prefix": "llama-1b-mxfp8", "hyperparameters": {"max_steps": "2000"}}  # fmt: skip
TUNING_PAGE = {"precision": "bf16", "batch_size": 32, "hyperparameters": {"max_steps": "20000"},
               "tune": {"max_cost_usd": 300}}  # fmt: skip


@pytest.fixture
def project(tmp_path, monkeypatch):
    shutil.copy(ROOT / "cdk.json", tmp_path / "cdk.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def cli(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(list(argv), stdin=io.StringIO(""))
    return status, capsys.readouterr().out


def rendered(draw, *args) -> list[str]:
    out = io.StringIO()
    draw(Console(file=out, width=WIDTH, highlight=False, soft_wrap=True), *args)
    return out.getvalue().splitlines()


def fits(lines: list[str]) -> list[str]:
    """The lines longer than the terminal, unless a single word (a URL) that cannot be broken."""
    return [line for line in lines if len(line) > WIDTH and len(line.split()) > 1]


def test_the_tune_dry_run_table_breaks_no_setting_at_80_columns(project, capsys):
    (project / "tune.json").write_text(json.dumps(TUNING_PAGE))
    status, out = cli(capsys, "tune", "tune.json", "--dry-run")
    assert status == 0
    planned = json.loads(cli(capsys, "tune", "tune.json", "--dry-run", "--json")[1])["plan"]
    lines = out.splitlines()
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert table and all(len(line) <= WIDTH for line in table), "\n".join(table)
    cells = " ".join(line.split("│")[2] for line in table if line.startswith("│"))  # the settings column
    for trial in planned["trials"]:
        for name, value in trial["settings"].items():
            shown = f"{name}={json.dumps(value).strip(chr(34))}"
            assert f" {shown} " in f" {cells} ", f"{shown} is broken or missing:\n" + "\n".join(table)
    assert rendered(render.print_tune_plan, planned) == lines  # COLUMNS=80 and Console(width=80) agree


def compare_row(run: str, trained: str, tasks: tuple[str, ...]) -> dict:
    scores = {
        task: {"acc": 0.875, "acc_stderr": 0.069, "acc_norm": 0.875, "acc_norm_stderr": 0.069}
        for task in tasks
    }
    return {"run": run, "trained_run": trained, "precision": "fp32", "max_steps": 300, "final_loss": None,
            "val_loss": None, "scores": scores}  # fmt: skip


@pytest.mark.parametrize(
    "runs, tasks",
    [
        # docs/evaluation.md's opening: two local results folders, one task
        ((("eval-demo/scores-300", "eval-demo/run-300/model/hf"), ("eval-demo/scores-30", "eval-demo/run-30/model/hf")),
         ("colours",)),
        # run names of a deployed workflow beside their losses, and the four standard tasks
        ((("llama-8b-mxfp8-2026-11-29-lr-sweep-3", "llama-8b-mxfp8-2026-11-29-lr-sweep-3"),
          ("llama-8b-bf16-baseline", "llama-8b-bf16-baseline")),
         ("arc_easy", "hellaswag", "piqa", "winogrande")),
    ],
)  # fmt: skip
def test_compare_cuts_no_run_name_at_80_columns(runs, tasks):
    rows = [compare_row(run, trained, tasks) for run, trained in runs]
    if tasks != ("colours",):
        for row in rows:
            row.update(final_loss=2.1234, val_loss=2.2345)
    lines = rendered(render_compare.print_compare, rows)
    assert not fits(lines), "\n".join(lines)
    text = "\n".join(lines)
    for run, trained in runs:
        assert run in text, text
        if trained != run:
            assert f"(of {trained})" in text, text
    for task in tasks:  # every task's scores are shown, in as many tables as the width needs
        assert task in text
    assert text.count("0.875 ± 0.069") == 2 * len(rows) * len(tasks)


def test_the_plan_says_time_and_cost_in_lines_that_fit_80_columns(project, capsys):
    (project / "run.json").write_text(json.dumps(README_RUN))
    status, out = cli(capsys, "plan", "run.json")
    assert status == 0
    lines = out.splitlines()
    assert not fits(lines), "\n".join(line for line in lines if len(line) > WIDTH)
    assert max(len(line) for line in lines) < 200  # a URL at most, not the whole summary
    text = " ".join(out.split())
    assert "8 GPUs, shard 8" in text and "tokens/s per GPU (estimate)" in text
    assert "cost $" in text and "https://aws.amazon.com/blogs/machine-learning/" in text
