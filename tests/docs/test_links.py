"""Every relative link and ``#anchor`` in README.md and docs/*.md resolves: the file exists, and the anchor is a
heading of the page it points to, by GitHub's anchor rules (:func:`tests.docs.pages.slug`)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.docs.pages import ROOT, Page, slug


def link_problems(pages: list[Page]) -> list[str]:
    """One line per broken link: ``page:line: target: what is wrong``."""
    by_path = {page.path.resolve(): page for page in pages}
    problems = []
    for page in pages:
        for target, line in page.links:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or target.startswith("mailto:"):
                continue  # an address on the web: not checked offline
            where = f"{page.name}:{line}: {target}"
            if not parts.path:  # #anchor: this page
                if parts.fragment not in page.anchors:
                    problems.append(f"{where}: no heading #{parts.fragment} in {page.name}")
                continue
            path = (page.path.parent / unquote(parts.path)).resolve()
            if not path.exists():
                problems.append(f"{where}: no file {_shown(path)}")
                continue
            if not parts.fragment:
                continue
            if path.suffix != ".md":
                problems.append(f"{where}: an anchor into {_shown(path)}, which is not a Markdown page")
                continue
            target_page = by_path.get(path) or Page.read(path, _shown(path))
            if parts.fragment not in target_page.anchors:
                known = ", ".join(sorted(target_page.anchors))
                problems.append(
                    f"{where}: no heading #{parts.fragment} in {target_page.name} (anchors: {known})"
                )
    return problems


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def test_every_relative_link_and_anchor_resolves(pages):
    problems = link_problems(pages)
    assert not problems, "broken links (fix the link or the heading):\n" + "\n".join(problems)


def test_the_pages_have_links_to_check(pages):
    """The reader finds the links that are there (so that an empty reading cannot pass the test above)."""
    readme = next(page for page in pages if page.name == "README.md")
    assert any(target == "docs/reference.md" for target, _ in readme.links)
    assert sum(len(page.links) for page in pages) > 50


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "other.md").write_text(
        "# Other page\n\n## A `code` heading: with punctuation!\n\n## Twice\n\n## Twice\n"
    )
    page = Page.parse(
        "[ok](other.md#a-code-heading-with-punctuation) [ok](other.md#twice-1) [ok](#here) "
        "[web](https://example.com/x) [gone](missing.md) [no anchor](other.md#nope) [self](#nowhere)\n\n# Here\n",
        tmp_path / "page.md",
        "page.md",
    )
    problems = link_problems([page])
    assert [p.split(": ", 2)[1] for p in problems] == ["missing.md", "other.md#nope", "#nowhere"], problems


def test_github_anchor_rules():
    assert slug("`cdk.json` keys") == "cdkjson-keys"
    assert (
        slug("Will it fit? Memory, time and cost before you pay")
        == "will-it-fit-memory-time-and-cost-before-you-pay"
    )
    assert slug("Trainer overhead: `make bench`") == "trainer-overhead-make-bench"
    assert slug("The seed article's figures") == "the-seed-articles-figures"
