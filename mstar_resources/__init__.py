"""Declarative, growable, sealable GPU scratch memory for LLM inference engines.

The public names are the imports below, the one list of them: type checkers read it, and the
package reads it to load each name on first use, so that composing ``pkg://mstar_resources.conf``
(which imports this package) costs neither torch nor the resolver.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
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
        WorkspaceAgreementError,
        WorkspacePlanError,
        WorkspaceSealedError,
        WorkspaceShortError,
    )
    from .resolver import ResolvedResource, build_pools, resolve


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
__all__ = sorted(_HOMES)  # noqa: PLE0605 (read from the imports above)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
