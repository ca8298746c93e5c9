"""scripts/bench_cost_curve.py on the CPU: its refusals (as the other benchmarks': exit status 2,
``prog: error: ...`` naming the flag and the value, before any GPU work), and its rows, measured by
a fake that stands in for FlashInfer and says so."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from mstar_resources.calibration.calibrate import LabelNeed
from mstar_resources.calibration.measure import Need
from mstar_resources.calibration.profile import CalibrationProfile
from mstar_resources.resolver import ResolvedResource
from mstar_resources.units import MIB

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


def test_without_a_gpu_it_refuses_after_checking_the_config(tmp_path: Path) -> None:
    # Hidden CUDA devices: the same refusal on a GPU machine as on this CPU one.
    done = run(
        "--json", str(tmp_path / "rows.json"), cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": ""}
    )
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


def fake_measurement(
    records: Sequence[ResolvedResource], profile: CalibrationProfile
) -> list[LabelNeed]:
    """A fake, not FlashInfer: prefill labels 'need' 128 bytes a batched token and decode labels
    64 KiB per largest graph batch, so that each number in a row can be told where it came from."""
    limits, graphs = profile.limits, profile.cuda_graph_batch_sizes
    needs = {"prefill": limits.max_num_batched_tokens * 128, "decode": max(graphs) * 65536}
    return [
        LabelNeed(r, label, Need(needs[label], None, "fake")) for r in records for label in r.labels
    ]


@pytest.fixture(scope="module")
def points(curve: ModuleType) -> list:
    """The 8B's default curve with its plans as declared (plain decode), measured by the fake."""
    settings = curve.settings("llama3-8b-h200", curve.TOKENS, curve.SEQS, "none")
    return [curve.measure_point(s, fake_measurement) for s in settings]


def test_the_points_are_the_limits_asked_for(curve: ModuleType, points: list) -> None:
    assert [(p.max_num_batched_tokens, p.max_num_seqs) for p in points] == [
        (t, s) for t in curve.TOKENS for s in curve.SEQS
    ]


@pytest.mark.parametrize(
    ("seqs", "graph_sizes"),
    [
        pytest.param(16, [1, 2, 4, 8, 16], id="below-the-deployment's"),
        pytest.param(100, [1, 2, 4, 8, 16, 32, 64], id="between-sizes"),
        pytest.param(1024, [1, 2, 4, 8, 16, 32, 64, 128, 256], id="above-the-deployment's"),
    ],
)
def test_graph_sizes_are_the_deployments_within_max_num_seqs(
    curve: ModuleType, seqs: int, graph_sizes: list[int]
) -> None:
    [setting] = curve.settings("llama3-8b-h200", [8192], [seqs], "none")
    assert setting.profile.limits.max_num_seqs == seqs
    assert setting.profile.cuda_graph_batch_sizes == graph_sizes


@pytest.mark.parametrize(
    ("engine", "tensor_cores", "first_graphs"),
    [
        pytest.param(None, True, [1, 2, 4, 8, 16, 24], id="the-deployment's-vllm"),
        pytest.param("sglang", True, [1, 2, 4, 8, 12, 16], id="sglang"),
        pytest.param("none", False, [1, 2, 4, 8, 16, 32], id="as-declared"),
    ],
)
def test_an_engine_plans_the_curve_as_it_does(
    curve: ModuleType, engine: str | None, tensor_cores: bool, first_graphs: list[int]
) -> None:
    [setting] = curve.settings("llama3-8b-h200", [8192], [100], engine)
    assert setting.profile.plans["decode"].tensor_cores is tensor_cores
    sizes = setting.profile.cuda_graph_batch_sizes
    assert sizes[: len(first_graphs)] == first_graphs and max(sizes) <= 100


@pytest.mark.parametrize(
    ("tokens", "vllm_mb"),
    [
        # max(394 MiB, tokens x 32 query heads x head dim 128 x 16 B)
        pytest.param(8192, 512, id="8192"),
        pytest.param(16384, 1024, id="16384"),
        pytest.param(32768, 2048, id="32768"),
        pytest.param(65536, 4096, id="65536"),
    ],
)
def test_engine_figures_for_llama3_8b(curve: ModuleType, tokens: int, vllm_mb: int) -> None:
    assert tokens * 32 * 128 * 16 == vllm_mb * MIB
    for setting in curve.settings("llama3-8b-h200", [tokens], [256, 1024]):
        assert curve.engines_mb(setting.profile) == {"vLLM": vllm_mb, "SGLang": 384}


def test_vllm_keeps_its_minimum_and_has_no_figure_for_mla(curve: ModuleType) -> None:
    [small] = curve.settings("llama3-70b-tp8-h200", [8192], [512])  # 8 heads a rank: 128 MiB
    assert curve.engines_mb(small.profile) == {"vLLM": 394, "SGLang": 384}
    [mla] = curve.settings("deepseek-v3-tp8-h200", [8192], [256])
    assert curve.engines_mb(mla.profile) == {"vLLM": None, "SGLang": 384}


def test_a_row_counts_every_workspace(points: list) -> None:
    point = next(p for p in points if (p.max_num_batched_tokens, p.max_num_seqs) == (65536, 256))
    prefill, decode = 65536 * 128, 256 * 65536  # the fake's figures; graphs go up to 256
    assert {(n.path, n.need_bytes, n.workspaces) for n in point.needs} == {
        ("attn.prefill", prefill, 1),
        ("attn.decode", decode, 2),  # decode in graph slots 0 and 1
    }
    assert point.workspaces == 3
    assert point.total_bytes == prefill + 2 * decode == 40 * MIB
    assert (point.largest.path, point.largest.need_bytes) == ("attn.decode", 16 * MIB)
    assert point.engines_mb == {"vLLM": 4096, "SGLang": 384}
    assert point.ratio("vLLM") == pytest.approx(4096 / 40)
    assert point.ratio("SGLang") == pytest.approx(384 / 40)


def test_no_ratio_to_a_need_of_nothing_or_a_missing_figure(curve: ModuleType) -> None:
    need = curve.ResourceNeed("attn.decode", 0, 2, "-")
    point = curve.Point(8192, 256, [1], [need], {"vLLM": None, "SGLang": 384})
    assert point.ratio("vLLM") is None
    assert point.ratio("SGLang") is None


def test_the_table_has_a_row_per_point(curve: ModuleType, points: list) -> None:
    lines = curve.table("llama3-8b-h200", points).splitlines()
    assert "max_num_batched_tokens" in lines[0]
    assert "vLLM/need" in lines[0]
    assert len(lines) == 1 + len(points)
    row = lines[1 + points.index(points[-1])]  # 65,536 tokens, 1,024 seqs
    assert row.split() == [
        "llama3-8b-h200",
        "65,536",
        "1,024",
        "16,777,216",
        "16.00",
        "attn.decode",
        "3",
        "41,943,040",
        "40.00",
        "4,096",
        "102.4",
        "384",
        "9.6",
    ]


def test_the_json_has_the_rows(curve: ModuleType, points: list) -> None:
    document = json.loads(json.dumps(curve.as_json("llama3-8b-h200", points)))
    assert document["deployment"] == "llama3-8b-h200"
    assert len(document["points"]) == len(points)
    first = document["points"][0]
    assert first["max_num_batched_tokens"] == 8192
    assert first["engines_mb"] == {"vLLM": 512, "SGLang": 384}
    assert first["total_need_bytes"] == 8192 * 128 + 2 * 256 * 65536
    assert first["ratio_to_need"]["vLLM"] == pytest.approx(512 * MIB / first["total_need_bytes"])


@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is not installed (the bench extra draws the figures)",
)
def test_the_figure_is_drawn(curve: ModuleType, points: list, tmp_path: Path) -> None:
    png = tmp_path / "curve.png"
    curve.plot("llama3-8b-h200", points, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
