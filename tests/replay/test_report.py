"""The replay's report from the setups' results, on the CPU: the figures report.json holds, the
table printed from them, and the files written."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from mstar_resources.replay import report as reporting
from mstar_resources.replay.engine import SealedOverflow, SetupResult
from mstar_resources.replay.report import (
    percentile,
    rank_report,
    setup_summary,
    table,
    tokens_identical,
    trace_line,
    trace_summary,
)
from mstar_resources.replay.workload import load_workload
from mstar_resources.units import MIB

SERVED = {"requests": 1998, "steps": 42013, "prompt_tokens": 2209565, "generated_tokens": 529807}
"""What was served of a trace, as report.json's ``trace`` entry holds it."""


@pytest.mark.parametrize(
    ("source", "line"),
    [
        pytest.param(
            {"source": "synthetic", "seed": 0, "max_model_len": 131072, "refused": 0,
             "clipped": 0},
            "trace: synthetic (seed 0): 1,998 requests served, 0 refused (prompt >= max_model_len "
            "131,072), 0 clipped (output cut to fit); 42,013 steps; 2,209,565 prompt tokens, "
            "529,807 generated",
            id="synthetic",
        ),
        pytest.param(
            {"source": "file", "path": "azure-conv-2023.csv", "offset": 100, "rows": 2000,
             "rows_in_file": 19366, "span_s": 424.259457, "step_ms": 10.0, "seed": 0,
             "max_model_len": 4096, "refused": 2, "clipped": 5},
            "trace: azure-conv-2023.csv rows 100..2,099 of 19,366 (424.3 s at 10 ms a step, "
            "seed 0): 1,998 requests served, 2 refused (prompt >= max_model_len 4,096), 5 clipped "
            "(output cut to fit); 42,013 steps; 2,209,565 prompt tokens, 529,807 generated",
            id="file",
        ),
    ],
)  # fmt: skip
def test_the_trace_line_names_the_source_and_what_was_served(source, line):
    assert trace_line({**source, **SERVED}) == line


def test_the_summary_counts_the_requests_and_their_tokens():
    workload = load_workload(
        None, requests=5, trace_offset=0, step_ms=10, seed=3, vocab_size=100, max_model_len=4096
    )
    requests = list(workload.requests())
    assert trace_summary(workload, steps=9) == {
        **workload.source,
        "requests": 5,
        "steps": 9,
        "prompt_tokens": sum(r.prompt_len for r in requests),
        "generated_tokens": sum(r.output_len for r in requests),
    }


def setup_result(name: str = "mstar-resources", **fields: Any) -> SetupResult:
    """A setup's result as the engine leaves it: 1 MiB of workspace and a KV cache of 4 pages of
    16 tokens, unless ``fields`` say otherwise."""
    figures: dict[str, Any] = dict(
        workspace_bytes=MIB, kv_pages=4, kv_tokens=64, kv_bytes=64 << 14, weights_bytes=1 << 20
    )
    return SetupResult(name, **{**figures, **fields})


OVERFLOW = SealedOverflow(
    workspace="attention:prefill",
    held_bytes=1_048_576,
    needed_bytes=13_737_984,
    setting="resources.attn.prefill.declared_mb",
    suggested_mb=14,
    message="workspace 'attention:prefill' is sealed at 1,048,576 bytes; set "
    "resources.attn.prefill.declared_mb=14 or more",
)
"""A sealed refusal, as a setup keeps it (docs/replay.md's floor too small for the trace)."""


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [
        pytest.param([], 0.5, 0.0, id="none"),
        pytest.param([7.0], 0.5, 7.0, id="one-value-p50"),
        pytest.param([7.0], 0.99, 7.0, id="one-value-p99"),
        pytest.param([float(v) for v in range(100, 0, -1)], 0.99, 99.0, id="p99-of-100"),
        pytest.param([float(v) for v in range(1, 101)], 0.5, 50.0, id="p50-of-100"),
        pytest.param([3.0, 1.0, 2.0], 0.0, 1.0, id="p0-is-the-least"),
        pytest.param([3.0, 1.0, 2.0], 1.0, 3.0, id="p100-is-the-most"),
    ],
)  # fmt: skip
def test_a_percentile_is_the_nearest_rank(values, fraction, expected):
    assert percentile(values, fraction) == expected


def test_a_setup_s_summary_holds_its_figures_and_decode_step_percentiles():
    result = setup_result(
        decode_step_s=[0.003, 0.001, 0.002], tokens={0: [5, 6], 1: [7]}, growths_before_seal=2,
        steps_served=9, int_workspace_bytes=3 * MIB, pinned_bytes=3 * MIB,
    )  # fmt: skip
    summary = setup_summary(result)
    assert summary.pop("decode_p50_ms") == pytest.approx(2.0)
    assert summary.pop("decode_p99_ms") == pytest.approx(3.0)
    assert summary.pop("decode_p99_over_p50") == pytest.approx(1.5)
    assert summary == {
        "setup": "mstar-resources", "workspace_bytes": MIB, "int_workspace_bytes": 3 * MIB,
        "pinned_bytes": 3 * MIB, "kv_tokens": 64, "kv_bytes": 64 << 14, "weights_bytes": 1 << 20,
        "decode_steps": 3, "tokens_out": 3, "steps_served": 9,
        "growths_before_seal": 2, "growths_after_seal": 0, "sealed_overflow": None,
    }  # fmt: skip


def test_a_setup_stopped_before_decoding_has_zero_times_and_its_overflow_s_figures():
    summary = setup_summary(setup_result(sealed_overflow=OVERFLOW))
    assert (summary["decode_steps"], summary["decode_p50_ms"], summary["decode_p99_ms"]) == (
        0,
        0,
        0,
    )
    assert summary["decode_p99_over_p50"] == 0.0
    assert summary["sealed_overflow"] == {
        "workspace": "attention:prefill", "held_bytes": 1_048_576, "needed_bytes": 13_737_984,
        "setting": "resources.attn.prefill.declared_mb", "suggested_mb": 14,
        "message": OVERFLOW.message,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("ours", "theirs", "identical"),
    [
        pytest.param({}, {}, True, id="same-tokens"),
        pytest.param({"tokens": {0: [1, 2]}}, {"tokens": {0: [1, 3]}}, False, id="different"),
        pytest.param({"sealed_overflow": OVERFLOW}, {}, False, id="one-stopped"),
        pytest.param({}, {"sealed_overflow": OVERFLOW}, False, id="the-other-stopped"),
    ],
)  # fmt: skip
def test_tokens_are_identical_only_where_both_setups_ran_to_the_end(ours, theirs, identical):
    results = [setup_result(**ours), setup_result("fixed 512 MiB", **theirs)]
    assert tokens_identical(results) is identical


TRACE = {
    "source": "file", "path": "azure-conv-2023.csv", "offset": 0, "rows": 2000,
    "rows_in_file": 19366, "span_s": 424.3, "step_ms": 10.0, "seed": 0, "max_model_len": 131072,
    "refused": 0, "clipped": 0, "requests": 2000, "steps": 42013, "prompt_tokens": 2209565,
    "generated_tokens": 529807,
}  # fmt: skip
"""report.json's ``trace`` entry for docs/replay.md's one-GPU run on Azure's conversation trace."""


def readme_run(**ours: Any) -> dict[str, Any]:
    """The one-GPU run in docs/replay.md as one rank's report, rebuilt from setups' results with its
    figures: decode steps whose median and p99 are the doc's (1.495 and 1.975 ms, 1.344 and
    1.736 ms), and its tokens out. ``ours`` changes the library's setup."""
    tokens = {0: [0] * 529_807}
    results = [
        setup_result(workspace_bytes=23 * MIB, kv_tokens=7_237_616, tokens=tokens,
                     decode_step_s=[0.001, 0.001495, 0.001975], int_workspace_bytes=3 * MIB,
                     pinned_bytes=3 * MIB, **ours),
        setup_result("fixed 512 MiB", workspace_bytes=512 * MIB, kv_tokens=7_212_576,
                     tokens=tokens, decode_step_s=[0.001, 0.001344, 0.001736],
                     int_workspace_bytes=296 * MIB, pinned_bytes=296 * MIB),
    ]  # fmt: skip
    return rank_report(
        results, deployment="llama3-8b-h200_calibrated", gpu="NVIDIA H200", ranks=1,
        model={"attention": "gqa", "layers": 2}, trace=TRACE,
    )  # fmt: skip


def test_one_rank_s_report_holds_the_keys_the_gpu_tests_read():
    report = readme_run()
    assert list(report) == [
        "deployment", "gpu", "ranks", "model", "trace", "setups", "tokens_identical",
        "decode_p50_ratio_rounds",
    ]  # fmt: skip
    assert (report["model"], report["trace"], report["tokens_identical"]) == (
        {"attention": "gqa", "layers": 2}, TRACE, True,
    )  # fmt: skip
    assert [s["setup"] for s in report["setups"]] == ["mstar-resources", "fixed 512 MiB"]
    assert report["setups"][0]["workspace_bytes"] == 23 * MIB


def test_the_table_is_the_readme_s():
    assert table(readme_run()).splitlines() == [
        "setup            workspace MiB  int MiB  pinned MiB  KV-cache tokens  decode p50 ms  "
        "p99 ms  p99/p50  tokens out  growths after seal  sealed overflows",
        "---------------  -------------  -------  ----------  ---------------  -------------  "
        "------  -------  ----------  ------------------  ----------------",
        "mstar-resources          23.00     3.00        3.00        7,237,616          1.495  "
        " 1.975     1.32     529,807                   0                 0",
        "fixed 512 MiB           512.00   296.00      296.00        7,212,576          1.344  "
        " 1.736     1.29     529,807                   0                 0",
        "ranks: 1; llama3-8b-h200_calibrated on NVIDIA H200",
        "trace: azure-conv-2023.csv rows 0..1,999 of 19,366 (424.3 s at 10 ms a step, "
        "seed 0): 2,000 requests served, 0 refused (prompt >= max_model_len 131,072), 0 clipped "
        "(output cut to fit); 42,013 steps; 2,209,565 prompt tokens, 529,807 generated",
        "KV-cache tokens: +25,040 a rank with mstar-resources (+0.35%); decode p50 ratio "
        "mstar-resources/fixed 512 MiB: 1.112",
        "int workspaces: 3,145,728 bytes on the GPU and 3,145,728 pinned on the host with "
        "mstar-resources, against 310,378,496 and 310,378,496 with fixed 512 MiB (each wrapper "
        "its own): +307,232,768 and +307,232,768 bytes saved",
        "generated tokens identical between the setups: yes",
    ]


def test_a_sealed_overflow_shows_in_its_row_and_on_a_line_of_its_own():
    lines = table(readme_run(sealed_overflow=OVERFLOW)).splitlines()
    ours_row = re.split(r" {2,}", lines[2])
    assert (ours_row[0], ours_row[-1]) == ("mstar-resources", "1 (stopped)")
    assert lines[-2] == "generated tokens identical between the setups: NO"
    assert lines[-1] == f"mstar-resources stopped at a sealed overflow: {OVERFLOW.message}"


def test_a_fixed_buffer_without_decode_steps_gives_a_ratio_of_zero():
    report = readme_run()
    report["setups"][1]["decode_p50_ms"] = 0.0  # as setup_summary has it for no decode steps
    ratio_line = table(report).splitlines()[6]
    assert ratio_line.endswith("decode p50 ratio mstar-resources/fixed 512 MiB: 0.000")


def test_the_report_is_written_as_json_beside_the_figure(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(reporting, "_plot", lambda *args: drawn.append(args))
    report, times = readme_run(), {"mstar-resources": [0.001], "fixed 512 MiB": [0.002]}
    paths = reporting.write(report, tmp_path, times)
    assert paths == [tmp_path / "report.json", tmp_path / "replay.png"]
    text = paths[0].read_text()
    assert text.endswith("}\n") and json.loads(text) == report
    assert drawn == [(report, times, tmp_path / "replay.png")]


@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is not installed (the bench extra draws replay.png)",
)
def test_the_figure_is_a_png_even_for_a_setup_without_decode_steps(tmp_path):
    report = readme_run(sealed_overflow=OVERFLOW)
    times = {"mstar-resources": [], "fixed 512 MiB": [0.001, 0.002]}
    json_path, png = reporting.write(report, tmp_path, times)
    assert json.loads(json_path.read_text()) == report
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


# --- the figure, as the report asks matplotlib to draw it (a recording stand-in) ---------------


class FakeAxes:
    """Stands in for one of matplotlib's axes: every call is recorded, by method, in ``calls``;
    ``bar`` returns its arguments as the bars that ``bar_label`` is handed back."""

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}

    def __getattr__(self, method: str) -> Any:
        if method.startswith("__"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.setdefault(method, []).append((args, kwargs))
            return ("bars", args) if method == "bar" else None

        return call

    def one(self, method: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The one call of ``method``."""
        (only,) = self.calls[method]
        return only


class FakeFigure:
    """Stands in for a matplotlib figure: its title, and ``savefig`` writing ``content`` (or
    raising ``error``) at the path it is given."""

    content = b"\x89PNG\r\n\x1a\nfake"

    def __init__(self, error: Exception | None) -> None:
        self.error, self.title, self.saved = error, "", []

    def suptitle(self, title: str) -> None:
        self.title = title

    def tight_layout(self) -> None:
        pass

    def savefig(self, path: Path, dpi: int, format: str) -> None:
        self.saved.append(path)
        path.write_bytes(self.content[:4])  # half a PNG, as a crash mid-write leaves it
        if self.error is not None:
            raise self.error
        path.write_bytes(self.content)


class FakePyplot:
    """Stands in for ``matplotlib.pyplot``: the figures made and closed, with three axes each."""

    def __init__(self) -> None:
        self.figures: list[tuple[FakeFigure, tuple[FakeAxes, ...]]] = []
        self.closed: list[FakeFigure] = []
        self.backends: list[str] = []
        self.error: Exception | None = None
        """What the next figure's ``savefig`` raises, if anything."""

    def subplots(self, rows: int, cols: int, figsize: tuple[float, float]) -> Any:
        figure, axes = FakeFigure(self.error), tuple(FakeAxes() for _ in range(rows * cols))
        self.figures.append((figure, axes))
        return figure, axes

    def close(self, figure: FakeFigure) -> None:
        self.closed.append(figure)


def install_fake_matplotlib(monkeypatch: pytest.MonkeyPatch) -> FakePyplot:
    """``matplotlib`` and ``matplotlib.pyplot`` as recording stand-ins, in ``sys.modules`` until
    the test ends: the report's figure code runs where matplotlib is not installed (CI), and what
    it asks to be drawn can be checked. That a real PNG comes out is checked where matplotlib is
    installed (test_the_figure_is_a_png_even_for_a_setup_without_decode_steps)."""
    pyplot = FakePyplot()
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.use = pyplot.backends.append  # type: ignore[attr-defined]
    module = types.ModuleType("matplotlib.pyplot")
    module.subplots = pyplot.subplots  # type: ignore[attr-defined]
    module.close = pyplot.close  # type: ignore[attr-defined]
    matplotlib.pyplot = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", module)
    return pyplot


@pytest.fixture
def fake_matplotlib(monkeypatch: pytest.MonkeyPatch) -> FakePyplot:
    return install_fake_matplotlib(monkeypatch)


def test_the_figure_draws_the_workspaces_the_tokens_they_leave_and_the_step_times(
    tmp_path, fake_matplotlib
):
    """On matplotlib's stand-in: what each panel is asked to draw, from docs/replay.md's run."""
    report = readme_run()
    times = {"mstar-resources": [0.001, 0.002], "fixed 512 MiB": [0.003]}
    json_path, png = reporting.write(report, tmp_path, times)
    assert json.loads(json_path.read_text()) == report
    assert fake_matplotlib.backends == ["Agg"]  # no display needed
    ((figure, (memory, tokens, steps)),) = fake_matplotlib.figures
    names = ["mstar-resources", "fixed 512 MiB"]
    assert memory.one("bar")[0] == (names, [23.0, 512.0])
    assert memory.one("bar_label")[1] == {"labels": ["23 MiB", "512 MiB"]}
    assert (memory.one("set_title")[0], memory.one("set_ylabel")[0]) == (
        ("Float workspaces",), ("MiB on one GPU",),
    )  # fmt: skip
    # The tokens the library's workspaces leave over the fixed buffer's, as the table's line.
    assert tokens.one("bar")[0] == (names, [25_040, 0])
    assert tokens.one("bar_label")[1] == {"labels": ["+25,040 (+0.35%)", "0"]}
    assert tokens.one("set_ylabel")[0] == ("KV-cache tokens over 7,212,576",)
    (data,), options = steps.one("boxplot")
    assert data == [[1.0, 2.0], [3.0]] and options["whis"] == (1, 99)  # in ms, p1 to p99
    ticks, labels = steps.one("set_xticks")[0]
    assert (list(ticks), labels) == ([1, 2], names)
    assert figure.title == "replay: llama3-8b-h200_calibrated, 1 rank(s), NVIDIA H200"
    assert png.read_bytes() == FakeFigure.content
    assert set(tmp_path.iterdir()) == {json_path, png}  # drawn beside it, renamed over it
    assert fake_matplotlib.closed == [figure]


def test_a_setup_without_decode_steps_is_drawn_at_zero(tmp_path, fake_matplotlib):
    report = readme_run(sealed_overflow=OVERFLOW)
    reporting.write(report, tmp_path, {"mstar-resources": [], "fixed 512 MiB": [0.001]})
    ((_, (_, _, steps)),) = fake_matplotlib.figures
    assert steps.one("boxplot")[0] == ([[0.0], [1.0]],)


def test_a_figure_that_fails_to_draw_leaves_the_png_written_before(tmp_path, fake_matplotlib):
    png = tmp_path / "replay.png"
    png.write_bytes(b"the last run's figure")
    fake_matplotlib.error = OSError(28, "No space left on device")
    with pytest.raises(OSError, match="No space left"):
        reporting.write(readme_run(), tmp_path, {"mstar-resources": [], "fixed 512 MiB": []})
    assert png.read_bytes() == b"the last run's figure"  # never half a PNG
    assert sorted(path.name for path in tmp_path.iterdir()) == ["replay.png", "report.json"]


def test_without_matplotlib_the_report_is_written_and_the_figure_skipped(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ModuleNotFoundError
    written = reporting.write(readme_run(), tmp_path, {"mstar-resources": [], "fixed 512 MiB": []})
    assert written == [tmp_path / "report.json"]
    assert json.loads((tmp_path / "report.json").read_text())["tokens_identical"] is True
    assert sorted(path.name for path in tmp_path.iterdir()) == ["report.json"]
