"""A serving trace: requests arriving over engine steps, either synthetic (long-tailed prompt and
output lengths) or read from a production trace file (arrival times and lengths). Seeded, so the
same arguments always give the same trace."""

from __future__ import annotations

import csv
import json
import math
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING

from .._internal.limits import argument_problem
from ..errors import ResourceConfigError
from ..units import is_int, is_positive_int

if TYPE_CHECKING:
    import _csv  # the type of csv.reader()'s reader, for its line_num

__all__ = ["CSV_COLUMNS", "JSONL_KEYS", "Request", "TraceFile", "read_trace", "synthetic_requests"]


@dataclass(frozen=True)
class Request:
    """One request of a trace: its prompt's length, how many tokens it generates, and when it
    arrives. Its prompt's token ids are drawn only when asked for (:meth:`prompt`), so a trace of
    any length holds no tokens."""

    id: int
    """Unique within a trace; traces number their requests 0..n-1 in arrival order."""
    arrival_step: int
    """The engine step at which it arrives (it can be admitted from that step on)."""
    prompt_len: int
    """Tokens in its prompt."""
    output_len: int
    """Tokens it generates; it ends after exactly that many (there is no EOS)."""
    vocab_size: int = 1
    """Its prompt's token ids are in [0, vocab_size)."""
    prompt_seed: int = 0
    """Seeds the draw of its prompt's token ids."""

    def __post_init__(self) -> None:
        if not is_int(self.arrival_step) or self.arrival_step < 0:
            raise ResourceConfigError(
                f"request {self.id}: arrival_step={self.arrival_step!r} must be a whole number >= 0"
            )
        for name in ("prompt_len", "output_len", "vocab_size"):
            value = getattr(self, name)
            if not is_positive_int(value):
                raise ResourceConfigError(
                    f"request {self.id}: {name}={value!r} must be a positive whole number"
                )

    def prompt(self) -> tuple[int, ...]:
        """Its prompt's ``prompt_len`` token ids, drawn from ``random.Random(prompt_seed)``: the
        same ids at every call."""
        draw = random.Random(self.prompt_seed)
        return tuple(draw.choices(range(self.vocab_size), k=self.prompt_len))


def synthetic_requests(
    num_requests: int,
    seed: int,
    max_model_len: int,
    vocab_size: int,
    *,
    prompt_median: int = 512,
    output_median: int = 64,
    sigma: float = 1.5,
    arrivals_per_step: float = 0.5,
) -> Iterator[Request]:
    """``num_requests`` requests drawn from ``random.Random(seed)``, one at a time (the same ones
    at every call), so a long synthetic trace is streamed as a trace file is.

    Prompt and output lengths are log-normal around their medians (``sigma`` is the spread of their
    logarithm), clipped so each is at least 1 and together they fit ``max_model_len``. Gaps between
    arrivals are exponential with mean ``1 / arrivals_per_step`` steps; the first request arrives at
    step 0 and arrival steps are the running sum rounded down. Each prompt's seed is the next
    64 bits of the same generator. The arguments are checked when it is called, not when the first
    request is asked for.
    """
    _check_trace_args(
        num_requests=num_requests,
        seed=seed,
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        prompt_median=prompt_median,
        output_median=output_median,
        sigma=sigma,
        arrivals_per_step=arrivals_per_step,
    )

    def drawn() -> Iterator[Request]:  # a generator of its own, so the checks above run now
        rng = random.Random(seed)
        clock = 0.0
        for index in range(num_requests):
            if index:
                clock += rng.expovariate(arrivals_per_step)
            prompt_len = _lognormal_len(rng, prompt_median, sigma)
            output_len = _lognormal_len(rng, output_median, sigma)
            # The prompt keeps its tail (long prompts are what chunked prefill is for); the
            # output gives way to it.
            prompt_len = min(prompt_len, max_model_len - 1)
            output_len = min(output_len, max_model_len - prompt_len)
            yield Request(
                id=index,
                arrival_step=math.floor(clock),
                prompt_len=prompt_len,
                output_len=output_len,
                vocab_size=vocab_size,
                prompt_seed=rng.getrandbits(64),
            )

    return drawn()


def _lognormal_len(rng: random.Random, median: int, sigma: float) -> int:
    """A length of at least 1 whose logarithm is normal around ``log(median)``."""
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


def _check_trace_args(**args: object) -> None:
    """Raise for the first unusable argument of :func:`synthetic_requests`, naming it."""
    checks = [
        *(
            argument_problem(name, args[name], whole=True, ge=1)
            for name in ("num_requests", "vocab_size", "prompt_median", "output_median")
        ),
        argument_problem("seed", args["seed"], whole=True),
        argument_problem(
            "max_model_len", args["max_model_len"], whole=True, ge=2, note=BOTH_TOKENS
        ),
        argument_problem("sigma", args["sigma"], ge=0),
        argument_problem("arrivals_per_step", args["arrivals_per_step"], gt=0),
    ]
    first = next((problem for problem in checks if problem is not None), None)
    if first is not None:
        raise ResourceConfigError(first)


BOTH_TOKENS = " (a prompt token and an output token)"


CSV_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The columns a CSV trace needs (the Azure LLM inference trace 2023's): arrival time, prompt
tokens, output tokens. Others are ignored."""

JSONL_KEYS = ("arrival_s", "prompt_len", "output_len")
"""The keys each object of a JSON-lines trace needs: arrival in seconds, prompt tokens, output
tokens. Others are ignored."""

_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
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

_FIX = "fix the row, or read a slice without it (the replay's trace_offset and requests)"
"""What to do about a bad value in a row, which every such message ends with."""


@dataclass(frozen=True)
class TraceFile:
    """A slice of a trace file, checked whole, and what became of its rows. Its requests are read
    again from the file each time they are asked for (:meth:`requests`), so holding one costs
    no memory for its rows."""

    path: Path
    """The file, as given."""
    offset: int
    """Rows of the file skipped before the slice (rows are counted from 0, after a header)."""
    rows_read: int
    """Rows in the slice: the requests kept plus those refused."""
    rows_in_file: int
    """Rows in the whole file; those outside the slice are counted, not checked."""
    served: int
    """Requests kept: the rows read less those refused."""
    refused: int
    """Rows whose prompt has ``max_model_len`` tokens or more: an engine rejects them unserved."""
    clipped: int
    """Requests whose output was cut to end at ``max_model_len`` tokens, as an engine stops them."""
    prompt_tokens: int
    """Prompt tokens of the requests kept."""
    output_tokens: int
    """Tokens the requests kept generate (after clipping)."""
    span_s: float
    """Seconds from the slice's first arrival to its last (refused rows included)."""
    step_ms: float
    """Milliseconds one engine step stood for when arrival times became arrival steps."""
    in_order: bool
    """Whether the slice's rows are in arrival order, as production traces are: its requests
    then stream from the file; a slice that is not is sorted in memory each time it is read."""
    _slice: _Slice = field(compare=False, repr=False)
    _first_arrival: Decimal = field(compare=False, repr=False)

    def requests(self) -> Iterator[Request]:
        """The requests kept, in arrival order, with ids 0..n-1, read from the file again. Each
        prompt's seed is the next 64 bits of ``random.Random(seed)``, in arrival order."""
        read = self._slice
        rows = read.rows()
        if not self.in_order:
            # Stable, so rows that arrive at the same time keep their order in the file.
            rows = iter(sorted(rows, key=lambda row: row[0]))
        step = Decimal(str(self.step_ms))  # str: 0.1 is 0.1 ms, not the float nearest it
        rng = random.Random(read.seed)
        served = 0
        for arrival, prompt_len, output_len in rows:
            fitted = _fit(prompt_len, output_len, read.max_model_len)
            if fitted is None:
                continue
            steps = ((arrival - self._first_arrival) * 1000 / step).to_integral_value(
                rounding=ROUND_FLOOR
            )
            yield Request(
                id=served,
                arrival_step=int(steps),
                prompt_len=prompt_len,
                output_len=fitted,
                vocab_size=read.vocab_size,
                prompt_seed=rng.getrandbits(64),
            )
            served += 1


def read_trace(
    path: str | Path,
    *,
    max_model_len: int,
    vocab_size: int,
    seed: int,
    step_ms: float,
    offset: int = 0,
    limit: int | None = None,
    progress: bool = False,
) -> TraceFile:
    """Rows ``offset`` .. ``offset + limit - 1`` of a production trace file, checked.

    The suffix picks the format: ``.csv`` with the columns of :data:`CSV_COLUMNS` (the Azure LLM
    inference trace 2023; ``TIMESTAMP`` a date and time such as ``2023-11-16 18:17:03.9799600``,
    or a number of seconds), or ``.jsonl``/``.json`` with one object a line holding
    :data:`JSONL_KEYS`. Rows are counted from 0 after the header; ``limit=None`` reads to the end,
    as does a ``limit`` past the file's last row (the slice is then the rest of the file).

    The file is streamed: rows before the slice are skipped unparsed, rows after it are counted,
    and memory does not grow with the file. ``progress`` shows a bar while a file of more than
    :data:`PROGRESS_BYTES` is read. The requests come from :meth:`TraceFile.requests`.

    Arrivals are sorted by time, and ``step_ms`` (milliseconds one engine step stands for) maps
    each to the step ``floor((t - t_first) / step_ms)``, where ``t_first`` is the slice's first
    arrival. The trace holds lengths only, so each prompt is ``prompt_len`` token ids over
    ``range(vocab_size)``, seeded from ``random.Random(seed)`` in arrival order. As an engine
    does, a prompt of ``max_model_len`` tokens or more is refused (not served; counted in
    ``refused``), and an output that would run past ``max_model_len`` is cut to fit (counted in
    ``clipped``).

    Raises :class:`ResourceConfigError` for a bad argument, or a file that can't be read as a
    trace, naming the file, the line (from 1) and the value, before anything is served.
    """
    _check_read_args(
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        seed=seed,
        step_ms=step_ms,
        offset=offset,
        limit=limit,
    )
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise ResourceConfigError(
            f"trace file {path}: can't tell its format from the suffix {path.suffix!r}; name a CSV "
            f"with the columns {','.join(CSV_COLUMNS)} '.csv', or JSON lines (one object a line "
            f"with {', '.join(JSONL_KEYS)}) '.jsonl' or '.json'"
        )
    read = _Slice(path, _FORMATS[suffix], offset, limit, seed, vocab_size, max_model_len)
    rows_in_file = last_line = rows_read = refused = clipped = prompt_tokens = output_tokens = 0
    earliest: Decimal | None = None
    latest: Decimal | None = None
    in_order = True
    from tqdm import tqdm

    size = _size(path)
    shown = progress and size > PROGRESS_BYTES
    with tqdm(
        total=size, unit="B", unit_scale=True, desc=f"reading {path.name}", disable=not shown
    ) as bar:
        for index, line, fields in read.every_row(bar.update):
            rows_in_file, last_line = index + 1, line
            if not read.holds(index):
                continue
            arrival, prompt_len, output_len = _parse_row(path, line, fields, read.names)
            rows_read += 1
            in_order = in_order and (latest is None or arrival >= latest)
            earliest = arrival if earliest is None else min(earliest, arrival)
            latest = arrival if latest is None else max(latest, arrival)
            fitted = _fit(prompt_len, output_len, max_model_len)
            if fitted is None:
                refused += 1
                continue
            clipped += fitted < output_len
            prompt_tokens += prompt_len
            output_tokens += fitted
    if rows_read == 0:
        raise ResourceConfigError(
            f"trace file {path}: offset={offset} starts past its last row: it has "
            f"{rows_in_file} rows (counted from 0 after any header), the last at line "
            f"{last_line}; set offset below {rows_in_file}"
        )
    assert earliest is not None and latest is not None
    return TraceFile(
        path=path,
        offset=offset,
        rows_read=rows_read,
        rows_in_file=rows_in_file,
        served=rows_read - refused,
        refused=refused,
        clipped=clipped,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        span_s=float(latest - earliest),
        step_ms=step_ms,
        in_order=in_order,
        _slice=read,
        _first_arrival=earliest,
    )


PROGRESS_BYTES = 64 * 1024 * 1024
"""Files larger than this show a progress bar while they are read, where one is asked for."""


def _fit(prompt_len: int, output_len: int, max_model_len: int) -> int | None:
    """The output length an engine serves a request with: cut to end at ``max_model_len``
    tokens; None if the prompt alone reaches it (the engine refuses the request)."""
    if prompt_len >= max_model_len:
        return None
    return min(output_len, max_model_len - prompt_len)


_Row = tuple[int, int, list[str] | str]
"""A row of a trace file before its values are checked: its index (from 0, after any header),
its line (from 1), and the fields of :data:`CSV_COLUMNS` (CSV) or its text (JSON lines)."""

_MAX_SECONDS = Decimal(10**12)
"""Arrival times at or beyond this many seconds (about 31,700 years) are refused: no trace means
them, and they would run past the precision the steps are computed with."""


@dataclass(frozen=True)
class _Slice:
    """One slice of a trace file, read as often as it is asked for, and how its rows become
    requests."""

    path: Path
    form: str
    """``csv`` or ``jsonl``."""
    offset: int
    limit: int | None
    seed: int
    vocab_size: int
    max_model_len: int

    @property
    def names(self) -> tuple[str, str, str]:
        """The columns (CSV) or keys (JSON lines) of arrival, prompt and output."""
        return CSV_COLUMNS if self.form == "csv" else JSONL_KEYS

    def holds(self, index: int) -> bool:
        """Whether row ``index`` is in the slice."""
        return self.offset <= index and (self.limit is None or index < self.offset + self.limit)

    def every_row(self, progress: Callable[[int], object] | None = None) -> Iterator[_Row]:
        """Every row of the file, unparsed; ``progress`` is told the bytes of each line read."""
        lines = _lines(self.path, progress)
        return _csv_rows(self.path, lines) if self.form == "csv" else _jsonl_rows(self.path, lines)

    def rows(self) -> Iterator[tuple[Decimal, int, int]]:
        """The slice's rows, parsed, read from the file again; the rows after it are not read."""
        for index, line, fields in self.every_row():
            if self.limit is not None and index >= self.offset + self.limit:
                return
            if index >= self.offset:
                yield _parse_row(self.path, line, fields, self.names)


def _size(path: Path) -> int:
    """The file's bytes; 0 where it can't be seen (reading it says what is wrong)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _check_read_args(
    max_model_len: object,
    vocab_size: object,
    seed: object,
    step_ms: object,
    offset: object,
    limit: object,
) -> None:
    """Raise for every unusable argument of :func:`read_trace`, naming each."""
    checks = [
        argument_problem("max_model_len", max_model_len, whole=True, ge=2, note=BOTH_TOKENS),
        argument_problem("vocab_size", vocab_size, whole=True, ge=1),
        argument_problem("seed", seed, whole=True),
        argument_problem(
            "step_ms", step_ms, of="milliseconds", gt=0,
            note=" (what one engine step stands for), e.g. step_ms=10",
        ),
        argument_problem("offset", offset, whole=True, ge=0, note=" (rows to skip)"),
        None if limit is None else argument_problem(
            "limit", limit, whole=True, of="rows", ge=1, note=", or None"
        ),
    ]  # fmt: skip
    problems = [problem for problem in checks if problem is not None]
    if problems:
        raise ResourceConfigError(*problems, where="read_trace's arguments")


def _lines(path: Path, progress: Callable[[int], object] | None = None) -> Iterator[str]:
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
        # A line ends at b"\n", which is never part of another UTF-8 character.
        for number, data in enumerate(file, start=1):
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


def _csv_rows(path: Path, lines: Iterator[str]) -> Iterator[_Row]:
    """Every row of a CSV trace after its header, with its index and the line it ends on."""
    # The lines keep their ends: the csv module reads them itself (a quoted field may hold one).
    reader = csv.reader(lines)
    header = next((row for row in _checked(path, reader) if row), None)
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
    for row in _checked(path, reader):
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


def _checked(path: Path, reader: _csv.Reader) -> Iterator[list[str]]:
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


def _jsonl_rows(path: Path, lines: Iterator[str]) -> Iterator[_Row]:
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


def _parse_row(
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
            f"{where}: {time_name}={_shown(values[0])} is neither a date and time (e.g. "
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
            f"{where}: {name}={_shown(value)} is not a whole number of tokens; {_FIX}"
        )
    if length < 0:
        raise ResourceConfigError(
            f"{where}: {name}={_shown(value)} is negative, and a length counts tokens; {_FIX}"
        )
    if length == 0:
        raise ResourceConfigError(f"{where}: {name}={_shown(value)} is zero, and {why}; {_FIX}")
    return length


def _shown(value: object) -> str:
    """A value as its file wrote it: quoted if it is text."""
    if isinstance(value, str):
        return repr(value)
    return str(value) if isinstance(value, Decimal) else json.dumps(value)
