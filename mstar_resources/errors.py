"""The exceptions this library raises: each names the setting to change and the value to give it."""

from __future__ import annotations

import torch

__all__ = [
    "ResourceConfigError",
    "ResourceError",
    "WorkspaceGrowthError",
    "WorkspaceSealedError",
]


class ResourceError(Exception):
    """Base of every error raised by mstar-resources."""


class ResourceConfigError(ResourceError, ValueError):
    """A setting (config key, argument or environment variable) holds an unusable value."""


class WorkspaceSealedError(ResourceError):
    """A plan needs more room than a sealed workspace has; a sealed workspace never moves."""


class WorkspaceGrowthError(ResourceError, torch.OutOfMemoryError):
    """A workspace could not get the memory it needed; it keeps its old buffer, intact and usable.

    Also a ``torch.OutOfMemoryError``, so an engine's out-of-memory handling still catches it.
    """
