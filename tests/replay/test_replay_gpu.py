"""The replay on a GPU, and on two GPUs under torchrun: both setups generate the same tokens, and
nothing grows or overflows after sealing; a floor too small is reported, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mstar_resources.units import MIB

from .test_trace_file import AZURE_HEAD

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).parents[2]
SHORT = [
    "deployment=llama3-8b-h200_calibrated", "layers=2", "requests=24", "progress=false",
    "memory_utilization=0.5",
]  # fmt: skip


def replay(*args: str, cwd: Path, ranks: int = 1) -> subprocess.CompletedProcess:
    launcher = [sys.executable]
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
    return subprocess.run(
        [*launcher, str(ROOT / "scripts" / "replay.py"), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"},
        capture_output=True,
        text=True,
        timeout=900,
    )


def check_report(folder: Path, ranks: int) -> dict:
    report = json.loads((folder / "report.json").read_text())
    assert report["ranks"] == ranks and report["tokens_identical"]
    ours, theirs = report["setups"]
    for setup in (ours, theirs):
        assert setup["sealed_overflow"] is None and setup["growths_after_seal"] == 0
        assert setup["tokens_out"] > 0 and setup["decode_steps"] > 0
    assert ours["tokens_out"] == theirs["tokens_out"]
    assert ours["workspace_bytes"] < theirs["workspace_bytes"]
    assert ours["kv_tokens"] > theirs["kv_tokens"]  # the memory the fixed buffer held back
    assert (folder / "replay.png").stat().st_size > 0
    return report


def test_a_short_replay_on_one_gpu(tmp_path):
    done = replay(*SHORT, f"report_dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    check_report(tmp_path, 1)
    assert "generated tokens identical between the setups: yes" in done.stdout


def test_the_mla_deployment_replays_through_flashinfer_s_mla_wrapper(tmp_path):
    """DeepSeek-V3's rank of TP8: prefill and graph-captured decode on FlashInfer's MLA wrapper,
    on the calibrated pools and on SGLang's buffer (vLLM plans no FlashInfer MLA on SM90)."""
    args = [*SHORT[1:], "deployment=deepseek-v3-tp8-h200_calibrated", f"report_dir={tmp_path}"]
    done = replay(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = check_report(tmp_path, 1)
    assert report["model"]["attention"] == "mla"
    ours, theirs = report["setups"]
    assert ours["workspace_bytes"] == 3 * 17 * MIB  # the calibrated floors, three workspaces
    assert theirs["workspace_bytes"] == 384 * MIB  # SGLang's buffer


def test_a_floor_too_small_is_reported_with_the_setting_to_raise(tmp_path):
    done = replay(*SHORT, "resources.attn.decode.declared_mb=1", "warmup=false", cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "mstar-resources overflowed a sealed workspace" in done.stderr
    assert "set resources.attn.decode.declared_mb=3 or more" in done.stderr
    assert "mstar-resources stopped at a sealed overflow" in done.stdout


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs for two ranks")
def test_a_short_replay_on_two_tensor_parallel_ranks(tmp_path):
    done = replay(*SHORT, f"report_dir={tmp_path}", cwd=tmp_path, ranks=2)
    assert done.returncode == 0, done.stderr[-3000:]
    report = check_report(tmp_path, 2)
    assert [r["model"]["qo_heads_per_rank"] for r in report["per_rank"]] == [16, 16]
    assert all(r["tokens_identical"] for r in report["per_rank"])


def test_a_trace_file_replays_and_the_report_says_what_was_served(tmp_path):
    trace = tmp_path / "azure.csv"
    trace.write_text(AZURE_HEAD)
    args = [arg for arg in SHORT if not arg.startswith("requests=")]
    done = replay(*args, f"trace={trace}", "requests=20", f"report_dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = check_report(tmp_path, 1)
    served = report["trace"]
    assert (served["source"], served["rows"], served["requests"]) == ("file", 20, 20)
    assert (served["refused"], served["clipped"]) == (0, 0)
    assert report["setups"][0]["tokens_out"] == served["generated_tokens"]
    assert f"trace: {trace} rows 0..19 of 20" in done.stdout
