"""vLLM's FlashInfer workspaces from this library (docs/vllm.md): vLLM loads :func:`register`
(entry point ``vllm.general_plugins``) in each of its processes; it does nothing unless
``MSTAR_RESOURCES_VLLM`` is set."""

from __future__ import annotations

from ..plugin import Seam
from .plans import plans_of_groups
from .seams import PLUGIN, READ_IN, SEAMS, active, register, version_problem
from .setting import ENV_VAR, Setting, read_setting
from .workspaces import VllmWorkspaces

__all__ = [
    "ENV_VAR",
    "PLUGIN",
    "READ_IN",
    "SEAMS",
    "Seam",
    "Setting",
    "VllmWorkspaces",
    "active",
    "plans_of_groups",
    "read_setting",
    "register",
    "version_problem",
]
