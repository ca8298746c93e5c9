"""A name of an engine's that a plugin replaces or reads, and the check that a module has each:
the part of an engine's seams that does not depend on the engine."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["Seam", "installed_version", "lacking", "missing_seams"]


@dataclass(frozen=True)
class Seam:
    """``name`` in module ``module`` (``Class.method`` for a method, ``Class.attribute`` for what
    ``Class.__init__`` sets)."""

    module: str
    name: str
    required: bool = True
    """False: used where this version of the engine has it."""
    instance: bool = False
    """An attribute each instance gets in ``__init__``: checked in the wheels' source only."""


def missing_seams(modules: Mapping[str, Any], seams: Sequence[Seam]) -> list[Seam]:
    """The required ``seams`` that ``modules`` (by module name: an object with the module's names
    as attributes) lack; an instance attribute is not looked for (instances have it)."""
    missing = []
    for seam in seams:
        if seam.instance:
            continue
        target: Any = modules.get(seam.module)
        for part in seam.name.split("."):
            target = getattr(target, part, None)
        if target is None and seam.required:
            missing.append(seam)
    return missing


def lacking(module: ModuleType, seams: Sequence[Seam]) -> str | None:
    """The required ones of ``seams`` that are ``module``'s and that it lacks, named
    (``module.Class.method, ...``); None where it has them all."""
    mine = [seam for seam in seams if seam.module == module.__name__]
    missing = missing_seams({module.__name__: module}, mine)
    return ", ".join(f"{s.module}.{s.name}" for s in missing) if missing else None


def installed_version(distribution: str) -> str | None:
    """The version of the installed ``distribution`` (an engine), None where it is not."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
