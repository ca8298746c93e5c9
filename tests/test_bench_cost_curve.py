"""scripts/bench_cost_curve.py on the CPU: its refusals, as the other benchmarks': exit status 2,
``prog: error: ...`` naming the flag and the value, before any GPU work."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .apps import run_app

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
SCRIPT = SCRIPTS / "bench_cost_curve.py"


@pytest.fixture(scope="module")
def curve() -> ModuleType:
    """The script as a module (scripts/ on the path while it imports, for ``_plot``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SCRIPTS))
        return importlib.import_module("bench_cost_curve")


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_refused(done: subprocess.CompletedProcess, flag: str, value: str, *also: str) -> None:
    """As the other benchmarks refuse: exit status 2, nothing on stdout, no traceback, one
    paragraph on stderr (argparse's usage first, for its own refusals) ending in
    ``bench_cost_curve.py: error: ...`` that names ``flag`` and ``value``, and holds ``also``."""
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert "\n\n" not in done.stderr.strip()  # one paragraph
    line = done.stderr.splitlines()[-1]
    assert line.startswith("bench_cost_curve.py: error: ")
    for word in [flag, value, *also]:
        assert word in line


@pytest.mark.parametrize(
    ("args", "flag", "value", "also"),
    [
        pytest.param(["--tokens", "0"], "--tokens", "'0'", ["whole number"], id="tokens-zero"),
        pytest.param(["--tokens", "8192", "-4"], "--tokens", "'-4'", [], id="tokens-negative"),
        pytest.param(["--tokens", "8k"], "--tokens", "'8k'", [], id="tokens-not-a-number"),
        pytest.param(
            ["--tokens", "2000000"], "--tokens", "'2000000'", ["1,048,576"], id="tokens-too-many"
        ),
        pytest.param(["--seqs", "0"], "--seqs", "'0'", [], id="seqs-zero"),
        pytest.param(["--seqs", "1.5"], "--seqs", "'1.5'", [], id="seqs-not-whole"),
        pytest.param(["--device", "cpu"], "--device", "'cpu'", ["GPU"], id="device-not-cuda"),
        pytest.param(
            ["llama3-8b-h100"],
            "argument deployment",
            "'llama3-8b-h100'",
            ["(did you mean llama3-8b-h200?)"],
            id="unknown-deployment",
        ),
        pytest.param(
            ["--deployment", "llama3-70b-tp8-h20"],
            "argument --deployment",
            "'llama3-70b-tp8-h20'",
            ["(did you mean llama3-70b-tp8-h200?)"],
            id="unknown-deployment-option",
        ),
        # A deployment without a profile: the ones that have one are listed, and why.
        pytest.param(
            ["none"],
            "argument deployment",
            "'none'",
            ["llama3-8b-h200", "`calibration` profile"],
            id="no-profile",
        ),
        pytest.param(
            ["llama3-8b-h200", "--deployment", "llama3-70b-tp8-h200"],
            "--deployment",
            "llama3-70b-tp8-h200",
            ["llama3-8b-h200", "give one"],
            id="two-deployments",
        ),
    ],
)
def test_bad_arguments_are_refused(
    tmp_path: Path, args: list[str], flag: str, value: str, also: list[str]
) -> None:
    assert_refused(run_app(*args, cwd=tmp_path, python=[sys.executable, str(SCRIPT)]), flag,
                   value, *also)  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--json", "--png"])
def test_an_output_in_a_missing_folder_is_refused(tmp_path: Path, flag: str) -> None:
    path = tmp_path / "missing" / "out"
    done = run_app(flag, str(path), cwd=tmp_path, python=[sys.executable, str(SCRIPT)])
    assert_refused(done, flag, str(path), "does not exist")
    assert len(done.stderr.splitlines()) == 1  # refused by the script: no usage
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--json", "--png"])
def test_an_output_that_is_a_folder_is_refused(tmp_path: Path, flag: str) -> None:
    done = run_app(flag, str(tmp_path), cwd=tmp_path, python=[sys.executable, str(SCRIPT)])
    assert_refused(done, flag, str(tmp_path), "a folder, not a file")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "engine", [[], ["--engine", "vllm"], ["--engine", "sglang"]], ids=["declared", "vllm", "sglang"]
)
def test_without_a_gpu_it_refuses_after_checking_the_config(
    tmp_path: Path, engine: list[str]
) -> None:
    # Hidden CUDA devices: the same refusal on a GPU machine as on this CPU one, after composing
    # every point (an engine's preset too).
    done = run(
        "llama3-8b-h200", *engine, "--json", str(tmp_path / "rows.json"), cwd=tmp_path,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert_refused(done, "--device", "cuda", "torch.cuda.is_available() is False", "needs a GPU")
    assert list(tmp_path.iterdir()) == []


def test_without_flashinfer_it_refuses_the_device(
    curve: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A GPU that torch sees, and no FlashInfer: refused before anything is measured.
    import torch  # the script imports it where it checks the device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        curve.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "flashinfer" else find_spec(name, *args),
    )
    with pytest.raises(SystemExit) as exit_:
        curve.main(["--tokens", "8192", "--seqs", "256"])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert ": error: --device cuda: FlashInfer is not installed" in line
    assert "mstar-resources[calibrate]" in line


def test_only_deployments_with_a_profile_are_offered(curve: ModuleType) -> None:
    offered = curve.profiled_deployments()
    assert {"llama3-8b-h200", "llama3-70b-tp8-h200", "deepseek-v3-tp8-h200"} <= set(offered)
    assert curve.DEPLOYMENT in offered
    assert "none" not in offered


def test_help_lists_the_deployments_with_a_profile(tmp_path: Path, curve: ModuleType) -> None:
    done = run_app("--help", cwd=tmp_path, python=[sys.executable, str(SCRIPT)])
    assert (done.returncode, done.stderr) == (0, "")
    listed = " ".join(done.stdout.split()).split("one with a profile: ")[1].split(" options:")[0]
    assert listed.split(", ") == curve.profiled_deployments()
    assert list(tmp_path.iterdir()) == []
