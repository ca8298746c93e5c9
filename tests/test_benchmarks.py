"""The benchmarks in scripts/ at their smallest sizes: each prints its table and writes its plot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.mark.parametrize(
    ("script", "args", "header"),
    [
        pytest.param("bench_plan_overhead.py",
                     ["--device", "cpu", "--rounds", "1", "--min-run-time", "0.01"],
                     "planner", id="plan-overhead"),
        pytest.param("bench_resolver_scale.py", ["--sizes", "10", "100", "--repeats", "1"],
                     "resources  compose ms", id="resolver-scale"),
        pytest.param("bench_memory.py", [], "deployment", id="memory"),
    ],
)  # fmt: skip
def test_benchmark_prints_a_table_and_writes_a_png(tmp_path, script, args, header):
    png = tmp_path / "plot.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args, "--png", str(png)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].lstrip().startswith(header)
    assert len(lines) >= 3  # the header, a row at least, and where the plot went
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
