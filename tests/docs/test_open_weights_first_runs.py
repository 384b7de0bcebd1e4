"""docs/open-weights.md's first run of each family, offline, as printed (issue 52 item 7): its blocks run in a copy
of the checkout from a fresh shell (``tests/docs/runs.py``'s runner, as the openings are run): transformers writes a
tiny random model of each family, the trainer trains each 4 steps on the CPU from that folder and exports it, and
the offline plan of a named size runs. Then each export is a folder of its source's class that transformers loads,
with the source's configuration."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from tests.docs import runs
from tests.docs.pages import ROOT, Page
from training.models import registry

SECTION = "A first run of each family, offline"


def _section(page: Page) -> tuple[int, list]:
    headings = runs._h2_lines(page)
    start = next(line for line, text in headings if text == SECTION)
    end = next((line for line, _ in headings if line > start), 10**9)
    return start, [block for block in page.blocks if start < block.line < end]


def test_the_section_shows_every_family(pages):
    page = next(p for p in pages if p.name == "docs/open-weights.md")
    _, blocks = _section(page)
    trained = [
        line for b in blocks if b.language == "bash" for line in b.text.splitlines() if "--init_from" in line
    ]
    model_types = {family.model_type for family in registry.FAMILIES.values()}
    assert {line.split("--init_from tiny-")[1].split()[0] for line in trained} == model_types


@pytest.mark.slow
def test_each_familys_first_run_works_offline_as_printed(pages, tmp_path):
    page = next(p for p in pages if p.name == "docs/open-weights.md")
    start, blocks = _section(page)
    root, scratch = tmp_path / "checkout", tmp_path / "scratch"
    root.mkdir()
    scratch.mkdir()
    runs.copy_checkout(ROOT, root)
    runner = runs.Runner(root, scratch)
    runner.page(page, start, blocks)
    assert not runner.outcome.failures, "\n".join(runner.outcome.failures)
    assert runner.outcome.count("run") == 7  # the python block, five trainings, the plan
    for family in registry.FAMILIES.values():
        source = root / f"tiny-{family.model_type}"
        (run,) = (root / "trainer-output").glob(f"tiny-{family.model_type}-fp32-*")
        exported = run / "model" / "hf"
        config = json.loads((exported / "config.json").read_text())
        assert config["architectures"] == [family.architecture]
        assert registry.read_hf_config(config) == registry.read_hf_config(
            json.loads((source / "config.json").read_text())
        )
        model = AutoModelForCausalLM.from_pretrained(exported)
        assert type(model).__name__ == family.architecture
