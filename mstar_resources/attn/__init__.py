"""Attention resources: FlashInfer's float workspaces."""

from .workspace import Workspace, WorkspacePool, workspace_bytes

__all__ = ["Workspace", "WorkspacePool", "workspace_bytes"]
