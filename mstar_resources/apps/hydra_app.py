"""Hydra apps that end a user's mistake in one paragraph on stderr, status 2 (``HYDRA_FULL_ERROR=1``
keeps Hydra's traceback), and keep the app's own bugs loud: their traceback, status 1. Each run is
first composed with the Compose API, so a compose error is an exception to explain; a
``compose_once`` app runs on that config, and a run with a flag (``--help``, ``--cfg job``) or any
other app goes on to ``@hydra.main``."""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import io
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log
from omegaconf import DictConfig, OmegaConf, open_dict

from .._internal.output import fail, guarded_stdout
from ..compose import (
    COMPOSE_ERRORS,
    DEPLOYMENT_GROUP,
    SHIPPED_CONF,
    Composition,
    group_options,
    hydra_on,
    not_a_choice,
    register_settings,
)
from ..errors import ResourceConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["cuda_device", "hydra_app", "package_version", "register_options_resolver",
           "register_settings"]  # fmt: skip

RESOLVERS = ("mstar_resources.options", "mstar_resources.shown")
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
MAX_DIGITS = 4000  # Python's int() reads no more; Hydra's parser would end in its traceback
# The flags of @hydra.main (Hydra 1.3; its parser is hydra._internal) that take a value, and the
# one read here: any other flag, or a line this can't read, goes on to @hydra.main.
FLAGS = argparse.ArgumentParser(add_help=False, exit_on_error=False)
FLAGS.add_argument("-sc", "--shell-completion", action="store_true")
for flag in ("-p --package", "-cp --config-path", "-cn --config-name", "--experimental-rerun"):
    FLAGS.add_argument(*flag.split())
FLAGS.add_argument("-cd", "--config-dir", action="append")  # Hydra takes the last: one is told
FLAGS.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
FLAGS.add_argument("--info", "-i", nargs="?", const="all")
FLAGS.add_argument("overrides", nargs="*")
HYDRA_FLAGS = frozenset({"-h", "--help", "--hydra-help", "--version", "--resolve", "-r", "--run"})
"""@hydra.main's flags that take no value (and ``-m``, refused before): any other is no flag."""


def is_cuda_device(device: str) -> bool:
    return re.fullmatch(r"cuda(:\d+)?", device) is not None


def cuda_device(device: str, without_gpu: str) -> torch.device:
    """The ``device`` setting as a CUDA device that is here; ``without_gpu``: what to do if none."""
    if not is_cuda_device(device):
        raise ResourceConfigError(f"device={device!r} is not a CUDA device; set device=cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise ResourceConfigError(
            f"device={device!r}, but torch sees no CUDA device (torch.cuda.is_available() is "
            f"False); {without_gpu}"
        )
    target = torch.device(device)
    count = torch.cuda.device_count()
    if target.index is not None and target.index >= count:
        raise ResourceConfigError(
            f"device={device!r}, but there are {count} CUDA devices; "
            f"set device=cuda:0 to cuda:{count - 1}"
        )
    return target


def package_version() -> str:
    return importlib.metadata.version("mstar-resources")


class _RaisedByTheApp(BaseException):
    """What the app's own code raised (``args[0]``), carried past Hydra's ``except Exception``."""


def hydra_app(
    prog: str, config_name: str, config_path: str = SHIPPED_CONF, *, compose_once: bool = False,
    command: str | None = None, version: str | Callable[[], str] | None = None,
    settings: type | None = None,
) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:  # fmt: skip
    """Make ``run(cfg)`` the ``main()`` of a Hydra app over ``config_path``/``config_name``;
    ``command``: how a user runs it (default ``prog``), ``settings``: its own schema."""
    invoked = command or prog

    def decorate(run: Callable[[DictConfig], None]) -> Callable[[], None]:
        @functools.wraps(run)  # Hydra finds a relative config_path beside ``run``'s module
        def task(cfg: DictConfig) -> None:
            try:
                run(cfg)
            except ResourceConfigError as error:
                fail(prog, str(error))
            except Exception as error:  # past Hydra's job runner, which would report it
                raise _RaisedByTheApp(error) from None

        hydra_main = hydra.main(version_base="1.3", config_path=config_path,
                                config_name=config_name)(task)  # fmt: skip

        def start(args: list[str]) -> None:
            if "--version" in args:
                given = version() if callable(version) else version
                print(prog, given or f"(built with mstar-resources {package_version()})")
                return
            if {"-m", "--multirun"} & set(args):
                fail(prog, "-m (--multirun) is not supported: Hydra's sweeper would run a job "
                     f"per value and write multirun.yaml beside them; run {prog} once per value "
                     "instead")  # fmt: skip
            try:
                line, unknown = FLAGS.parse_known_args(args)
            except argparse.ArgumentError as error:
                fail(prog, f"{error}; `{invoked} --help` lists the flags and settings")
            if stray := [a for a in unknown if a.startswith("-") and a not in HYDRA_FLAGS]:
                fail(prog, f"{stray[0]} is not a flag {prog} takes; `{invoked} --help` lists "
                     "the flags and settings")  # fmt: skip
            if line.experimental_rerun is not None:
                fail(prog, "--experimental-rerun is not supported: it reruns a job from the "
                     f"output folder Hydra writes, which {prog} does not write; run it again with "
                     "the same settings instead")  # fmt: skip
            if "--resolve" in unknown and line.cfg is None and not {"-h", "--help"} & set(args):
                fail(prog, "--resolve resolves the config --cfg prints: give it with --cfg job "
                     "(or leave it out)")  # fmt: skip
            config_dirs = line.config_dir or []
            if len(config_dirs) > 1:
                fail(prog, f"--config-dir is given {len(config_dirs)} times "
                     f"({', '.join(config_dirs)}), and Hydra reads one: put your deployments "
                     "in one folder's deployment/ (a calibrated file beside the deployment it "
                     "lists, as mstar-resources-calibrate writes it) and give that "
                     "folder")  # fmt: skip
            config_dir = line.config_dir = config_dirs[0] if config_dirs else None
            try:
                if config_dir is not None:
                    Path(config_dir).resolve()  # a loop of links raises
                    if not os.path.isdir(config_dir):  # as given: FILE/.. is no folder
                        what = "a file" if os.path.exists(config_dir) else "not there"
                        fail(prog, f"--config-dir {config_dir} is {what}; it takes a folder of "
                             "configs (one with a deployment/ folder, as "
                             "mstar-resources-calibrate writes it)")  # fmt: skip
            except (OSError, RuntimeError) as error:  # RuntimeError: a loop of links (Python 3.11)
                fail(prog, f"--config-dir {config_dir} can't be read ({error}); give a folder of "
                     "configs")  # fmt: skip
            on = Composition(config_name, line.overrides, config_dir, line.config_name, settings)
            if refusal := _refusal(line, on, prog, invoked, compose_once):
                fail(prog, refusal)
            flags = [k for k, v in vars(line).items()
                     if v and k not in ("overrides", "config_dir", "config_name")]  # fmt: skip
            try:
                with hydra_on(line.config_path or config_path, run):
                    if problem := _config_dir_problem(line, on) or _group_value_problem(on):
                        raise ResourceConfigError(problem)
                    if not line.shell_completion:  # its overrides are no config's
                        cfg = on.config(full_error=os.environ.get("HYDRA_FULL_ERROR") == "1")
                    if compose_once and not flags and not unknown:
                        # What @hydra.main does before it calls the task: HydraConfig.get() in
                        # the app, its logging config.
                        HydraConfig.instance().set_config(cfg)
                        configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
                        with open_dict(cfg):
                            del cfg["hydra"]
                        return task(cfg)
            except ResourceConfigError as error:
                fail(prog, f"{error}; `{invoked} --help` lists the settings")
            # Hydra reads the command line itself: the deployment as composed above.
            composed = dict(zip(on.texts, on.composed_texts, strict=True))
            sys.argv[1:] = [composed.get(arg, arg) for arg in args]
            hydra_main()

        def main() -> None:
            # A name the terminal's encoding lacks is written escaped, not as a traceback.
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, io.TextIOWrapper):
                    stream.reconfigure(errors="backslashreplace")
            try:
                os.getcwd()
            except OSError:
                fail(prog, "the working directory was deleted (Hydra reads paths from it); cd "
                     "to a folder that exists and run it again")  # fmt: skip
            if settings is not None:
                register_settings(config_name, settings)
            register_options_resolver(config_name)
            try:
                with guarded_stdout(prog):
                    start(sys.argv[1:])
                return
            except _RaisedByTheApp as carried:
                error = carried.args[0]
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                raise SystemExit(INTERRUPTED) from None
            finally:
                for name in RESOLVERS:
                    OmegaConf.clear_resolver(name)
            raise error  # out of the except clause: the error keeps its own context

        return main

    return decorate


def _refusal(
    line: argparse.Namespace, on: Composition, prog: str, invoked: str, compose_once: bool
) -> str | None:
    """What in the command line ``line`` the app does not run, found before composing."""
    if line.package is not None:
        return (f"--package {line.package} is not supported: {prog} composes its own config, "
                "whose keys stay where its schema puts them; leave it out")  # fmt: skip
    if line.config_path is not None:
        folder = line.config_path.removeprefix("file://")
        if not os.path.isfile(os.path.join(folder, f"{on.composed_name}.yaml")):
            return (f"--config-path {line.config_path} replaces the folder of {prog}'s own "
                    f"configs, and holds no {on.composed_name}.yaml; add a "
                    "folder of your own with --config-dir DIR instead")  # fmt: skip
    for override in line.overrides:
        key, _, value = override.partition("=")
        digits = value.strip().lstrip("+-")
        if len(digits) > MAX_DIGITS and digits.isdecimal():
            return (f"{key}={value.strip()[:12]}... has {len(digits):,} digits, a number "
                    "larger than any setting takes; give a smaller one")  # fmt: skip
    if line.shell_completion and len([o for o in on.overrides if o.key_or_group in
                                      ("install", "uninstall", "query")]) != 1:  # fmt: skip
        given = " ".join(line.overrides) if line.overrides else "alone"
        return (f"--shell-completion {given} is not supported: it takes one of install=SHELL "
                "or uninstall=SHELL (SHELL: bash, zsh or fish), e.g. "
                f'eval "$({invoked} --shell-completion install=bash)"')  # fmt: skip
    for override in [] if line.shell_completion else on.overrides:
        key = override.key_or_group
        if not key:
            return (f"{override.input_line} names no setting before its =; write "
                    "SETTING=VALUE, e.g. deployment=NAME")  # fmt: skip
        if override.is_sweep_override():
            return (f"{override.input_line} is a sweep (one run per value), and {prog} runs "
                    f"once; give {key} one value and run {prog} once per value, or write a "
                    f"list as {key}=[a,b] and a string with commas quoted, "
                    f"{key}='a,b'")  # fmt: skip
        if override.package is not None:  # Hydra's advice would be to append, with +
            value = override.get_value_string()
            return (f"{override.input_line} moves a config group to another package, which "
                    f"no setting here takes; set {key}={value}")  # fmt: skip
        if compose_once and key.startswith(("hydra/", "hydra.")):
            return (f"{override.input_line} is not supported: {prog} runs without Hydra's job "
                    "set-up (no log files, no output folders), so Hydra's own settings and "
                    f"config groups stay as its config sets them; leave {key} out")  # fmt: skip
    return None


def _config_dir_problem(line: argparse.Namespace, on: Composition) -> str | None:
    """A ``--config-dir`` that would add nothing: none of the app's config groups is in it."""
    config_dir = line.config_dir
    if config_dir is None or line.config_name is not None:
        return None
    groups = sorted(g for g in on.choices if not g.startswith("hydra/")) or [DEPLOYMENT_GROUP]
    readable = os.R_OK | os.X_OK
    if not os.access(config_dir, readable):
        mode = oct(os.stat(config_dir).st_mode & 0o777)
        return (f"--config-dir {config_dir} can't be read by this user (mode {mode}); make it "
                "readable, or give another")  # fmt: skip
    folders = [os.path.join(config_dir, group) for group in groups]
    if any(os.path.isdir(folder) for folder in folders):
        if locked := [f for f in folders if os.path.isdir(f) and not os.access(f, readable)]:
            return (f"--config-dir {config_dir}: {locked[0]} can't be read by this user; make "
                    "it readable, or give another folder")  # fmt: skip
        return None
    inside = os.path.basename(os.path.normpath(config_dir)) in groups
    parent = os.path.dirname(os.path.normpath(os.path.abspath(config_dir)))
    fix = (f"it is a group's folder itself: give its parent, --config-dir {parent}" if inside
           else f"point it at the folder that holds {DEPLOYMENT_GROUP}/")  # fmt: skip
    return (f"--config-dir {config_dir} holds none of the folders of the config groups "
            f"composed here ({', '.join(g + '/' for g in groups)}), so it adds nothing "
            f"({DEPLOYMENT_GROUP}=NAME is read from DIR/{DEPLOYMENT_GROUP}/NAME.yaml); "
            f"{fix}")  # fmt: skip


def _group_value_problem(on: Composition) -> str | None:
    """An override of a config group whose value is no plain option name, or an unread key."""
    for override in on.overrides:
        group, value = override.key_or_group, override.value()
        options = on.options(group)
        text = (override.input_line or "").partition("=")[2]
        if (override.is_add() or override.is_force_add()) and "." not in group and not options:
            return (f"{override.input_line} adds a key {group!r} at the top of the config, "
                    "which nothing reads; set one of the settings, or add a resource under "
                    "resources")  # fmt: skip
        if override.is_add() and options and group in on.choices:
            return (f"{override.input_line} adds a second {group}, and the config picks one "
                    f"already; pick yours without the +: {group}={text}")  # fmt: skip
        if override.is_delete() and not options and (problem := on.deletion_problem(override)):
            return problem
        if override.is_delete() or not options or (isinstance(value, str) and value in options):
            continue
        if isinstance(value, list):
            why = f": {group}= takes one name, and a list would merge several"
            return not_a_choice(group, text, options, why, closest=False)
        if not isinstance(value, str) and text in options:  # `inf`, `null`, `1e3`: an option
            kind = "boolean" if isinstance(value, bool) else "number"
            read_as = "null, no value" if value is None else f"the {kind} {value!r}"
            return (f"{group}={text} is read as {read_as}, not as the name {text!r} of the "
                    f"{group} there is; quote it: {group}='{text}' (in a shell, "
                    f"\"{group}='{text}'\")")  # fmt: skip
        if not isinstance(value, str) or value in (".", "..") or "/" in value:
            why = f": {group}= takes a name, not a path" if isinstance(value, str) else ""
            return not_a_choice(group, text, options, why)
    return None


def register_options_resolver(config_name: str) -> None:
    """Register the resolvers of the help of ``config_name``: ``${mstar_resources.options:GROUP}``
    (``GROUP,KEY``: the options that set KEY) and ``${mstar_resources.shown:VALUE}``."""

    def sets(group: str, option: str, key: str) -> bool:  # the config with group=option sets key
        try:
            return hydra.compose(config_name, overrides=[f"{group}={option}"]).get(key) is not None
        except COMPOSE_ERRORS:  # a broken option of the user's: --help lists it, unread
            return False

    def options(group: str, key: str | None = None) -> str:
        names = group_options(group, config_name)
        return ", ".join(n for n in names if key is None or sets(group, n, key))

    def command_line_form(value: object) -> str:  # ``null``, ``true``, an enum's name
        if isinstance(value, bool) or value is None:
            return {True: "true", False: "false", None: "null"}[value]
        return str(getattr(value, "name", value))

    OmegaConf.register_new_resolver(RESOLVERS[0], options, replace=True)
    OmegaConf.register_new_resolver(RESOLVERS[1], command_line_form, replace=True)
