"""Declarative, growable, sealable GPU scratch memory for LLM inference engines.

The names below load on first use, so composing ``pkg://mstar_resources.conf`` (which imports this
package) costs neither torch nor the resolver.
"""

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
        ResourceConfigError,
        ResourceError,
        WorkspaceAgreementError,
        WorkspacePlanError,
        WorkspaceSealedError,
        WorkspaceShortError,
    )
    from .resolver import ResolvedResource, build_pools, pools_of, resolve

__all__ = [
    "IntWorkspace",
    "ResolvedResource",
    "ResourceConfigError",
    "ResourceError",
    "Workspace",
    "WorkspaceAgreementError",
    "WorkspaceGrowthError",
    "WorkspacePlanError",
    "WorkspacePool",
    "WorkspaceSealedError",
    "WorkspaceShortError",
    "WorkspaceStats",
    "build_pools",
    "check_calibration",
    "pools_of",
    "resolve",
    "workspace_bytes",
]

_HOMES = {
    "ResolvedResource": ".resolver",
    "ResourceConfigError": ".errors",
    "ResourceError": ".errors",
    "IntWorkspace": ".attn.workspace",
    "Workspace": ".attn.workspace",
    "WorkspaceAgreementError": ".errors",
    "WorkspaceGrowthError": ".attn.workspace",
    "WorkspacePool": ".attn.workspace",
    "WorkspacePlanError": ".errors",
    "WorkspaceSealedError": ".errors",
    "WorkspaceShortError": ".errors",
    "WorkspaceStats": ".attn.workspace",
    "build_pools": ".resolver",
    "check_calibration": ".calibration.record",
    "pools_of": ".resolver",
    "resolve": ".resolver",
    "workspace_bytes": ".attn.workspace",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
