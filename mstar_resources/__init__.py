"""Declarative, growable, sealable GPU scratch memory for LLM inference engines."""

from .attn.workspace import Workspace, WorkspacePool, WorkspaceStats, workspace_bytes
from .errors import ResourceConfigError, ResourceError, WorkspaceGrowthError, WorkspaceSealedError

__all__ = [
    "ResourceConfigError",
    "ResourceError",
    "Workspace",
    "WorkspaceGrowthError",
    "WorkspacePool",
    "WorkspaceSealedError",
    "WorkspaceStats",
    "workspace_bytes",
]
