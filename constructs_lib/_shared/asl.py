"""Amazon States Language text helpers: intrinsic-function string literals and ``States.Format`` calls."""

from __future__ import annotations

import re


def literal(text: str) -> str:
    """``text`` as an intrinsic-function string literal (quotes, braces and backslashes escaped)."""
    return "'" + re.sub(r"([\\'{}])", r"\\\1", text) + "'"


def format_intrinsic(template: str, *arguments: str) -> str:
    """``States.Format`` of ``template`` (whose ``{}`` are placeholders; everything else is escaped)."""
    escaped = "{}".join(literal(piece)[1:-1] for piece in template.split("{}"))
    return f"States.Format('{escaped}', {', '.join(arguments)})"
