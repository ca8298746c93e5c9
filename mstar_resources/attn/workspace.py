"""FlashInfer's workspaces: the float one a plan reserves its split-KV partials in, and the int one
(with its host mirror) it writes its indices to. The wrappers of one (label, cg slot) share all
three, on the conditions ``docs/workspaces-and-ranks.md`` gives."""

from __future__ import annotations

from ..floor import resolve_floor
from ._buffer import WorkspaceGrowthError, WorkspaceStats
from ._float_workspace import Workspace, install_int_workspace
from ._int_workspace import IntWorkspace
from ._pool import WorkspacePool

__all__ = [
    "IntWorkspace", "Workspace", "WorkspaceGrowthError", "WorkspacePool", "WorkspaceStats",
    "install_int_workspace", "workspace_bytes"
]  # fmt: skip


def workspace_bytes(declared_mb: int | None = None) -> int:
    """The floor of one FlashInfer workspace: what its resource declares, else
    ``MSTAR_WORKSPACE_BUFFER_MB`` (default 512), in bytes (MB = 2**20 bytes)."""
    return resolve_floor(declared_mb).bytes
