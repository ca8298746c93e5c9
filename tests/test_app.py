"""What every app made with ``hydra_app`` does at its edges: the user's mistakes in one paragraph
(exit 2), the app's own bugs with their traceback (exit 1), its own ``--version``, help that lists
every setting and offers only what works, a closed pipe met quietly, and the environment left as
the user set it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mstar_resources.apps.calibrate import CalibrateSettings
from mstar_resources.apps.dry_run import DryRunSettings

from .apps import run_cli, run_help

ROOT = Path(__file__).parents[1]
DRY_RUN = [sys.executable, "-m", "mstar_resources.apps.dry_run"]
CALIBRATE = [sys.executable, "-m", "mstar_resources.apps.calibrate"]
ENGINE = [sys.executable, "-m", "tests.engine.app"]
APPS = [
    pytest.param(DRY_RUN, "mstar-resources", DryRunSettings, id="dry-run"),
    pytest.param(CALIBRATE, "mstar-resources-calibrate", CalibrateSettings, id="calibrate"),
]
TREE = {"resources", "calibration", "calibrated"}  # the composed tree, not the app's settings


@pytest.mark.parametrize(("python", "prog", "settings"), APPS)
def test_version_names_the_app_and_this_package(tmp_path, python, prog, settings):
    from importlib.metadata import version

    done = run_cli("--version", cwd=tmp_path, python=python)
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"{prog} {version('mstar-resources')}\n", ""
    )  # fmt: skip


def test_an_engine_s_version_names_the_library_it_was_built_with(tmp_path):
    from importlib.metadata import version

    done = run_cli("--version", cwd=ROOT, python=ENGINE)
    assert done.stdout == f"engine (built with mstar-resources {version('mstar-resources')})\n"


@pytest.mark.parametrize(("python", "prog", "settings"), APPS)
def test_help_lists_every_setting_of_the_app(python, prog, settings):
    done = run_help(python)
    assert (done.returncode, done.stderr) == (0, "")
    for field in dataclasses.fields(settings):
        if field.name not in TREE:
            assert f"{field.name}=" in done.stdout, f"{prog} --help omits {field.name}"
    assert "deployment=" in done.stdout and "resources.<path>.<field>=" in done.stdout


def test_calibration_s_help_offers_only_deployments_with_a_profile():
    done = run_help(CALIBRATE)
    offered = next(line for line in done.stdout.splitlines() if "deepseek-v3-tp8-h200," in line)
    assert "llama3-8b-h200_calibrated" in offered
    assert "none" not in offered.split(": ", 1)[1].split(", ")


def test_the_engine_s_help_is_its_own_and_lists_every_deployment():
    done = run_cli("--help", cwd=ROOT, python=ENGINE)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("engine: an example engine's entry point")
    assert "lab-a100" in done.stdout and "llama3-70b-tp8-h200_calibrated" in done.stdout


@pytest.mark.parametrize("flag", ["--help", "--hydra-help", "--version"])
@pytest.mark.parametrize("python", [DRY_RUN, CALIBRATE], ids=["dry-run", "calibrate"])
def test_a_reader_that_goes_away_ends_it_quietly(tmp_path, python, flag):
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    process = subprocess.Popen(
        [*python, flag], cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `| head -c 0` would
    status, stderr = process.wait(timeout=120), process.stderr.read()
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr, stderr
    assert status == 0  # whether or not it had something left to print


def test_calibration_s_errors_point_at_a_command_that_exists(tmp_path):
    done = run_cli("deployment=nope", cwd=tmp_path, python=CALIBRATE)
    assert done.returncode == 2
    assert "`mstar-resources-calibrate --help` lists the settings" in done.stderr


BUGGY_APP = """
import os, subprocess, sys
from omegaconf import DictConfig
from mstar_resources.apps.hydra_app import hydra_app
from mstar_resources.apps.dry_run import DryRunSettings

@hydra_app(
    "buggy", config_name="mstar_resources", compose_once={compose_once}, settings=DryRunSettings
)
def main(cfg: DictConfig) -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('HYDRA_FULL_ERROR'))"],
        capture_output=True, text=True,
    )
    print("inside:", os.environ.get("HYDRA_FULL_ERROR"), "child:", child.stdout.strip())
    if cfg.format.name == "json":
        print(cfg.typo)  # the app's own bug
    if cfg.format.name == "table" and "--misuse" in os.environ.get("BUGGY", ""):
        from mstar_resources import build_pools
        pools = build_pools(cfg.resources, "cpu")
        pools["attn.decode"].get("decode", cg_slot=3)  # misuse of the API: a slot not served

main()
print("after:", os.environ.get("HYDRA_FULL_ERROR"))
"""


def run_buggy(tmp_path: Path, compose_once: bool, *args: str, env: dict[str, str] | None = None):
    script = tmp_path / "buggy.py"
    script.write_text(textwrap.dedent(BUGGY_APP.format(compose_once=compose_once)))
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("compose_once", [True, False], ids=["compose-once", "hydra-main"])
def test_the_app_s_own_bug_keeps_its_traceback(tmp_path, compose_once):
    done = run_buggy(tmp_path, compose_once, "format=json")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "print(cfg.typo)" in done.stderr  # down to the line that raised
    assert "\nomegaconf.errors.ConfigAttributeError: " in done.stderr  # the type, unrenamed
    assert "is not a setting" not in done.stderr and "error:" not in done.stderr.split("\n")[0]
    assert "Error executing job" not in done.stderr


@pytest.mark.parametrize("compose_once", [True, False], ids=["compose-once", "hydra-main"])
def test_the_app_s_misuse_of_the_api_keeps_its_traceback(tmp_path, compose_once):
    """A ResourceUsageError is the app's own bug, not the user's mistake: traceback, status 1."""
    done = run_buggy(tmp_path, compose_once, "format=table", env={"BUGGY": "--misuse"})
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last)" in done.stderr
    assert 'pools["attn.decode"].get("decode", cg_slot=3)' in done.stderr
    assert "\nmstar_resources.errors.ResourceUsageError: " in done.stderr


@pytest.mark.parametrize("compose_once", [True, False], ids=["compose-once", "hydra-main"])
@pytest.mark.parametrize("user", [None, "0"], ids=["unset", "set-to-0"])
def test_the_environment_is_left_as_the_user_set_it(tmp_path, compose_once, user):
    env = {} if user is None else {"HYDRA_FULL_ERROR": user}
    done = run_buggy(tmp_path, compose_once, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"inside: {user} child: {user}", f"after: {user}"]


@pytest.mark.parametrize("compose_once", [True, False], ids=["compose-once", "hydra-main"])
def test_a_compose_error_is_still_one_paragraph(tmp_path, compose_once):
    done = run_buggy(tmp_path, compose_once, "format=xml")
    assert done.returncode == 2
    assert done.stderr.startswith("buggy: error: format='xml' is not valid; format takes")
    assert done.stderr.count("\n") == 1
