"""vLLM's FlashInfer workspaces from this library (docs/vllm.md): vLLM loads :func:`register`
(entry point ``vllm.general_plugins``) in each of its processes; it does nothing unless
``MSTAR_RESOURCES_VLLM`` is set."""

from __future__ import annotations

from ..plugin import Seam
from ..setting import Setting
from .seams import PLUGIN, READ_IN, SEAMS, active, register, version_problem
from .workspaces import ENV_VAR, VLLM

__all__ = [
    "ENV_VAR", "PLUGIN", "READ_IN", "SEAMS", "VLLM", "Seam", "Setting", "active", "register",
    "version_problem"
]  # fmt: skip
