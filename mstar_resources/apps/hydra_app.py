"""Hydra apps that tell a user's mistake in one paragraph and keep the app's own bugs loud.

The library's own console scripts are built with :func:`hydra_app`, and an engine can build its
entry point with it too (``tests/engine/app.py`` does)::

    @hydra_app("my-engine", config_name="engine", config_path="conf")
    def main(cfg: DictConfig) -> None:
        pools = build_pools(cfg.resources, "cuda")

What the user got wrong (an override Hydra cannot compose, a :class:`ResourceConfigError` from the
app) ends in one paragraph on stderr and exit status 2, told from the exceptions' fields
(``hydra_errors.py``). Anything else the app raises keeps its traceback, as Hydra's
``run_and_report`` keeps it: from the app's entry point down to where it was raised, without
Hydra's frames, exit status 1. Set ``HYDRA_FULL_ERROR=1`` for Hydra's full traceback of a
compose error instead.

``@hydra.main`` composes the config twice (once to read ``hydra.mode``), which doubles a dry run's
time. An app made with ``compose_once=True`` (the library's own, whose configs set no log files
and no output folders) composes a plain run (overrides only) once, through Hydra's Compose API,
and calls the function; anything with a flag (``--help``, ``--cfg job``, ``--info``, ...) still goes
to ``@hydra.main``. ``-m`` is refused: Hydra's sweeper writes ``multirun.yaml``, and these apps
write nothing to disk. ``--version`` names the app and this package's version.

What the apps refuse before composing, each in one paragraph and exit status 2: a sweep
(``key=1,2``: they run once), Hydra's own config groups (``hydra/job_logging=...``) in an app
made with ``compose_once``, ``--shell-completion`` without ``install=SHELL`` or
``uninstall=SHELL``, and a config group's value that is not one plain option name
(``deployment=../x``, ``deployment=[a,b]``, ``deployment=null``). A config file that is not
YAML, or not UTF-8, is named with its line.

Ctrl-C ends an app with one line (``PROG: interrupted``) and exit status 130. A reader that goes
away (``| head -1``) ends it quietly with status 0, whether or not it went before the output was
all written: what was printed was all it wanted. Any other failure to write stdout (a full disk,
``> /dev/full``, a closed stdout) is one line and exit status 2.

Help templates may list a config group's options with ``${mstar_resources.options:GROUP}`` (every
option, the engine's own included) and ``${mstar_resources.options:GROUP,KEY}`` (those whose
composed config sets ``KEY``); the resolver is registered while the app runs, never at import.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.metadata
import importlib.resources
import inspect
import os
import posixpath
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import hydra
import yaml
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.utils import configure_log
from hydra.errors import HydraException, MissingConfigException
from hydra.version import VersionBase
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ..calibration.profile import PROFILE_KEY
from ..calibration.record import RECORD_KEY
from ..errors import ResourceConfigError, ResourceUsageError
from ..resolver import RESOURCES_KEY
from .hydra_errors import (
    DEPLOYMENT_GROUP,
    explain,
    not_a_choice,
    not_a_primary_config,
    not_utf8,
    not_yaml,
)
from .stdout import StdoutFailed, stdout_watched

__all__ = [
    "compose_deployment",
    "fail",
    "hydra_app",
    "package_version",
    "register_options_resolver",
    "register_settings",
]

SHIPPED_CONF = "pkg://mstar_resources.conf"
"""Where the library's config tree is, for Hydra."""

MULTIRUN_FLAGS = frozenset({"-m", "--multirun"})
VERSION_FLAG = "--version"
OPTIONS_RESOLVER = "mstar_resources.options"
SHOWN_RESOLVER = "mstar_resources.shown"
INTERRUPTED = 130
"""The exit status of a run ended by Ctrl-C: 128 + SIGINT, as a shell reports it."""
COMPOSE_ERRORS = (
    HydraException,
    OmegaConfBaseException,
    yaml.YAMLError,
    ValueError,
    OSError,
    RecursionError,
)
"""What composing may raise that :func:`_told` can tell as a mistake in a file or a name."""
SHELL_COMPLETION = ("install", "uninstall", "query")
"""What Hydra's ``--shell-completion`` does, one at a run (``install=bash`` prints the script)."""


def fail(prog: str, message: str) -> NoReturn:
    """Print ``prog: error: message`` on stderr and exit with status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def register_settings(config_name: str, settings: type) -> None:
    """Register ``settings``, the schema of an app's own settings, in Hydra's ConfigStore as
    ``<config_name>_settings``, the name its primary config ``config_name`` lists first. An app
    does it when it runs; a program composing that primary config itself does it first."""
    ConfigStore.instance().store(
        name=f"{config_name}_settings", node=settings, provider="mstar-resources"
    )


def compose_deployment(
    config_name: str, deployment: str, config_dir: Path | None = None, *, settings: type
) -> DictConfig:
    """The shipped primary config ``config_name`` composed with ``deployment=<deployment>``, the
    deployment found in ``config_dir``'s ``deployment/`` folder where given, with the rules of
    ``mstar-resources --config-dir <config_dir> deployment=<deployment>``: a mistake in a file or
    a name raises :class:`ResourceConfigError`, told in the words the apps use. For a program
    that is no app (an engine's plugin): Hydra's global state, where the program initialised
    it, is set aside while composing and given back after. ``settings`` types the primary
    config's top (:func:`register_settings`)."""
    register_settings(config_name, settings)
    overrides = [f"{DEPLOYMENT_GROUP}={deployment}"]
    line = argparse.Namespace(
        config_dir=None if config_dir is None else str(config_dir),
        config_name=None,
        overrides=list(overrides),
    )
    folders = [_config_folder(SHIPPED_CONF, compose_deployment)]
    if config_dir is not None:
        overrides.append(f"hydra.searchpath=[file://{config_dir}]")
        folders.append(config_dir)
    with _hydra_set_aside(), _config_source(SHIPPED_CONF, compose_deployment):
        try:
            return compose(config_name, overrides=overrides)
        except COMPOSE_ERRORS as error:
            listed = functools.partial(_group_options, config_name=config_name)
            told = _told(error, line, listed, folders)
            if told is None:
                raise
            raise ResourceConfigError(told) from None


def deployment_options(config_name: str) -> list[str]:
    """The shipped deployments, by name (those starting with ``_`` left out)."""
    with _hydra_set_aside(), _config_source(SHIPPED_CONF, compose_deployment):
        names = _group_options(DEPLOYMENT_GROUP, config_name)
    return sorted(name for name in names if not name.startswith("_"))


@contextlib.contextmanager
def _hydra_set_aside() -> Iterator[None]:
    """Hydra's global state (the initialised Hydra, its version base) as the program had it, given
    back on the way out: Hydra's own ``initialize_*`` refuse to run where it is initialised."""
    instance = GlobalHydra.instance()
    program_hydra = instance.hydra
    base = VersionBase.instance().version_base
    instance.clear()
    try:
        yield
    finally:
        GlobalHydra.set_instance(instance)  # the program's own object, as it was
        instance.clear()
        if program_hydra is not None:
            instance.initialize(program_hydra)
        VersionBase.instance().version_base = base


def package_version() -> str:
    """This package's installed version."""
    return importlib.metadata.version("mstar-resources")


class _RaisedByTheApp(BaseException):
    """Carries what the app's own code raised past Hydra's job runner and its error report (which
    catch ``Exception`` only), to be raised again, unchanged, by the entry point."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


def hydra_app(
    prog: str,
    config_name: str,
    config_path: str = SHIPPED_CONF,
    *,
    compose_once: bool = False,
    command: str | None = None,
    version: str | Callable[[], str] | None = None,
    settings: type | None = None,
) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:
    """Make ``run(cfg)`` the ``main()`` of a Hydra app over ``config_path``/``config_name``.

    ``config_path`` is ``pkg://<package>`` or a folder relative to ``run``'s module, as for
    ``@hydra.main``. ``prog`` starts each error line; ``command`` is how a user runs the app
    (``python scripts/replay.py``; default ``prog``), which errors name for ``--help``.
    ``version`` (or a function that returns it) is what ``--version`` prints after ``prog``;
    without it, ``--version`` names the mstar-resources it was built with.
    ``settings``: the dataclass that types the app's own settings, registered in Hydra's
    ConfigStore as ``<config_name>_settings`` when the app runs (its primary config lists it
    first in its defaults), so that no other app's or engine's ConfigStore holds it.
    ``compose_once``: compose a plain run once (see the module's docstring); only for a config
    that sets ``hydra/job_logging: none`` and no output folder, since the run then skips Hydra's
    job set-up.
    """

    def decorate(run: Callable[[DictConfig], None]) -> Callable[[], None]:
        app = _App(
            prog, command or prog, config_name, config_path, run, compose_once, version, settings
        )

        def main() -> None:
            if settings is not None:
                register_settings(config_name, settings)
            app.main(sys.argv[1:])

        main.__doc__ = f"The entry point of {prog}."
        return main

    return decorate


class _App:
    """One app of :func:`hydra_app`: ``run`` behind Hydra, with what the module's docstring says
    it refuses, reports and keeps."""

    def __init__(
        self,
        prog: str,
        invoked: str,
        config_name: str,
        config_path: str,
        run: Callable[[DictConfig], None],
        compose_once: bool,
        version: str | Callable[[], str] | None,
        settings: type | None = None,
    ) -> None:
        self.prog, self.invoked, self.version = prog, invoked, version
        self.config_name, self.config_path, self.run = config_name, config_path, run
        self.compose_once = compose_once
        self.settings = settings
        """The dataclass of the app's settings (``hydra_app``'s ``settings``), where given."""
        self.full_error = _FullError()
        self.task = self._task(run)
        self.hydra_main = hydra.main(
            version_base="1.3", config_path=config_path, config_name=config_name
        )(self.task)

    def _task(self, run: Callable[[DictConfig], None]) -> Callable[[DictConfig], None]:
        """``run`` as Hydra calls it: the user's mistakes told, the app's own errors carried out."""

        @functools.wraps(run)  # Hydra finds a relative config_path beside ``run``'s module
        def task(cfg: DictConfig) -> None:
            # Raised out of here, an error would reach Hydra's job runner, which reports it as a
            # failed job; a BaseException passes it by.
            with self.full_error.as_the_user_set_it():
                try:
                    run(cfg)
                except ResourceUsageError as error:  # the app's own bug: its traceback
                    raise _RaisedByTheApp(error) from None
                except ResourceConfigError as error:
                    fail(self.prog, str(error))
                except (SystemExit, KeyboardInterrupt, StdoutFailed):
                    raise
                except BaseException as error:
                    raise _RaisedByTheApp(error) from None

        return task

    def main(self, args: list[str]) -> None:
        """Run on the command line's ``args``: how each way out ends (module docstring)."""
        try:
            with _options_resolver(self.config_name), stdout_watched():
                self._start(args)
        except _RaisedByTheApp as carried:
            error = carried.error
        except StdoutFailed as failed:
            failed.end(self.prog)
        except KeyboardInterrupt:
            print(f"{self.prog}: interrupted", file=sys.stderr)
            raise SystemExit(INTERRUPTED) from None
        else:
            return
        raise error  # out of the except clause: the error keeps its own context

    def _start(self, args: list[str]) -> None:
        prog, invoked = self.prog, self.invoked
        if VERSION_FLAG in args:
            print(f"{prog} {self._version()}")
            return
        if MULTIRUN_FLAGS & set(args):
            fail(
                prog,
                "-m (--multirun) is not supported: Hydra's sweeper would run a job per value "
                f"and write multirun.yaml beside them; run {prog} once per value instead",
            )
        refused = _refused(prog, invoked, args, compose_once=self.compose_once)
        if refused is not None:
            fail(prog, refused)
        line = _command_line(args)
        config_dir = line.config_dir if line is not None else None
        folders = [_config_folder(self.config_path, self.run)]
        if config_dir is not None:
            folders.append(Path(config_dir).resolve())
        listed = functools.partial(self._listed, config_dir=config_dir)

        # Before composing, which would merge `deployment=[a,b]` without a word and compose
        # `deployment=../resources/default` forever.
        overrides = _parsed(line.overrides) if line is not None else []
        refused = (
            _group_value_problem(overrides, listed)
            or _added_at_the_top(overrides, listed)
            or _app_settings_in_deployment(overrides, folders, self.settings)
        )
        if refused is not None:
            fail(prog, f"{refused}; `{invoked} --help` lists the settings")
        reported = functools.partial(
            _compose_errors_reported, prog, invoked, line, listed, self.full_error, folders
        )
        if not self.compose_once or any(arg.startswith("-") for arg in args):
            with reported():
                self.hydra_main()
            return
        with _config_source(self.config_path, self.run):
            with reported():
                cfg = compose(self.config_name, overrides=args, return_hydra_config=True)
            # What @hydra.main does before it calls the task (HydraConfig.get() in the app, its
            # logging config), which the compose API leaves undone; hydra.core's own calls.
            HydraConfig.instance().set_config(cfg)
            configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
            with open_dict(cfg):
                del cfg["hydra"]
            self.task(cfg)

    def _version(self) -> str:
        """What ``--version`` prints after the program's name."""
        if self.version is None:
            return f"(built with mstar-resources {package_version()})"
        return self.version if isinstance(self.version, str) else self.version()

    def _listed(self, group: str, config_dir: str | None) -> list[str]:
        """The options of config group ``group`` ("": the primary configs) where the app finds
        its configs, and in the user's ``--config-dir``."""
        composing = GlobalHydra.instance().is_initialized()  # no --config-dir then
        with _hydra_initialized(self.config_path, self.run):
            names = set(_group_options(group, self.config_name))
        if not group:  # the other primary configs there are other apps'
            names &= {self.config_name}
        if config_dir is not None and os.path.isdir(config_dir) and not composing:
            with initialize_config_dir(os.path.abspath(config_dir), version_base="1.3"):
                names |= set(_group_options(group, None))
        if not group:  # the app's settings schemas are no primary configs
            stored = ConfigStore.instance().list("")
            names -= {name.removesuffix(".yaml") for name in stored if name.endswith(".yaml")}
        return sorted(name for name in names if not name.startswith("_"))


class _FullError:
    """``HYDRA_FULL_ERROR=1`` while Hydra composes, so that @hydra.main raises its errors rather
    than printing them; as the user set it (or unset) while the app's own code runs, and after.

    Hydra's public API gives no other way: ``@hydra.main`` reports a compose error itself (its
    text, exit status 1) unless that variable is set, and the one-paragraph error with exit
    status 2 needs the exception. The variable is restored before the app's code runs and when
    the call ends, so nothing of it outlives the call."""

    def __init__(self) -> None:
        self._user: str | None = None

    @contextlib.contextmanager
    def while_composing(self) -> Iterator[None]:
        self._user = os.environ.get("HYDRA_FULL_ERROR")
        os.environ["HYDRA_FULL_ERROR"] = "1"
        try:
            yield
        finally:
            self._restore()

    @contextlib.contextmanager
    def as_the_user_set_it(self) -> Iterator[None]:
        composing = os.environ.get("HYDRA_FULL_ERROR") == "1" and self._user != "1"
        self._restore()
        try:
            yield
        finally:
            if composing:
                os.environ["HYDRA_FULL_ERROR"] = "1"

    @property
    def user_asked(self) -> bool:
        """Whether the user set ``HYDRA_FULL_ERROR=1`` for Hydra's full tracebacks."""
        return self._user == "1"

    def _restore(self) -> None:
        if self._user is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = self._user


@contextlib.contextmanager
def _compose_errors_reported(
    prog: str,
    invoked: str,
    line: argparse.Namespace | None,
    listed: Callable[[str], list[str]],
    full_error: _FullError,
    folders: list[Path],
) -> Iterator[None]:
    """Hydra's and OmegaConf's compose errors raised inside as :func:`fail`."""
    try:
        with full_error.while_composing():
            yield
    except COMPOSE_ERRORS as error:
        if full_error.user_asked:
            raise
        told = _told(error, line, listed, folders)
        if told is None:
            raise
        fail(prog, f"{told}; `{invoked} --help` lists the settings")


def _told(
    error: BaseException,
    line: argparse.Namespace | None,
    listed: Callable[[str], list[str]],
    folders: list[Path],
) -> str | None:
    """``error``, raised while composing the command ``line``, as one paragraph; None where it is
    not a mistake in ``line`` or in a config file (a ``ValueError`` or ``OSError`` of Hydra's that
    no override explains). ``listed(group)`` names a config group's options; ``folders`` are where
    the app's config files are."""
    overrides = _parsed(line.overrides) if line is not None else []
    if isinstance(error, yaml.YAMLError):
        return not_yaml(error)
    if isinstance(error, RecursionError):
        given = " ".join(line.overrides) if line is not None and line.overrides else "the config"
        return (
            f"composing {given} never ends: a defaults list names a config that lists it again, "
            "itself or through others (a deployment whose defaults list names that deployment, "
            "say); remove the name from that list"
        )
    if isinstance(error, UnicodeDecodeError):
        return _undecodable(error, folders)
    if line is not None and line.config_name:
        configs = listed("")
        missing = (
            isinstance(error, MissingConfigException)
            and error.options is None
            and _names_config(line.config_name, error.missing_cfg_file)
        )
        if missing or line.config_name.removesuffix(".yaml") not in configs:  # another app's
            return not_a_primary_config(line.config_name, configs)
    if isinstance(error, HydraException | OmegaConfBaseException):
        told = explain(error)
        chosen = next((o.value() for o in overrides if o.key_or_group == DEPLOYMENT_GROUP), None)
        if told.startswith(f"{DEPLOYMENT_GROUP} is not a setting: a deployment file") and (
            line is not None and line.config_dir and isinstance(chosen, str)
        ):
            path = Path(line.config_dir) / DEPLOYMENT_GROUP / f"{chosen}.yaml"
            if path.is_file():
                told = told.replace("a deployment file was", f"the deployment file {path} was")
        return told
    for override in overrides:
        key, value = override.key_or_group, override.value()
        if (
            isinstance(error, OSError)
            and error.filename
            and isinstance(value, str)
            and len(value) > 80
            and value in str(error.filename)
        ):
            # Hydra looked the value up as a file of the config group: it is the value that is
            # too long for one.
            shown = f"{value[:80]}... ({len(value):,} characters)"
            return not_a_choice(key, shown, listed(key), ": no option has so long a name",
                                closest=False)  # fmt: skip
        if isinstance(error, OSError) and error.filename and key in str(error.filename):
            # Hydra looks a key up as a config group on disk first; no setting is that long.
            shown = key if len(key) <= 80 else f"{key[:80]}... ({len(key)} characters)"
            return f"{shown} is not a setting: no setting or config group has so long a name"
    return None


_MAX_DIGITS = 4000
"""The most digits a number on the command line may have: Python reads no more than 4,300."""


def _command_line(args: list[str]) -> argparse.Namespace | None:
    """``args`` as Hydra reads them (its flags, and the overrides); None where it can't."""
    try:
        return _HYDRA_FLAGS.parse_known_args(args)[0]
    except argparse.ArgumentError:
        return None


def _hydra_flags() -> argparse.ArgumentParser:
    """The command line ``@hydra.main`` takes (Hydra 1.3's documented flags), to read the config
    folder, the config name and the overrides the way Hydra will before it composes. Hydra's own
    parser is private (``hydra._internal``); the flags are its public interface."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for flags in (
        ("--help", "-h"),
        ("--hydra-help",),
        ("--version",),
        ("--resolve",),
        ("--run", "-r"),
        ("--multirun", "-m"),
        ("--shell-completion", "-sc"),
    ):
        parser.add_argument(*flags, action="store_true")  # fmt: skip
    parser.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
    for flags in (
        ("--package", "-p"),
        ("--config-path", "-cp"),
        ("--config-name", "-cn"),
        ("--config-dir", "-cd"),
        ("--experimental-rerun",),
    ):
        parser.add_argument(*flags)  # fmt: skip
    parser.add_argument("--info", "-i", nargs="?", const="all")
    parser.add_argument("overrides", nargs="*")
    return parser


_HYDRA_FLAGS = _hydra_flags()


def _parsed(overrides: list[str]) -> list[Override]:
    """``overrides`` parsed; [] where one is no override Hydra can read (composing says so)."""
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return []


def _refused(prog: str, invoked: str, args: list[str], *, compose_once: bool) -> str | None:
    """What in ``args`` the app does not run, told before anything is composed, or None."""
    line = _command_line(args)
    if line is None:
        return None
    if line.config_dir is not None and not os.path.isdir(line.config_dir):
        what = "a file" if os.path.exists(line.config_dir) else "not there"
        return (
            f"--config-dir {line.config_dir} is {what}; it takes a folder of configs (one with "
            "a deployment/ folder, as mstar-resources-calibrate writes it)"
        )
    for override in line.overrides:
        key, _, value = override.partition("=")
        digits = value.strip().lstrip("+-")
        if len(digits) > _MAX_DIGITS and digits.isdecimal():
            # Python's int() refuses so many digits; Hydra's parser would end in its traceback.
            return (
                f"{key}={value.strip()[:12]}... has {len(digits):,} digits, a number larger than "
                "any setting takes; give a smaller one"
            )
    overrides = _parsed(line.overrides)
    if line.shell_completion:
        asked = [o.key_or_group for o in overrides if o.key_or_group in SHELL_COMPLETION]
        if len(asked) == 1:
            return None
        given = " ".join(line.overrides) if line.overrides else "alone"
        return (
            f"--shell-completion {given} is not supported: it takes one of "
            "install=SHELL or uninstall=SHELL (SHELL: bash, zsh or fish), e.g. "
            f'eval "$({invoked} --shell-completion install=bash)"'
        )
    for override in overrides:
        key = override.key_or_group
        if override.is_sweep_override():
            return (
                f"{override.input_line} is a sweep (one run per value), and {prog} runs once; "
                f"give {key} one value and run {prog} once per value, or write a list as "
                f"{key}=[a,b] and a string with commas quoted, {key}='a,b'"
            )
        if compose_once and key.startswith("hydra/"):
            return (
                f"{override.input_line} is not supported: {prog} runs without Hydra's job "
                "set-up (no log files, no output folders), so Hydra's own config groups stay "
                f"as its config sets them; leave {key} out"
            )
    return None


def _added_at_the_top(overrides: list[Override], listed: Callable[[str], list[str]]) -> str | None:
    """An override that adds a key at the top of the config (``+foo=1``), which no app reads: its
    settings and the tree's keys are all there already (a resource is added under ``resources``,
    ``+resources.attn.verify.labels=[verify]``). Config groups are Hydra's to refuse."""
    for override in overrides:
        key = override.key_or_group
        added = override.is_add() or override.is_force_add()
        if added and "." not in key and not listed(key):
            return (
                f"{override.input_line} adds a key {key!r} at the top of the config, which "
                "nothing reads; set one of the settings, or add a resource under resources"
            )
    return None


DEPLOYMENT_KEYS = ("defaults", RESOURCES_KEY, PROFILE_KEY, RECORD_KEY)
"""The top-level keys a deployment file may set: the app's own settings come after it in the
primary config, which would override a deployment's without a word."""


def _app_settings_in_deployment(
    overrides: list[Override], folders: list[Path], settings: type | None
) -> str | None:
    """A deployment file (the one ``deployment=NAME`` picks, the user's ``--config-dir`` first)
    that sets one of the app's ``settings``, such as ``format`` or ``device``, or None. Its
    values would be overridden by the primary config's own; a key that is no setting, and a
    file Hydra cannot read, are Hydra's to report."""
    if settings is None or not dataclasses.is_dataclass(settings):
        return None
    taken = {field.name for field in dataclasses.fields(settings)} - set(DEPLOYMENT_KEYS)
    chosen = next(
        (o.value() for o in overrides if o.key_or_group == DEPLOYMENT_GROUP and not o.is_delete()),
        None,
    )
    if not isinstance(chosen, str):
        return None
    for folder in reversed(folders):
        path = folder / DEPLOYMENT_GROUP / f"{chosen}.yaml"
        try:
            body = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        keys = body if isinstance(body, dict) else {}
        extra = [key for key in keys if key in taken]
        if extra:
            return (
                f"{DEPLOYMENT_GROUP}={chosen} ({path}) sets {', '.join(map(str, extra))}, the "
                "app's own settings, which its primary config would override without a word: "
                f"give them on the command line ({extra[0]}=...), and declare only "
                f"{', '.join(DEPLOYMENT_KEYS[1:])} in a deployment; take them out of the file"
            )
        return None
    return None


def _group_value_problem(
    overrides: list[Override], listed: Callable[[str], list[str]]
) -> str | None:
    """An override of a config group whose value is not one plain option name (a list, a path,
    null, a number), or None. Hydra would merge a list's options, read a path as a file beside
    the group's, and refuse the rest in words of its own."""
    for override in overrides:
        if override.is_delete() or override.is_sweep_override():
            continue
        group, value = override.key_or_group, override.value()
        options = listed(group)
        if not options or (isinstance(value, str) and value in options):
            continue
        text = (override.input_line or "").partition("=")[2]
        if isinstance(value, list):
            why = f": {group}= takes one name, and a list would merge several"
            return not_a_choice(group, text, options, why, closest=False)
        if not isinstance(value, str) and text in options:  # `inf`, `null`, `1e3`: an option
            read_as = (
                "null, no value" if value is None
                else f"the {'boolean' if isinstance(value, bool) else 'number'} {value!r}"
            )  # fmt: skip
            return (
                f"{group}={text} is read as {read_as}, not as the name {text!r} of the {group} "
                f"there is; quote it: {group}='{text}' (in a shell, \"{group}='{text}'\")"
            )
        if not isinstance(value, str):
            return not_a_choice(group, text, options)
        if value in (".", "..") or posixpath.basename(value) != value:
            return not_a_choice(group, text, options, f": {group}= takes a name, not a path")
    return None


def _undecodable(error: UnicodeDecodeError, folders: list[Path]) -> str | None:
    """``error``, met reading a config file, as a sentence naming the file and the line; None
    where no YAML file in ``folders`` (where the app's configs are) holds the bytes it could not
    decode (``error.object``)."""
    if not error.object:
        return None
    for folder in folders:
        for path in sorted(folder.rglob("*.yaml")):
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if bytes(error.object) in data:
                try:
                    data.decode(error.encoding)
                except UnicodeDecodeError as found:
                    return not_utf8(str(path), data, found)
    return None


def _names_config(given: str, missing: str | None) -> bool:
    """Whether ``--config-name=given`` is the config Hydra reports ``missing``."""
    return missing is not None and given.strip("/").removesuffix(".yaml") == missing.removesuffix(
        ".yaml"
    )


def _group_options(group: str, config_name: str | None) -> list[str]:
    """The options of config group ``group`` (with the primary config's search path), or [].

    Hydra's compose API composes but lists nothing; its config loader (``hydra.core``'s
    interface, what Hydra's own ``--help`` lists groups with) is the one public way to list a
    group over the whole search path, an engine's ``hydra.searchpath`` included."""
    if not GlobalHydra.instance().is_initialized():
        return []
    loader = GlobalHydra.instance().config_loader()
    try:
        return loader.get_group_options(group, config_name=config_name)
    except (HydraException, OSError):  # a key too long for a folder's name, ...
        return []


def register_options_resolver(config_name: str) -> None:
    """Register ``${mstar_resources.options:GROUP[,KEY]}`` for the help template of the app whose
    primary config is ``config_name``: a config group's options (the engine's own and the
    library's), or those whose composed config sets ``KEY``; and
    ``${mstar_resources.shown:VALUE}``, a value as the command line writes it
    (:func:`shown_on_the_command_line`). :func:`hydra_app` does it while its
    app runs; an engine on plain ``@hydra.main`` calls it once before its ``main()`` (README,
    "Plain @hydra.main")."""

    def options(group: str, key: str | None = None) -> str:
        names = _group_options(group, config_name)
        if key is not None:
            names = [name for name in names if _composes_with(config_name, group, name, key)]
        return ", ".join(names)

    OmegaConf.register_new_resolver(OPTIONS_RESOLVER, options, replace=True)
    OmegaConf.register_new_resolver(SHOWN_RESOLVER, shown_on_the_command_line, replace=True)


def shown_on_the_command_line(value: object) -> str:
    """``value`` as one gives it on the command line: ``null``, ``true``, ``false``, an enum's
    name; the rest as ``str`` writes it (``${mstar_resources.shown:${key}}`` in a help template)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(getattr(value, "name", value))


@contextlib.contextmanager
def _options_resolver(config_name: str) -> Iterator[None]:
    """:func:`register_options_resolver` while the app runs, and cleared after."""
    register_options_resolver(config_name)
    try:
        yield
    finally:
        OmegaConf.clear_resolver(OPTIONS_RESOLVER)
        OmegaConf.clear_resolver(SHOWN_RESOLVER)


def _composes_with(config_name: str, group: str, option: str, key: str) -> bool:
    """Whether the primary config with ``group=option`` sets ``key``."""
    try:
        cfg = compose(config_name, overrides=[f"{group}={option}"])
    except (HydraException, OmegaConfBaseException):
        return False
    return cfg.get(key) is not None


def _hydra_initialized(
    config_path: str, run: Callable[..., object]
) -> contextlib.AbstractContextManager[object]:
    """Hydra as it is where it is initialized (composing), else on ``config_path``."""
    if GlobalHydra.instance().is_initialized():
        return contextlib.nullcontext()
    return _config_source(config_path, run)


def _config_folder(config_path: str, run: Callable[..., object]) -> Path:
    """The folder of the app's own configs, as @hydra.main would find it for ``run``."""
    if config_path.startswith("pkg://"):
        return Path(str(importlib.resources.files(config_path.removeprefix("pkg://"))))
    return (Path(inspect.getfile(run)).parent / config_path).resolve()


def _config_source(
    config_path: str, run: Callable[..., object]
) -> contextlib.AbstractContextManager[object]:
    """Hydra initialised on ``config_path`` as @hydra.main would find it for ``run``."""
    if config_path.startswith("pkg://"):
        return initialize_config_module(config_path.removeprefix("pkg://"), version_base="1.3")
    folder = Path(inspect.getfile(run)).parent / config_path
    return initialize_config_dir(str(folder.resolve()), version_base="1.3")
