"""SGLang's FlashInfer workspaces from this library (docs/sglang.md): SGLang loads
:func:`register` (entry point ``sglang.srt.plugins``) in each of its processes; it does nothing
unless ``MSTAR_RESOURCES_SGLANG`` is set."""

from __future__ import annotations

from .seams import PLUGIN, READ_IN, SEAMS, active, register, version_problem
from .workspaces import ENV_VAR, SGLANG

__all__ = [
    "ENV_VAR", "PLUGIN", "READ_IN", "SEAMS", "SGLANG", "active", "register", "version_problem"
]  # fmt: skip
