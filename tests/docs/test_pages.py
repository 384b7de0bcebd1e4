"""Each page of docs/ opens with the shortest working example: its first block after the title is a code block
(the examples themselves are checked by the other doc tests: commands, inputs, links)."""

from __future__ import annotations

from pathlib import Path

from markdown_it import MarkdownIt

from tests.docs.pages import ROOT, doc_paths


def opening_problem(text: str, name: str) -> str | None:
    tokens = [
        t for t in MarkdownIt("commonmark").enable("table").parse(text) if t.level == 0 and t.nesting >= 0
    ]
    if not tokens or tokens[0].type != "heading_open" or tokens[0].tag != "h1":
        return f"{name}: must start with its title (# ...)"
    following = next((t for t in tokens[1:] if t.type not in ("inline",)), None)
    if following is None or following.type != "fence":
        return f"{name}: must open with the shortest working example (a code block right after the title)"
    return None


def test_every_docs_page_opens_with_an_example():
    problems = [
        p
        for path in doc_paths()
        if path.parent == ROOT / "docs"
        if (p := opening_problem(path.read_text(), path.name))
    ]
    assert not problems, "\n".join(problems)


def test_a_page_without_an_opening_example_is_found():
    assert opening_problem("# Title\n\nSome words first.\n\n```bash\nmake test\n```\n", "x.md") is not None
    assert opening_problem("# Title\n\n```bash\nmake test\n```\n", "x.md") is None
    assert len(doc_paths()) > 8 and all(isinstance(p, Path) and p.is_relative_to(ROOT) for p in doc_paths())
