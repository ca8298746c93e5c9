"""FlashInfer's workspaces: the float one a plan reserves its split-KV partials in, and the int one
(with its host mirror) it writes its indices to.

The wrappers of one (label, cg slot) share all three (``docs/workspaces-and-ranks.md`` says it at
length): the float workspace, since its partials live within one run and the wrappers run one
after another on one stream; the int workspace, provided each wrapper is planned right before it
runs (or its graph replays) with no other plan on it between, so no cascade
(:meth:`WorkspacePool.install` refuses one); and its host mirror, pageable, so the copy a plan
queues has read it before the next plan rewrites it (:class:`IntWorkspace` says why a pinned one
races).
"""

from __future__ import annotations

from .._internal.floor import resolve_floor
from .buffer import WorkspaceGrowthError, WorkspaceStats
from .float_workspace import MAX_GROWTHS_PER_PLAN, Workspace, install_int_workspace
from .int_workspace import IntWorkspace
from .pool import WorkspacePool

__all__ = [
    "MAX_GROWTHS_PER_PLAN",
    "IntWorkspace",
    "Workspace",
    "WorkspaceGrowthError",
    "WorkspacePool",
    "WorkspaceStats",
    "install_int_workspace",
    "workspace_bytes",
]


def workspace_bytes(declared_mb: int | None = None) -> int:
    """The floor of one FlashInfer workspace: what its resource declares, else
    ``MSTAR_WORKSPACE_BUFFER_MB`` (default 512), in bytes (MB = 2**20 bytes)."""
    return resolve_floor(declared_mb).bytes
