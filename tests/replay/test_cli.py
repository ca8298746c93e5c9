"""The replay app on a machine without a GPU: its refusals (one paragraph and exit status 2), and
the steps of a run that need no GPU: the KV caches sized from free memory, the engines' buffer,
one setup's order, what failed, and the report printed and written."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from mstar_resources.apps import replay as cli
from mstar_resources.calibration.profile import load_profile
from mstar_resources.errors import WorkspaceSealedError
from mstar_resources.replay import report as reporting
from mstar_resources.replay.engine import SealedOverflow
from mstar_resources.replay.model import ModelSizes
from mstar_resources.units import MIB

from ..apps import run_app, run_cli, run_help
from ..conftest import compose_shipped
from .test_report import OVERFLOW, readme_run, setup_result

SCRIPT = str(Path(__file__).parents[2] / "scripts" / "replay.py")
DEPLOYMENT = "deployment=llama3-8b-h200_calibrated"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
TRACES = {
    "good.csv": HEADER + "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:51.2224670,879,55\n",
    "columns.csv": "time,prompt,output\n0,374,44\n",
    "negative.csv": HEADER + "2023-11-16 18:15:46.6805900,-374,44\n",
    "huge.csv": HEADER + "2023-11-16 18:15:46.6805900," + "9" * 5000 + ",44\n",
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
                     r"2 problems in the replay's settings: - requests=0 must be at least 1 and at "
                     r"most 1,000,000,000 \(a whole number\) - memory_utilization=1\.5 must be "
                     r"between 0 and 1",
                     id="every-problem"),
        pytest.param([DEPLOYMENT, "layers=two"], {},
                     r"layers='two' is not valid; layers takes a whole number of layers",
                     id="wrong-type"),
        pytest.param([DEPLOYMENT, "report_dir=/dev/null/replay"], {},
                     r"report_dir='/dev/null/replay' can't be made a folder \(/dev/null is a file, "
                     r"not a folder\)", id="report-dir"),
        pytest.param([DEPLOYMENT, "report_dir=/proc/replay"], {},
                     r"report_dir='/proc/replay' can't be made a folder \(no folder can be made "
                     r"in /proc", id="report-dir-in-proc"),
        pytest.param([DEPLOYMENT, "dry_run=true", "report_dir=rd"], {},
                     r"report_dir='rd' is where a replay writes its report, and dry_run=true "
                     r"replays nothing", id="report-dir-in-a-dry-run"),
        pytest.param([DEPLOYMENT, "trace="], {}, r"trace='' names no file; set trace=PATH",
                     id="empty-trace"),
        pytest.param([DEPLOYMENT, "calibration.plans.decode.kind=paged_prefill"], {},
                     r"calibration\.plans\.decode\.kind=paged_prefill: the replay's model runs",
                     id="plan-kind"),
        pytest.param([DEPLOYMENT], {"WORLD_SIZE": "3", "RANK": "0"},
                     r"3 ranks can't split calibration\.model\.num_qo_heads=32 and "
                     r"num_kv_heads=8 evenly", id="ranks"),
        pytest.param(["deployment=deepseek-v3-tp8-h200_calibrated"],
                     {"WORLD_SIZE": "3", "RANK": "0"},
                     r"3 ranks can't split calibration\.model\.num_qo_heads=16 evenly; run on a "
                     r"number of ranks that divides it", id="ranks-mla"),
        pytest.param([DEPLOYMENT, "requests=99999999999999999999", "dry_run=true"], {},
                     r"requests=99,999,999,999,999,999,999 must be at least 1 and at most "
                     r"1,000,000,000",
                     id="requests-beyond-the-bound"),
        pytest.param([DEPLOYMENT, "calibration.limits.max_model_len=1", "dry_run=true"], {},
                     r"calibration\.limits\.max_model_len=1 is too short to replay",
                     id="max-model-len-names-its-key"),
        pytest.param([DEPLOYMENT, "requests=100001", "dry_run=true"], {},
                     r"requests=100,001 synthetic requests is more than 100,000 \(five times the "
                     r"largest public trace\); a trace file's requests are bounded by its rows",
                     id="synthetic-requests-beyond-the-bound"),
        pytest.param([DEPLOYMENT, "step_ms=0"], {},
                     r"step_ms=0\.0 must be above 0 \(a number of milliseconds\)", id="step-ms"),
        pytest.param([DEPLOYMENT, "trace={traces}/good.csv", "trace_offset=-1", "dry_run=true"], {},
                     r"trace_offset=-1 must be at least 0", id="trace-offset"),
        pytest.param([DEPLOYMENT, "trace_offset=2"], {},
                     r"trace_offset=2 skips rows of a trace file, and trace=null replays the "
                     r"synthetic trace", id="offset-without-trace"),
        pytest.param([DEPLOYMENT, "trace={traces}/missing.csv", "dry_run=true"], {},
                     r"trace file \S+/missing\.csv does not exist", id="trace-missing"),
        pytest.param([DEPLOYMENT, "trace={traces}/columns.csv", "dry_run=true"], {},
                     r"columns\.csv, line 1: the header has the columns 'time,prompt,output'.* "
                     r"it lacks TIMESTAMP, ContextTokens, GeneratedTokens", id="trace-columns"),
        pytest.param([DEPLOYMENT, "trace={traces}/negative.csv", "requests=1", "dry_run=true"],
                     {},
                     r"negative\.csv, line 2: ContextTokens='-374' is negative",
                     id="trace-negative"),
        pytest.param([DEPLOYMENT, "trace={traces}/good.csv", "trace_offset=3", "dry_run=true"],
                     {}, r"trace_offset=3 starts past its last row: it has 3 rows .*; set "
                     r"trace_offset below 3", id="trace-offset-past-the-end"),
        pytest.param([DEPLOYMENT, "trace={traces}/huge.csv", "dry_run=true"], {},
                     r"huge\.csv, line 2: ContextTokens has 5,000 digits, more tokens than any "
                     r"model holds", id="trace-5000-digits"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_paragraph_and_exit_2(tmp_path, traces, args, env, message):
    args = [arg.replace("{traces}", str(traces)) for arg in args]
    done = run_app(*args, cwd=tmp_path, env=env, python=[sys.executable, SCRIPT])
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith("replay: error: ")
    assert re.search(message, " ".join(done.stderr.split())), done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_without_a_gpu_it_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible; test_replay_gpu runs the replay")
    done = run_app(DEPLOYMENT, "layers=1", cwd=tmp_path, python=[sys.executable, SCRIPT])
    assert done.returncode == 2
    assert "torch sees no CUDA device" in done.stderr and "the replay runs on a GPU" in done.stderr


def test_the_gpu_is_looked_for_before_a_trace_file_is_read(tmp_path, traces):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible; test_replay_gpu runs the replay")
    # A file the dry run refuses (the table above) is not even read without a GPU.
    bad = traces / "negative.csv"
    done = run_app(DEPLOYMENT, f"trace={bad}", cwd=tmp_path, python=[sys.executable, SCRIPT])
    assert done.returncode == 2, done.stderr
    assert "torch sees no CUDA device" in done.stderr and "trace file" not in done.stderr


def test_a_dry_run_reads_and_schedules_a_trace_without_a_gpu(tmp_path, traces):
    done = run_app(DEPLOYMENT, f"trace={traces / 'good.csv'}", "dry_run=true", cwd=tmp_path,
                   python=[sys.executable, SCRIPT])  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    trace, busiest, last = done.stdout.splitlines()
    assert "good.csv rows 0..2 of 3, to its end (requests=64 asked for more)" in trace
    assert "3 requests served, 0 refused" in trace
    assert busiest.startswith("most requests in a step: ")
    assert "KV pages of 16 tokens the schedule reached: " in busiest
    assert last == "dry run: nothing ran on a GPU"
    assert list(tmp_path.iterdir()) == []


def test_help_is_the_app_s_own():
    done = run_help([sys.executable, SCRIPT])
    assert (done.returncode, done.stderr) == (0, "")
    for needed in ("torchrun --nproc-per-node", "llama3-8b-h200_calibrated"):
        assert needed in done.stdout
    # Each setting's value as the command line writes it: null and true, not Python's None, True.
    assert "trace=PATH|null          a trace file to replay (now: null;" in done.stdout
    assert "(now: true)" in done.stdout and "(now: false)" in done.stdout
    assert not re.search(r"now: (None|True|False)\b", done.stdout)


def test_the_report_dir_is_checked_before_anything_runs_and_made_only_to_write(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible; test_replay_gpu runs the replay")
    report_dir = tmp_path / "new" / "replay"
    done = run_app(DEPLOYMENT, f"report_dir={report_dir}", cwd=tmp_path,
                   python=[sys.executable, SCRIPT])  # fmt: skip
    assert done.returncode == 2 and "torch sees no CUDA device" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing left behind by a run that could not start


def profile_of(deployment: str):
    return load_profile(compose_shipped([f"deployment={deployment}"]).calibration)


def test_each_setup_s_kv_cache_is_what_its_workspaces_leave():
    shape = ModelSizes.of(profile_of("llama3-8b-h200"), layers=4, vocab_size=8192, tp=1)
    assert shape.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2  # 16 KiB: 4 layers of K and V
    free, mib = 100 << 30, MIB
    ours, theirs = (cli.kv_pages_for(free, ws * mib, shape, 0.8) for ws in (25, 512))
    # 80% of the 487 MiB the fixed buffer holds back, in pages of 16 tokens x 16 KiB.
    assert ours - theirs == pytest.approx(487 * mib * 0.8 / (16 * 16 * 1024), abs=1)


def test_both_kv_caches_are_sized_from_one_measure_of_free_memory():
    shape = ModelSizes.of(profile_of("llama3-8b-h200"), layers=4, vocab_size=8192, tp=1)
    pages = cli.kv_pages(100 << 30, {"library": 25 * MIB, "fixed": 512 * MIB}, shape, 0.8)
    # 80% of (100 GiB less each setup's workspaces), in pages of 256 KiB (16 tokens x 16 KiB).
    assert pages == {"library": 327_600, "fixed": 326_041}


@pytest.mark.parametrize(
    ("every_rank", "pages"),
    [
        pytest.param([{"library": 10, "fixed": 8}], 7, id="one-rank"),
        pytest.param([{"library": 10, "fixed": 8}, {"library": 9, "fixed": 6}], 5,
                     id="the-smallest-rank"),
        pytest.param([{"library": 4, "fixed": 8}, {"library": 9, "fixed": 6}], 3,
                     id="the-smallest-setup"),
    ],
)  # fmt: skip
def test_the_schedule_fits_the_smallest_cache_of_any_rank_less_the_dummy_page(every_rank, pages):
    assert cli.schedule_pages(every_rank) == pages


@pytest.mark.parametrize(
    ("deployment", "ranks", "setting", "mb"),
    [
        pytest.param("llama3-8b-h200_calibrated", 1, None, 512, id="vllm"),
        pytest.param("llama3-8b-h200_calibrated", 2, None, 394, id="vllm-two-ranks"),
        pytest.param("deepseek-v3-tp8-h200_calibrated", 1, None, 384, id="mla-sglang"),
        pytest.param("llama3-8b-h200_calibrated", 1, 100, 100, id="the-setting"),
    ],
)  # fmt: skip
def test_the_engines_buffer_is_the_setting_else_vllm_s_else_sglang_s(
    deployment, ranks, setting, mb
):
    assert cli.fixed_buffer_mb(setting, profile_of(deployment), ranks) == mb


class FakeSetup:
    """The calls run_setup makes on a setup, recorded; the one named ``fail_at`` raises
    ``error`` (a RuntimeError naming it by default). Serving fills in the steps served."""

    def __init__(self, fail_at: str | None = None, error: Exception | None = None) -> None:
        self.result = setup_result()
        self.calls: list[str] = []
        self.fail_at, self.error = fail_at, error

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_at:
            raise self.error or RuntimeError(name)

    def warm_up(self) -> None:
        self._call("warm_up")

    def seal_and_capture(self) -> None:
        self._call("seal_and_capture")

    def serve(self, steps, trace, progress):
        self._call("serve")
        self.result.steps_served = len(steps)
        return self.result


class FakeProgress:
    """A progress bar that says whether it was closed."""

    closed = False

    def close(self) -> None:
        self.closed = True


SEALED = WorkspaceSealedError(  # OVERFLOW, as a sealed workspace raises it
    OVERFLOW.message,
    workspace=OVERFLOW.workspace,
    held_bytes=OVERFLOW.held_bytes,
    needed_bytes=OVERFLOW.needed_bytes,
    setting=OVERFLOW.setting,
    suggested_mb=OVERFLOW.suggested_mb,
)


@pytest.mark.parametrize(
    ("warm_up", "fail_at", "calls", "overflow"),
    [
        pytest.param(True, None, ["warm_up", "seal_and_capture", "serve"], None, id="warm-up"),
        pytest.param(False, None, ["seal_and_capture", "serve"], None, id="no-warm-up"),
        pytest.param(False, "seal_and_capture", ["seal_and_capture"], OVERFLOW,
                     id="overflow-at-capture"),
    ],
)  # fmt: skip
def test_a_setup_runs_in_an_engine_s_order_and_a_sealed_overflow_stops_it(
    warm_up, fail_at, calls, overflow
):
    setup, progress = FakeSetup(fail_at, SEALED), FakeProgress()
    result = cli.run_setup(setup, [object()] * 3, [], warm_up=warm_up, progress=progress)
    assert result is setup.result and setup.calls == calls
    assert result.sealed_overflow == overflow
    assert progress.closed


def test_any_other_error_of_a_setup_passes_through_with_the_progress_bar_closed():
    setup, progress = FakeSetup("warm_up"), FakeProgress()
    with pytest.raises(RuntimeError, match="warm_up"):
        cli.run_setup(setup, [], [], warm_up=True, progress=progress)
    assert progress.closed and setup.result.sealed_overflow is None


def test_a_sealed_overflow_is_kept_as_its_figures():
    assert SealedOverflow.of(SEALED) == OVERFLOW


@pytest.mark.parametrize(
    ("ours", "theirs", "failed"),
    [
        pytest.param({}, {}, [], id="nothing"),
        pytest.param({"growths_after_seal": 2}, {}, ["mstar-resources: 2 growths after sealing"],
                     id="growth-after-seal"),
        pytest.param({"tokens": {0: [1]}}, {"tokens": {0: [2]}},
                     ["the two setups generated different tokens"], id="different-tokens"),
        pytest.param({}, {"growths_after_seal": 1, "tokens": {0: [2]}},
                     ["fixed 512 MiB: 1 growths after sealing",
                      "the two setups generated different tokens"], id="both"),
    ],
)  # fmt: skip
def test_what_failed_is_a_line_each(ours, theirs, failed):
    results = [setup_result(**ours), setup_result("fixed 512 MiB", **theirs)]
    assert cli.failures(results) == failed


def test_a_setup_stopped_by_a_sealed_overflow_fails_with_its_message_and_nothing_more():
    # Its tokens were cut short where it stopped: that they differ is no further failure.
    stopped = setup_result(sealed_overflow=OVERFLOW, growths_after_seal=1, tokens={0: [1]})
    (failed,) = cli.failures([stopped, setup_result("fixed 512 MiB", tokens={0: [1, 2]})])
    assert failed == f"mstar-resources overflowed a sealed workspace: {OVERFLOW.message}"


def test_rank_0_prints_the_table_and_writes_nothing_without_a_report_dir(capsys, monkeypatch):
    monkeypatch.setattr(reporting, "write", lambda *args: pytest.fail("wrote files"))
    report = readme_run()
    cli.print_report(report, {}, None)
    assert capsys.readouterr().out == reporting.table(report) + "\n"


def test_rank_0_names_each_file_it_writes_into_the_report_dir(tmp_path, capsys, monkeypatch):
    written = []

    def write(report, folder, step_times):
        written.append((report, folder, step_times))
        return [folder / "report.json", folder / "replay.png"]

    monkeypatch.setattr(reporting, "write", write)
    report, times = readme_run(), {"mstar-resources": [0.001]}
    cli.print_report(report, times, str(tmp_path))
    assert written == [(report, tmp_path, times)]
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"wrote {tmp_path / 'report.json'}", f"wrote {tmp_path / 'replay.png'}",
    ]  # fmt: skip


# --- fair timing: rounds in turned order ---------------------------------------------------------


@pytest.mark.parametrize(
    ("rounds", "order"),
    [
        (1, ["library", "fixed"]),
        (2, ["library", "fixed", "fixed", "library"]),
        (3, ["library", "fixed", "fixed", "library", "library", "fixed"]),
    ],
)
def test_the_setups_run_in_turned_order_each_round(rounds, order):
    assert cli.round_order(rounds) == order


def test_a_setup_s_rounds_pool_their_steps_and_any_failure():
    first = setup_result(decode_step_s=[1.0, 3.0], tokens={0: [5]}, steps_served=9)
    second = setup_result(decode_step_s=[2.0], tokens={0: [5]}, steps_served=7,
                          growths_after_seal=1, sealed_overflow=OVERFLOW)  # fmt: skip
    both = cli.merge_runs([first, second])
    assert both.decode_step_s == [1.0, 3.0, 2.0]
    assert (both.growths_after_seal, both.sealed_overflow, both.steps_served) == (1, OVERFLOW, 7)
    assert (both.workspace_bytes, both.tokens) == (first.workspace_bytes, first.tokens)


def test_each_round_s_ratio_is_its_own_p50s():
    library = [setup_result(decode_step_s=[1.0, 2.0, 3.0]), setup_result(decode_step_s=[4.0])]
    fixed = [setup_result("fixed", decode_step_s=[2.0]), setup_result("fixed", decode_step_s=[2.0])]
    assert cli.round_ratios(library, fixed) == [1.0, 2.0]


def test_a_round_that_generated_other_tokens_fails():
    runs = {
        "library": [setup_result(tokens={0: [1, 2]}), setup_result(tokens={0: [1, 3]})],
        "fixed": [setup_result("fixed", tokens={0: [1, 2]})] * 2,
    }
    assert cli.round_failures(runs) == [
        "mstar-resources: round 2 generated other tokens than round 1"
    ]


def test_the_table_gives_each_round_s_ratio_and_the_spread():
    report = readme_run()
    report["decode_p50_ratio_rounds"] = [1.02, 1.1]
    (line,) = [line for line in reporting.table(report).splitlines() if "decode p50 ratio" in line]
    assert line.endswith("(rounds, the order turned each: 1.020, 1.100; spread 0.080)")


def test_the_dry_run_imports_neither_torch_nor_flashinfer(tmp_path):
    """Reading and scheduling a trace on a CPU needs no torch (a few hundred MiB with a CUDA
    build): what it reads of FlashInfer (its installed version and headers) is torch-free."""
    runner = (
        "import sys\n"
        "from mstar_resources.apps.replay import main\n"
        f"sys.argv = ['replay', {DEPLOYMENT!r}, 'requests=20', 'dry_run=true', 'progress=false']\n"
        "main()\n"
        "heavy = ('torch', 'flashinfer')\n"
        "sys.stderr.write(repr(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = run_cli(cwd=tmp_path, python=[sys.executable, "-c", runner])
    assert done.returncode == 0, done.stderr
    assert "dry run: nothing ran on a GPU" in done.stdout
    assert done.stderr == "[]"


def test_the_streamed_schedule_holds_only_the_requests_in_flight_and_repeats_itself():
    from mstar_resources.replay.workload import load_workload

    profile = profile_of("llama3-8b-h200")
    shape = ModelSizes.of(profile, layers=4, vocab_size=8192, tp=1)
    workload = load_workload(None, requests=40, trace_offset=0, step_ms=10, seed=0,
                             vocab_size=8192, max_model_len=4096)  # fmt: skip
    streamed = cli._StreamedSchedule(workload, profile, 1 << 20, shape)
    steps, arrivals = streamed()
    held = []
    for step in steps:
        for chunk in (*step.prefill, *step.decode):
            assert chunk.request in arrivals  # its request is there while it runs
        held.append(len(arrivals))
    assert len(arrivals) == 0 and max(held) < 40  # every request finished and was let go
    assert streamed.steps == len(held)
    again, _ = streamed()
    assert [(len(s.prefill), len(s.decode)) for s in again] == [
        (len(s.prefill), len(s.decode)) for s in streamed()[0]
    ]


def test_a_trace_file_s_requests_are_bounded_by_its_rows_only(tmp_path, traces):
    """requests past the synthetic trace's bound read a file to its end: its rows bound it."""
    done = run_app(DEPLOYMENT, f"trace={traces / 'good.csv'}", "requests=5000000",
                   "dry_run=true", cwd=tmp_path, python=[sys.executable, SCRIPT])  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "good.csv rows 0..2 of 3, to its end (requests=5,000,000 asked for more)" in done.stdout
