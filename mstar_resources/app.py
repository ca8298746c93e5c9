"""Hydra apps that tell a user's mistake in one paragraph and keep the app's own bugs loud.

The library's own console scripts are built with :func:`hydra_app`, and an engine can build its
entry point with it too (``tests/engine/app.py`` does)::

    @hydra_app("my-engine", config_name="engine", config_path="conf")
    def main(cfg: DictConfig) -> None:
        pools = build_pools(cfg.resources, "cuda")

What the user got wrong (an override Hydra cannot compose, a :class:`ResourceConfigError` from the
app) ends in one paragraph on stderr and exit status 2, told from the exceptions' fields
(``_explain.py``). Anything else the app raises keeps its traceback, as Hydra's ``run_and_report``
keeps it: from the app's entry point down to where it was raised, without Hydra's frames, exit
status 1. Set ``HYDRA_FULL_ERROR=1`` for Hydra's full traceback of a compose error instead.

``@hydra.main`` composes the config twice (once to read ``hydra.mode``), which doubles a dry run's
time. An app made with ``compose_once=True`` (the library's own, whose configs set no log files
and no output folders) composes a plain run (overrides only) once, through Hydra's Compose API,
and calls the function; anything with a flag (``--help``, ``--cfg job``, ``--info``, ...) still goes
to ``@hydra.main``. ``-m`` is refused: Hydra's sweeper writes ``multirun.yaml``, and these apps
write nothing to disk. ``--version`` names the app and this package's version.

Help templates may list a config group's options with ``${mstar_resources.options:GROUP}`` (every
option, the engine's own included) and ``${mstar_resources.options:GROUP,KEY}`` (those whose
composed config sets ``KEY``); the resolver is registered while the app runs, never at import.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import hydra
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import configure_log
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ._explain import explain, not_a_choice
from .errors import ResourceConfigError

__all__ = ["fail", "hydra_app", "package_version", "register_settings"]

SHIPPED_CONF = "pkg://mstar_resources.conf"
"""Where the library's config tree is, for Hydra."""

MULTIRUN_FLAGS = frozenset({"-m", "--multirun"})
VERSION_FLAG = "--version"
OPTIONS_RESOLVER = "mstar_resources.options"


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
    invoked = command or prog
    full_error = _FullError()

    def decorate(run: Callable[[DictConfig], None]) -> Callable[[], None]:
        @functools.wraps(run)  # Hydra finds a relative config_path beside ``run``'s module
        def task(cfg: DictConfig) -> None:
            # Raised out of here, an error would reach Hydra's job runner, which reports it as a
            # failed job; a BaseException passes it by.
            with full_error.as_the_user_set_it():
                try:
                    run(cfg)
                except ResourceConfigError as error:
                    fail(prog, str(error))
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as error:
                    raise _RaisedByTheApp(error) from None

        hydra_main = hydra.main(
            version_base="1.3", config_path=config_path, config_name=config_name
        )(task)

        def start(args: list[str]) -> None:
            if VERSION_FLAG in args:
                if version is None:
                    print(f"{prog} (built with mstar-resources {package_version()})")
                else:
                    print(f"{prog} {version if isinstance(version, str) else version()}")
                return
            if MULTIRUN_FLAGS & set(args):
                fail(
                    prog,
                    "-m (--multirun) is not supported: Hydra's sweeper writes multirun.yaml, and "
                    f"{prog} writes nothing to disk; run it once per value instead",
                )
            if not compose_once or any(arg.startswith("-") for arg in args):
                with _compose_errors_reported(prog, invoked, args, config_name, full_error):
                    hydra_main()
                return
            with _config_source(config_path, run):
                with _compose_errors_reported(prog, invoked, args, config_name, full_error):
                    cfg = compose(config_name, overrides=args, return_hydra_config=True)
                HydraConfig.instance().set_config(cfg)  # as @hydra.main would
                configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
                with open_dict(cfg):
                    del cfg["hydra"]
                task(cfg)

        def main() -> None:
            if settings is not None:
                register_settings(config_name, settings)
            try:
                with _options_resolver(config_name):
                    try:
                        start(sys.argv[1:])
                    finally:
                        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
            except _RaisedByTheApp as carried:
                error = carried.error
            except BrokenPipeError:
                error = None
            else:
                return
            if error is None or isinstance(error, BrokenPipeError):
                # The reader went away (`| head`): nothing left to tell, and nowhere to.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise SystemExit(1)
            raise error  # out of the except clause: the error keeps its own context

        main.__doc__ = f"The entry point of {prog}."
        return main

    return decorate


class _FullError:
    """``HYDRA_FULL_ERROR=1`` while Hydra composes, so that @hydra.main raises its errors rather
    than printing them; as the user set it (or unset) while the app's own code runs, and after."""

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
    prog: str, invoked: str, args: list[str], config_name: str, full_error: _FullError
) -> Iterator[None]:
    """Hydra's and OmegaConf's compose errors raised inside as :func:`fail`."""
    try:
        with full_error.while_composing():
            yield
    except (HydraException, OmegaConfBaseException, ValueError, OSError) as error:
        if full_error.user_asked:
            raise
        told = _told(error, args, config_name)
        if told is None:
            raise
        fail(prog, f"{told}; `{invoked} --help` lists the settings")


def _told(error: BaseException, args: list[str], config_name: str) -> str | None:
    """``error``, raised while composing ``args``, as one paragraph; None where it is not a
    mistake in ``args`` (a ``ValueError`` or ``OSError`` of Hydra's that no override explains)."""
    if isinstance(error, HydraException | OmegaConfBaseException):
        return explain(error)
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except HydraException:
        return None
    for override in overrides:
        key, value = override.key_or_group, override.value()
        if isinstance(error, ValueError) and not isinstance(value, str | list):
            # Hydra picks a config group's option by name only: `deployment=null` is no name.
            options = _group_options(key, config_name)
            if options:
                return not_a_choice(key, (override.input_line or "").partition("=")[2], options)
        if isinstance(error, OSError) and error.filename and key in str(error.filename):
            # Hydra looks a key up as a config group on disk first; no setting is that long.
            shown = key if len(key) <= 80 else f"{key[:80]}... ({len(key)} characters)"
            return f"{shown} is not a setting: no setting or config group has so long a name"
    return None


def _group_options(group: str, config_name: str) -> list[str]:
    """The options of config group ``group`` (with the primary config's search path), or []."""
    if not GlobalHydra.instance().is_initialized():
        return []
    loader = GlobalHydra.instance().config_loader()
    return loader.get_group_options(group, config_name=config_name)


@contextlib.contextmanager
def _options_resolver(config_name: str) -> Iterator[None]:
    """``${mstar_resources.options:GROUP[,KEY]}`` for help templates, while the app runs."""

    def options(group: str, key: str | None = None) -> str:
        names = _group_options(group, config_name)
        if key is not None:
            names = [name for name in names if _composes_with(config_name, group, name, key)]
        return ", ".join(names)

    OmegaConf.register_new_resolver(OPTIONS_RESOLVER, options, replace=True)
    try:
        yield
    finally:
        OmegaConf.clear_resolver(OPTIONS_RESOLVER)


def _composes_with(config_name: str, group: str, option: str, key: str) -> bool:
    """Whether the primary config with ``group=option`` sets ``key``."""
    try:
        cfg = compose(config_name, overrides=[f"{group}={option}"])
    except (HydraException, OmegaConfBaseException):
        return False
    return cfg.get(key) is not None


def _config_source(
    config_path: str, run: Callable[..., object]
) -> contextlib.AbstractContextManager[object]:
    """Hydra initialised on ``config_path`` as @hydra.main would find it for ``run``."""
    if config_path.startswith("pkg://"):
        return initialize_config_module(config_path.removeprefix("pkg://"), version_base="1.3")
    folder = Path(inspect.getfile(run)).parent / config_path
    return initialize_config_dir(str(folder.resolve()), version_base="1.3")
