"""The exceptions this library raises: each names the setting to change and the value to give it.

Torch-free, so that composing and checking a config imports no torch. The one error that is also a
torch error, ``WorkspaceGrowthError``, lives beside the workspaces that raise it.
"""

from __future__ import annotations

__all__ = ["ResourceConfigError", "ResourceError", "WorkspacePlanError", "WorkspaceSealedError"]


class ResourceError(Exception):
    """Base of every error raised by mstar-resources."""


class ResourceConfigError(ResourceError, ValueError):
    """A setting (config key, argument or environment variable) holds an unusable value."""


class WorkspaceSealedError(ResourceError):
    """A plan needs more room than a sealed workspace has; a sealed workspace never moves."""


class WorkspacePlanError(ResourceError):
    """A plan that growing cannot satisfy: its planner does not plan on the workspace's tensor, or
    keeps asking for more."""
