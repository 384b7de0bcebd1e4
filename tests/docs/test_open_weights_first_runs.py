"""docs/open-weights.md's first run of each family, offline, as printed (issue 52 item 7): its blocks run in a copy
of the checkout from a fresh shell (``tests/docs/runs.py``'s runner, as the openings are run): transformers writes a
tiny random model of each family, the trainer trains each 4 steps on the CPU from that folder and exports it, and
the offline plan of a named size runs. Then each export is a folder of its source's class that transformers loads,
with the source's configuration.

One test per family, each naming its own failure: each runs its own line of the page's training block, as printed,
in the copy where the page's python block ran (a module fixture: made once, the tests kept on one xdist worker, as
sharing them would make it twice, some 12 of the module's 32 CPU s); the lines are independent commands, each
reading only its own tiny model folder."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from tests.docs import runs
from tests.docs.pages import ROOT, Block, Page
from training.models import registry

SECTION = "A first run of each family, offline"
MODEL_TYPES = sorted(family.model_type for family in registry.FAMILIES.values())


def _section(page: Page) -> tuple[int, list[Block]]:
    headings = runs._h2_lines(page)
    start = next(line for line, text in headings if text == SECTION)
    end = next((line for line, _ in headings if line > start), 10**9)
    return start, [block for block in page.blocks if start < block.line < end]


def _training_lines(blocks: list[Block]) -> dict[str, Block]:
    """Each family's training command of the section's ``bash`` block, as a block of its own line (its line
    number kept), by the model type it trains from ``tiny-<type>``."""
    found = {}
    for block in blocks:
        if block.language != "bash":
            continue
        for offset, text in enumerate(block.text.splitlines()):
            if "--init_from tiny-" in text:
                model_type = text.split("--init_from tiny-")[1].split()[0]
                found[model_type] = dataclasses.replace(block, line=block.line + offset, text=text + "\n")
    return found


@dataclasses.dataclass
class Written:
    """A copy of the checkout where the section's python block ran as printed (the five tiny models)."""

    page: Page
    start: int
    blocks: list[Block]
    root: Path
    scratch: Path


@pytest.fixture(scope="module")
def written(pages, tmp_path_factory) -> Written:
    page = next(p for p in pages if p.name == "docs/open-weights.md")
    start, blocks = _section(page)
    folder = tmp_path_factory.mktemp("open-weights")
    root, scratch = folder / "checkout", folder / "scratch"
    root.mkdir()
    scratch.mkdir()
    runs.copy_checkout(ROOT, root)
    runner = runs.Runner(root, scratch)
    runner.page(page, start, [block for block in blocks if block.language == "python"])
    assert not runner.outcome.failures, "\n".join(runner.outcome.failures)
    assert runner.outcome.count("run") == 1
    return Written(page, start, blocks, root, scratch)


def test_the_section_shows_every_family(pages):
    page = next(p for p in pages if p.name == "docs/open-weights.md")
    _, blocks = _section(page)
    assert sorted(_training_lines(blocks)) == MODEL_TYPES
    python = [block for block in blocks if block.language == "python"]
    bash = [line for block in blocks if block.language == "bash" for line in block.text.splitlines() if line]
    # the python block, a training line per family and the plan: nothing else runs
    assert len(python) == 1 and len(bash) == len(MODEL_TYPES) + 1
    assert bash[-1] == ".venv/bin/blackwell-training plan qwen3-32b.json"


@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_each_familys_first_run_works_offline_as_printed(written, model_type):
    runner = runs.Runner(written.root, written.scratch)
    runner.page(written.page, written.start, [_training_lines(written.blocks)[model_type]])
    assert not runner.outcome.failures, "\n".join(runner.outcome.failures)
    assert runner.outcome.count("run") == 1
    family = next(f for f in registry.FAMILIES.values() if f.model_type == model_type)
    source = written.root / f"tiny-{model_type}"
    (run,) = (written.root / "trainer-output").glob(f"tiny-{model_type}-fp32-*")
    exported = run / "model" / "hf"
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == [family.architecture]
    assert registry.read_hf_config(config) == registry.read_hf_config(
        json.loads((source / "config.json").read_text())
    )
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert type(model).__name__ == family.architecture


@pytest.mark.slow
def test_the_offline_plan_of_a_named_size_runs_as_printed(written):
    runner = runs.Runner(written.root, written.scratch)
    saved = [block for block in written.blocks if block.language == "json"]
    plan = [
        block for block in written.blocks if block.language == "bash" and "training.trainer" not in block.text
    ]
    runner.page(written.page, written.start, [*saved, *plan])
    assert not runner.outcome.failures, "\n".join(runner.outcome.failures)
    assert runner.outcome.count("run") == 1 and (written.root / "qwen3-32b.json").is_file()
