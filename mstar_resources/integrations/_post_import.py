"""Run a function on a module once it is imported, without importing it: a plugin is loaded in
every engine process, and importing the model runner in one that builds no model would cost
seconds and may initialise CUDA before the engine forks."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

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
        spec: importlib.machinery.ModuleSpec | None = None
        try:
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
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
    """``callback(module)`` once module ``name`` is imported: now if it is, else right after its
    import succeeds."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    with _finder._lock:
        _finder.waiting.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
