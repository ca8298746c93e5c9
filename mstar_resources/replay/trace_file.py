"""A slice of a production trace file: checked whole once, counted (requests kept, refused,
clipped), and read again as requests each time they are asked for."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path

from .._internal.limits import argument_problem
from ..errors import ResourceConfigError
from .trace import BOTH_TOKENS, Request
from .trace_rows import (
    CSV_COLUMNS,
    FORMATS,
    JSONL_KEYS,
    Row,
    csv_rows,
    jsonl_rows,
    lines_of,
    parse_row,
)

__all__ = ["PROGRESS_BYTES", "TraceFile", "read_trace"]


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
    if suffix not in FORMATS:
        raise ResourceConfigError(
            f"trace file {path}: can't tell its format from the suffix {path.suffix!r}; name a CSV "
            f"with the columns {','.join(CSV_COLUMNS)} '.csv', or JSON lines (one object a line "
            f"with {', '.join(JSONL_KEYS)}) '.jsonl' or '.json'"
        )
    read = _Slice(path, FORMATS[suffix], offset, limit, seed, vocab_size, max_model_len)
    counts = _count_rows(read, progress)
    if counts.rows_read == 0:
        raise ResourceConfigError(
            f"trace file {path}: offset={offset} starts past its last row: it has "
            f"{counts.rows_in_file} rows (counted from 0 after any header), the last at line "
            f"{counts.last_line}; set offset below {counts.rows_in_file}"
        )
    assert counts.earliest is not None and counts.latest is not None
    return TraceFile(
        path=path,
        offset=offset,
        rows_read=counts.rows_read,
        rows_in_file=counts.rows_in_file,
        served=counts.rows_read - counts.refused,
        refused=counts.refused,
        clipped=counts.clipped,
        prompt_tokens=counts.prompt_tokens,
        output_tokens=counts.output_tokens,
        span_s=float(counts.latest - counts.earliest),
        step_ms=step_ms,
        in_order=counts.in_order,
        _slice=read,
        _first_arrival=counts.earliest,
    )


@dataclass
class _Counts:
    """What a slice's rows come to, counted as the file is read once."""

    rows_in_file: int = 0
    last_line: int = 0
    rows_read: int = 0
    refused: int = 0
    clipped: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    earliest: Decimal | None = None
    latest: Decimal | None = None
    in_order: bool = True

    def add(self, arrival: Decimal, prompt_len: int, output_len: int, max_model_len: int) -> None:
        """Count one row of the slice, served as an engine would serve it (:func:`_fit`)."""
        self.rows_read += 1
        self.in_order = self.in_order and (self.latest is None or arrival >= self.latest)
        self.earliest = arrival if self.earliest is None else min(self.earliest, arrival)
        self.latest = arrival if self.latest is None else max(self.latest, arrival)
        fitted = _fit(prompt_len, output_len, max_model_len)
        if fitted is None:
            self.refused += 1
            return
        self.clipped += fitted < output_len
        self.prompt_tokens += prompt_len
        self.output_tokens += fitted


def _count_rows(read: _Slice, progress: bool) -> _Counts:
    """Every row of ``read``'s file seen once: those of the slice checked and counted, the rest
    counted only; a progress bar over the bytes where ``progress`` and the file is large."""
    from tqdm import tqdm

    counts = _Counts()
    size = _size(read.path)
    shown = progress and size > PROGRESS_BYTES
    with tqdm(
        total=size, unit="B", unit_scale=True, desc=f"reading {read.path.name}", disable=not shown
    ) as bar:
        for index, line, fields in read.every_row(bar.update):
            counts.rows_in_file, counts.last_line = index + 1, line
            if read.holds(index):
                arrival, prompt_len, output_len = parse_row(read.path, line, fields, read.names)
                counts.add(arrival, prompt_len, output_len, read.max_model_len)
    return counts


PROGRESS_BYTES = 64 * 1024 * 1024
"""Files larger than this show a progress bar while they are read, where one is asked for."""


def _fit(prompt_len: int, output_len: int, max_model_len: int) -> int | None:
    """The output length an engine serves a request with: cut to end at ``max_model_len``
    tokens; None if the prompt alone reaches it (the engine refuses the request)."""
    if prompt_len >= max_model_len:
        return None
    return min(output_len, max_model_len - prompt_len)


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

    def every_row(self, progress: Callable[[int], object] | None = None) -> Iterator[Row]:
        """Every row of the file, unparsed; ``progress`` is told the bytes of each line read."""
        lines = lines_of(self.path, progress)
        return csv_rows(self.path, lines) if self.form == "csv" else jsonl_rows(self.path, lines)

    def rows(self) -> Iterator[tuple[Decimal, int, int]]:
        """The slice's rows, parsed, read from the file again; the rows after it are not read."""
        for index, line, fields in self.every_row():
            if self.limit is not None and index >= self.offset + self.limit:
                return
            if index >= self.offset:
                yield parse_row(self.path, line, fields, self.names)


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
