"""``mstar-resources`` run as a program, in a subprocess, in an empty working directory."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import VAR

MIB = 1 << 20
SCRIPT = Path(sys.executable).parent / "mstar-resources"

DEFAULT_TABLE = """\
path          owner      labels   slots  floor MB  source   workspaces  reserved MB
------------  ---------  -------  -----  --------  -------  ----------  -----------
attn.prefill  attention  prefill  eager       512  default           1          512
attn.decode   attention  decode   0,1         512  default           2        1,024
------------  ---------  -------  -----  --------  -------  ----------  -----------
total                                                                3        1,536
"""


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, python: list[str] | None = None
) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in (VAR, "HYDRA_FULL_ERROR")}
    return subprocess.run(
        [*(python or [sys.executable, "-m", "mstar_resources.cli"]), *args],
        cwd=cwd,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_dry_run_prints_the_default_tree_and_leaves_the_directory_empty(tmp_path):
    done = run_cli(cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == DEFAULT_TABLE
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not SCRIPT.exists(), reason=f"no console script at {SCRIPT}: pip install -e .")
def test_the_console_script_is_the_same_program(tmp_path):
    done = run_cli(cwd=tmp_path, python=[str(SCRIPT)])
    assert (done.returncode, done.stdout) == (0, DEFAULT_TABLE)


def test_json_is_one_document_on_stdout_and_nothing_else(tmp_path):
    done = run_cli("format=json", "deployment=llama3-8b-h200", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    report = json.loads(done.stdout)  # fails on anything besides the one document
    assert list(report) == ["resources", "total_reserved_bytes"]
    assert report["resources"][1] == {
        "path": "attn.decode",
        "owner": "attention",
        "labels": ["decode"],
        "cg_slots": [0, 1],
        "declared_mb": 128,
        "floor_mb": 128,
        "floor_bytes": 128 * MIB,
        "floor_source": "declared",
        "floor_setting": "resources.attn.decode.declared_mb",
        "workspaces": 2,
        "reserved_bytes": 256 * MIB,
    }
    assert report["total_reserved_bytes"] == (256 + 256) * MIB
    assert list(tmp_path.iterdir()) == []


# (arguments, environment) -> {path: (floor MB, source, setting)}
P, D = "resources.attn.prefill.declared_mb", "resources.attn.decode.declared_mb"
PRECEDENCE = [
    pytest.param([], {}, {"attn.prefill": (512, "default", VAR),
                          "attn.decode": (512, "default", VAR)}, id="default"),
    pytest.param([], {VAR: "40"}, {"attn.prefill": (40, "env", VAR),
                                   "attn.decode": (40, "env", VAR)}, id="env"),
    pytest.param([f"{P}=20"], {VAR: "40"},
                 {"attn.prefill": (20, "declared", P), "attn.decode": (40, "env", VAR)},
                 id="declared-and-env"),
    pytest.param(["deployment=llama3-70b-tp8-h200"], {VAR: "40"},
                 {"attn.prefill": (128, "declared", P), "attn.decode": (64, "declared", D)},
                 id="deployment"),
    pytest.param(["deployment=llama3-70b-tp8-h200", f"{D}=96"], {},
                 {"attn.prefill": (128, "declared", P), "attn.decode": (96, "declared", D)},
                 id="override-of-a-deployment-value"),
    pytest.param(["deployment=llama3-8b-h200", f"{P}=null"], {VAR: "8"},
                 {"attn.prefill": (8, "env", VAR), "attn.decode": (128, "declared", D)},
                 id="override-back-to-env"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "env", "expected"), PRECEDENCE)
def test_precedence_and_provenance_through_the_cli(tmp_path, args, env, expected):
    done = run_cli("format=json", *args, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)["resources"]
    got = {r["path"]: (r["floor_mb"], r["floor_source"], r["floor_setting"]) for r in records}
    assert got == expected


def test_the_dry_run_imports_no_flashinfer(tmp_path):
    assert importlib.util.find_spec("flashinfer") is not None, "FlashInfer must be installed here"
    runner = (
        "import sys\n"
        "from mstar_resources import cli\n"
        "sys.argv = ['mstar-resources', 'format=json']\n"
        "cli.main()\n"
        "sys.stderr.write(repr(sorted(m for m in sys.modules if m.startswith('flashinfer'))))\n"
    )
    done = run_cli(cwd=tmp_path, python=[sys.executable, "-c", runner])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total_reserved_bytes"] == 1536 * MIB
    assert done.stderr == "[]"


# (arguments, environment, what stderr must say)
BAD_INPUT = [
    pytest.param(["resources.attn.decode.declared_mb=lots"], {},
                 r"Error merging override resources\.attn\.decode\.declared_mb=lots; Value "
                 r"'lots' of type 'str' could not be converted to Integer; full_key: "
                 r"resources\.attn\.decode\.declared_mb",
                 id="wrong-type"),
    pytest.param(["resources.attn.decode.cg_slots=[a]"], {},
                 r"override resources\.attn\.decode\.cg_slots=\[a\]; Value 'a' of type 'str'",
                 id="slot-wrong-type"),
    pytest.param(["resources.attn.decode.declared_mb=0"], {},
                 r"resources\.attn\.decode\.declared_mb=0 is not a positive whole number of MB; "
                 r"declare the floor in MB \(e\.g\. declared_mb=256\)",
                 id="declared-zero"),
    pytest.param(["resources.attn.decode.declared_mb=-64"], {},
                 r"resources\.attn\.decode\.declared_mb=-64 is not a positive",
                 id="declared-negative"),
    pytest.param(["resources.attn.prefill.labels=[]"], {},
                 r"resources\.attn\.prefill\.labels=\[\] is empty; list the plan labels",
                 id="labels-empty"),
    pytest.param(["resources.attn.prefill.labels=[p,p]"], {},
                 r"resources\.attn\.prefill\.labels=\['p', 'p'\] repeats \['p'\]; list each "
                 r"label once",
                 id="labels-duplicate"),
    pytest.param(["resources.attn.decode.cg_slots=[0,-1]"], {},
                 r"resources\.attn\.decode\.cg_slots=\[0, -1\] has negative slots \[-1\]",
                 id="slot-negative"),
    pytest.param(["resources.attn.decode.cg_slots=[1,1]"], {},
                 r"resources\.attn\.decode\.cg_slots=\[1, 1\] repeats \[1\]", id="slots-duplicate"),
    pytest.param(["resources.attn.decode.labels=???"], {},
                 r"resources\.attn\.decode\.labels is not set; set it to a list of plan labels",
                 id="missing-field"),
    pytest.param(["+resources.attn.verify.cg_slots=[0]"], {},
                 r"resources\.attn\.verify\.labels is not set", id="resource-missing-labels"),
    pytest.param(["resources.attn.decode.size_mb=8"], {},
                 r"Could not override 'resources\.attn\.decode\.size_mb'\. .*Key 'size_mb' not in "
                 r"'Resource'",
                 id="unknown-key"),
    pytest.param(["+resources.attn.decode.size_mb=8"], {},
                 r"resources\.attn\.decode\.size_mb is not a resource setting; a resource takes "
                 r"owner, declared_mb, labels, cg_slots",
                 id="unknown-key-appended"),
    pytest.param(["+resources.attn.decode._target_=os.getcwd"], {},
                 r"resources\.attn\.decode\._target_='os\.getcwd' is not allowed", id="target"),
    pytest.param([], {VAR: "half"},
                 r"MSTAR_WORKSPACE_BUFFER_MB='half' is not a positive whole number of MB; set "
                 r"it to one \(e\.g\. MSTAR_WORKSPACE_BUFFER_MB=256\)",
                 id="bad-variable"),
    pytest.param(["deployment=llama3-8b-h100"], {},
                 r"Could not find 'deployment/llama3-8b-h100'; Available options in 'deployment': "
                 r"llama3-70b-tp8-h200, llama3-70b-tp8-h200_calibrated, llama3-8b-h200, "
                 r"llama3-8b-h200_calibrated, none\.",
                 id="misspelled-deployment"),
    pytest.param(["deployment=["], {},
                 r"deployment=\[: no viable alternative at input '\['", id="unparsable-override"),
    pytest.param(["format=xml"], {},
                 r"format='xml' is not an output format; set format=table or format=json",
                 id="bad-format"),
    pytest.param(["device=tpu"], {},
                 r"device='tpu' is not a device to reserve on; set device=cpu", id="bad-device"),
    pytest.param([f"{P}=0", "resources.attn.decode.labels=[]"], {VAR: "x"},
                 r"3 problems in the resources config: - resources\.attn\.prefill\.declared_mb=0 "
                 r".* - resources\.attn\.decode\.labels=\[\] .* - MSTAR_WORKSPACE_BUFFER_MB='x'",
                 id="every-problem-at-once"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "env", "match"), BAD_INPUT)
def test_bad_input_is_one_paragraph_and_exit_status_2(tmp_path, args, env, match):
    done = run_cli(*args, cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("mstar-resources: error: ")
    assert "Traceback" not in done.stderr and "HYDRA_FULL_ERROR" not in done.stderr
    paragraph = " ".join(line.strip() for line in done.stderr.splitlines())
    assert "\n\n" not in done.stderr
    assert re.search(match, paragraph), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_hydra_full_error_still_gives_the_traceback(tmp_path):
    done = run_cli("deployment=llama3-8b-h100", cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "MissingConfigException" in done.stderr


def test_device_cuda_without_a_gpu_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible; test_cli_gpu covers device=cuda")
    done = run_cli("device=cuda", cwd=tmp_path)
    assert done.returncode == 2
    assert "device='cuda', but torch sees no CUDA device" in done.stderr


def test_a_reader_that_goes_away_ends_it_quietly(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in (VAR, "HYDRA_FULL_ERROR")}
    process = subprocess.Popen(
        [sys.executable, "-m", "mstar_resources.cli", "format=json"],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `mstar-resources | head -c 0` would
    assert (process.wait(timeout=120), process.stderr.read()) == (1, b"")
