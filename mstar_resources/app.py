"""Hydra apps whose bad input ends in one paragraph on stderr and exit status 2.

The library's own console scripts are built with :func:`hydra_app`, and an engine can build its
entry point with it too (``tests/engine/app.py`` does)::

    @hydra_app("my-engine", config_name="engine", config_path="conf")
    def main(cfg: DictConfig) -> None:
        pools = build_pools(cfg.resources, "cuda")

``@hydra.main`` composes the config twice (once to read ``hydra.mode``), which doubles a dry run's
time. An app made with ``compose_once=True`` (the library's own, whose configs set no log files
and no output folders) composes a plain run (overrides only) once, through Hydra's Compose API,
and calls the function; anything with a flag (``--help``, ``--cfg job``, ``--info``, ...) still goes
to ``@hydra.main``. ``-m`` is refused: Hydra's sweeper writes ``multirun.yaml``, and these apps
write nothing to disk.

Compose errors are told from the exceptions' fields (``_explain.py``). Set ``HYDRA_FULL_ERROR=1``
for Hydra's full traceback instead.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import hydra
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ._explain import explain
from .errors import ResourceConfigError

__all__ = ["fail", "hydra_app"]

SHIPPED_CONF = "pkg://mstar_resources.conf"
"""Where the library's config tree is, for Hydra."""

MULTIRUN_FLAGS = frozenset({"-m", "--multirun"})


def fail(prog: str, message: str) -> NoReturn:
    """Print ``prog: error: message`` on stderr and exit with status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def hydra_app(
    prog: str,
    config_name: str,
    config_path: str = SHIPPED_CONF,
    *,
    compose_once: bool = False,
) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:
    """Make ``run(cfg)`` the ``main()`` of a Hydra app over ``config_path``/``config_name``.

    ``config_path`` is ``pkg://<package>`` or a folder relative to ``run``'s module, as for
    ``@hydra.main``. A compose error, a :class:`ResourceConfigError` from ``run`` and ``-m`` end
    the app with one line on stderr and status 2; a closed stdout ends it quietly with status 1.
    ``compose_once``: compose a plain run once (see the module's docstring); only for a config
    that sets ``hydra/job_logging: none`` and no output folder, since the run then skips Hydra's
    job set-up.
    """

    def decorate(run: Callable[[DictConfig], None]) -> Callable[[], None]:
        @functools.wraps(run)  # Hydra finds a relative config_path beside ``run``'s module
        def task(cfg: DictConfig) -> None:
            # Raised out of here under @hydra.main, an error would reach Hydra's job runner,
            # which wraps it; a SystemExit passes through.
            try:
                run(cfg)
            except ResourceConfigError as error:
                fail(prog, str(error))
            except BrokenPipeError:  # the reader went away (`| head`): nothing left to tell
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise SystemExit(1) from None

        hydra_main = hydra.main(
            version_base="1.3", config_path=config_path, config_name=config_name
        )(task)

        def main() -> None:
            args = sys.argv[1:]
            if MULTIRUN_FLAGS & set(args):
                fail(
                    prog,
                    "-m (--multirun) is not supported: Hydra's sweeper writes multirun.yaml, and "
                    f"{prog} writes nothing to disk; run it once per value instead",
                )
            with _compose_errors_reported(prog):
                if not compose_once or any(arg.startswith("-") for arg in args):
                    hydra_main()
                    return
                with _config_source(config_path, run):
                    cfg = compose(config_name, overrides=args, return_hydra_config=True)
                    HydraConfig.instance().set_config(cfg)  # as @hydra.main would
                    configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
                    with open_dict(cfg):
                        del cfg["hydra"]
                    task(cfg)

        main.__doc__ = f"The entry point of {prog}."
        return main

    return decorate


@contextlib.contextmanager
def _compose_errors_reported(prog: str) -> Iterator[None]:
    """Hydra's and OmegaConf's errors raised inside as :func:`fail`; ``HYDRA_FULL_ERROR=1`` while
    inside, so that @hydra.main raises them rather than printing them itself."""
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except (HydraException, OmegaConfBaseException) as error:
        if before == "1":
            raise
        fail(prog, f"{explain(error)}; `{prog} --help` lists the settings")
    finally:
        if before is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


def _config_source(
    config_path: str, run: Callable[..., object]
) -> contextlib.AbstractContextManager[object]:
    """Hydra initialised on ``config_path`` as @hydra.main would find it for ``run``."""
    if config_path.startswith("pkg://"):
        return initialize_config_module(config_path.removeprefix("pkg://"), version_base="1.3")
    folder = Path(inspect.getfile(run)).parent / config_path
    return initialize_config_dir(str(folder.resolve()), version_base="1.3")


def _options(group: str) -> str:
    """The options of config group ``group``, comma-separated, for a help text."""
    return ", ".join(GlobalHydra.instance().config_loader().get_group_options(group))


# For the apps' help templates: ``${mstar_resources.options:deployment}``.
OmegaConf.register_new_resolver("mstar_resources.options", _options, replace=True)
