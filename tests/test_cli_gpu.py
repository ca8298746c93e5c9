"""``mstar-resources device=cuda`` on a GPU: it allocates exactly what it reports reserving."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .apps import run_cli

pytestmark = pytest.mark.gpu
CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="default-tree"),
        pytest.param(["deployment=llama3-8b-h200", "resources.attn.decode.declared_mb=96"],
                     id="deployment-and-override"),
    ],
)  # fmt: skip
def test_device_cuda_allocates_exactly_the_reported_bytes(tmp_path, args):
    done = run_cli("device=cuda", "format=json", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["device"] == "cuda"
    # Every float workspace and every int workspace, as the totals report them; the pinned
    # mirrors are host memory.
    reserved = report["total_reserved_bytes"] + report["total_int_reserved_bytes"]
    assert report["allocated_bytes"] == reserved > report["total_reserved_bytes"] > 0
    assert list(tmp_path.iterdir()) == []


def test_the_table_reports_what_the_gpu_holds(tmp_path):
    done = run_cli("device=cuda:0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        "allocated on cuda:0: 1,635,778,560 bytes (torch.cuda.memory_allocated), reserved: "
        "1,635,778,560 bytes (float 1,610,612,736, int 25,165,824)"
    ) in done.stdout


def test_a_calibration_reused_with_another_mla_shape_is_named_stale(tmp_path):
    """DeepSeek-V3's calibration, as shipped, holds on the H200 it was measured on; composed with
    another compressed-KV width, pools built on the GPU warn, naming the field and both values."""
    import torch
    import yaml

    name = "deepseek-v3-tp8-h200_calibrated"
    recorded = yaml.safe_load((CONF / "deployment" / f"{name}.yaml").read_text())["calibrated"]
    here = torch.cuda.get_device_name()
    # Made on another GPU (an H100 runs this as often as the H200 it was made on): one warning
    # naming both, and nothing else.
    other_gpu = f"gpu ('{recorded['gpu']}' recorded, '{here}' here)"
    done = run_cli("device=cuda", f"deployment={name}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    if here == recorded["gpu"]:
        assert done.stderr == ""
    else:
        assert other_gpu in done.stderr and "head_dim_ckv" not in done.stderr
    done = run_cli("device=cuda", f"deployment={name}", "calibration.model.head_dim_ckv=256",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "profile.model.head_dim_ckv (512 recorded, 256 here)" in done.stderr
    assert (other_gpu in done.stderr) == (here != recorded["gpu"])
    assert "mstar-resources-calibrate deployment=deepseek-v3-tp8-h200" in done.stderr
