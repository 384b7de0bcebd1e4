"""The documentation as the doc tests read it: README.md and docs/*.md, parsed with markdown-it-py (CommonMark plus
tables, as GitHub renders them) into what the tests check: fenced blocks, tables, links, headings' anchors, inline
code, and the figure markers (``<!-- figure: COMMAND -->`` right before a table or a block)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parent.parent.parent
FIGURE = re.compile(r"^<!--\s*figure:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, the flags after it (```` ```json input ````), its text, where it starts,
    and the figure command of a marker right before it."""

    page: str
    line: int
    language: str
    flags: frozenset[str]
    text: str
    figure: str | None = None

    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass(frozen=True)
class Table:
    """A table: header cells, body rows (each cell's Markdown source), where it starts, its figure command."""

    page: str
    line: int
    header: list[str]
    rows: list[list[str]]
    figure: str | None = None

    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Page:
    """One Markdown page: its blocks, tables, relative links (target, line), anchors and inline code spans."""

    name: str
    path: Path
    blocks: list[Block] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    links: list[tuple[str, int]] = field(default_factory=list)
    anchors: set[str] = field(default_factory=set)
    inline_code: list[tuple[str, int]] = field(default_factory=list)
    markers: list[tuple[str, int]] = field(default_factory=list)
    """Every figure marker (command, line), whether or not a table or block follows it."""

    @classmethod
    def read(cls, path: Path, name: str | None = None) -> Page:
        return cls.parse(path.read_text(), path, name or path.relative_to(ROOT).as_posix())

    @classmethod
    def parse(cls, text: str, path: Path, name: str) -> Page:
        page = cls(name=name, path=path)
        tokens = MarkdownIt("commonmark").enable("table").parse(text)
        counts: dict[str, int] = {}
        figures: dict[int, str] = {}  # the line a marker ends on -> its command
        for index, token in enumerate(tokens):
            line = (token.map[0] + 1) if token.map else 0
            if token.type == "html_block" and token.map and (match := FIGURE.match(token.content.strip())):
                figures[token.map[1]] = match.group(1)
                page.markers.append((match.group(1), line))
            elif token.type == "fence":
                language, *flags = token.info.split() or [""]
                figure = figures.get(line - 1)
                page.blocks.append(Block(name, line, language, frozenset(flags), token.content, figure))
            elif token.type == "table_open":
                page.tables.append(_table(tokens, index, name, line, figures.get(line - 1)))
            elif token.type == "heading_open":
                page.anchors.add(_unique(slug(heading_text(tokens[index + 1])), counts))
            elif token.type == "inline":
                page._read_inline(token, line)
        return page

    def _read_inline(self, token: Token, line: int) -> None:
        for child in token.children or []:
            if child.type == "link_open":
                self.links.append((str(child.attrs.get("href", "")), line))
            elif child.type == "image":
                self.links.append((str(child.attrs.get("src", "")), line))
            elif child.type == "code_inline":
                self.inline_code.append((child.content, line))


def _table(tokens: list[Token], start: int, page: str, line: int, figure: str | None) -> Table:
    rows: list[list[str]] = []
    header: list[str] = []
    row: list[str] = []
    for token in tokens[start + 1 :]:
        if token.type == "table_close":
            break
        if token.type == "tr_open":
            row = []
        elif token.type == "inline":
            row.append(token.content)
        elif token.type == "tr_close":
            if header:
                rows.append(row)
            else:
                header = row
    return Table(page, line, header, rows, figure)


def heading_text(inline: Token) -> str:
    """A heading's text as GitHub makes its anchor from it: the text of its words and code spans."""
    return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))


def slug(text: str) -> str:
    """GitHub's anchor for a heading (github-slugger): lower case, punctuation removed (letters, digits, ``_``,
    ``-`` and spaces kept), each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _unique(anchor: str, counts: dict[str, int]) -> str:
    """The second heading with the same anchor gets ``-1``, the third ``-2`` (GitHub's rule)."""
    seen = counts.get(anchor, 0)
    counts[anchor] = seen + 1
    return anchor if seen == 0 else f"{anchor}-{seen}"


def doc_paths() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def all_pages() -> list[Page]:
    return [Page.read(path) for path in doc_paths()]
