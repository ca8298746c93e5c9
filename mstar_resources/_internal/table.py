"""Plain-text tables for the apps' reports."""

from __future__ import annotations

import unicodedata
from collections.abc import Container, Sequence


def display_width(text: str) -> int:
    """Terminal columns of ``text``: wide and fullwidth characters two, combining marks none."""
    width = 0
    for char in text:
        if unicodedata.category(char) in ("Mn", "Me"):
            continue  # drawn over the character before it
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def format_table(rows: Sequence[Sequence[str] | None], right: Container[int] = ()) -> str:
    """``rows`` in columns two spaces apart, a rule for None; columns in ``right`` right-aligned."""
    cells = [row for row in rows if row is not None]
    widths = [max(display_width(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for row in rows:
        line = ["-" * width for width in widths] if row is None else row
        padded = []
        for i, (cell, width) in enumerate(zip(line, widths, strict=True)):
            # str.ljust counts characters, and a CJK character takes two columns.
            pad = " " * (width - display_width(cell))
            padded.append(pad + cell if i in right else cell + pad)
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)
