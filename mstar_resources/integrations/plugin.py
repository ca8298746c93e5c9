"""What every engine plugin shares: its seams and patches as data (:class:`Seam`), and its life in
a process (:class:`EnginePlugin`): read the setting, check the release, patch each module as it is
imported, or leave the engine as it is with one line saying why."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import re
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import ResourceConfigError, ResourceUsageError
from ..units import installed_version, release
from .setting import AUTO, PluginSetting, Setting

if TYPE_CHECKING:
    from ..attn.workspace import WorkspacePool, WorkspaceStats


Patch = Callable[[Any, Any, Any], Any]
"""``patch(state, original, owner)``: what replaces ``original`` on ``owner`` (module or class)."""


@dataclass(frozen=True)
class Seam:
    """``name`` in the engine's module ``module`` (``Class.method`` for a method,
    ``Class.attribute`` for what ``Class.__init__`` sets) that the plugin replaces or reads."""

    module: str
    name: str
    required: bool = True  # False: used where the running release has it
    instance: bool = False  # set in __init__: checked in the wheels' source only
    patch: Patch | None = None  # what replaces it (None: the plugin only reads it)
    since: str | None = None  # the first release read that has it (None: the first read)
    until: str | None = None  # the last release read that has it (None: the newest read)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


PATCHED = "__mstar_resources_patch__"
"""Set on each replacement, so that a seam reached twice is patched once."""


def before(hook: Callable[[Any, Any], object]) -> Patch:
    """The patch of a method that calls ``hook(state, instance)`` first."""

    def patch(state: Any, method: Any, owner: Any) -> Any:
        @functools.wraps(method)
        def replacement(self: Any, *args: Any, **kwargs: Any) -> Any:
            hook(state, self)
            return method(self, *args, **kwargs)

        return replacement

    return patch


def after(hook: Callable[[Any, Any, Any], object]) -> Patch:
    """The patch of a method that calls ``hook(state, instance, its result)`` after it."""

    def patch(state: Any, method: Any, owner: Any) -> Any:
        @functools.wraps(method)
        def replacement(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(self, *args, **kwargs)
            hook(state, self, result)
            return result

        return replacement

    return patch


def patch_module(state: PluginState, seams: Sequence[Seam], module: ModuleType) -> None:
    """Apply ``seams``' patches of ``module``; where it lacks a required seam, patch none of it
    and leave the engine as it is, naming what it lacks."""
    mine = [seam for seam in seams if seam.module == module.__name__]
    missing = [s for s in mine if s.required and not s.instance and _find(module, s.name) is None]
    if missing:
        state.block(f"this {state.engine} lacks {', '.join(seam.qualname for seam in missing)}")
        return
    for seam in mine:
        path, _, attribute = seam.name.rpartition(".")
        owner = _find(module, path)
        original = getattr(owner, attribute, None)
        if seam.patch is None or original is None or getattr(original, PATCHED, False):
            continue  # read only, optional and absent, or patched already (another module's import)
        replacement = seam.patch(state, original, owner)
        if replacement is not original:
            with contextlib.suppress(AttributeError):  # a bound method: not marked
                setattr(replacement, PATCHED, True)
            setattr(owner, attribute, replacement)


def _find(module: Any, dotted: str) -> Any:
    """``module``'s ``dotted`` name (``Class.method``), None where it has none."""
    for part in filter(None, dotted.split(".")):
        module = getattr(module, part, None)
    return module


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


# -- a module patched once the engine imports it -----------------------------------------------

Callback = Callable[[ModuleType], None]


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks waiting for it."""

    def __init__(self, loader: importlib.abc.Loader, callbacks: list[Callback]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its own loader (source lookups, resource readers), as if never wrapped.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        for callback in self._callbacks:
            callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """For a module waited for, the spec the finders after it give, its loader wrapped."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Callback]] = {}
        self._lock = threading.Lock()
        self._finding: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        with self._lock:
            if fullname not in self.waiting or fullname in self._finding:
                return None
            self._finding.add(fullname)
        try:  # the finders after this one: it finds nothing while it looks
            spec = importlib.util.find_spec(fullname)
        finally:
            with self._lock:
                self._finding.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        with self._lock:
            callbacks = self.waiting.pop(fullname, [])
        spec.loader = _Loader(spec.loader, callbacks)
        return spec


_finder = _Finder()


def when_imported(name: str, callback: Callback) -> None:
    """``callback(module)`` once module ``name`` is imported: now, or right after its import
    (importing a model runner costs seconds, and may initialise CUDA before the engine forks)."""
    if (module := sys.modules.get(name)) is not None:
        callback(module)
        return
    with _finder._lock:
        _finder.waiting.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


class PluginState:
    """One engine plugin's state in one process."""

    engine = "the engine"  # as log lines name it
    logger = logging.getLogger("mstar_resources.integrations")

    def __init__(self, setting: Setting) -> None:
        self.setting = setting
        self.blocked: str | None = None  # why no engine of this process is served
        self.unread_release: str | None = None
        """The engine's version where no release read was it: what the plugin sizes from how the
        releases read launch their kernels (the TRT-LLM workspace) is left to the engine there."""
        self._start_engine()

    def _start_engine(self) -> None:
        """One engine's state, empty."""
        self.untouched = self.blocked  # why the engine runs as it is (None: served, or not yet)
        self.pools: dict[str, WorkspacePool] = {}  # by resource path
        self.sealed_before: str | None = None  # the engine's graph capture...
        self.shared_int_wrappers = 0  # decode wrappers given a shared int workspace
        self.provenance: dict[str, str] = {}  # by resource path: whence a floor here, in words

    @property
    def serving(self) -> bool:
        raise NotImplementedError

    @property
    def held_bytes(self) -> int:
        """What the pools' float workspaces hold."""
        return sum(pool.held_bytes for pool in self.pools.values())

    @property
    def int_held_bytes(self) -> int:
        return sum(pool.int_held_bytes for pool in self.pools.values())

    def stats(self) -> list[WorkspaceStats]:
        return [s for pool in self.pools.values() for s in [*pool.stats(), *pool.int_stats()]]

    def report(self) -> dict[str, Any]:
        """What the plugin did in this process, as plain data (an engine's adds its own keys)."""
        stats = self.stats()
        return {
            "setting": self.setting.describe(),
            "untouched": self.untouched,
            "workspace_bytes": self.held_bytes,
            "workspaces": [dataclasses.asdict(s) for s in stats],
            "sealed_before": self.sealed_before,
            "growths": sum(s.times_grown for s in stats),
            "sealed_overflows": sum(s.sealed_refusals for s in stats),
            "int_workspace_bytes": self.int_held_bytes,
            "shared_int_wrappers": self.shared_int_wrappers,
            "provenance": dict(self.provenance),
        }

    def seal(self, before: str) -> None:
        """Seal every workspace, ``before`` what (in words, for the log)."""
        if not self.serving or self.sealed_before is not None:
            return
        for pool in self.pools.values():
            pool.seal()
        self.sealed_before = before
        stats = self.stats()
        self.logger.info(
            "mstar-resources: sealed %d FlashInfer workspaces, %s bytes of float and %s of int, "
            "before %s %s (%d growths before the seal): %s",
            len(stats), f"{self.held_bytes:,}", f"{self.int_held_bytes:,}", self.engine, before,
            sum(s.times_grown for s in stats), "; ".join(str(s) for s in stats),
        )  # fmt: skip

    def block(self, reason: str) -> None:
        """Leave every engine of this process as it is, for ``reason``."""
        self.blocked = self.blocked or reason
        self.leave_untouched(reason)

    def leave_untouched(self, reason: str) -> None:
        """Leave the engine as it is, for ``reason``, said once in a WARNING, unless served."""
        if self.untouched is None and not self.serving:
            self.untouched = reason
            self.logger.warning(
                "mstar-resources: %s set, but %s; %s keeps its own FlashInfer workspace",
                self.setting.describe(), reason, self.engine,
            )  # fmt: skip

    def check_calibration(self, device: Any) -> None:
        """Warn where a calibrated deployment's FlashInfer or GPU differs from ``device``'s."""
        from ..calibration.record import check_calibration

        root, records = self.setting.root, list(self.setting.records)
        if root is None or root.get("calibrated") is None or getattr(device, "type", "") != "cuda":
            return
        if (stale := check_calibration(root, device, resolved=records, warn=False)) is not None:
            self.logger.warning(
                "mstar-resources: %s: %s; or set %s=%s to measure %s's plans in the worker",
                self.setting.describe(), stale, self.setting.name, AUTO, self.engine,
            )  # fmt: skip


@dataclass(eq=False)
class EnginePlugin:
    """An engine's plugin, and its state in this process (:meth:`active`)."""

    setting: PluginSetting
    distribution: str  # the engine's, e.g. ``vllm``
    releases: tuple[str, ...]  # those whose source every seam was read in, oldest first
    seams: tuple[Seam, ...]
    state: Callable[[Setting], PluginState]
    _active: PluginState | None = field(default=None, init=False)

    def active(self) -> PluginState | None:
        """This process's state, where the plugin is enabled in it (None: it is not)."""
        return self._active

    def version_problem(self, version: str | None) -> str | None:
        """Why the plugin does not serve ``version`` (None: it does, seams permitting)."""
        engine = self.setting.engine
        if version is None:
            return f"{engine} is not installed here"
        if not isinstance(version, str):
            raise ResourceUsageError(
                f"version={version!r} must be {engine}'s version as a string (e.g. "
                f"{self.releases[-1]!r}), or None where it is not installed"
            )
        if not release(version):
            return f"{engine}'s version {version!r} is not a version number"
        first = release(self.releases[0])
        # a pre-release (0.26.0rc1, 0.26.0.dev3) comes before its release
        pre_release = re.match(r"\d+(\.\d+)*\.?(a|b|rc|dev)", version.lower())
        if release(version) < first or (release(version) == first and pre_release):
            return (
                f"{engine} {version} is older than every release this plugin was read in "
                f"({', '.join(self.releases)})"
            )
        return None

    def register(self) -> None:
        """The engine's entry point, in each of its processes: patch each seam's module as it is
        imported. A bad setting exits with status 2 and one paragraph (an engine would go on)."""
        try:
            setting = self.setting.read()
        except ResourceConfigError as error:
            print(f"mstar-resources: {error}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        if setting is None or self._active is not None:
            return
        state = self.state(setting)
        version = installed_version(self.distribution)
        if (problem := self.version_problem(version)) is not None:
            state.block(problem)
            return
        self._active = state
        if version is not None and version.split("+")[0] not in self.releases:
            state.unread_release = version

        @functools.cache  # said once, as the engine imports the first module patched: vLLM 0.34
        def announce() -> None:  # loads its plugins before it sets up its logging (EngineArgs)
            if state.unread_release is not None:
                state.logger.info(
                    "mstar-resources: %s %s is not a release this plugin was read in (%s); it "
                    "is served where each seam the plugin needs is there, and left as it is, the "
                    "seam named, where one is not; buffers no allocator checks stay the engine's",
                    self.setting.engine, version, ", ".join(self.releases),
                )  # fmt: skip
            state.logger.info(
                "mstar-resources: %s: %s's FlashInfer workspaces from its pools",
                setting.describe(), self.setting.engine,
            )  # fmt: skip

        def patch(module: ModuleType) -> None:
            announce()
            patch_module(state, self.seams, module)

        for module in dict.fromkeys(seam.module for seam in self.seams if seam.patch):
            when_imported(module, patch)
