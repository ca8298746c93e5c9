"""Odd input to every app made with ``hydra_app``: a config file of the user's own that is not YAML
or not UTF-8, a config group's value that is a path or a list, what the apps do not run (a sweep,
Hydra's own config groups, a bare ``--shell-completion``), a wrong type in the user's YAML, a
``--config-name`` that is not there, Ctrl-C, and a stdout that takes nothing. Each ends in one
paragraph on stderr and exit status 2 (Ctrl-C: one line and 130; a reader gone: 0), never a
traceback. The tables of input run each app in this process (``run_app``); Ctrl-C and the
stdouts that fail run it as a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .apps import run_app, run_cli
from .conftest import VAR

ROOT = Path(__file__).parents[1]
DRY_RUN = [sys.executable, "-m", "mstar_resources.apps.dry_run"]
CALIBRATE = [sys.executable, "-m", "mstar_resources.apps.calibrate"]
APPS = [
    pytest.param(DRY_RUN, "mstar-resources", id="dry-run"),
    pytest.param(CALIBRATE, "mstar-resources-calibrate", id="calibrate"),
]
PRIMARY_CONFIG = {
    "mstar-resources": "mstar_resources",
    "mstar-resources-calibrate": "mstar_resources_calibrate",
}
D = "resources.attn.decode.declared_mb"
A_DEPLOYMENT = "llama3-8b-h200"  # listed in every app's choices


def assert_one_paragraph(done: subprocess.CompletedProcess, prog: str, *named: str) -> None:
    """Exit status 2, one paragraph on stderr that starts with the program and names ``named``."""
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"{prog}: error: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and "HYDRA_FULL_ERROR" not in done.stderr
    for text in named:
        assert text in done.stderr, f"{text!r} not named in {done.stderr!r}"


# Each kind of run the tables below make: (arguments, exit status)
RUNS = [
    pytest.param([f"{D}=0"], 2, id="refused-setting"),
    pytest.param(["--config-dir", "conf", "deployment=mine"], 2, id="broken-file-of-the-user-s"),
    pytest.param(["--cfg", "job"], 0, id="through-hydra-main"),
]


@pytest.mark.parametrize(("args", "status"), RUNS)
@pytest.mark.parametrize(("python", "prog"), APPS)
def test_an_app_run_in_this_process_is_what_it_is_as_a_process(
    tmp_path, python, prog, args, status
):
    """What run_app's tables rest on: the same status, stdout and stderr as run_cli's."""
    deployment_file(tmp_path, b"resources: {attn: {decode: {declared_mb: [1\n")
    in_process = run_app(*args, cwd=tmp_path, python=python)
    as_a_process = run_cli(*args, cwd=tmp_path, python=python)
    assert (in_process.returncode, in_process.stdout, in_process.stderr) == (
        as_a_process.returncode, as_a_process.stdout, as_a_process.stderr,
    )  # fmt: skip
    assert in_process.returncode == status
    assert (in_process.stderr if status else in_process.stdout).startswith(
        f"{prog}: error: " if status else "resources:"
    )


def deployment_file(tmp_path: Path, body: bytes) -> Path:
    """``deployment/mine.yaml`` in a config folder of the user's own, holding ``body``."""
    folder = tmp_path / "conf" / "deployment"
    folder.mkdir(parents=True)
    path = folder / "mine.yaml"
    path.write_bytes(b"# @package _global_\n" + body)
    return path


# A file of the user's own that no YAML reader takes: (its body, the line it is told at)
BAD_FILES = [
    pytest.param(b"resources:\n  attn:\n    decode:\n      declared_mb: [1, 2\n", 6,
                 id="broken-yaml"),
    pytest.param(b"resources:\n  attn:\n    decode:\n      declared_mb: 1\n      declared_mb: 2\n",
                 6, id="duplicate-key"),
    pytest.param(b"# caf\xe9\nresources: {}\n", 2, id="not-utf8"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "line"), BAD_FILES)
@pytest.mark.parametrize(("python", "prog"), APPS)
def test_a_bad_file_of_the_user_s_own_is_named_with_its_line(tmp_path, python, prog, body, line):
    path = deployment_file(tmp_path, body)
    done = run_app("--config-dir", "conf", "deployment=mine", cwd=tmp_path, python=python)
    assert_one_paragraph(done, prog, str(path.resolve()), f"line {line}")


# Deployment files that compose under the key `deployment`, not at the top: (the file's bytes)
NOT_GLOBAL = [
    pytest.param(b"\xef\xbb\xbf# @package _global_\nresources: {}\n", id="byte-order-mark"),
    pytest.param(b"", id="empty"),
    pytest.param(b"resources:\n  attn:\n    decode:\n      declared_mb: 7\n", id="no-header"),
]


@pytest.mark.parametrize("body", NOT_GLOBAL)
@pytest.mark.parametrize(("python", "prog"), APPS)
def test_a_deployment_file_without_its_header_is_named_with_the_fix(tmp_path, python, prog, body):
    path = tmp_path / "conf" / "deployment" / "mine.yaml"
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    done = run_app("--config-dir", "conf", "deployment=mine", cwd=tmp_path, python=python)
    assert_one_paragraph(done, prog, "conf/deployment/mine.yaml", "`# @package _global_`")


@pytest.mark.parametrize(
    "files",
    [
        pytest.param({"mine": "mine"}, id="lists-itself"),
        pytest.param({"mine": "other", "other": "mine"}, id="a-chain-back-to-itself"),
    ],
)
@pytest.mark.parametrize(("python", "prog"), APPS)
def test_a_deployment_whose_defaults_come_back_to_it_is_one_paragraph(
    tmp_path, python, prog, files
):
    folder = tmp_path / "conf" / "deployment"
    folder.mkdir(parents=True)
    for name, listed in files.items():
        (folder / f"{name}.yaml").write_text(f"# @package _global_\ndefaults:\n  - {listed}\n")
    done = run_app("--config-dir", "conf", "deployment=mine", cwd=tmp_path, python=python)
    assert_one_paragraph(done, prog, "deployment=mine never ends", "lists it again")


@pytest.mark.parametrize(
    ("name", "read_as"),
    [("inf", "the number inf"), ("nan", "the number nan"), ("null", "null, no value"),
     ("true", "the boolean True"), ("1e3", "the number 1000.0")],
)  # fmt: skip
def test_a_deployment_named_as_hydra_reads_a_value_is_told_to_be_quoted(tmp_path, name, read_as):
    folder = tmp_path / "conf" / "deployment"
    folder.mkdir(parents=True)
    (folder / f"{name}.yaml").write_text("# @package _global_\nresources: {}\n")
    done = run_app("--config-dir", "conf", f"deployment={name}", cwd=tmp_path)
    assert_one_paragraph(done, "mstar-resources", f"is read as {read_as}", f"deployment='{name}'")
    quoted = run_app("--config-dir", "conf", f"deployment='{name}'", cwd=tmp_path)
    assert quoted.returncode == 0, quoted.stderr


# A config group's value that is no plain option name: (arguments, the value named)
NOT_A_NAME = [
    pytest.param(["deployment=../resources/default"], "deployment=../resources/default",
                 id="path-beside-the-group"),
    pytest.param(["deployment=../../etc/passwd"], "deployment=../../etc/passwd",
                 id="path-out-of-the-tree"),
    pytest.param([f"deployment=[deepseek-v3-tp8-h200,{A_DEPLOYMENT}]"],
                 f"deployment=[deepseek-v3-tp8-h200,{A_DEPLOYMENT}]", id="list"),
    pytest.param([f"deployment=[deepseek-v3-tp8-h200,{A_DEPLOYMENT}]", "--help"],
                 f"deployment=[deepseek-v3-tp8-h200,{A_DEPLOYMENT}]", id="list-with-help"),
    pytest.param([f"deployment=[deepseek-v3-tp8-h200,{A_DEPLOYMENT}]", "--cfg", "job"],
                 f"deployment=[deepseek-v3-tp8-h200,{A_DEPLOYMENT}]", id="list-with-cfg"),
    pytest.param(["--config-dir", ".", f"deployment=[{A_DEPLOYMENT}]"],
                 f"deployment=[{A_DEPLOYMENT}]", id="list-through-hydra-main"),
    pytest.param(["--config-dir", ".", "deployment=../resources/default"],
                 "deployment=../resources/default", id="path-through-hydra-main"),
    pytest.param(["--config-dir", ".", "deployment=null"], "deployment=null",
                 id="null-through-hydra-main"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "value"), NOT_A_NAME)
@pytest.mark.parametrize(("python", "prog"), APPS)
def test_a_deployment_is_one_plain_name(tmp_path, python, prog, args, value):
    (tmp_path / "deployment").mkdir()  # a config dir as --config-dir takes one
    done = run_app(*args, cwd=tmp_path, python=python)
    assert_one_paragraph(done, prog, f"{value} is not a deployment", A_DEPLOYMENT)
    assert done.stdout == ""


def test_a_setting_missing_from_the_user_s_resource_is_offered_with_a_plus(tmp_path):
    deployment_file(tmp_path, b"resources:\n  layers:\n    l49:\n      labels: [decode]\n")
    key = "resources.layers.l49.declared_mb"
    done = run_app("--config-dir", "conf", "deployment=mine", f"{key}=7", cwd=tmp_path)
    assert_one_paragraph(done, "mstar-resources", f"add it with a plus: +{key}=VALUE")
    done = run_app("--config-dir", "conf", "deployment=mine", f"+{key}=7", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "layers.l49" in done.stdout and " 7 " in done.stdout


@pytest.mark.parametrize(("python", "prog"), APPS)
def test_a_number_of_thousands_of_digits_is_one_paragraph(tmp_path, python, prog):
    done = run_app(f"deployment={A_DEPLOYMENT}", f"{D}={'9' * 5000}", cwd=tmp_path, python=python)
    assert_one_paragraph(done, prog, f"{D}=999999999999... has 5,000 digits")


def test_the_user_s_own_deployments_are_listed_too(tmp_path):
    deployment_file(tmp_path, b"resources: {}\n")
    done = run_app("--config-dir", "conf", "deployment=../mine", cwd=tmp_path)
    assert_one_paragraph(done, "mstar-resources", "deployment=../mine", "mine", A_DEPLOYMENT)


# What the apps do not run: (arguments, what the paragraph names)
NOT_RUN = [
    pytest.param(["hydra/job_logging=default"], ["hydra/job_logging=default"],
                 id="hydra-logging"),
    pytest.param(["--shell-completion"], ["--shell-completion", "install=SHELL"],
                 id="shell-completion-alone"),
    pytest.param([f"{D}=1,2"], [f"{D}=1,2", f"{D}=[a,b]"], id="sweep"),
    pytest.param(["deployment=none,llama3-8b-h200"], ["deployment=none,llama3-8b-h200"],
                 id="sweep-of-a-group"),
    pytest.param([f"{D}=range(1,3)"], [f"{D}=range(1,3)"], id="sweep-function"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "named"), NOT_RUN)
@pytest.mark.parametrize(("python", "prog"), APPS)
def test_what_the_apps_do_not_run_is_one_paragraph(tmp_path, python, prog, args, named):
    done = run_app(*args, cwd=tmp_path, python=python)
    assert_one_paragraph(done, prog, *named)
    assert "--multirun" not in done.stderr  # the apps refuse it
    assert list(tmp_path.iterdir()) == []  # no log file


def test_shell_completion_itself_still_installs(tmp_path):
    done = run_cli("--shell-completion", "install=bash", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert "complete -o nospace" in done.stdout  # the script for bash


# A value of the wrong type written in the user's own YAML file, as YAML reads it
WRONG_TYPES = [
    pytest.param("1e3", id="exponent"),
    pytest.param("true", id="boolean"),
    pytest.param("512.0", id="float"),
]


@pytest.mark.parametrize("value", WRONG_TYPES)
@pytest.mark.parametrize(("python", "prog"), APPS)
def test_a_wrong_type_in_a_file_is_told_as_on_the_command_line(tmp_path, python, prog, value):
    body = f"resources:\n  attn:\n    decode:\n      declared_mb: {value}\n"
    deployment_file(tmp_path, body.encode())
    from_file = run_app("--config-dir", "conf", "deployment=mine", cwd=tmp_path, python=python)
    assert_one_paragraph(from_file, prog, f"{D}=")
    from_command_line = run_app(f"{D}={value}", cwd=tmp_path, python=python)
    assert from_file.stderr == from_command_line.stderr


# What was told with nothing after "pick one of" or "takes": (arguments, what it names)
NOTHING_LISTED = [
    pytest.param(["--config-name", "nope"], ["--config-name=nope", "pick one of {config},"],
                 id="config-name-missing"),
    pytest.param(["--config-name", "{other}"], ["--config-name={other}", "pick one of {config},"],
                 id="config-name-of-another-app"),
    pytest.param(["--config-name", "{own}"], ["--config-name={own}", "--config-dir {folder}"],
                 id="config-name-of-a-file"),
    pytest.param(["--config-dir", "conf", "--config-name", "mne"],
                 ["--config-name=mne", "(did you mean mine?)"], id="config-name-misspelled"),
    pytest.param(["calibration.model.head_dim=128", "deployment=none"],
                 ["calibration.model", "calibration is empty"], id="key-under-an-empty-node"),
    pytest.param(["--config-dir", "{own}"], ["--config-dir {own} is a file", "a folder of configs"],
                 id="config-dir-a-file"),
    pytest.param(["--config-dir", "{folder}/nope"], ["--config-dir {folder}/nope is not there"],
                 id="config-dir-missing"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "named"), NOTHING_LISTED)
@pytest.mark.parametrize(("python", "prog"), APPS)
def test_what_there_is_to_pick_reads_well(tmp_path, python, prog, args, named):
    own = tmp_path / "conf" / "mine.yaml"
    own.parent.mkdir()
    own.write_text("defaults:\n  - mstar_resources\n  - _self_\n")
    # Each app names its own primary config, not the others' beside it in the package.
    config = PRIMARY_CONFIG[prog]
    other = next(c for c in PRIMARY_CONFIG.values() if c != config)
    fill = {"own": str(own), "folder": str(own.parent), "config": config, "other": other}
    done = run_app(*(arg.format(**fill) for arg in args), cwd=tmp_path, python=python)
    assert_one_paragraph(done, prog, *(text.format(**fill) for text in named))
    assert " ;" not in done.stderr and ", ;" not in done.stderr and "one of ;" not in done.stderr


# Each child restores Python's own SIGINT handler first: a child of a job started in the background
# (`cmd &`, nohup) inherits SIGINT ignored, and its os.kill would then do nothing.
INTERRUPTED_COMPOSE = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from mstar_resources import compose as composing
from mstar_resources.apps import dry_run as cli

def compose(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while composing
    raise AssertionError("not interrupted")

composing.compose = compose
sys.argv = ["mstar-resources"]
cli.main()
"""

INTERRUPTED_RUN = """
import os, signal
signal.signal(signal.SIGINT, signal.default_int_handler)
from omegaconf import DictConfig
from mstar_resources.apps.hydra_app import hydra_app
from mstar_resources.apps.dry_run import DryRunSettings

@hydra_app("slow", config_name="mstar_resources", compose_once={compose_once},
           settings=DryRunSettings)
def main(cfg: DictConfig) -> None:
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the app's own long resolve
    raise AssertionError("not interrupted")

main()
"""

INTERRUPTS = [
    pytest.param(INTERRUPTED_COMPOSE, "mstar-resources", id="compose"),
    pytest.param(INTERRUPTED_RUN.format(compose_once=True), "slow", id="run"),
    pytest.param(INTERRUPTED_RUN.format(compose_once=False), "slow", id="run-under-hydra-main"),
]


@pytest.mark.parametrize(("script", "prog"), INTERRUPTS)
def test_ctrl_c_is_one_line_and_status_130(tmp_path, script, prog):
    done = run_cli(cwd=tmp_path, python=[sys.executable, "-c", textwrap.dedent(script)])
    assert (done.returncode, done.stderr) == (130, f"{prog}: interrupted\n")


# Where stdout takes nothing: (how stdout is given, the arguments)
STDOUT_FAILS = [
    pytest.param("full", [], id="full-report"),
    pytest.param("full", ["--help"], id="full-help"),
    pytest.param("full", ["--version"], id="full-version"),
    pytest.param("closed", [], id="closed-report"),
    pytest.param("closed", ["--help"], id="closed-help"),
]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(("stdout", "args"), STDOUT_FAILS)
@pytest.mark.parametrize(("python", "prog"), APPS)
def test_a_stdout_that_takes_nothing_is_one_line(tmp_path, python, prog, stdout, args):
    environ = {k: v for k, v in os.environ.items() if k not in (VAR, "HYDRA_FULL_ERROR")}
    if prog != "mstar-resources" and not args:
        args = ["--version"]  # the GPU apps print nothing else on a CPU
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [*python, *args],
            cwd=tmp_path,
            env=environ,
            stdout=full if stdout == "full" else None,
            preexec_fn=(lambda: os.close(1)) if stdout == "closed" else None,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert_one_paragraph(done, prog, "stdout")


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["format=json"]],
                         ids=["help", "version", "report"])  # fmt: skip
def test_a_reader_that_reads_one_line_gets_status_0_every_time(tmp_path, args):
    environ = {k: v for k, v in os.environ.items() if k not in (VAR, "HYDRA_FULL_ERROR")}
    command = " ".join([*DRY_RUN, *args])
    for _ in range(3):  # the reader goes before or after the rest is written, at random
        done = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {command} | head -1 > /dev/null"],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(
    ("python", "setting"),
    [(None, "format: json"), (None, "device: cuda"), (CALIBRATE, "margin: 0.5")],
    ids=["dry-run-format", "dry-run-device", "calibrate-margin"],
)  # fmt: skip
def test_a_deployment_file_that_sets_an_apps_setting_is_refused_naming_it(
    tmp_path: Path, python: list[str] | None, setting: str
) -> None:
    """The app's settings come after the deployment in its primary config and would override the
    file's without a word: a file that sets one is refused, naming the key and the file."""
    (tmp_path / "deployment").mkdir()
    mine = tmp_path / "deployment" / "mine.yaml"
    mine.write_text(f"# @package _global_\ndefaults:\n  - llama3-8b-h200\n  - _self_\n{setting}\n")
    done = run_app("--config-dir", str(tmp_path), "deployment=mine", cwd=tmp_path, python=python)
    key = setting.split(":")[0]
    assert done.returncode == 2, done.stderr
    assert f"deployment=mine ({mine}) sets {key}, the app's own settings" in done.stderr
    assert done.stdout == ""
    mine.write_text("# @package _global_\ndefaults:\n  - llama3-8b-h200\n  - _self_\n")
    if python is None:  # the same file without it composes
        assert (
            run_app("--config-dir", str(tmp_path), "deployment=mine", cwd=tmp_path).returncode == 0
        )
