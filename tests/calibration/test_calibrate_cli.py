"""``mstar-resources-calibrate``'s bad input, which it reports before it looks for a GPU."""

from __future__ import annotations

import re
import sys

import pytest

from ..apps import run_app, run_help

CALIBRATE = ["-m", "mstar_resources.apps.calibrate"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["deployment=none"],
                     r"deployment=none carries no `calibration` profile to calibrate",
                     id="no-profile"),
        pytest.param(["deployment=llama3-8b-h100"],
                     r"deployment=llama3-8b-h100 is not a deployment \(did you mean "
                     r"llama3-8b-h200\?\)", id="misspelled-deployment"),
        # none is listed, never offered as the closest: calibration refuses it
        pytest.param(["deployment=nope"],
                     r"deployment=nope is not a deployment; pick one of deepseek-v3-tp8-h200, ",
                     id="misspelled-not-none"),
        pytest.param(["deployment=llama3-8b-h200", "margin=lots"],
                     r"margin='lots' is not valid; margin takes a fraction, at least 0",
                     id="margin-type"),
        pytest.param(["deployment=llama3-8b-h200", "margin=-0.5"],
                     r"margin=-0\.5 must be at least 0 and at most 10 \(a fraction\)",
                     id="negative-margin"),
        pytest.param(["deployment=llama3-8b-h200", "margin=1e6"],
                     r"margin=1000000\.0 must be at least 0 and at most 10 \(a fraction\)",
                     id="huge-margin"),
        pytest.param(["deployment=llama3-8b-h200", "margin=inf"],
                     r"margin=inf must be at least 0 and at most 10 \(a fraction\)",
                     id="infinite-margin"),
        pytest.param(["deployment=llama3-8b-h200", "calibration.model.num_kv_heads=5"],
                     r"calibration\.model\.num_kv_heads=5 does not divide", id="bad-profile"),
        pytest.param(["deployment=llama3-8b-h200", "resources.attn.decode.labels=[decode,verify]"],
                     r"add calibration\.plans\.verify \(for resources\.attn\.decode\)",
                     id="label-without-plan"),
        pytest.param(["deployment=llama3-8b-h200", "calibration.plans.decode.kind=trtllm"],
                     r"calibration\.plans\.decode\.kind='trtllm' is not valid; "
                     r"calibration\.plans\.decode\.kind takes one of decode, paged_prefill, "
                     r"ragged_prefill, mla, pod", id="unknown-kind"),
        pytest.param(["deployment=llama3-8b-h200", "calibration.engine=vllm"],
                     r"calibration\.engine is not a setting; calibration takes model, ",
                     id="no-engine-setting"),
        pytest.param(["deployment=qwen3.5-122b-a10b-h200",
                      "calibration.plans.decode.q_len_per_req=0"],
                     r"calibration\.plans\.decode\.q_len_per_req=0 must be a positive whole number",
                     id="bad-plan-option"),
        pytest.param(["deployment=llama3-8b-h200", "device=tpu"],
                     r"device='tpu' is not a CUDA device; set device=cuda:N", id="not-cuda"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_paragraph(tmp_path, args, message):
    done = run_app(*args, cwd=tmp_path, python=[sys.executable, *CALIBRATE])
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("mstar-resources-calibrate: error: ")
    assert len(done.stderr.strip().splitlines()) == 1
    assert re.search(message, done.stderr), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_is_the_app_s_own():
    done = run_help([sys.executable, *CALIBRATE])
    assert (done.returncode, done.stderr) == (0, "")
    for needed in ("deployment=NAME", "margin=FRACTION", "(now: 0.0)", "device=cuda[:N]",
                   "output_dir=PATH", "MSTAR_WORKSPACE_BUFFER_MB", "llama3-8b-h200"):  # fmt: skip
        assert needed in done.stdout
    assert len(re.findall(r"^  mstar-resources-calibrate \S", done.stdout, re.M)) >= 3
    assert "powered by Hydra" not in done.stdout and "mstar_resources" not in done.stdout


def test_an_output_dir_that_cannot_be_made_is_refused_before_the_gpu(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    work = tmp_path / "work"
    work.mkdir()
    args = ["deployment=llama3-8b-h200", f"output_dir={blocker}/deployment"]
    done = run_app(*args, cwd=work, python=[sys.executable, *CALIBRATE])
    assert done.returncode == 2, done.stderr
    assert re.search(
        rf"output_dir='{re.escape(str(blocker))}/deployment' can't take the calibrated "
        rf"deployment \({re.escape(str(blocker))} is a file, not a folder\)",
        done.stderr,
    ), done.stderr
    assert list(work.iterdir()) == []


def test_vllms_workspace_manager_is_said_and_left_out_of_the_measurement(tmp_path):
    """A deployment declaring vLLM's WorkspaceManager is calibrated for the rest: one line says
    calibration does not measure the manager (vLLM's profile does), and no plan is asked for."""
    args = [
        "deployment=llama3-8b-h200",
        "device=tpu",
        "+resources.vllm.workspace_manager={owner: vllm, labels: [workspace_manager]}",
    ]
    done = run_app(*args, cwd=tmp_path, python=[sys.executable, *CALIBRATE])
    told, refused = done.stderr.strip().splitlines()
    assert told.startswith("mstar-resources-calibrate: resources.vllm.workspace_manager ")
    assert "calibration does not measure" in told
    assert "device='tpu' is not a CUDA device" in refused and done.returncode == 2
