"""The benchmarks and the engine proofs in scripts/, as their user meets them: at small sizes each
runs to status 0 and writes nothing unless asked (``--png``); a bad argument, or one that would run
without bound, ends the run before anything is measured as an app's does (one paragraph on stderr,
status 2); a stdout that fails and Ctrl-C end it in one line, with nothing left half-written."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from .apps import run_app

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

# Where FlashInfer is installed (a GPU machine), the plan-overhead default would also build and
# time its decode plan: that belongs to the GPU tests' time, not to these smoke tests'.
PLAN_OVERHEAD_DEVICE = [] if importlib.util.find_spec("flashinfer") is None else ["--device", "cpu"]

# Each script with the flags that make it quick.
FAST = [
    pytest.param(
        "bench_plan_overhead.py",
        [*PLAN_OVERHEAD_DEVICE, "--rounds", "1", "--min-run-time", "0.01"],
        id="plan-overhead",
    ),
    pytest.param(
        "bench_resolver_scale.py", ["--sizes", "10", "100", "--repeats", "1"], id="resolver-scale"
    ),
    pytest.param("bench_memory.py", [], id="memory"),
    pytest.param(
        "bench_launch_check.py",
        ["--device", "cpu", "--rounds", "1", "--calls", "5"],
        id="launch-check",
    ),
    pytest.param("bench_dry_run.py", ["--rounds", "2"], id="dry-run"),
    # Two gloo ranks (each process imports torch: about 2 s) and two rounds after the warm-up.
    pytest.param("bench_seal_ranks.py", ["--ranks", "2", "--rounds", "2"], id="seal-ranks"),
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
    pytest.param("bench_int_mirror.py", ["--steps", "0"], "--steps", "0", "1 to 100,000",
                 id="int-mirror-steps"),
    pytest.param(
        "bench_int_mirror.py", [], "CUDA GPU", "FlashInfer", "", id="int-mirror-no-gpu",
        marks=pytest.mark.skipif(
            decode_row_measurable(), reason="CUDA and FlashInfer are here: it measures"
        ),
    ),
    pytest.param(
        "bench_seal_ranks.py", ["--rounds", "0"], "--rounds", "0", "", id="seal-ranks-rounds"
    ),
    pytest.param("bench_seal_ranks.py", ["--ranks", "0"], "--ranks", "0", "", id="ranks"),
    # No machine here has a GPU for each of 64 ranks.
    pytest.param("bench_seal_ranks.py", ["--backend", "nccl", "--ranks", "64"], "--backend",
                 "nccl", "64 GPUs", id="nccl-without-gpus"),
    # Values that would run for hours, fill the memory or the disk, or write over a file: refused
    # before anything runs, naming the most that is taken.
    pytest.param("bench_resolver_scale.py", ["--sizes", "100000000"], "--sizes", "'100000000'",
                 "1 to 10,000", id="sizes-too-large"),
    pytest.param("bench_seal_ranks.py", ["--ranks", "1000"], "--ranks", "'1000'", "1 to 64",
                 id="ranks-too-many"),
    pytest.param("bench_plan_overhead.py", ["--min-run-time", "1e9"], "--min-run-time", "'1e9'",
                 "0 to 1", id="min-run-time-too-long"),
    pytest.param("bench_plan_overhead.py", ["--min-run-time", "nan"], "--min-run-time", "'nan'",
                 "", id="min-run-time-nan"),
    pytest.param("bench_vllm.py", ["--dry-run", "--budget", "-1"], "--budget", "'-1'",
                 "from 0 to inf", id="vllm-budget-negative"),
    pytest.param("bench_vllm.py", ["--dry-run", "--budget", "nan"], "--budget", "'nan'", "",
                 id="vllm-budget-nan"),
    pytest.param("bench_vllm.py", ["--dry-run", "--timeout", "-1"], "--timeout", "'-1'",
                 "0 to 86400", id="vllm-timeout-negative"),
    pytest.param("bench_vllm.py", ["--dry-run", "--out", "/etc/passwd"], "--out /etc/passwd",
                 "is a file, not a folder", "", id="vllm-out-a-file"),
    pytest.param("bench_vllm.py", ["--dry-run", "--rounds", "1000"], "--rounds", "'1000'",
                 "1 to 100", id="vllm-rounds-too-many"),
    pytest.param("vllm_proof.py", ["--dry-run", "--budget", "nan"], "--budget", "'nan'", "",
                 id="vllm-proof-budget-nan"),
    pytest.param("vllm_proof.py", ["--dry-run", "--timeout", "-1"], "--timeout", "'-1'", "",
                 id="vllm-proof-timeout-negative"),
    pytest.param("vllm_proof.py", ["--dry-run", "--requests", "1000000000000"], "--requests",
                 "'1000000000000'", "1 to 65,536", id="vllm-proof-requests-too-many"),
    pytest.param("vllm_proof.py", ["--dry-run", "--out", "/etc/passwd"], "--out /etc/passwd",
                 "is a file, not a folder", "", id="vllm-proof-out-a-file"),
    pytest.param("sglang_proof.py", ["--dry-run", "--budget", "-1"], "--budget", "'-1'", "",
                 id="sglang-proof-budget-negative"),
    pytest.param("sglang_proof.py", ["--dry-run", "--out", "/etc/passwd"], "--out /etc/passwd",
                 "is a file, not a folder", "", id="sglang-proof-out-a-file"),
]  # fmt: skip


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


@pytest.mark.parametrize(("script", "args"), FAST)
def test_a_short_run_ends_with_status_0_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, args: list[str]
) -> None:
    """``import matplotlib`` fails in it, as where only the ``test`` extra is installed: a run
    that imported it would fail."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    done = run_app(*args, cwd=tmp_path, python=[sys.executable, str(SCRIPTS / script)])
    assert done.returncode == 0, done.stderr
    assert done.stdout
    assert list(tmp_path.iterdir()) == []


def test_png_in_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    png = tmp_path / "missing" / "plot.png"
    done = run("bench_memory.py", "--png", str(png), cwd=tmp_path)
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


def test_a_stdout_that_cannot_take_the_table_is_one_line_and_status_2(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, str(SCRIPTS / "bench_memory.py")], stdout=full,
            stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300,
        )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("bench_memory.py: error: stdout can't take the output")


def test_ctrl_c_ends_a_run_in_one_line_and_leaves_no_temporary_folder(tmp_path: Path) -> None:
    """Interrupted while it measures, in the folder of trees it writes: status 130, as a shell
    reports Ctrl-C, one line, and the folder gone."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "bench_resolver_scale.py"), "--sizes", "10000",
         "--repeats", "1000"],
        cwd=tmp_path, env={**os.environ, "TMPDIR": str(temporary)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # whatever pytest's is
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(temporary.glob("*/tree_10000/engine.yaml")):
            assert process.poll() is None and time.monotonic() < deadline, process.stderr
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert (process.returncode, stdout, stderr) == (
        130,
        "",
        "bench_resolver_scale.py: interrupted\n",
    )
    assert list(temporary.iterdir()) == []


def test_png_without_matplotlib_is_a_usage_error(tmp_path: Path, no_matplotlib: Path) -> None:
    done = run(
        "bench_dry_run.py", "--png", str(tmp_path / "x.png"), cwd=tmp_path, pythonpath=no_matplotlib
    )
    assert done.returncode == 2
    assert "--png" in done.stderr
    assert "matplotlib" in done.stderr
    assert list(tmp_path.iterdir()) == []


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


@pytest.fixture
def rules(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/_args.py, imported as the benchmarks import it (from beside them)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("_args")


# The argument rules the benchmarks share, in-process: a rule and its bound, a command-line text,
# and the value it becomes (None: refused, the text named in the error).
RULES = [
    pytest.param("count", 10, "1", 1, id="count-one"),
    pytest.param("count", 10, "10", 10, id="count-most"),
    pytest.param("count", 10, "11", None, id="count-past-most"),
    pytest.param("count", 10, "0", None, id="count-zero"),
    pytest.param("count", 10, "-5", None, id="count-negative"),
    pytest.param("count", 10, "1.5", None, id="count-fraction"),
    pytest.param("count", 10, "x", None, id="count-not-a-number"),
    pytest.param("seconds", 1.0, "0", 0.0, id="seconds-zero"),
    pytest.param("seconds", 1.0, "0.02", 0.02, id="seconds-positive"),
    pytest.param("seconds", 1.0, "2", None, id="seconds-past-most"),
    pytest.param("seconds", 1.0, "-1", None, id="seconds-negative"),
    pytest.param("seconds", 1.0, "nan", None, id="seconds-nan"),
    pytest.param("seconds", 1.0, "inf", None, id="seconds-inf"),
    pytest.param("seconds", math.inf, "inf", math.inf, id="seconds-unbounded-inf"),
    pytest.param("seconds", math.inf, "nan", None, id="seconds-unbounded-nan"),
    pytest.param("seconds", 1.0, "x", None, id="seconds-not-a-number"),
]


@pytest.mark.parametrize(("rule", "most", "text", "value"), RULES)
def test_argument_rule(
    rules: ModuleType, rule: str, most: float, text: str, value: float | None
) -> None:
    convert = getattr(rules, rule)(most)
    if value is None:
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(text))):
            convert(text)
    else:
        assert convert(text) == value


def test_the_memory_tables_in_the_docs_are_what_bench_memory_prints(tmp_path: Path) -> None:
    """One source for these figures: the README's table and benchmarks.md's block are the
    script's columns, row for row."""
    done = run("bench_memory.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = {
        cells[0]: cells[1:] for cells in (line.split() for line in done.stdout.splitlines()[1:])
    }
    root = SCRIPTS.parent
    readme = [line for line in (root / "README.md").read_text().splitlines()
              if line.startswith("| `") and "_calibrated`" in line]  # fmt: skip
    assert len(readme) == len(printed)
    for line in readme:
        cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        # README: need, reserved, vLLM, SGLang, TRT-LLM, MLC, int need, int reserved, engines int
        ours = printed[cells[0]]
        assert cells[1:] == [ours[1], ours[2], *ours[4:]], cells[0]
    block = (
        (root / "docs" / "benchmarks.md")
        .read_text()
        .split("$ python scripts/bench_memory.py   # the float columns\n")[1]
        .split("```")[0]
    )
    for line in block.splitlines()[1:]:
        cells = line.split()
        assert cells[1:] == printed[cells[0]][:8], cells[0]


def test_ctrl_c_to_the_ranks_process_group_is_one_line_not_a_traceback_a_rank(
    tmp_path: Path,
) -> None:
    """Ctrl-C reaches every process of the terminal's group: the ranks (started with it
    ignored) say nothing, and the parent says it once and ends them."""

    def children(pid: int) -> list[str]:
        return [c for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]  # fmt: skip

    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "bench_seal_ranks.py"), "--ranks", "2", "--rounds", "1000"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # a process group of its own, as a terminal's job is
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # whatever pytest's is
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(children(process.pid)) < 2:  # the ranks (and the queue's feeder) started
            assert process.poll() is None and time.monotonic() < deadline, process.stderr
            time.sleep(0.1)
        time.sleep(2)  # the ranks importing torch, as a Ctrl-C would find them
        for child in children(process.pid):  # each ignores SIGINT (a rank killed first may not
            # live to print its traceback: the race is the parent's, this is what decides it)
            ignored = next(line for line in Path(f"/proc/{child}/status").read_text().splitlines()
                           if line.startswith("SigIgn:"))  # fmt: skip
            assert int(ignored.split()[1], 16) & (1 << (signal.SIGINT - 1)), child
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert (process.returncode, stdout, stderr) == (130, "", "bench_seal_ranks.py: interrupted\n")
