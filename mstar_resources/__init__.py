"""Declarative, growable, sealable GPU scratch memory for LLM inference engines."""

from .attn.workspace import Workspace, WorkspacePool, workspace_bytes
from .errors import ResourceConfigError, ResourceError, WorkspaceGrowthError, WorkspaceSealedError

__all__ = [
    "ResourceConfigError",
    "ResourceError",
    "Workspace",
    "WorkspaceGrowthError",
    "WorkspacePool",
    "WorkspaceSealedError",
    "workspace_bytes",
]
