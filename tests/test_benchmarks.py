"""The benchmarks in scripts/, at small sizes: each prints its table, writes nothing unless asked
(``--png``), never creates a folder, and draws its figure when asked and matplotlib is there."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    tmp_path: Path, no_matplotlib: Path, script: str, args: list[str], header: str
) -> None:
    done = run(script, *args, cwd=tmp_path, pythonpath=no_matplotlib)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert header in lines[0]
    assert len(lines) >= 2  # the header and a row at least
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", [p.values[0] for p in FAST])
def test_png_in_a_missing_folder_is_a_usage_error(tmp_path: Path, script: str) -> None:
    png = tmp_path / "missing" / "plot.png"
    done = run(script, "--png", str(png), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "--png" in line
    assert str(png) in line
    assert list(tmp_path.iterdir()) == []


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
