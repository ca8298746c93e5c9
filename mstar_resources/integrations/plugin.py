"""What every engine plugin shares: the seams it relies on and the patches it makes, as data; the
releases it serves; and its life in a process (read the setting, check the release, patch each
module as it is imported, leave the engine as it is with one line saying why).

An engine's package holds only its seams and what its engine decides: ``vllm/seams.py`` and
``sglang/seams.py`` each declare an :class:`EnginePlugin` whose seams are :class:`Seam` rows; a
row with a ``patch`` is replaced in the engine where the running release has it, and a release
that lacks a required one is left as it is, the seam named.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..errors import ResourceConfigError
from ..units import release
from ._post_import import when_imported
from .setting import AUTO, PluginSetting, Setting

if TYPE_CHECKING:
    from ..attn.workspace import WorkspacePool, WorkspaceStats

__all__ = [
    "EnginePlugin",
    "PluginState",
    "Seam",
    "installed_version",
    "lacking",
    "missing_seams",
]

Patch = Callable[[Any, Any, Any], Any]
"""``patch(state, original, owner)``: what replaces ``original`` (the engine's function, method
or value) on ``owner`` (its module or class), for the plugin's ``state`` in this process."""


@dataclass(frozen=True)
class Seam:
    """``name`` in the engine's module ``module`` (``Class.method`` for a method,
    ``Class.attribute`` for what ``Class.__init__`` sets) that the plugin replaces or reads."""

    module: str
    name: str
    required: bool = True
    """The plugin cannot serve, where ``module`` is imported, without it; False: used where the
    running release has it."""
    instance: bool = False
    """An attribute each instance gets in ``__init__``: checked in the wheels' source only."""
    patch: Patch | None = None
    """What replaces it (None: the plugin only reads it)."""
    since: str | None = None
    """The first release read that has it (None: every release read, from the first)."""
    until: str | None = None
    """The last release read that has it (None: to the newest read)."""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


def missing_seams(modules: Mapping[str, Any], seams: Sequence[Seam]) -> list[Seam]:
    """The required ``seams`` that ``modules`` (by module name: an object with the module's names
    as attributes) lack; an instance attribute is not looked for (instances have it)."""
    return [
        seam
        for seam in seams
        if seam.required and not seam.instance and _find(modules.get(seam.module), seam) is None
    ]


def lacking(module: ModuleType, seams: Sequence[Seam]) -> str | None:
    """The required ones of ``seams`` that are ``module``'s and that it lacks, named
    (``module.Class.method, ...``); None where it has them all."""
    mine = [seam for seam in seams if seam.module == module.__name__]
    missing = missing_seams({module.__name__: module}, mine)
    return ", ".join(seam.qualname for seam in missing) if missing else None


def _find(module: Any, seam: Seam) -> Any:
    target = module
    for part in seam.name.split("."):
        target = getattr(target, part, None)
    return target


PATCHED = "__mstar_resources_patch__"
"""Set on each replacement, so that a seam reached twice is patched once."""


def patch_module(state: PluginState, seams: Sequence[Seam], module: ModuleType) -> None:
    """Apply to ``module`` each of ``seams``' patches that are its, where it has their seam; if
    it lacks a required seam, nothing of it is patched and ``state`` leaves the engine as it
    is, naming the seam."""
    lacks = lacking(module, seams)
    if lacks is not None:
        state.block(f"this {state.engine} lacks {lacks}")
        return
    for seam in seams:
        if seam.module != module.__name__ or seam.patch is None:
            continue
        *path, attribute = seam.name.split(".")
        owner: Any = module
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, attribute, None)
        if original is None or getattr(original, PATCHED, False):
            continue  # optional and absent here, or patched already (by another module's import)
        replacement = seam.patch(state, original, owner)
        if replacement is not original:
            with contextlib.suppress(AttributeError):  # a bound method: not marked
                setattr(replacement, PATCHED, True)
            setattr(owner, attribute, replacement)


def _pre_release(version: str) -> bool:
    """Whether ``version`` is a pre-release of its numbers (``0.26.0rc1``, ``0.26.0.dev3``),
    which comes before the release itself."""
    rest = re.sub(r"^\d+(\.\d+)*", "", version.split("+")[0]).lstrip(".").lower()
    return rest.startswith(("a", "b", "rc", "dev"))


def installed_version(distribution: str) -> str | None:
    """The version of the installed ``distribution`` (an engine), None where it is not."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


class PluginState:
    """One engine plugin's state in one process: why it leaves the engine as it is, if it does,
    and what the engine's own package adds (its workspaces, reserved and sealed at its seams)."""

    engine = "the engine"
    """The engine, as log lines name it."""
    logger = logging.getLogger("mstar_resources.integrations")

    def __init__(self, setting: Setting) -> None:
        self.setting = setting
        self.blocked: str | None = None
        """Why no engine of this process is served (this release lacks a seam), or None."""
        self.untouched: str | None = None
        """Why the engine runs as it is (None: the plugin serves it, or has not decided)."""
        self.pools: dict[str, WorkspacePool] = {}
        """The engine's workspaces, by resource path."""
        self.sealed_before: str | None = None
        """What the workspaces were sealed before (the engine's graph capture...), once sealed."""
        self.shared_int_wrappers = 0
        """Decode wrappers given a shared int workspace in place of their own."""
        self.provenance: dict[str, str] = {}
        """By resource path: where a floor measured or derived here came from, in words."""

    @property
    def serving(self) -> bool:
        raise NotImplementedError

    @property
    def held_bytes(self) -> int:
        """What the pools hold on the GPU: float and int workspaces."""
        return sum(pool.held_bytes for pool in self.pools.values())

    def stats(self) -> list[WorkspaceStats]:
        """The float workspaces' stats, then the int workspaces'."""
        return [s for pool in self.pools.values() for s in [*pool.stats(), *pool.int_stats()]]

    def report(self) -> dict[str, Any]:
        """What the plugin did in this process, as plain data: these keys in every engine's,
        then the engine's own."""
        stats = self.stats()
        return {
            "setting": self.setting.describe(),
            "untouched": self.untouched,
            "workspace_bytes": self.held_bytes,
            "workspaces": [dataclasses.asdict(s) for s in stats],
            "sealed_before": self.sealed_before,
            "growths": sum(s.times_grown for s in stats),
            "sealed_overflows": sum(s.sealed_refusals for s in stats),
            "int_workspace_bytes": sum(pool.int_held_bytes for pool in self.pools.values()),
            "shared_int_wrappers": self.shared_int_wrappers,
            "provenance": dict(self.provenance),
        }

    def block(self, reason: str) -> None:
        """Leave every engine of this process as it is, for ``reason``."""
        self.blocked = self.blocked or reason
        self.leave_untouched(reason)

    def leave_untouched(self, reason: str) -> None:
        """Leave the engine as it is, for ``reason``, said once in a WARNING; nothing once the
        plugin serves it."""
        if self.untouched is None and not self.serving:
            self.untouched = reason
            self.logger.warning(
                "mstar-resources: %s set, but %s; %s keeps its own FlashInfer workspace",
                self.setting.describe(), reason, self.engine,
            )  # fmt: skip

    def check_calibration(self, device: Any) -> None:
        """A calibrated deployment names what differs here (FlashInfer's version, the GPU): its
        floors may fall short, and a sealed workspace then refuses the engine's capture."""
        stale = self.setting.stale_calibration(device)
        if stale is not None:
            self.logger.warning(
                "mstar-resources: %s: %s; or set %s=%s to measure %s's plans in the worker",
                self.setting.describe(), stale, self.setting.name, AUTO, self.engine,
            )  # fmt: skip


State = TypeVar("State", bound="PluginState")


class EnginePlugin(Generic[State]):
    """An engine's plugin: its setting, the releases its seams were read in, the seams, and the
    state it keeps in a process (:meth:`active`)."""

    def __init__(
        self,
        setting: PluginSetting,
        distribution: str,
        releases: tuple[str, ...],
        seams: tuple[Seam, ...],
        state: Callable[[Setting], State],
    ) -> None:
        self.setting = setting
        self.distribution = distribution
        """The engine's distribution (``vllm``), whose installed version is checked."""
        self.releases = releases
        """The releases whose source every seam was read in, oldest first."""
        self.seams = seams
        self.state = state
        self._active: State | None = None

    def active(self) -> State | None:
        """This process's state, where the plugin is enabled in it (None: it is not)."""
        return self._active

    def missing_seams(self, modules: Mapping[str, Any]) -> list[Seam]:
        """The required seams that ``modules`` lack (:func:`missing_seams`)."""
        return missing_seams(modules, self.seams)

    @property
    def engine(self) -> str:
        return self.setting.engine

    def installed(self) -> str | None:
        return installed_version(self.distribution)

    def version_problem(self, version: str | None) -> str | None:
        """Why the plugin does not serve ``version`` (None: it does, where each seam it needs is
        there): not installed, or older than every release read."""
        if version is None:
            return f"{self.engine} is not installed here"
        if not release(version):
            return f"{self.engine}'s version {version!r} is not a version number"
        first = release(self.releases[0])
        if release(version) < first or (release(version) == first and _pre_release(version)):
            return (
                f"{self.engine} {version} is older than every release this plugin was read in "
                f"({self.read_in()})"
            )
        return None

    def version_note(self, version: str) -> str | None:
        """What to say of a served ``version`` that was not read: served as far as its seams
        hold (None where it was read)."""
        if version.split("+")[0] in self.releases:
            return None
        return (
            f"{self.engine} {version} is not a release this plugin was read in "
            f"({self.read_in()}); it is served where each seam the plugin needs is there, and "
            "left as it is, the seam named, where one is not"
        )

    def read_in(self) -> str:
        return ", ".join(self.releases)

    def register(self) -> None:
        """The engine's entry point, in each of its processes: read the setting and, where it is
        set and the release is served, patch each seam's module as it is imported; once a
        process, and nothing at all without the setting. A bad setting ends the process with
        status 2 and one paragraph naming it (an engine logs a plugin's exception and goes on,
        or shows its traceback)."""
        try:
            setting = self.setting.read()
        except ResourceConfigError as error:
            print(f"mstar-resources: {error}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        if setting is None or self._active is not None:
            return
        state = self.state(setting)
        version = self.installed()
        problem = self.version_problem(version)
        if problem is not None:
            state.block(problem)
            return
        self._active = state
        note = None if version is None else self.version_note(version)
        if note is not None:
            state.logger.info("mstar-resources: %s", note)
        state.logger.info(
            "mstar-resources: %s: %s's FlashInfer workspaces from its pools",
            setting.describe(), self.engine,
        )  # fmt: skip
        for module in dict.fromkeys(seam.module for seam in self.seams if seam.patch):
            when_imported(module, functools.partial(patch_module, state, self.seams))
