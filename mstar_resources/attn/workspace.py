"""FlashInfer's workspaces: the scratch a plan reserves its split-KV partials in, and the int
workspace (with its host mirror) it writes its indices to.

What is shared, and on what condition (``docs/workspaces-and-ranks.md`` says it at length):

- A **float workspace** is shared by every wrapper of its (label, cg slot). It holds a plan's
  split-KV partials, written and read within one run, so wrappers that run one after another on
  one stream can share it.
- An **int workspace** is shared by the same wrappers, on one condition: each wrapper is planned
  right before it runs, and no other plan on that int workspace comes between its plan and its
  run (or its graph's replay). It holds the plan's indices from the plan to the run, and a graph
  replays over its fixed addresses. vLLM and SGLang plan their decode wrapper of a graph size
  right before each replay, one wrapper a step; a wrapper that plans several levels before it
  runs them (FlashInfer's cascade) cannot share, and :meth:`WorkspacePool.install` refuses it.
- Its **host mirror** is shared with it: a plan writes its indices there, then queues a copy to
  the int workspace. The mirror is pageable memory, which the copy reads before it is queued, so
  the next plan may rewrite it at once (a pinned one would be read when the stream reaches the
  copy: :class:`IntWorkspace` says why that races).
"""

from __future__ import annotations

from .._internal.floor import resolve_floor
from .buffer import WorkspaceGrowthError, WorkspaceStats
from .float_workspace import MAX_GROWTHS_PER_PLAN, Workspace, install_int_workspace
from .int_workspace import IntWorkspace, int_buffers
from .pool import WorkspacePool

__all__ = [
    "MAX_GROWTHS_PER_PLAN",
    "IntWorkspace",
    "Workspace",
    "WorkspaceGrowthError",
    "WorkspacePool",
    "WorkspaceStats",
    "install_int_workspace",
    "int_buffers",
    "workspace_bytes",
]


def workspace_bytes(declared_mb: int | None = None) -> int:
    """The floor of one FlashInfer workspace: what its resource declares, else
    ``MSTAR_WORKSPACE_BUFFER_MB`` (default 512), in bytes (MB = 2**20 bytes)."""
    return resolve_floor(declared_mb).bytes
