"""The pages cite only what a reader can open: published sources by their address, files in the repository by
their path. Never an issue or pull-request number of this project's tracker, and never a path outside the
repository (a development machine's notes); and the source article, wherever a page names it, by its URL."""

from __future__ import annotations

import re

from tests.docs.pages import ROOT, Page, doc_paths

ARTICLE_URL = (
    "https://aws.amazon.com/blogs/machine-learning/"
    "optimize-model-training-on-amazon-sagemaker-ai-with-nvidia-blackwell/"
)
"""The AWS Machine Learning blog post this project starts from ("Optimize model training on Amazon SageMaker AI with
NVIDIA Blackwell", June 2026)."""
UNOPENABLE = (
    (re.compile(r"\b(?:issues?|PRs?|pull requests?|tickets?)\s*#?\d+\b", re.IGNORECASE), "an issue number"),
    (re.compile(r"(?<![\w.])#\d{1,4}\b(?!-)"), "an issue number"),
    (re.compile(r"(?<![\w.~])/(?:work|home|root|Users)/"), "a path outside the repository"),
    (re.compile(r"\bshared/(?:notes|seeds)\b"), "a path outside the repository"),
    (
        re.compile(r"\bplatform-facts\.md|\banchors\.md|\barchitecture\.md\b"),
        "a notes file outside the repository",
    ),
)
NAMES_THE_ARTICLE = re.compile(r"\b(?:source|seed) article\b|\bthe article\b", re.IGNORECASE)


def source_problems(text: str, name: str) -> list[str]:
    """One line per citation a reader cannot open, and per page that names the article without its URL."""
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        seen: list[range] = []
        for pattern, what in UNOPENABLE:
            for match in pattern.finditer(line):
                number_linked = re.search(
                    rf"/(?:issues|pull)/{re.escape(match.group(0).lstrip('#').split()[-1].lstrip('#'))}\b",
                    line,
                )
                if number_linked and what == "an issue number":
                    continue  # an upstream project's issue, linked by its address on the same line
                if not any(match.start() in span for span in seen):  # "issue #36" once, not also as "#36"
                    seen.append(range(match.start(), match.end()))
                    problems.append(f"{name}:{number}: {what}: {match.group(0)!r}")
        if re.search(r"\bseed article\b", line, re.IGNORECASE):
            problems.append(f"{name}:{number}: 'seed article': say the source article, and link it")
    if NAMES_THE_ARTICLE.search(text) and ARTICLE_URL not in text:
        problems.append(f"{name}: names the source article but never links it ({ARTICLE_URL})")
    return problems


def test_the_pages_cite_only_what_a_reader_can_open():
    problems = [
        p
        for path in doc_paths()
        for p in source_problems(path.read_text(), path.relative_to(ROOT).as_posix())
    ]
    assert not problems, "\n".join(problems)


def test_the_readme_links_the_source_article(pages: list[Page]):
    readme = next(page for page in pages if page.name == "README.md")
    assert any(target == ARTICLE_URL for target, _ in readme.links)


def test_an_unopenable_citation_is_found():
    text = (
        "Measured in issue #36 and issue 27 (see PR 12), as /work/shared/notes/anchors.md says; see also #41.\n"
        "The seed article's figures.\n"
        "Fine: [the article]("
        + ARTICLE_URL
        + "), `/opt/ml/model`, docs/plan.md, sm_90, step-2, C#, a list item 1.\n"
    )
    problems = source_problems(text, "p.md")
    assert [p.split(": ", 2)[1] for p in problems] == [
        "an issue number", "an issue number", "an issue number", "an issue number",
        "a path outside the repository", "a path outside the repository", "a notes file outside the repository",
        "'seed article'",
    ], problems  # fmt: skip
    assert source_problems("The source article says so.\n", "q.md") == [
        f"q.md: names the source article but never links it ({ARTICLE_URL})"
    ]
