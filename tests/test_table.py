"""format_table: columns line up on screen, where a wide (CJK) character takes two columns."""

from __future__ import annotations

import re

import pytest

from mstar_resources._internal.output import display_width, format_table


@pytest.mark.parametrize(
    ("text", "width"),
    [
        pytest.param("attn.decode", 11, id="ascii"),
        pytest.param("注意力", 6, id="cjk"),
        pytest.param("\uff2d\uff22", 4, id="fullwidth"),  # "MB" in fullwidth letters
        pytest.param("e\u0301", 1, id="combining-mark"),
        pytest.param("注意力.decode", 13, id="mixed"),
        pytest.param("", 0, id="empty"),
    ],
)
def test_display_width(text: str, width: int) -> None:
    assert display_width(text) == width


HEAD = ["path", "owner", "labels", "reserved MB"]
Row = list[str] | None


def spans(line: str, row: Row) -> list[tuple[int, int]]:
    """The screen columns where each cell of ``line`` (drawn from ``row``) starts and ends."""
    if row is None:
        found = [(m.start(), m.end()) for m in re.finditer("-+", line)]
    else:
        found, at = [], 0
        for cell in row:
            at = line.index(cell, at)
            found.append((at, at + len(cell)))
            at += len(cell)
    return [(display_width(line[:start]), display_width(line[:end])) for start, end in found]


@pytest.mark.parametrize(
    ("rows", "right"),
    [
        pytest.param(
            [
                HEAD,
                None,
                ["attn.prefill", "attention", "prefill", "512"],
                ["attn.decode", "attention", "decode", "1,024"],
            ],
            {3},
            id="ascii",
        ),
        pytest.param(
            [
                HEAD,
                None,
                ["注意力.prefill", "注意力", "prefill", "512"],
                ["attn.decode", "attention", "解码", "1,024"],
                None,
                ["total", "全部", "-", "1,536"],
            ],
            {3},
            id="cjk",
        ),
        pytest.param(
            [
                HEAD,
                None,
                ["注意力.prefill", "注意力", "预填充", "512"],
                ["attn.decode", "attention", "decode", "1,024"],
            ],
            {1, 2, 3},
            id="cjk-right-aligned",
        ),
    ],
)
def test_columns_line_up_on_screen(rows: list[Row], right: set[int]) -> None:
    lines = format_table(rows, right=right).splitlines()
    assert len(lines) == len(rows)
    by_line = [spans(line, row) for line, row in zip(lines, rows, strict=True)]
    for column in range(len(HEAD)):
        # A left-aligned column starts at one screen column on every line, a right-aligned one
        # ends at one.
        edge = 1 if column in right else 0
        assert len({cells[column][edge] for cells in by_line}) == 1, "\n".join(lines)
