"""Plain-text tables for the apps' reports."""

from __future__ import annotations

from collections.abc import Container, Sequence


def format_table(rows: Sequence[Sequence[str] | None], right: Container[int] = ()) -> str:
    """``rows`` as aligned columns, two spaces apart; None draws a rule across them, and the
    columns numbered in ``right`` are right-aligned."""
    cells = [row for row in rows if row is not None]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for row in rows:
        line = ["-" * width for width in widths] if row is None else row
        lines.append(
            "  ".join(
                cell.rjust(width) if i in right else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(lines)
