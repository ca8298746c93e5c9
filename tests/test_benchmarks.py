"""The benchmarks in scripts/, at small sizes: each prints its table, writes nothing unless asked
(``--png``), never creates a folder, and draws its figure when asked and matplotlib is there; bad
input ends the run as an app's does (one paragraph on stderr, status 2)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .apps import run_app

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

# Where FlashInfer is installed (a GPU machine), the plan-overhead default would also build and
# time its decode plan: that belongs to the GPU tests' time, not to these smoke tests'.
PLAN_OVERHEAD_DEVICE = [] if importlib.util.find_spec("flashinfer") is None else ["--device", "cpu"]

# Each script with the flags that make it quick, and a word of its table's header.
FAST = [
    pytest.param(
        "bench_plan_overhead.py",
        [*PLAN_OVERHEAD_DEVICE, "--rounds", "1", "--min-run-time", "0.01"],
        "planner",
        id="plan-overhead",
    ),
    pytest.param(
        "bench_resolver_scale.py",
        ["--sizes", "10", "100", "--repeats", "1"],
        "compose",
        id="resolver-scale",
    ),
    pytest.param("bench_memory.py", [], "deployment", id="memory"),
    pytest.param("bench_dry_run.py", ["--rounds", "2"], "median", id="dry-run"),
    # Two gloo ranks (each process imports torch: about 2 s) and two rounds after the warm-up.
    pytest.param(
        "bench_seal_ranks.py", ["--ranks", "2", "--rounds", "2"], "seal(group)", id="seal-ranks"
    ),
]


def decode_row_measurable() -> bool:
    """True where bench_plan_overhead.py --device cuda would measure, not refuse: CUDA and
    FlashInfer are both there (torch is imported only where FlashInfer is)."""
    if importlib.util.find_spec("flashinfer") is None:
        return False
    import torch

    return torch.cuda.is_available()


# Each flag's refusal, end to end: the script, its arguments, the flag and the value its error
# must name, and any other text the error must hold. Refused before anything is measured, but the
# scripts that import torch take a second or two each: one row per flag, the rules' edge cases
# are in RULES.
REFUSED = [
    pytest.param(
        "bench_memory.py",
        ["llama3-8b-h100_calibrated"],
        "deployments",
        "llama3-8b-h100_calibrated",
        "(did you mean llama3-8b-h200_calibrated?)",
        id="memory-missing-deployment",
    ),
    pytest.param(
        "bench_memory.py",
        ["none"],
        "deployments",
        "none",
        "llama3-8b-h200_calibrated",  # the calibrated ones are listed
        id="memory-deployment-not-calibrated",
    ),
    pytest.param("bench_resolver_scale.py", ["--sizes", "-5"], "--sizes", "-5", "", id="sizes"),
    pytest.param(
        "bench_resolver_scale.py", ["--sizes", "10", "0"], "--sizes", "0", "", id="sizes-one-bad"
    ),
    pytest.param("bench_resolver_scale.py", ["--repeats", "0"], "--repeats", "0", "", id="repeats"),
    pytest.param(
        "bench_plan_overhead.py", ["--rounds", "0"], "--rounds", "0", "", id="plan-overhead-rounds"
    ),
    pytest.param(
        "bench_plan_overhead.py",
        ["--min-run-time", "-1"],
        "--min-run-time",
        "-1",
        "",
        id="min-run-time",
    ),
    pytest.param(
        "bench_plan_overhead.py",
        ["--device", "cuda"],
        "--device",
        "cuda",
        "--device cpu",  # the fix
        id="plan-overhead-cuda",
        marks=pytest.mark.skipif(
            decode_row_measurable(), reason="CUDA and FlashInfer are here: the row is measured"
        ),
    ),
    pytest.param("bench_dry_run.py", ["--rounds", "0"], "--rounds", "0", "", id="dry-run-rounds"),
    pytest.param(
        "bench_seal_ranks.py", ["--rounds", "0"], "--rounds", "0", "", id="seal-ranks-rounds"
    ),
    pytest.param("bench_seal_ranks.py", ["--ranks", "0"], "--ranks", "0", "", id="ranks"),
    # Refused before any trace is written or read.
    pytest.param(
        "bench_trace.py",
        ["--deployment", "nope"],
        "--deployment",
        "'nope'",
        "llama3-8b-h200_calibrated",
        id="trace-deployment",
    ),
    # No machine has a GPU for each of 1,000 ranks.
    pytest.param(
        "bench_seal_ranks.py",
        ["--backend", "nccl", "--ranks", "1000"],
        "--backend",
        "nccl",
        "1000 GPUs",
        id="nccl-without-gpus",
    ),
]


def run(
    script: str, *args: str, cwd: Path, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``script`` run with ``args`` by this Python, in ``cwd``."""
    env = None
    if pythonpath is not None:
        path = [str(pythonpath), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def no_matplotlib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PYTHONPATH folder on which ``import matplotlib`` fails, as where only the ``test`` extra
    is installed: a run that imported it would fail."""
    folder = tmp_path_factory.mktemp("no_matplotlib")
    (folder / "matplotlib").mkdir()
    (folder / "matplotlib" / "__init__.py").write_text(
        "raise ImportError('matplotlib is hidden from this run')\n"
    )
    return folder


@pytest.mark.parametrize(("script", "args", "header"), FAST)
def test_default_run_prints_a_table_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, args: list[str], header: str
) -> None:
    """In this process, where torch is imported already (the ranks of bench_seal_ranks.py are
    processes of their own still); ``import matplotlib`` fails in it, as where only the ``test``
    extra is installed: a run that imported it would fail."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    done = run_app(*args, cwd=tmp_path, python=[sys.executable, str(SCRIPTS / script)])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert header in lines[0]
    assert len(lines) >= 2  # the header and a row at least
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", [p.values[0] for p in FAST])
def test_png_in_a_missing_folder_is_a_usage_error(tmp_path: Path, script: str) -> None:
    png = tmp_path / "missing" / "plot.png"
    done = run_app("--png", str(png), cwd=tmp_path, python=[sys.executable, str(SCRIPTS / script)])
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "--png" in line
    assert str(png) in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("path", "problem"),
    [("m.txt", "ending in .png, not '.txt'"), ("/dev/full", "ending in .png"),
     ("dir.png", "that is a folder")],
)  # fmt: skip
def test_png_that_cannot_take_a_png_is_a_usage_error(tmp_path: Path, path: str, problem: str):
    (tmp_path / "dir.png").mkdir()
    done = run("bench_memory.py", "--png", path, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"bench_memory.py: error: --png {path}: ") and problem in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.png"]


@pytest.mark.parametrize(("script", "args", "header"), FAST)
def test_a_stdout_that_cannot_take_the_table_is_one_line_and_status_2(
    tmp_path: Path, script: str, args: list[str], header: str
) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, str(SCRIPTS / script), *args], stdout=full, stderr=subprocess.PIPE,
            text=True, cwd=tmp_path, timeout=300,
        )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    # The last line (a row left out, say for want of FlashInfer, is told before it).
    assert done.stderr.splitlines()[-1].startswith(f"{script}: error: stdout can't take the output")


def test_png_without_matplotlib_is_a_usage_error(tmp_path: Path, no_matplotlib: Path) -> None:
    done = run(
        "bench_dry_run.py", "--png", str(tmp_path / "x.png"), cwd=tmp_path, pythonpath=no_matplotlib
    )
    assert done.returncode == 2
    assert "--png" in done.stderr
    assert "matplotlib" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is not installed (the bench extra draws the figures)",
)
@pytest.mark.parametrize(("script", "args", "header"), FAST)
def test_png_writes_the_figure(tmp_path: Path, script: str, args: list[str], header: str) -> None:
    png = tmp_path / "x.png"
    done = run(script, *args, "--png", str(png), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert header in done.stdout.splitlines()[0]
    assert done.stdout.splitlines()[-1] == f"plot: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.iterdir()) == [png]


@pytest.mark.parametrize(("script", "args", "flag", "value", "also"), REFUSED)
def test_bad_input_is_a_usage_error(
    tmp_path: Path, script: str, args: list[str], flag: str, value: str, also: str
) -> None:
    done = run_app(*args, cwd=tmp_path, python=[sys.executable, str(SCRIPTS / script)])
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert "\n\n" not in done.stderr.strip()  # one paragraph
    # argparse's own refusals print the usage first: the error is the last line.
    line = done.stderr.splitlines()[-1]
    assert line.startswith(f"{script}: error: ")
    assert flag in line
    assert value in line
    assert also in line
    assert list(tmp_path.iterdir()) == []


def test_trace_benchmark_measures_each_length_in_a_fresh_process(tmp_path: Path) -> None:
    """A short run of scripts/bench_trace.py: a line per measurement and length, the first
    length's ratios 1.00, and a reading whose peak memory is a process's, not nothing."""
    done = run("bench_trace.py", "--rows", "200", "400", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["what", "rows", "x"]
    rows = [line.split() for line in lines[1:]]
    assert [(row[0], row[1]) for row in rows] == [
        ("read", "200"),
        ("read", "400"),
        ("dry", "run"),
        ("dry", "run"),
    ]
    # Each ratio is its row's figure against the first length's, to the rounding shown.
    for first, second in (rows[0:2], rows[2:4]):
        _, seconds, _, rss, _ = (float(x) for x in first[-5:])
        x_rows, seconds_2, x_time, rss_2, x_memory = (float(x) for x in second[-5:])
        assert x_rows == 2.0
        for ratio, shown, now, then, unit in (
            (x_time, seconds_2 / seconds, seconds_2, seconds, 0.005),
            (x_memory, rss_2 / rss, rss_2, rss, 0.05),
        ):
            assert abs(ratio - shown) <= shown * (unit / then + unit / now) + 0.005
        assert rss_2 > 1  # peak RSS MiB of a Python process


def test_memory_without_a_need_prints_a_dash_for_its_ratio(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A calibrated deployment whose calibration measured no need (0 bytes) gets ``-`` in the
    reserved/need column, as an engine without a buffer does in its own, and the run goes on."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_memory = importlib.import_module("bench_memory")
    row = bench_memory.Row(
        workspaces=3, need=0.0, reserved=23.0, engines=dict.fromkeys(bench_memory.ENGINES, 384),
        int_need_kib=None, int_reserved=3.0, engines_int=296,
    )  # fmt: skip
    monkeypatch.setattr(bench_memory, "measure", lambda deployment: row)
    assert bench_memory.main(["llama3-8b-h200_calibrated"]) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert "/need" in header and "int need KiB" in header
    # An int need not measured is a dash too.
    assert line.split() == [
        "llama3-8b-h200_calibrated", "3", "0.00", "23", "-", *["384"] * 4, "-", "3", "296",
    ]  # fmt: skip


def test_memory_reports_the_shipped_int_needs_and_the_engines_own_int_workspaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_memory = importlib.import_module("bench_memory")
    row = bench_memory.measure("llama3-8b-h200_calibrated")
    # Three workspaces' int needs (4,104 prefill; 4,384 each decode slot), 1 MiB each reserved,
    # and 37 wrappers' own 8 MiB (35 graph sizes, an eager decode, a prefill).
    assert row.int_need_kib == pytest.approx((4_104 + 2 * 4_384) / 1024)
    assert (row.int_reserved, row.engines_int) == (3.0, 37 * 8)


@pytest.fixture
def rules(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/_args.py, imported as the benchmarks import it (from beside them)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("_args")


# The argument rules the benchmarks share, in-process: a rule, a command-line text, and the
# value it becomes (None: refused, the text named in the error).
RULES = [
    pytest.param("positive_int", "1", 1, id="int-one"),
    pytest.param("positive_int", "0", None, id="int-zero"),
    pytest.param("positive_int", "-5", None, id="int-negative"),
    pytest.param("positive_int", "1.5", None, id="int-fraction"),
    pytest.param("positive_int", "x", None, id="int-not-a-number"),
    pytest.param("non_negative_float", "0", 0.0, id="float-zero"),
    pytest.param("non_negative_float", "0.02", 0.02, id="float-positive"),
    pytest.param("non_negative_float", "-1", None, id="float-negative"),
    pytest.param("non_negative_float", "nan", None, id="float-nan"),
    pytest.param("non_negative_float", "inf", None, id="float-inf"),
    pytest.param("non_negative_float", "x", None, id="float-not-a-number"),
]


@pytest.mark.parametrize(("rule", "text", "value"), RULES)
def test_argument_rule(rules: ModuleType, rule: str, text: str, value: float | None) -> None:
    convert = getattr(rules, rule)
    if value is None:
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(text))):
            convert(text)
    else:
        assert convert(text) == value


def test_bench_memory_s_columns_line_up_whatever_the_names(tmp_path: Path) -> None:
    """The longest deployment name (qwen3.5-122b-a10b-h200_calibrated, 33 characters) sets the
    first column, so every row's figures sit under their headings."""
    done = run_app(cwd=tmp_path, python=[sys.executable, str(SCRIPTS / "bench_memory.py")])
    assert done.returncode == 0, done.stderr
    head, *rows = done.stdout.splitlines()
    end = head.index("workspaces") + len("workspaces")
    assert any(row.startswith("qwen3.5-122b-a10b-h200_calibrated ") for row in rows)
    for row in rows:
        assert row[end - 1] != " " and row[end] == " ", row
