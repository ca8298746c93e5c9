"""Declarative, growable, sealable GPU scratch memory for LLM inference engines.

The public names are listed three times, each for its reader: the imports below for type checkers
(each ``as`` itself: re-exported), ``_HOMES`` for loading each name on first use, so that
composing ``pkg://mstar_resources.conf`` (which imports this package) costs neither torch nor the
resolver, and ``__all__``. ``tests/test_init.py`` checks that the three agree.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attn.buffer import (
        WorkspaceGrowthError as WorkspaceGrowthError,
    )
    from .attn.buffer import (
        WorkspaceStats as WorkspaceStats,
    )
    from .attn.float_workspace import (
        Workspace as Workspace,
    )
    from .attn.int_workspace import (
        IntWorkspace as IntWorkspace,
    )
    from .attn.pool import (
        WorkspacePool as WorkspacePool,
    )
    from .attn.workspace import (
        workspace_bytes as workspace_bytes,
    )
    from .calibration.record import check_calibration as check_calibration
    from .errors import (
        Problem as Problem,
    )
    from .errors import (
        ResourceConfigError as ResourceConfigError,
    )
    from .errors import (
        ResourceError as ResourceError,
    )
    from .errors import (
        ResourceUsageError as ResourceUsageError,
    )
    from .errors import (
        WorkspaceAgreementError as WorkspaceAgreementError,
    )
    from .errors import (
        WorkspacePlanError as WorkspacePlanError,
    )
    from .errors import (
        WorkspaceSealedError as WorkspaceSealedError,
    )
    from .errors import (
        WorkspaceShortError as WorkspaceShortError,
    )
    from .resolver import (
        ResolvedResource as ResolvedResource,
    )
    from .resolver import (
        build_pools as build_pools,
    )
    from .resolver import (
        resolve as resolve,
    )


_HOMES = {
    "IntWorkspace": ".attn.int_workspace",
    "Workspace": ".attn.float_workspace",
    "WorkspaceGrowthError": ".attn.buffer",
    "WorkspacePool": ".attn.pool",
    "WorkspaceStats": ".attn.buffer",
    "workspace_bytes": ".attn.workspace",
    "check_calibration": ".calibration.record",
    "Problem": ".errors",
    "ResourceConfigError": ".errors",
    "ResourceError": ".errors",
    "ResourceUsageError": ".errors",
    "WorkspaceAgreementError": ".errors",
    "WorkspacePlanError": ".errors",
    "WorkspaceSealedError": ".errors",
    "WorkspaceShortError": ".errors",
    "ResolvedResource": ".resolver",
    "build_pools": ".resolver",
    "resolve": ".resolver",
}
"""Each public name and the module it lives in: the facade loads each on first use."""

__all__ = [
    "IntWorkspace",
    "Problem",
    "ResolvedResource",
    "ResourceConfigError",
    "ResourceError",
    "ResourceUsageError",
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
    "resolve",
    "workspace_bytes",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
