"""Hydra apps that end a user's mistake in one paragraph on stderr, status 2 (``HYDRA_FULL_ERROR=1``
keeps Hydra's traceback), and keep the app's own bugs loud: their traceback, status 1.

Each run is composed first with Hydra's Compose API, on the search path ``@hydra.main`` builds, so
that a compose error is an exception to explain (``hydra_errors.py``). A ``compose_once`` app (its
configs set no log files and no output folders) runs on that config; a run with a flag (``--help``,
``--cfg job``), and any other app, go on to ``@hydra.main``."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.metadata
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import hydra
import yaml
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import configure_log
from hydra.errors import HydraException
from hydra.version import VersionBase
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ..calibration.deployments import shipped_deployments
from ..errors import ResourceConfigError
from . import hydra_errors
from .hydra_errors import DEPLOYMENT_GROUP, not_a_choice
from .settings import ComposedTree
from .stdout import guarded_stdout

__all__ = ["compose_deployment", "fail", "hydra_app", "package_version",
           "register_options_resolver", "register_settings"]  # fmt: skip

SHIPPED_CONF = "pkg://mstar_resources.conf"
RESOLVERS = ("mstar_resources.options", "mstar_resources.shown")
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, yaml.YAMLError, ValueError, OSError,
                  RecursionError)  # fmt: skip
MAX_DIGITS = 4000  # Python's int() reads no more; Hydra's parser would end in its traceback
# The flags of @hydra.main (Hydra 1.3; its parser is hydra._internal) that take a value, and the
# one read here: any other flag, or a line this can't read, goes on to @hydra.main.
FLAGS = argparse.ArgumentParser(add_help=False, exit_on_error=False)
FLAGS.add_argument("-sc", "--shell-completion", action="store_true")
for flag in ("-p --package", "-cp --config-path", "-cn --config-name", "-cd --config-dir",
             "--experimental-rerun"):  # fmt: skip
    FLAGS.add_argument(*flag.split())
FLAGS.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
FLAGS.add_argument("--info", "-i", nargs="?", const="all")
FLAGS.add_argument("overrides", nargs="*")


def fail(prog: str, message: str) -> NoReturn:
    """Print ``prog: error: message`` on stderr and exit with status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def register_settings(config_name: str, settings: type) -> None:
    """Store the schema of an app's own settings as ``<config_name>_settings``, which its primary
    config ``config_name`` lists first."""
    ConfigStore.instance().store(f"{config_name}_settings", settings, provider="mstar-resources")


def package_version() -> str:
    return importlib.metadata.version("mstar-resources")


def compose_deployment(
    config_name: str, deployment: str, config_dir: Path | None = None, *, settings: type
) -> DictConfig:
    """The shipped primary config ``config_name`` composed as ``mstar-resources --config-dir
    <config_dir> deployment=<deployment>`` composes it, for a program that is no app (an engine's
    plugin): a mistake raises :class:`ResourceConfigError`; the program's own Hydra is kept."""
    register_settings(config_name, settings)
    given = ["--config-dir", str(config_dir)] if config_dir else []
    line = FLAGS.parse_args([f"{DEPLOYMENT_GROUP}={deployment}", *given])
    with _hydra_on(SHIPPED_CONF, compose_deployment):
        return _Line(line, config_name).config(hydra=False)


def deployment_options(config_name: str) -> list[str]:
    """The shipped deployments, by name (those starting with ``_`` left out)."""
    with _hydra_on(SHIPPED_CONF, compose_deployment):
        return _options(DEPLOYMENT_GROUP, config_name)


@contextmanager
def _hydra_on(config_path: str, run: Callable[..., object]) -> Iterator[None]:
    """Hydra initialised on ``config_path`` as ``@hydra.main`` over ``run`` finds it; the program's
    own Hydra, which ``initialize_*`` refuse to run beside, given back after."""
    instance, base = GlobalHydra.instance(), VersionBase.instance().version_base
    program_hydra, instance.hydra = instance.hydra, None
    pkg = config_path.removeprefix("pkg://")
    folder = str((Path(inspect.getfile(run)).parent / config_path).resolve())
    try:
        with initialize_config_module(pkg, version_base="1.3") if pkg != config_path else (
            initialize_config_dir(folder, version_base="1.3")
        ):  # fmt: skip
            yield
    finally:  # initialize_*'s exit leaves a copy of the instance it found
        GlobalHydra.set_instance(instance)
        instance.hydra, VersionBase.instance().version_base = program_hydra, base


def _options(group: str, config_name: str | None, searchpath: tuple[str, ...] = ()) -> list[str]:
    """The options of config group ``group`` ("": primary configs), as Hydra's ``--help`` lists
    them, those starting with ``_`` left out."""
    try:
        loader = GlobalHydra.instance().config_loader()
        names = loader.get_group_options(group, config_name=config_name, overrides=[*searchpath])
    except (HydraException, OSError):  # a key too long for a folder's name, ...
        return []
    return sorted(name for name in names if not name.startswith("_"))


class _RaisedByTheApp(BaseException):
    """What the app's own code raised (``args[0]``), carried past Hydra's job runner and its error
    report, which catch ``Exception`` only, to be raised again, unchanged, by the entry point."""


def hydra_app(
    prog: str, config_name: str, config_path: str = SHIPPED_CONF, *, compose_once: bool = False,
    command: str | None = None, version: str | Callable[[], str] | None = None,
    settings: type | None = None,
) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:  # fmt: skip
    """Make ``run(cfg)`` the ``main()`` of a Hydra app over ``config_path``/``config_name`` (as for
    ``@hydra.main``). ``prog`` starts each error line; ``command``, how a user runs the app, is
    named for ``--help``; ``--version`` prints ``version`` (or what it returns), else the
    mstar-resources the app was built with; ``settings``, the app's own settings, are registered
    (:func:`register_settings`) when it runs, so that no other app's ConfigStore holds them."""
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
            except argparse.ArgumentError:
                return hydra_main()  # type: ignore[no-any-return]
            on = _Line(line, config_name)
            refusal = on.refusal(prog, invoked, compose_once)
            if refusal is not None:
                fail(prog, refusal)
            flags = [k for k, v in vars(line).items()
                     if v and k not in ("overrides", "config_dir", "config_name")]  # fmt: skip
            try:
                with _hydra_on(line.config_path or config_path, run):
                    problem = on.group_value_problem() or on.app_settings_in_deployment(settings)
                    if problem is not None:
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
            hydra_main()

        def main() -> None:
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


class _Line:
    """A command line as Hydra reads it, for an app whose primary config is ``config_name``: what
    the app refuses in it, its config, and what composing it raises as one paragraph. Only the
    user's files (``--config-dir``) are looked into: the shipped ones are tested."""

    def __init__(self, line: argparse.Namespace, config_name: str) -> None:
        self.line, self.config_name = line, config_name
        self.folder = Path(line.config_dir).resolve() if line.config_dir else None
        try:
            self.overrides = OverridesParser.create().parse_overrides(line.overrides)
        except (HydraException, ValueError):  # no override Hydra can read: composing says so
            self.overrides = []

    def options(self, group: str) -> list[str]:
        return _options(group, self.config_name, self.searchpath)

    @functools.cached_property
    def searchpath(self) -> tuple[str, ...]:
        """The override that adds ``--config-dir`` to the primary config's search path."""
        if not self.folder:
            return ()
        try:
            path = list(compose(self.config_name, return_hydra_config=True).hydra.searchpath)
        except COMPOSE_ERRORS:
            path = []
        return (f"hydra.searchpath=[{','.join([*path, f'file://{self.folder}'])}]",)

    def deployment_file(self) -> Path | None:
        """The file of the deployment the line picks, where the user's ``--config-dir`` has it."""
        names = [o.value() for o in self.overrides if o.key_or_group == DEPLOYMENT_GROUP]
        if self.folder and names and isinstance(names[0], str):
            path = self.folder / DEPLOYMENT_GROUP / f"{names[0]}.yaml"
            return path if path.is_file() else None
        return None

    def shadowed_file(self) -> str | None:
        """The user's deployment file the line picks, where a shipped deployment of its name
        would be composed in its place (Hydra's search path has ``--config-dir`` after the
        package's configs), so that the file would be ignored without a word."""
        path = self.deployment_file()
        if path is None or path.parent == shipped_deployments().resolve() or (
                path.stem not in _options(DEPLOYMENT_GROUP, self.config_name)):  # fmt: skip
            return None
        return (f"{DEPLOYMENT_GROUP}={path.stem} picks the shipped deployment of that name, not "
                f"{path}: Hydra finds the package's configs before a --config-dir's, so the file "
                f"would be ignored; rename it (e.g. to {path.stem}_mine.yaml) and use the new "
                "name")  # fmt: skip

    def refusal(self, prog: str, invoked: str, compose_once: bool) -> str | None:
        """What in the line the app does not run, found before anything is composed."""
        line, config_dir = self.line, self.line.config_dir
        if config_dir is not None and not os.path.isdir(config_dir):
            what = "a file" if os.path.exists(config_dir) else "not there"
            return (f"--config-dir {config_dir} is {what}; it takes a folder of configs (one with "
                    "a deployment/ folder, as mstar-resources-calibrate writes it)")  # fmt: skip
        for override in line.overrides:
            key, _, value = override.partition("=")
            digits = value.strip().lstrip("+-")
            if len(digits) > MAX_DIGITS and digits.isdecimal():
                return (f"{key}={value.strip()[:12]}... has {len(digits):,} digits, a number "
                        "larger than any setting takes; give a smaller one")  # fmt: skip
        if line.shell_completion and len([o for o in self.overrides if o.key_or_group in
                                          ("install", "uninstall", "query")]) != 1:  # fmt: skip
            given = " ".join(line.overrides) if line.overrides else "alone"
            return (f"--shell-completion {given} is not supported: it takes one of install=SHELL "
                    "or uninstall=SHELL (SHELL: bash, zsh or fish), e.g. "
                    f'eval "$({invoked} --shell-completion install=bash)"')  # fmt: skip
        for override in [] if line.shell_completion else self.overrides:
            key = override.key_or_group
            if override.is_sweep_override():
                return (f"{override.input_line} is a sweep (one run per value), and {prog} runs "
                        f"once; give {key} one value and run {prog} once per value, or write a "
                        f"list as {key}=[a,b] and a string with commas quoted, "
                        f"{key}='a,b'")  # fmt: skip
            if override.package is not None:  # Hydra's advice would be to append, with +
                value = override.get_value_string()
                return (f"{override.input_line} moves a config group to another package, which "
                        f"no setting here takes; set {key}={value}")  # fmt: skip
            if compose_once and key.startswith("hydra/"):
                return (f"{override.input_line} is not supported: {prog} runs without Hydra's job "
                        "set-up (no log files, no output folders), so Hydra's own config groups "
                        f"stay as its config sets them; leave {key} out")  # fmt: skip
        return None

    def group_value_problem(self) -> str | None:
        """An override of a config group whose value is no plain option name (Hydra would merge a
        list's options, or compose a path), or one adding a key at the top that no app reads."""
        for override in self.overrides:
            group, value = override.key_or_group, override.value()
            options = self.options(group)
            if (override.is_add() or override.is_force_add()) and "." not in group and not options:
                return (f"{override.input_line} adds a key {group!r} at the top of the config, "
                        "which nothing reads; set one of the settings, or add a resource under "
                        "resources")  # fmt: skip
            if override.is_delete() or not options or (isinstance(value, str) and value in options):
                continue
            text = (override.input_line or "").partition("=")[2]
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

    def app_settings_in_deployment(self, settings: type | None) -> str | None:
        """The deployment file the line picks, where it sets one of the app's ``settings``, which
        its primary config would override (a file Hydra cannot read is Hydra's to report)."""
        path = self.deployment_file()
        if path is None or not dataclasses.is_dataclass(settings):
            return None
        tree = [field.name for field in dataclasses.fields(ComposedTree)]
        taken = {field.name for field in dataclasses.fields(settings)} - set(tree)
        try:
            body = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None
        extra = [key for key in (body if isinstance(body, dict) else {}) if key in taken]
        return None if not extra else (
            f"{DEPLOYMENT_GROUP}={path.stem} ({path}) sets {', '.join(map(str, extra))}, the "
            "app's own settings, which its primary config would override without a word: give "
            f"them on the command line ({extra[0]}=...), and declare only {', '.join(tree)} in a "
            "deployment; take them out of the file")  # fmt: skip

    def config(self, full_error: bool = False, hydra: bool = True) -> DictConfig:
        """The line composed (with Hydra's config where ``hydra``), a mistake in it or in a config
        file raised as ResourceConfigError."""
        shadowed = self.shadowed_file()
        if shadowed is not None:
            raise ResourceConfigError(shadowed)
        try:
            overrides = [*self.line.overrides, *self.searchpath]
            return compose(self.line.config_name or self.config_name, overrides,
                           return_hydra_config=hydra)  # fmt: skip
        except COMPOSE_ERRORS as error:
            paragraph = None if full_error else self.paragraph(error)
            if paragraph is None:
                raise
            raise ResourceConfigError(paragraph) from None

    def paragraph(self, error: BaseException) -> str | None:
        """``error``, raised composing the line, as one paragraph; None where it is no mistake in
        the line or in a config file (a ``ValueError`` or ``OSError`` no override explains)."""
        if isinstance(error, yaml.YAMLError):
            return hydra_errors.not_yaml(error)
        if isinstance(error, RecursionError):
            given = " ".join(self.line.overrides) or "the config"
            return (f"composing {given} never ends: a defaults list names a config that lists it "
                    "again, itself or through others (a deployment whose defaults list names that "
                    "deployment, say); remove the name from that list")  # fmt: skip
        if isinstance(error, UnicodeDecodeError) and self.folder:
            # ``error.object`` is the chunk of the file that Hydra's reader was decoding.
            found = [p for p in sorted(self.folder.rglob("*.yaml")) if error.object
                     and bytes(error.object) in p.read_bytes()]  # fmt: skip
            return hydra_errors.not_utf8(found[0], error) if found else None
        if given := self.line.config_name:  # not the other apps' configs, nor the settings'
            mine = {p.stem for p in self.folder.glob("*.yaml")} if self.folder else set()
            configs = [c for c in self.options("") if c == self.config_name or c in mine]
            if given.removesuffix(".yaml") not in configs:  # not there, or another app's
                return hydra_errors.not_a_primary_config(given, configs)
        if isinstance(error, HydraException | OmegaConfBaseException):
            return hydra_errors.explain(error, self.deployment_file())
        if type(error) is ValueError:  # OmegaConf's int() of a list's index
            return self.list_index_problem()
        filename = str(error.filename) if isinstance(error, OSError) and error.filename else ""
        for override in self.overrides if filename else []:
            # Hydra looks a key up as a config group on disk first, and a group's value as a file.
            key, value = override.key_or_group, override.value()
            if isinstance(value, str) and len(value) > 80 and value in filename:
                shown = f"{value[:80]}... ({len(value):,} characters)"
                why = ": no option has so long a name"
                return not_a_choice(key, shown, self.options(key), why, closest=False)
            if key in filename:
                shown = key if len(key) <= 80 else f"{key[:80]}... ({len(key):,} characters)"
                return f"{shown} is not a setting: no setting or config group has so long a name"
        return None

    def list_index_problem(self) -> str | None:
        """The first override that sets an item of a list by a name, not a position."""
        for i, override in enumerate(self.overrides):
            parts = override.key_or_group.split(".")
            try:
                cfg = compose(self.line.config_name or self.config_name,
                              [*self.line.overrides[:i], *self.searchpath])  # fmt: skip
            except COMPOSE_ERRORS:
                return None
            for depth, part in enumerate(parts[1:], 1):
                path = ".".join(parts[:depth])
                if isinstance(OmegaConf.select(cfg, path), ListConfig) and not part.isdigit():
                    return (f"{override.input_line} is not a setting: {path} is a list, whose "
                            f"items are set by position ({path}.0=...) or all at once "
                            f"({path}=[...])")  # fmt: skip
        return None


def register_options_resolver(config_name: str) -> None:
    """Register, for the help template of the primary config ``config_name``,
    ``${mstar_resources.options:GROUP[,KEY]}`` (a group's options, or those whose config sets KEY)
    and ``${mstar_resources.shown:VALUE}``; an app on plain ``@hydra.main`` calls it first."""

    def sets(group: str, option: str, key: str) -> bool:  # the config with group=option sets key
        try:
            return compose(config_name, overrides=[f"{group}={option}"]).get(key) is not None
        except (HydraException, OmegaConfBaseException):
            return False

    def options(group: str, key: str | None = None) -> str:
        names = _options(group, config_name)
        return ", ".join(n for n in names if key is None or sets(group, n, key))

    def command_line_form(value: object) -> str:  # ``null``, ``true``, an enum's name
        if isinstance(value, bool) or value is None:
            return {True: "true", False: "false", None: "null"}[value]
        return str(getattr(value, "name", value))

    OmegaConf.register_new_resolver(RESOLVERS[0], options, replace=True)
    OmegaConf.register_new_resolver(RESOLVERS[1], command_line_form, replace=True)
