"""A trace file: both formats, arrival times to steps, slices, prompts past the context refused or
clipped as an engine does, seeded prompts, and each bad file refused naming file, line and value.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from mstar_resources.errors import ResourceConfigError
from mstar_resources.replay import trace_file as trace_module
from mstar_resources.replay.trace_file import TraceFile, read_trace

VOCAB = 1000
AZURE_CONV = Path(__file__).parent / "data" / "azure-conv-2023-first-2000.csv"
"""The header and first 2,000 rows of the Azure LLM inference trace 2023 (conversation), CC-BY 4.0:
data/README.md says where from and how it was cut."""

AZURE_HEAD = """\
TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:51.3910170,91,16
2023-11-16 18:15:52.5732450,91,16
2023-11-16 18:15:52.9921190,381,84
2023-11-16 18:15:54.4260870,1313,142
2023-11-16 18:15:54.9320210,388,84
2023-11-16 18:15:55.0176690,242,14
2023-11-16 18:15:55.1455750,209,152
2023-11-16 18:15:55.3808030,394,124
2023-11-16 18:15:56.1080580,394,59
2023-11-16 18:15:56.2631480,1315,174
2023-11-16 18:15:56.7869690,2221,15
2023-11-16 18:15:57.2267160,389,90
2023-11-16 18:15:57.8385010,415,106
2023-11-16 18:15:58.1114940,120,12
2023-11-16 18:15:58.5172230,369,74
2023-11-16 18:15:59.5671350,206,162
2023-11-16 18:15:59.7056780,1353,142
"""
"""The first 20 rows of the Azure LLM inference trace 2023 (conversation), as the file has them."""

AZURE_LENGTHS = [
    tuple(int(field) for field in line.split(",")[1:]) for line in AZURE_HEAD.splitlines()[1:]
]
"""(prompt, output) of each row of ``AZURE_HEAD``."""


def write(tmp_path: Path, name: str, text: str) -> Path:
    """``text`` in a file ``name`` under ``tmp_path``."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(*rows: tuple[object, object, object]) -> str:
    """JSON lines of (arrival_s, prompt_len, output_len) rows."""
    keys = ("arrival_s", "prompt_len", "output_len")
    return "".join(json.dumps(dict(zip(keys, row, strict=True))) + "\n" for row in rows)


def read(path: Path, **overrides: object) -> TraceFile:
    """``path`` read with small defaults, and ``overrides`` of the arguments."""
    args: dict = {"max_model_len": 4096, "vocab_size": VOCAB, "seed": 0, "step_ms": 10}
    return read_trace(path, **{**args, **overrides})


def lengths(trace: TraceFile) -> list[tuple[int, int]]:
    return [(r.prompt_len, r.output_len) for r in list(trace.requests())]


def test_azure_rows_become_requests(tmp_path):
    trace = read(write(tmp_path, "azure.csv", AZURE_HEAD))
    assert [r.id for r in list(trace.requests())] == list(range(20))
    assert lengths(trace) == AZURE_LENGTHS
    # 18:15:50.9951690 - 18:15:46.6805900 = 4.314579 s, at 10 ms a step.
    assert [r.arrival_step for r in list(trace.requests())[:3]] == [0, 431, 454]
    assert list(trace.requests())[-1].arrival_step == 1302
    assert (trace.rows_read, trace.rows_in_file, trace.offset) == (20, 20, 0)
    assert (trace.refused, trace.clipped) == (0, 0)
    assert trace.span_s == pytest.approx(13.025088)
    assert trace.path == tmp_path / "azure.csv"
    assert trace.step_ms == 10


@pytest.mark.parametrize(
    "name", [pytest.param("t.jsonl", id="jsonl"), pytest.param("t.json", id="json")]
)
def test_json_lines_read_like_the_csv(tmp_path, name):
    rows = [(46.68059 + i, prompt, output) for i, (prompt, output) in enumerate(AZURE_LENGTHS)]
    trace = read(write(tmp_path, name, jsonl(*rows)), step_ms=1000)
    assert lengths(trace) == AZURE_LENGTHS
    assert [r.arrival_step for r in list(trace.requests())] == list(range(20))


@pytest.mark.parametrize(
    ("arrivals", "step_ms", "steps"),
    [
        pytest.param([0, 0.0099, 0.01, 0.025, 1.5], 10, [0, 0, 1, 2, 150], id="10ms"),
        pytest.param([0, 0.0099, 0.01, 0.025, 1.5], 0.1, [0, 99, 100, 250, 15000], id="0.1ms"),
        pytest.param([0, 0.0099, 0.01, 0.025, 1.5], 1000, [0, 0, 0, 0, 1], id="1s"),
        pytest.param([100, 100.5, 101], 250, [0, 2, 4], id="from-first-arrival"),
        pytest.param([-2, -1.5, 0], 500, [0, 1, 4], id="negative-seconds"),
    ],
)
def test_arrival_steps_count_step_ms_from_the_first(tmp_path, arrivals, step_ms, steps):
    path = write(tmp_path, "t.jsonl", jsonl(*((t, 3, 2) for t in arrivals)))
    assert [r.arrival_step for r in list(read(path, step_ms=step_ms).requests())] == steps


@pytest.mark.parametrize(
    ("first", "second", "steps"),
    [
        pytest.param(
            "2023-11-16 18:17:03.9799600", "2023-11-16 18:17:04.0000000", 20, id="7-digits"
        ),
        pytest.param("2023-11-16 23:59:59.9", "2023-11-17T00:00:00.1", 200, id="midnight"),
        pytest.param("2023-11-16 18:17:03", "2023-11-16 18:17:04.5", 1500, id="no-fraction"),
        pytest.param("2023-11-16 18:17:03Z", "2023-11-16 19:17:03+01:00", 0, id="zones"),
        pytest.param("12.5", "14", 1500, id="seconds"),
        pytest.param(" 1700158623 ", "1700158623.0005", 0, id="padded-seconds"),
    ],
)
def test_timestamps_are_read_to_the_digit(tmp_path, first, second, steps):
    text = f"TIMESTAMP,ContextTokens,GeneratedTokens\n{first},5,5\n{second},6,6\n"
    trace = read(write(tmp_path, "t.csv", text), step_ms=1)
    assert [r.arrival_step for r in list(trace.requests())] == [0, steps]


def test_arrivals_are_sorted_and_ties_keep_file_order(tmp_path):
    path = write(tmp_path, "t.jsonl", jsonl((3, 30, 1), (1, 10, 1), (3, 31, 1), (2, 20, 1)))
    trace = read(path, step_ms=1000)
    assert [r.prompt_len for r in list(trace.requests())] == [10, 20, 30, 31]
    assert [r.arrival_step for r in list(trace.requests())] == [0, 1, 2, 2]
    assert [r.id for r in list(trace.requests())] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("offset", "limit", "rows"),
    [
        pytest.param(0, None, range(20), id="all"),
        pytest.param(5, 3, range(5, 8), id="middle"),
        pytest.param(18, None, range(18, 20), id="to-the-end"),
        pytest.param(0, 1, range(1), id="first"),
        pytest.param(10, 10, range(10, 20), id="exactly-to-the-end"),
    ],
)
def test_a_slice_reads_those_rows(tmp_path, offset, limit, rows):
    trace = read(write(tmp_path, "azure.csv", AZURE_HEAD), offset=offset, limit=limit)
    assert lengths(trace) == [AZURE_LENGTHS[row] for row in rows]
    assert next(trace.requests()).arrival_step == 0
    assert (trace.offset, trace.rows_read, trace.rows_in_file) == (offset, len(rows), 20)


def test_rows_outside_the_slice_are_not_checked(tmp_path):
    text = AZURE_HEAD.replace(",374,44", ",many,44")
    assert read(write(tmp_path, "t.csv", text), offset=1).rows_read == 19


def test_prompts_past_the_context_are_refused_and_outputs_clipped(tmp_path):
    rows = [(0, 100, 1), (1, 99, 1), (2, 99, 2), (3, 150, 5), (4, 50, 50), (5, 50, 51), (6, 1, 1)]
    trace = read(write(tmp_path, "t.jsonl", jsonl(*rows)), max_model_len=100, step_ms=1000)
    assert lengths(trace) == [(99, 1), (99, 1), (50, 50), (50, 50), (1, 1)]
    # The refused first row still starts the clock: the slice arrived from its time on.
    assert [r.arrival_step for r in list(trace.requests())] == [1, 2, 4, 5, 6]
    assert [r.id for r in list(trace.requests())] == list(range(5))
    assert (trace.rows_read, trace.refused, trace.clipped) == (7, 2, 2)


def test_same_seed_same_prompts_other_seed_other_prompts(tmp_path):
    path = write(tmp_path, "azure.csv", AZURE_HEAD)
    first, again, other = read(path, seed=3), read(path, seed=3), read(path, seed=4)
    assert first == again
    assert [r.prompt() for r in list(first.requests())] != [
        r.prompt() for r in list(other.requests())
    ]
    assert lengths(first) == lengths(other)
    assert all(0 <= token < VOCAB for r in list(first.requests()) for token in r.prompt())


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("t.CSV", AZURE_HEAD, id="upper-case-suffix"),
        pytest.param("t.csv", AZURE_HEAD.replace("\n", "\r\n"), id="crlf"),
        pytest.param("t.csv", "\ufeff" + AZURE_HEAD, id="byte-order-mark"),
        pytest.param("t.csv", AZURE_HEAD + "\n\n", id="blank-lines-at-end"),
        pytest.param(
            "t.csv",
            "\n".join(f"{line},x" for line in AZURE_HEAD.splitlines()),
            id="extra-column",
        ),
        pytest.param(
            "t.csv",
            "".join(",".join(reversed(line.split(","))) + "\n" for line in AZURE_HEAD.splitlines()),
            id="columns-reordered",
        ),
    ],
)
def test_ordinary_variations_of_a_csv_read_the_same(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    assert lengths(read(path)) == AZURE_LENGTHS


def test_json_lines_skip_blank_lines_and_ignore_other_keys(tmp_path):
    text = '\n{"arrival_s": 0, "prompt_len": 3, "output_len": 2, "id": "a"}\n\n'
    text += '{"output_len": 1, "arrival_s": 0.5, "prompt_len": 4}\n'
    trace = read(write(tmp_path, "t.jsonl", text), step_ms=100)
    assert lengths(trace) == [(3, 2), (4, 1)]
    assert [r.arrival_step for r in list(trace.requests())] == [0, 5]
    assert trace.rows_in_file == 2


def csv_row_3(row: str) -> str:
    """A CSV trace whose row on line 3 is ``row``."""
    return f"TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\n{row}\n1,5,5\n"


def jsonl_row_2(row: str) -> str:
    """A JSON-lines trace whose row on line 2 is ``row``."""
    return f'{{"arrival_s": 0, "prompt_len": 5, "output_len": 5}}\n{row}\n'


@pytest.mark.parametrize(
    ("name", "text", "args", "named"),
    [
        pytest.param("absent.csv", None, {}, [], id="missing-file"),
        pytest.param("t.txt", AZURE_HEAD, {}, ["'.txt'"], id="other-suffix"),
        pytest.param("t", AZURE_HEAD, {}, ["''"], id="no-suffix"),
        pytest.param("t.csv", "", {}, ["empty"], id="empty-csv"),
        pytest.param("t.csv", "\n\n", {}, ["empty"], id="blank-csv"),
        pytest.param("t.jsonl", "\n \n", {}, ["empty"], id="empty-jsonl"),
        pytest.param(
            "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", {}, ["line 1"], id="header-only"
        ),
        pytest.param(
            "t.csv",
            "time,in,GeneratedTokens\n0,5,5\n",
            {},
            ["line 1", "'time,in,GeneratedTokens'", "lacks TIMESTAMP, ContextTokens"],
            id="wrong-columns",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("2,5"),
            {},
            ["line 3", "'2,5'"],
            id="too-few-fields",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("yesterday,5,5"),
            {},
            ["line 3", "TIMESTAMP='yesterday'"],
            id="time-not-a-time",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("2023-13-16 18:15:46.6805900,5,5"),
            {},
            ["line 3", "TIMESTAMP='2023-13-16 18:15:46.6805900'"],
            id="month-13",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("inf,5,5"),
            {},
            ["line 3", "TIMESTAMP='inf'"],
            id="infinite-time",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("1e400,5,5"),
            {},
            ["line 3", "TIMESTAMP='1e400'"],
            id="huge-time",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("2,abc,5"),
            {},
            ["line 3", "ContextTokens='abc'"],
            id="length-not-a-number",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("2,5.0,5"),
            {},
            ["line 3", "ContextTokens='5.0'"],
            id="length-not-whole",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("2,5,-3"),
            {},
            ["line 3", "GeneratedTokens='-3'", "negative"],
            id="negative-output",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("2,-1,5"),
            {},
            ["line 3", "ContextTokens='-1'", "negative"],
            id="negative-prompt",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("2,5,0"),
            {},
            ["line 3", "GeneratedTokens='0'", "zero"],
            id="zero-output",
        ),
        pytest.param(
            "t.csv",
            csv_row_3("2,0,5"),
            {},
            ["line 3", "ContextTokens='0'", "zero"],
            id="zero-prompt",
        ),
        pytest.param(
            "t.jsonl",
            jsonl_row_2("[1, 2, 3]"),
            {},
            ["line 2", "'[1, 2, 3]'"],
            id="not-an-object",
        ),
        pytest.param(
            "t.jsonl",
            jsonl_row_2('{"arrival_s": 1, "output_len": 5'),
            {},
            ["line 2", """'{"arrival_s": 1, "output_len": 5'"""],
            id="not-json",
        ),
        pytest.param(
            "t.jsonl",
            jsonl_row_2('{"arrival_s": 1, "prompt": 5, "output_len": 5}'),
            {},
            ["line 2", "keys arrival_s, prompt, output_len", "lacks prompt_len"],
            id="missing-key",
        ),
        pytest.param(
            "t.jsonl",
            jsonl_row_2('{"arrival_s": NaN, "prompt_len": 5, "output_len": 5}'),
            {},
            ["line 2", "arrival_s=NaN"],
            id="nan-time",
        ),
        pytest.param(
            "t.jsonl",
            jsonl_row_2('{"arrival_s": "soon", "prompt_len": 5, "output_len": 5}'),
            {},
            ["line 2", "arrival_s='soon'"],
            id="time-text",
        ),
        pytest.param(
            "t.jsonl",
            jsonl_row_2('{"arrival_s": 1, "prompt_len": 12.5, "output_len": 5}'),
            {},
            ["line 2", "prompt_len=12.5"],
            id="fractional-length",
        ),
        pytest.param(
            "t.jsonl",
            jsonl_row_2('{"arrival_s": 1, "prompt_len": 5, "output_len": true}'),
            {},
            ["line 2", "output_len=true"],
            id="bool-length",
        ),
        pytest.param(
            "t.jsonl",
            jsonl_row_2('{"arrival_s": 1, "prompt_len": 5, "output_len": 0}'),
            {},
            ["line 2", "output_len=0", "zero"],
            id="zero-output-jsonl",
        ),
        pytest.param(
            "t.jsonl",
            jsonl_row_2('{"arrival_s": 1, "prompt_len": -4, "output_len": 1}'),
            {},
            ["line 2", "prompt_len=-4", "negative"],
            id="negative-prompt-jsonl",
        ),
        pytest.param(
            "t.csv", AZURE_HEAD, {"offset": 20}, ["offset=20", "line 21"], id="offset-past-end"
        ),
        pytest.param(
            "t.jsonl",
            jsonl((0, 1, 1), (1, 1, 1)),
            {"offset": 2},
            ["offset=2", "line 2"],
            id="offset-past-end-jsonl",
        ),
    ],
)
def test_bad_file_is_refused_naming_file_line_and_value(tmp_path, name, text, args, named):
    path = tmp_path / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ResourceConfigError) as caught:
        read(path, **args)
    message = str(caught.value)
    assert "\n" not in message
    for part in [f"trace file {path}", *named]:
        assert part in message


def test_bytes_that_are_not_text_are_refused_at_their_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(AZURE_HEAD.encode() + b"2023-11-16 18:16:00.0,5,\xff\n")
    with pytest.raises(ResourceConfigError, match=r"t\.csv, line 22: byte 0xff is not UTF-8"):
        read(path)


def test_a_file_with_no_line_end_is_refused_reading_a_bounded_part(tmp_path):
    """A link to /dev/zero has no line end, ever: refused at line 1 after a bounded read, as is a
    line longer than any row, without holding the file."""
    from mstar_resources.replay.trace_rows import MAX_LINE_BYTES

    zero = tmp_path / "zero.csv"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ResourceConfigError, match=r"zero\.csv, line 1: no line end within"):
        read(zero)
    long = tmp_path / "long.csv"
    long.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "9" * (3 * MAX_LINE_BYTES))
    tracemalloc.start()
    try:
        with pytest.raises(ResourceConfigError, match=r"long\.csv, line 2: no line end within"):
            read(long)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_LINE_BYTES


def test_a_limit_past_the_last_row_reads_to_the_end(tmp_path):
    trace = read(write(tmp_path, "t.csv", AZURE_HEAD), offset=10, limit=11)
    assert (trace.offset, trace.rows_read, trace.rows_in_file) == (10, 10, 20)


def test_a_length_of_thousands_of_digits_is_refused_naming_it(tmp_path):
    row = "2023-11-16 18:15:46.6805900," + "7" * 5000 + ",9\n"
    path = write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + row)
    with pytest.raises(ResourceConfigError, match=r"line 2: ContextTokens has 5,000 digits"):
        read(path)


def test_an_unreadable_file_is_refused_naming_it(tmp_path, monkeypatch):
    path = write(tmp_path, "t.csv", AZURE_HEAD)

    def deny(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", deny)
    with pytest.raises(ResourceConfigError, match=r"t\.csv can't be read \(permission denied\)"):
        read(path)


def test_a_folder_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.mkdir()
    with pytest.raises(ResourceConfigError, match=rf"trace file {path} is a folder"):
        read(path)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        pytest.param({"step_ms": 0}, r"step_ms=0 must be a finite number of", id="zero-step"),
        pytest.param({"step_ms": -1.5}, r"step_ms=-1\.5 must be", id="negative-step"),
        pytest.param({"step_ms": float("nan")}, r"step_ms=nan must be", id="nan-step"),
        pytest.param({"step_ms": float("inf")}, r"step_ms=inf must be", id="inf-step"),
        pytest.param({"step_ms": "10"}, r"step_ms='10' must be", id="text-step"),
        pytest.param({"step_ms": True}, r"step_ms=True must be", id="bool-step"),
        pytest.param(
            {"max_model_len": 1}, r"max_model_len=1 must be a whole number >= 2", id="mml"
        ),
        pytest.param({"vocab_size": 0}, r"vocab_size=0 must be a positive", id="vocab"),
        pytest.param({"seed": 1.5}, r"seed=1\.5 must be a whole number", id="seed"),
        pytest.param({"offset": -1}, r"offset=-1 must be a whole number >= 0", id="offset"),
        pytest.param({"limit": 0}, r"limit=0 must be a positive whole number", id="limit"),
    ],
)
def test_bad_argument_is_named_before_the_file_is_read(tmp_path, override, match):
    with pytest.raises(ResourceConfigError, match=match):
        read(tmp_path / "absent.csv", **override)


def test_every_bad_argument_is_named_at_once(tmp_path):
    with pytest.raises(ResourceConfigError) as caught:
        read(tmp_path / "absent.csv", step_ms=0, limit=0)
    assert len(caught.value.problems) == 2
    assert "step_ms=0" in str(caught.value)
    assert "limit=0" in str(caught.value)


def test_the_azure_conversation_trace():
    trace = read_trace(
        AZURE_CONV, max_model_len=4096, vocab_size=128256, seed=0, step_ms=10, limit=2000
    )
    # The fixture is the published file's first 2,000 rows (of 19,366), so the slice is all of it.
    assert (trace.rows_read, trace.rows_in_file) == (2000, 2000)
    assert AZURE_CONV.read_bytes().replace(b"\r\n", b"\n").startswith(AZURE_HEAD.encode())
    # Of the first 2,000 rows, 26 prompts hold 4,096 tokens or more, and 117 others would run past.
    assert (trace.refused, trace.clipped, len(list(trace.requests()))) == (26, 117, 1974)
    assert all(r.prompt_len + r.output_len <= 4096 for r in list(trace.requests()))
    arrivals = [r.arrival_step for r in list(trace.requests())]
    assert arrivals[0] == 0
    assert arrivals == sorted(arrivals)
    # 18:15:46.6805900 to 18:22:50.9400470.
    assert trace.span_s == pytest.approx(424.259457)
    assert arrivals[-1] == 42425


def azure_like(rows: int) -> str:
    """``rows`` rows in the Azure trace's format, 10 ms apart, cycling through AZURE_LENGTHS."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for row in range(rows):
        prompt, output = AZURE_LENGTHS[row % len(AZURE_LENGTHS)]
        lines.append(f"{row / 100:.2f},{prompt},{output}")
    return "\n".join(lines) + "\n"


def test_a_file_in_arrival_order_streams_in_memory_that_does_not_grow_with_it(tmp_path):
    """Reading and serving every row of a 40,000-row file holds a few rows at a time: its peak
    is a small part of the file's size (the rows as Python objects would be many times it)."""
    path = write(tmp_path, "big.csv", azure_like(40_000))
    tracemalloc.start()
    try:
        trace = read(path, limit=None)
        served = sum(1 for _ in trace.requests())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert trace.in_order and served == trace.served == 40_000
    assert peak < path.stat().st_size / 8, f"peak {peak:,} B for a {path.stat().st_size:,} B file"


def test_a_file_out_of_order_is_read_sorted_and_says_so(tmp_path):
    rows = [(5, 10, 1), (1, 20, 1), (3, 30, 1)]
    trace = read(write(tmp_path, "t.jsonl", jsonl(*rows)), step_ms=1000)
    assert not trace.in_order
    assert [(r.arrival_step, r.prompt_len) for r in trace.requests()] == [(0, 20), (2, 30), (4, 10)]


def test_rows_before_the_slice_are_skipped_unparsed(tmp_path):
    """A bad value before the offset is not read; the same value inside the slice is refused."""
    text = azure_like(5).replace("0.01,396", "0.01,abc")
    path = write(tmp_path, "t.csv", text)
    assert lengths(read(path, offset=2)) == AZURE_LENGTHS[2:5]
    with pytest.raises(ResourceConfigError, match=r"line 3: ContextTokens='abc'"):
        read(path, offset=1)


def test_a_large_file_is_read_under_a_progress_bar(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, "azure.csv", AZURE_HEAD)
    read(path, progress=True)
    assert "reading azure.csv" not in capsys.readouterr().err  # small: no bar
    monkeypatch.setattr(trace_module, "PROGRESS_BYTES", 100)
    read(path, progress=True)
    assert "reading azure.csv" in capsys.readouterr().err
    read(path, progress=False)
    assert "reading azure.csv" not in capsys.readouterr().err


ODD_FILES = [
    pytest.param("cr.csv", AZURE_HEAD.replace("\n", "\r"), "line 1", "not CR alone", id="cr-only"),
    pytest.param(
        "wide.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,Note\n2023-11-16 18:15:46.68,374,44,"
        + "x" * 140_000 + "\n",
        "line 2", "longer than 131,072 characters", id="field-over-the-csv-limit",
    ),
    pytest.param(
        "digits.jsonl", '{"arrival_s": 1, "prompt_len": ' + "9" * 5000 + ', "output_len": 4}\n',
        "line 1", "a number has thousands of digits", id="json-number-of-5000-digits",
    ),
    pytest.param(
        "deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n", "line 1", "nested too deeply",
        id="json-nested-100000-deep",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "line", "why"), ODD_FILES)
def test_a_file_the_parsers_refuse_is_one_paragraph_naming_the_line(
    tmp_path, name, text, line, why
):
    with pytest.raises(ResourceConfigError) as raised:
        lengths(read(write(tmp_path, name, text)))
    message = str(raised.value)
    assert f"{name}, {line}:" in message and why in message
    assert "\n" not in message
    assert "trace_offset and requests" in message


def test_a_loop_of_symbolic_links_is_one_paragraph(tmp_path):
    (tmp_path / "a.csv").symlink_to(tmp_path / "b.csv")
    (tmp_path / "b.csv").symlink_to(tmp_path / "a.csv")
    with pytest.raises(ResourceConfigError, match=r"a\.csv can't be opened \(.*\); pass the path"):
        read(tmp_path / "a.csv")
