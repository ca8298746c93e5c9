"""The apps run as a user runs them, for the tests: ``run_cli`` in a subprocess, ``run_app`` in
this process. What only a process shows stays with the first; the tables of odd input use the
second, which saves each run a fresh interpreter's half second or so of CPU. ``run_help``: an
app's ``--help`` as a process, run once for the tests that each read a part of it."""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from .conftest import INT_VAR, VAR

DRY_RUN = [sys.executable, "-m", "mstar_resources.apps.dry_run"]
SETTINGS = "_settings.yaml"
"""How the ConfigStore names an app's settings schema (``register_settings``)."""


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    """This process's environment without the floor variables and HYDRA_FULL_ERROR, and ``env``."""
    environ = {k: v for k, v in os.environ.items() if k not in (VAR, INT_VAR, "HYDRA_FULL_ERROR")}
    return {**environ, **(env or {})}


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, python: list[str] | None = None
) -> subprocess.CompletedProcess:
    """``python ARGS`` (default: the dry run) in a subprocess, in ``cwd``."""
    return subprocess.run(
        [*(python or DRY_RUN), *args],
        cwd=cwd,
        env=_environment(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_help(python: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python --help`` (default: the dry run) as :func:`run_cli` runs it, in an empty folder that
    it must leave empty; run once a test process, for every test that reads that help (the help of
    calibration composes each deployment to list those with a profile: some
    1.5 s of CPU a run)."""
    return _help(tuple(python or DRY_RUN))


@functools.cache
def _help(python: tuple[str, ...]) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as folder:
        done = run_cli("--help", cwd=Path(folder), python=list(python))
        left = sorted(os.listdir(folder))
    assert left == [], f"{' '.join(python)} --help wrote {left}"
    return done


def run_app(
    *args: str, cwd: Path, env: dict[str, str] | None = None, python: list[str] | None = None
) -> subprocess.CompletedProcess:
    """:func:`run_cli`'s run, in this process: what ``python -m MODULE`` or ``python SCRIPT``
    runs (``python`` as for run_cli), with ``sys.argv``, the working folder and the environment
    set and put back, stdout and stderr captured, and ``SystemExit``'s code as the exit status.
    An exception that escapes is printed as the interpreter would, with status 1.

    A fresh interpreter costs some 0.5 s of CPU an app run; the tables of odd input run here,
    and what only a process shows (its exit status, signals, a stdout that fails, what it
    imports) stays with run_cli."""
    executable, *target = python or DRY_RUN
    assert executable == sys.executable, python
    if target[0] == "-m":
        (_, module) = target
        program = [module]

        def start() -> None:
            importlib.import_module(module).main()
    else:
        (script,) = program = target

        def start() -> None:
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT`
            try:
                runpy.run_path(script, run_name="__main__")
            finally:
                sys.path.pop(0)

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_hydra = HydraConfig.instance().cfg
    # A fresh process holds no app's settings schema: each app registers its own as it runs.
    store = ConfigStore.instance().repo
    saved_settings = {name: node for name, node in store.items() if name.endswith(SETTINGS)}
    try:
        for name in saved_settings:
            del store[name]
        os.environ.clear()
        os.environ.update(_environment(env))
        os.chdir(cwd)
        sys.argv = [*program, *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                start()
                status = 0
            except SystemExit as exit:  # as the interpreter reads it
                status = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
                if not isinstance(exit.code, int | None):
                    print(exit.code, file=sys.stderr)
            except Exception:  # a KeyboardInterrupt stops the tests, as it would
                traceback.print_exc()
                status = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        HydraConfig.instance().cfg = saved_hydra
        GlobalHydra.instance().clear()
        for name in [name for name in store if name.endswith(SETTINGS)]:
            del store[name]
        store.update(saved_settings)
    return subprocess.CompletedProcess([*program, *args], status, out.getvalue(), err.getvalue())
