"""Declarative, growable, sealable GPU scratch memory for LLM inference engines.

The public names are the imports below (each ``as`` itself: re-exported), the one list of them:
type checkers read it, and the package reads it to load each name on first use, so that composing ``pkg://mstar_resources.conf``
(which imports this package) costs neither torch nor the resolver.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attn.workspace import (
        IntWorkspace as IntWorkspace,
    )
    from .attn.workspace import (
        Workspace as Workspace,
    )
    from .attn.workspace import (
        WorkspaceGrowthError as WorkspaceGrowthError,
    )
    from .attn.workspace import (
        WorkspacePool as WorkspacePool,
    )
    from .attn.workspace import (
        WorkspaceStats as WorkspaceStats,
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


def _homes() -> dict[str, str]:
    """Each public name and the module it lives in, read from the imports above."""
    (block,) = (
        node
        for node in ast.parse(Path(__file__).read_text(encoding="utf-8")).body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    return {
        alias.name: "." * node.level + (node.module or "")
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


_HOMES = _homes()
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
