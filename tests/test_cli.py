"""``mstar-resources`` run as a program, in an empty working directory: in a subprocess, or (the
tables of bad input) in this process with `run_app`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mstar_resources.units import MIB

from .apps import run_app, run_cli, run_help
from .conftest import INT_VAR, VAR

SCRIPT = Path(sys.executable).parent / "mstar-resources"

DEFAULT_TABLE = """\
path          owner      labels   slots  floor MB  source   workspaces  reserved MB  int MB  int source  int reserved MB
------------  ---------  -------  -----  --------  -------  ----------  -----------  ------  ----------  ---------------
attn.prefill  attention  prefill  eager       512  default           1          512       8  default                   8
attn.decode   attention  decode   0,1         512  default           2        1,024       8  default                  16
------------  ---------  -------  -----  --------  -------  ----------  -----------  ------  ----------  ---------------
total                                                                3        1,536                                   24
"""  # noqa: E501


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
    assert list(report) == [
        "resources", "total_reserved_bytes", "total_int_reserved_bytes"
    ]  # fmt: skip
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
        "int_declared_mb": None,
        "int_floor_mb": 8,
        "int_floor_bytes": 8 * MIB,
        "int_floor_source": "default",
        "int_floor_setting": "MSTAR_INT_WORKSPACE_BUFFER_MB",
        "int_reserved_bytes": 16 * MIB,
    }
    assert report["total_reserved_bytes"] == (256 + 256) * MIB
    # One int workspace a float one, 3 x 8 MiB on the GPU.
    assert report["total_int_reserved_bytes"] == 3 * 8 * MIB
    assert list(tmp_path.iterdir()) == []


def test_the_dry_run_imports_neither_torch_nor_flashinfer(tmp_path):
    runner = (
        "import sys\n"
        "from mstar_resources.apps import dry_run as cli\n"
        "sys.argv = ['mstar-resources', 'format=json']\n"
        "cli.main()\n"
        "heavy = ('torch', 'flashinfer')\n"
        "sys.stderr.write(repr(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = run_cli(cwd=tmp_path, python=[sys.executable, "-c", runner])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total_reserved_bytes"] == 1536 * MIB
    assert done.stderr == "[]"


P, D = "resources.attn.prefill.declared_mb", "resources.attn.decode.declared_mb"
DEPLOYMENTS = (
    "deepseek-v3-tp8-h200, deepseek-v3-tp8-h200_calibrated, glm-4.5-air-h200, "
    "glm-4.5-air-h200_calibrated, llama3-70b-tp8-h200, llama3-70b-tp8-h200_calibrated, "
    "llama3-8b-h200"
)

# (arguments, environment, what stderr must say): this project's key, value and fix.
BAD_INPUT = [
    pytest.param([f"{D}=lots"], {},
                 rf"{D}='lots' is not valid; {D} takes a whole number of MB from 1 to "
                 r"1,048,576, or null",
                 id="wrong-type"),
    pytest.param(["resources.attn.decode.cg_slots=[a]"], {},
                 r"resources\.attn\.decode\.cg_slots\[0\]='a' is not valid; "
                 r"resources\.attn\.decode\.cg_slots takes a list of slot numbers",
                 id="slot-wrong-type"),
    pytest.param([f"{D}=0"], {},
                 rf"{D}=0 is not a positive whole number of MB; declare the workspace's floor in "
                 r"MB, at most 1,048,576 \(1 TiB, more than any GPU holds; "
                 r"e\.g\. declared_mb=256\)",
                 id="declared-zero"),
    pytest.param([f"{D}={10**20}"], {},
                 rf"{D}={10**20:,} MB is more than 1,048,576 \(1 TiB",
                 id="declared-beyond-any-gpu"),
    pytest.param([f"{D}={'9' * 320}"], {},
                 rf"{D}=<a number of 320 digits> MB is more than 1,048,576",
                 id="declared-320-digits"),
    pytest.param(["resources.attn.decode.cg_slots=[0,99999999999999999999]"], {},
                 r"resources\.attn\.decode\.cg_slots has slots \[99,999,999,999,999,999,999\] "
                 r"past the largest, 255", id="slot-past-the-largest"),
    pytest.param([f"{D}=٣"], {}, r"the value holds '٣', a digit of another script: write "
                 r"numbers in ASCII digits \(0-9\)", id="declared-arabic-digit"),
    pytest.param(["+foo=1"], {}, r"\+foo=1 adds a key 'foo' at the top of the config, which "
                 r"nothing reads", id="added-at-the-top"),
    pytest.param(["++foo=1"], {}, r"\+\+foo=1 adds a key 'foo' at the top", id="forced-at-the-top"),
    pytest.param(["~resources.attn"], {}, r"resources declares no resource, so there is nothing "
                 r"to reserve", id="no-resource-left"),
    pytest.param(["deployment=null"], {}, r"deployment=null is not a deployment; pick one of "
                 r"deepseek-v3-tp8-h200, .*llama3-8b-h200_calibrated, none", id="deployment-null"),
    pytest.param(["deployment=5"], {}, r"deployment=5 is not a deployment; pick one of ",
                 id="deployment-number"),
    pytest.param(["resources=null"], {},
                 r"resources=null is not a resource tree; pick one of default",
                 id="tree-null"),
    pytest.param(["resources=5"], {},
                 r"resources=5 is not a resource tree; pick one of default",
                 id="tree-number"),
    pytest.param([f"resources.attn.{'x' * 300}=1"], {},
                 r"resources\.attn\.x{65}\.\.\. \(315 characters\) is not a setting",
                 id="key-300-characters"),
    pytest.param(["resources.attn.prefill.labels=[]"], {},
                 r"resources\.attn\.prefill\.labels=\[\] is empty; list the plan labels",
                 id="labels-empty"),
    pytest.param(["resources.attn.decode.cg_slots=[1,1]"], {},
                 r"resources\.attn\.decode\.cg_slots=\[1, 1\] repeats \[1\]",
                 id="slots-duplicate"),
    pytest.param(["resources.attn.decode.labels=???"], {},
                 r"resources\.attn\.decode\.labels is not set; set it to a list of plan labels",
                 id="missing-field"),
    pytest.param(["+resources.attn.verify.cg_slots=[0]"], {},
                 r"resources\.attn\.verify\.labels is not set", id="resource-missing-labels"),
    pytest.param(["+resources.attn.decode.size_mb=8"], {},
                 r"resources\.attn\.decode\.size_mb is not a resource setting; a resource takes "
                 r"owner, declared_mb, int_declared_mb, labels, cg_slots",
                 id="unknown-key-appended"),
    pytest.param(["+resources.attn.decode._target_=os.getcwd"], {},
                 r"resources\.attn\.decode\._target_='os\.getcwd' is not allowed", id="target"),
    pytest.param([], {VAR: "half"},
                 r"MSTAR_WORKSPACE_BUFFER_MB='half' is not a positive whole number of MB; set "
                 r"it to one, at most 1,048,576 \(1 TiB, more than any GPU holds; e\.g\. "
                 r"MSTAR_WORKSPACE_BUFFER_MB=256\)",
                 id="bad-variable"),
    pytest.param([], {VAR: str(10**20)},
                 rf"MSTAR_WORKSPACE_BUFFER_MB={10**20:,} MB is more than 1,048,576",
                 id="variable-beyond-any-gpu"),
    pytest.param(["resources.attn.decode.int_declared_mb=-1"], {},
                 r"resources\.attn\.decode\.int_declared_mb=-1 is not a whole number of MB \(0: "
                 r"none\); .* or leave it unset for MSTAR_INT_WORKSPACE_BUFFER_MB or the default "
                 r"of 8",
                 id="int-declared-negative"),
    pytest.param(["resources.attn.decode.int_declared_mb=half"], {},
                 r"resources\.attn\.decode\.int_declared_mb='half' is not valid",
                 id="int-declared-wrong-type"),
    pytest.param([], {INT_VAR: "-1"},
                 r"MSTAR_INT_WORKSPACE_BUFFER_MB='-1' is not a positive whole number of MB; .* "
                 r"or unset it for the default of 8",
                 id="bad-int-variable"),
    pytest.param(["deployment=llama3-8b-h200", "~calibration.model"], {},
                 r"~calibration\.model deletes calibration\.model, a setting of the schema",
                 id="delete-a-schema-field"),
    pytest.param([f"deployment={'x' * 5000}"], {},
                 r"deployment=x{80}\.\.\. \(5,000 characters\) is not a deployment: no option has "
                 r"so long a name; pick one of deepseek-v3-tp8-h200,", id="deployment-5000-chars"),
    pytest.param(["resources.attn.decode.labels=[déc]"], {},
                 r"the value holds 'é', which Hydra reads only in quotes: give it as "
                 r"\"resources\.attn\.decode\.labels=\['déc'\]\"", id="non-ascii-unquoted"),
    pytest.param(["resources.attn.decode.owner=a=b"], {},
                 r"the value holds '=', which Hydra reads only in quotes: give it as "
                 r"\"resources\.attn\.decode\.owner='a=b'\"", id="equals-unquoted"),
    pytest.param(["resources.attn.decode.declared_mb==96"], {},
                 r"; write it as one KEY=VALUE: resources\.attn\.decode\.declared_mb=96;",
                 id="equals-twice"),
    pytest.param(["resources.attn.decode.declared_mb = 96"], {},
                 r"; write it as one KEY=VALUE: resources\.attn\.decode\.declared_mb=96;",
                 id="spaces-around-equals"),
    pytest.param(["resources.attn.verify.labels=[verify]"], {},
                 r"resources\.attn takes prefill, decode; a resource of your own is added with a "
                 r"plus: \+resources\.attn\.verify\.labels=\[LABEL\];", id="new-resource"),
    pytest.param(["resources.attn.decode.zzqq=1"], {},  # a resource's field: no resource to add
                 r"resources\.attn\.decode\.zzqq is not a setting; resources\.attn\.decode takes "
                 r"owner, declared_mb, int_declared_mb, labels, cg_slots; `", id="resource-field"),
    pytest.param(["~resources"], {},
                 r"resources=None \(unset: null, or deleted with ~resources\) is not a mapping",
                 id="resources-deleted"),
    pytest.param(["deployment", "llama3-8b-h200"], {},
                 r"; a setting is one word, KEY=VALUE: deployment=VALUE;", id="no-equals"),
    pytest.param(["--config-name=nope"], {},
                 r"--config-name=nope is not a config of this app; pick one of mstar_resources, "
                 r"or add --config-dir DIR for one of your own", id="config-name-unknown"),
    pytest.param(["--config-name=mstar_resources_calibrate"], {},  # calibration's, same path
                 r"--config-name=mstar_resources_calibrate is not a config of this app \(did you "
                 r"mean mstar_resources\?\); pick one of mstar_resources,",
                 id="config-name-another-apps"),
    pytest.param(["deployment=llama3-8b-h100"], {},
                 r"deployment=llama3-8b-h100 is not a deployment \(did you mean "
                 rf"llama3-8b-h200\?\); pick one of {DEPLOYMENTS}, llama3-8b-h200_calibrated, none",
                 id="misspelled-deployment"),
    pytest.param(["deployment=["], {}, r"'deployment=\[' is not an override Hydra can read",
                 id="unparsable-override"),
    pytest.param(["format=xml"], {},
                 r"format='xml' is not valid; format takes table or json", id="bad-format"),
    pytest.param(["formt=json"], {},
                 r"formt is not a setting \(did you mean format\?\)", id="misspelled-setting"),
    pytest.param(["device=tpu"], {},
                 r"device='tpu' is not a device to reserve on; set device=cpu", id="bad-device"),
    pytest.param(["-m", "deployment=none,llama3-8b-h200"], {},
                 r"-m \(--multirun\) is not supported: .* once per value", id="multirun"),
    pytest.param([f"{P}=0", "resources.attn.decode.labels=[]"], {VAR: "x"},
                 r"3 problems in the resources config: - resources\.attn\.prefill\.declared_mb=0 "
                 r".* - resources\.attn\.decode\.labels=\[\] .* - MSTAR_WORKSPACE_BUFFER_MB='x'",
                 id="every-problem-at-once"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "env", "match"), BAD_INPUT)
def test_bad_input_is_one_paragraph_and_exit_status_2(tmp_path, args, env, match):
    done = run_app(*args, cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("mstar-resources: error: ")
    assert "Traceback" not in done.stderr and "HYDRA_FULL_ERROR" not in done.stderr
    paragraph = " ".join(line.strip() for line in done.stderr.splitlines())
    assert "\n\n" not in done.stderr
    assert re.search(match, paragraph), done.stderr
    assert list(tmp_path.iterdir()) == []


# A misspelled key anywhere under `resources`: (override, the key it names, the closest setting)
MISSPELLED = [
    pytest.param("resources.attn.decode.declard_mb=96", "resources.attn.decode.declard_mb",
                 "resources.attn.decode.declared_mb", id="field"),
    pytest.param("resources.attn.decode.cg_slot=[0]", "resources.attn.decode.cg_slot",
                 "resources.attn.decode.cg_slots", id="list-field"),
    pytest.param("resources.attn.decod.declared_mb=96", "resources.attn.decod",
                 "resources.attn.decode", id="resource"),
    pytest.param("resources.atn.decode.declared_mb=96", "resources.atn", "resources.attn",
                 id="group"),
    pytest.param("deploymnet=llama3-8b-h200", "deploymnet", "deployment", id="config-group"),
]  # fmt: skip


@pytest.mark.parametrize(("override", "key", "closest"), MISSPELLED)
def test_a_misspelled_key_gets_the_closest_setting_never_the_plus_advice(
    tmp_path, override, key, closest
):
    done = run_app(override, cwd=tmp_path)
    assert done.returncode == 2
    start = f"mstar-resources: error: {key} is not a setting (did you mean {closest}?); "
    assert done.stderr.startswith(start), done.stderr
    assert "+" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_help_is_the_app_s_own():
    done = run_help()  # in a folder it leaves empty
    assert (done.returncode, done.stderr) == (0, "")
    text = done.stdout
    for needed in ("format=table|json", "device=cpu|cuda[:N]", "deployment=NAME",
                   "resources.<path>.declared_mb", "MSTAR_WORKSPACE_BUFFER_MB", "3. 512",
                   "int_declared_mb", "MSTAR_INT_WORKSPACE_BUFFER_MB", "--config-dir DIR",
                   "# @package _global_", DEPLOYMENTS):  # fmt: skip
        assert needed in text
    assert len(re.findall(r"^  \S*.*mstar-resources \S", text, re.M)) >= 3  # example commands
    assert "powered by Hydra" not in text and "mstar_resources" not in text  # no internal group


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
    environ = {k: v for k, v in os.environ.items() if k not in (VAR, INT_VAR, "HYDRA_FULL_ERROR")}
    process = subprocess.Popen(
        [sys.executable, "-m", "mstar_resources.apps.dry_run", "format=json"],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `mstar-resources | head -c 0` would
    assert (process.wait(timeout=120), process.stderr.read()) == (0, b"")  # all it wanted
