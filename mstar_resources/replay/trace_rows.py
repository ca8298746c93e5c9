"""Reading a trace file's rows: CSV (the Azure LLM inference trace's columns) or JSON lines, each
row checked and its arrival time and lengths parsed, naming the file, the line and the value of
anything that is not a trace."""

from __future__ import annotations

import csv
import functools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ResourceConfigError
from ..units import is_int

if TYPE_CHECKING:
    import _csv  # the type of csv.reader()'s reader, for its line_num

__all__ = ["CSV_COLUMNS", "FORMATS", "JSONL_KEYS", "Row", "csv_rows", "jsonl_rows", "lines_of",
           "parse_row"]  # fmt: skip

CSV_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The columns a CSV trace needs (the Azure LLM inference trace 2023's): arrival time, prompt
tokens, output tokens. Others are ignored."""

JSONL_KEYS = ("arrival_s", "prompt_len", "output_len")
"""The keys each object of a JSON-lines trace needs: arrival in seconds, prompt tokens, output
tokens. Others are ignored."""

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
"""The format each accepted suffix (lower case) names."""

_TIMESTAMP = re.compile(
    r"(?P<main>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d+))?(?P<zone>Z|[+-].+)?",
    re.ASCII,
)
"""A date and time with any number of fractional digits: the Azure trace writes 7, which
``datetime.fromisoformat`` does not read before Python 3.11, so the fraction is read apart."""

_WHOLE = re.compile(r"[+-]?\d+", re.ASCII)
"""A length as a CSV writes it; ``int()`` alone would also take ``1_000`` and non-ASCII digits."""

_MAX_DIGITS = 18
"""The most digits a length may have: more is no model's context, and past 4,300 Python's int()
refuses the text."""

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

MAX_LINE_BYTES = 1 << 20
"""The longest line read: a trace's rows are tens of bytes (the Azure trace's about 40), and a
longer line is no row (csv's own limit on a field is 131,072 characters)."""

_FIX = "fix the row, or read a slice without it (the replay's trace_offset and requests)"
"""What to do about a bad value in a row, which every such message ends with."""

Row = tuple[int, int, list[str] | str]
"""A row of a trace file before its values are checked: its index (from 0, after any header),
its line (from 1), and the fields of :data:`CSV_COLUMNS` (CSV) or its text (JSON lines)."""

_MAX_SECONDS = Decimal(10**12)
"""Arrival times at or beyond this many seconds (about 31,700 years) are refused: no trace means
them, and they would run past the precision the steps are computed with."""


def lines_of(path: Path, progress: Callable[[int], object] | None = None) -> Iterator[str]:
    """The file's lines as text, read as they are needed; a missing file, a folder or bytes
    that are not UTF-8 are refused."""
    try:
        file = path.open("rb")
    except FileNotFoundError:
        raise ResourceConfigError(f"trace file {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise ResourceConfigError(f"trace file {path} is a folder; pass a trace file") from None
    except PermissionError:
        raise ResourceConfigError(
            f"trace file {path} can't be read (permission denied); make it readable, or copy it "
            "somewhere that is"
        ) from None
    except OSError as error:  # a loop of symbolic links, a name too long, ...
        raise ResourceConfigError(
            f"trace file {path} can't be opened ({error.strerror or error}); pass the path of a "
            "trace file"
        ) from None
    with file:
        # A line ends at b"\n", which is never part of another UTF-8 character. Read a bounded
        # length at a time: a file with no line end (a link to /dev/zero) is refused, not held.
        read_line = functools.partial(file.readline, MAX_LINE_BYTES + 1)
        for number, data in enumerate(iter(read_line, b""), start=1):
            if len(data) > MAX_LINE_BYTES:
                raise ResourceConfigError(
                    f"trace file {path}, line {number}: no line end within its first "
                    f"{MAX_LINE_BYTES:,} bytes; a trace file's rows are short lines of text"
                )
            if progress is not None:
                progress(len(data))
            try:
                # -sig: a CSV saved by a spreadsheet may start with a byte-order mark.
                yield data.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                raise ResourceConfigError(
                    f"trace file {path}, line {number}: byte {data[error.start]:#04x} is not "
                    "UTF-8 text; a trace file is text"
                ) from None


def csv_rows(path: Path, lines: Iterator[str]) -> Iterator[Row]:
    """Every row of a CSV trace after its header, with its index and the line it ends on."""
    # The lines keep their ends: the csv module reads them itself (a quoted field may hold one).
    reader = csv.reader(lines)
    header = next((row for row in _read_rows(path, reader) if row), None)
    if header is None:
        raise ResourceConfigError(
            f"trace file {path} is empty; a CSV trace starts with the header line "
            f"{','.join(CSV_COLUMNS)}, then one request a line"
        )
    columns = [name.strip() for name in header]
    missing = [name for name in CSV_COLUMNS if name not in columns]
    if missing:
        raise ResourceConfigError(
            f"trace file {path}, line {reader.line_num}: the header has the columns "
            f"{','.join(header)!r}, and a trace needs {', '.join(CSV_COLUMNS)} (the Azure LLM "
            f"inference trace's); it lacks {', '.join(missing)}"
        )
    positions = [columns.index(name) for name in CSV_COLUMNS]
    header_line = reader.line_num
    index = 0
    for row in _read_rows(path, reader):
        if not row:  # a blank line, e.g. at the end
            continue
        if len(row) != len(header):
            raise ResourceConfigError(
                f"trace file {path}, line {reader.line_num}: {','.join(row)!r} has {len(row)} "
                f"fields, and the header has {len(header)}; each row needs one value a column"
            )
        yield index, reader.line_num, [row[position] for position in positions]
        index += 1
    if not index:
        raise ResourceConfigError(
            f"trace file {path} has a header (line {header_line}) and no rows after it; a trace "
            "needs at least one request"
        )


def _read_rows(path: Path, reader: _csv.Reader) -> Iterator[list[str]]:
    """The rows of a ``csv.reader``, its refusal of one told as the line it is on."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise ResourceConfigError(
                f"trace file {path}, line {reader.line_num}: not a CSV row the trace can read "
                f"({error}); lines end in LF or CRLF (not CR alone), and no field is longer "
                f"than {csv.field_size_limit():,} characters; {_FIX}"
            ) from None
        yield row


def jsonl_rows(path: Path, lines: Iterator[str]) -> Iterator[Row]:
    """Every non-blank line of a JSON-lines trace, unparsed: only the slice is parsed."""
    index = 0
    for line, text in enumerate(lines, start=1):
        if text.strip():
            yield index, line, text.rstrip("\r\n")
            index += 1
    if not index:
        raise ResourceConfigError(
            f"trace file {path} is empty; a JSON-lines trace holds one object a line with "
            f"{', '.join(JSONL_KEYS)}"
        )


def parse_row(
    path: Path, line: int, fields: list[str] | str, names: Sequence[str]
) -> tuple[Decimal, int, int]:
    """A row's arrival in seconds and its prompt and output lengths; a bad value is refused."""
    where = f"trace file {path}, line {line}"
    # A line of JSON is parsed only now, so that rows outside the slice cost no parsing.
    values: Sequence[object] = _json_fields(where, fields) if isinstance(fields, str) else fields
    time_name, prompt_name, output_name = names
    arrival = _seconds(values[0])
    if arrival is None:
        raise ResourceConfigError(
            f"{where}: {time_name}={_text(values[0])} is neither a date and time (e.g. "
            f"2023-11-16 18:17:03.9799600) nor a number of seconds (finite, under "
            f"{_MAX_SECONDS:,}); {_FIX}"
        )
    prompt_len = _length(where, prompt_name, values[1], "a prompt needs a token")
    output_len = _length(where, output_name, values[2], "a request generates at least one token")
    return arrival, prompt_len, output_len


def _json_fields(where: str, text: str) -> list[object]:
    """The values of :data:`JSONL_KEYS` in a line of JSON; anything else is refused."""
    try:
        # Decimal: times keep every digit written; NaN and Infinity stay floats, refused later.
        row = json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError:
        row = None
    except (ValueError, RecursionError) as error:  # a number of thousands of digits, deep nesting
        reason = (
            "it is nested too deeply"
            if isinstance(error, RecursionError)
            else "a number has thousands of digits, more than any time or length"
        )
        raise ResourceConfigError(
            f"{where}: the line can't be read as JSON ({reason}); {_FIX}"
        ) from None
    if not isinstance(row, dict):
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ResourceConfigError(
            f"{where}: {shown!r} is not a JSON object; a JSON-lines trace holds one object a "
            f"line with {', '.join(JSONL_KEYS)}"
        )
    missing = [key for key in JSONL_KEYS if key not in row]
    if missing:
        raise ResourceConfigError(
            f"{where}: the object has the keys {', '.join(row) or 'none'}, and a row needs "
            f"{', '.join(JSONL_KEYS)}; it lacks {', '.join(missing)}"
        )
    return [row[key] for key in JSONL_KEYS]


def _seconds(value: object) -> Decimal | None:
    """Seconds of a number, or of a date and time since 1970 (UTC if it names no zone); None
    for anything else, or a number that is not finite."""
    if is_int(value) or isinstance(value, Decimal):
        seconds: Decimal | None = Decimal(value)
    elif isinstance(value, str):
        seconds = _seconds_of_text(value.strip())
    else:
        return None
    if seconds is None or not seconds.is_finite() or abs(seconds) >= _MAX_SECONDS:
        return None
    return seconds


def _seconds_of_text(text: str) -> Decimal | None:
    """Seconds written as a number, or as a date and time; None if it is neither."""
    try:
        return Decimal(text)
    except InvalidOperation:
        pass
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        return None
    zone = match["zone"] or ""
    try:
        moment = datetime.fromisoformat(match["main"] + ("+00:00" if zone == "Z" else zone))
    except ValueError:  # a month 13, or a zone that is not one
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    whole = (moment - _EPOCH) // timedelta(seconds=1)
    return whole + Decimal(f"0.{match['fraction'] or 0}")


def _length(where: str, name: str, value: object, why: str) -> int:
    """A length of at least one token; anything else is refused, saying ``why`` for zero."""
    if isinstance(value, str) and _WHOLE.fullmatch(value.strip()):
        if len(value.strip().lstrip("+-")) > _MAX_DIGITS:  # int() refuses 4,300 digits or more
            raise ResourceConfigError(
                f"{where}: {name} has {len(value.strip()):,} digits, more tokens than any model "
                f"holds; {_FIX}"
            )
        length = int(value)
    elif is_int(value):
        length = value
    else:
        raise ResourceConfigError(
            f"{where}: {name}={_text(value)} is not a whole number of tokens; {_FIX}"
        )
    if length < 0:
        raise ResourceConfigError(
            f"{where}: {name}={_text(value)} is negative, and a length counts tokens; {_FIX}"
        )
    if length == 0:
        raise ResourceConfigError(f"{where}: {name}={_text(value)} is zero, and {why}; {_FIX}")
    return length


def _text(value: object) -> str:
    """A value as its file wrote it: quoted if it is text."""
    if isinstance(value, str):
        return repr(value)
    return str(value) if isinstance(value, Decimal) else json.dumps(value)
