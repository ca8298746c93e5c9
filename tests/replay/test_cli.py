"""The replay app's refusals, on a machine without a GPU: one paragraph and exit status 2."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from mstar_resources.profile import load_profile
from mstar_resources.units import MIB

from ..conftest import compose_shipped
from ..test_cli import run_cli

SCRIPT = str(Path(__file__).parents[2] / "scripts" / "replay.py")
DEPLOYMENT = "deployment=llama3-8b-h200_calibrated"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
TRACES = {
    "good.csv": HEADER + "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:51.2224670,879,55\n",
    "columns.csv": "time,prompt,output\n0,374,44\n",
    "negative.csv": HEADER + "2023-11-16 18:15:46.6805900,-374,44\n",
}
"""Trace files the refusals read, written once into a folder of their own (``{traces}`` in an
argument), so that each run's working folder stays empty."""


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("traces")
    for name, text in TRACES.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param(["deployment=none"], {}, r"carries no `calibration` profile", id="no-profile"),
        pytest.param([DEPLOYMENT, "layers=0"], {},
                     r"layers=0 must be at least 1 \(a whole number of layers\)", id="layers"),
        pytest.param([DEPLOYMENT, "memory_utilization=1.5", "requests=0"], {},
                     r"2 problems in the replay's settings: - requests=0 must be at least 1 "
                     r"\(a whole number\) - memory_utilization=1\.5 must be between 0 and 1",
                     id="every-problem"),
        pytest.param([DEPLOYMENT, "layers=two"], {},
                     r"layers='two' is not valid; layers takes a whole number of layers",
                     id="wrong-type"),
        pytest.param([DEPLOYMENT, "report_dir=/dev/null/replay"], {},
                     r"report_dir='/dev/null/replay' can't be made a folder \(Not a directory\)",
                     id="report-dir"),
        pytest.param([DEPLOYMENT, "calibration.plans.decode.kind=paged_prefill"], {},
                     r"calibration\.plans\.decode\.kind=paged_prefill: the replay's model runs",
                     id="plan-kind"),
        pytest.param([DEPLOYMENT], {"WORLD_SIZE": "3", "RANK": "0"},
                     r"3 ranks can't split calibration\.model\.num_qo_heads=32 and "
                     r"num_kv_heads=8 evenly", id="ranks"),
        pytest.param([DEPLOYMENT, "step_ms=0"], {},
                     r"step_ms=0\.0 must be above 0 \(a number of milliseconds\)", id="step-ms"),
        pytest.param([DEPLOYMENT, "trace={traces}/good.csv", "trace_offset=-1"], {},
                     r"trace_offset=-1 must be at least 0", id="trace-offset"),
        pytest.param([DEPLOYMENT, "trace_offset=2"], {},
                     r"trace_offset=2 skips rows of a trace file, and trace=null replays the "
                     r"synthetic trace", id="offset-without-trace"),
        pytest.param([DEPLOYMENT, "trace={traces}/missing.csv"], {},
                     r"trace file \S+/missing\.csv does not exist", id="trace-missing"),
        pytest.param([DEPLOYMENT, "trace={traces}/columns.csv"], {},
                     r"columns\.csv, line 1: the header has the columns 'time,prompt,output'.* "
                     r"it lacks TIMESTAMP, ContextTokens, GeneratedTokens", id="trace-columns"),
        pytest.param([DEPLOYMENT, "trace={traces}/negative.csv", "requests=1"], {},
                     r"negative\.csv, line 2: ContextTokens='-374' is negative",
                     id="trace-negative"),
        pytest.param([DEPLOYMENT, "trace={traces}/good.csv", "trace_offset=1"], {},
                     r"offset=1 limit=64 select rows 1\.\.64, past its last row: it has 3 rows.* "
                     r"\(the replay's trace_offset=1 is its offset, requests=64 its limit\)",
                     id="trace-slice"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_paragraph_and_exit_2(tmp_path, traces, args, env, message):
    args = [arg.replace("{traces}", str(traces)) for arg in args]
    done = run_cli(*args, cwd=tmp_path, env=env, python=[sys.executable, SCRIPT])
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith("replay: error: ")
    assert re.search(message, " ".join(done.stderr.split())), done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_without_a_gpu_it_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible; test_replay_gpu runs the replay")
    done = run_cli(DEPLOYMENT, "layers=1", cwd=tmp_path, python=[sys.executable, SCRIPT])
    assert done.returncode == 2
    assert "torch sees no CUDA device" in done.stderr and "the replay runs on a GPU" in done.stderr


def test_a_good_trace_file_is_read_before_the_gpu_is_looked_for(tmp_path, traces):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible; test_replay_gpu runs the replay")
    # The same run refuses a bad file without a GPU (the table above): the file is read first.
    good = traces / "good.csv"
    done = run_cli(DEPLOYMENT, f"trace={good}", "trace_offset=1", "requests=2", cwd=tmp_path,
                   python=[sys.executable, SCRIPT])  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "torch sees no CUDA device" in done.stderr and "trace file" not in done.stderr


def test_help_is_the_app_s_own(tmp_path):
    done = run_cli("--help", cwd=tmp_path, python=[sys.executable, SCRIPT])
    assert (done.returncode, done.stderr) == (0, "")
    for needed in ("torchrun --nproc-per-node", "llama3-8b-h200_calibrated"):
        assert needed in done.stdout


def test_the_report_dir_is_made_before_anything_runs(tmp_path):
    report_dir = tmp_path / "new" / "replay"
    done = run_cli(DEPLOYMENT, f"report_dir={report_dir}", cwd=tmp_path,
                   python=[sys.executable, SCRIPT])  # fmt: skip
    assert report_dir.is_dir()  # made, even where there is no GPU to fill it
    assert done.returncode in (0, 2), done.stderr


def test_each_setup_s_kv_cache_is_what_its_workspaces_leave():
    from mstar_resources.replay.cli import kv_pages_for
    from mstar_resources.replay.model import Shape

    profile = load_profile(compose_shipped(["deployment=llama3-8b-h200"]).calibration)
    shape = Shape.of(profile, layers=4, vocab_size=8192, tp=1)
    assert shape.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2  # 16 KiB: 4 layers of K and V
    free, mib = 100 << 30, MIB
    ours, theirs = (kv_pages_for(free, ws * mib, shape, 0.8) for ws in (25, 512))
    # 80% of the 487 MiB the fixed buffer holds back, in pages of 16 tokens x 16 KiB.
    assert ours - theirs == pytest.approx(487 * mib * 0.8 / (16 * 16 * 1024), abs=1)
