"""Declarative, growable, sealable GPU scratch memory for LLM inference engines. Each public name
loads from its home module on first use, so composing ``pkg://mstar_resources.conf`` (which imports
this package) costs neither torch nor the resolver."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attn.workspace import (
        IntWorkspace,
        Workspace,
        WorkspaceGrowthError,
        WorkspacePool,
        WorkspaceStats,
        workspace_bytes,
    )
    from .calibration.record import check_calibration
    from .errors import (
        Problem,
        ResourceConfigError,
        ResourceError,
        ResourceUsageError,
        WorkspaceAgreementError,
        WorkspacePlanError,
        WorkspaceSealedError,
        WorkspaceShortError,
    )
    from .resolver import ResolvedResource, build_pools, resolve

__all__ = [
    "IntWorkspace", "Problem", "ResolvedResource", "ResourceConfigError", "ResourceError",
    "ResourceUsageError", "Workspace", "WorkspaceAgreementError", "WorkspaceGrowthError",
    "WorkspacePlanError", "WorkspacePool", "WorkspaceSealedError", "WorkspaceShortError",
    "WorkspaceStats", "build_pools", "check_calibration", "resolve", "workspace_bytes"
]  # fmt: skip

_HOMES = (".errors", ".resolver", ".calibration.record", ".attn.workspace")  # torch's last


def __getattr__(name: str) -> Any:
    if name in __all__:
        for home in _HOMES:
            module = importlib.import_module(home, __name__)
            if name in module.__all__:
                value = getattr(module, name)
                globals()[name] = value  # later lookups skip this function
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
